"""The suite: a target resolved to an adapter, a profile it can serve, the nine cases, and the report.

``TARGET`` is an installed provider's name (``docker``, ``host-process``, ``memory``)
or the URL of a provider service. The profile comes from ``--profile``, or is
derived from the envelope: its first tier, network ``none`` where served, the
smallest resources it accepts (raised to what a shell needs), ``ephemeral_zdr``
where served, and a base image it is known to have (its fixed image, the Docker
tier's ``checkfu/busybox:1`` pinned by the engine, the memory provider's own).
"""

from __future__ import annotations

import json
import platform as host_platform
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from checkfu.conformance.cases import CASES, Case, CaseResult, Context, run_case
from checkfu.contract.codec import digest as canonical_digest
from checkfu.contract.envelope import SandboxProviderCapabilities
from checkfu.contract.errors import SandboxAdapterUnavailable, SandboxProfileInvalid
from checkfu.contract.profile import NetworkPolicy, SandboxProfile
from checkfu.contract.vocabulary import Platform, Resources
from checkfu.core.registry import Adapter, Registry, adapter_from_factory, load_registry
from checkfu.wire.client import RemoteProvider
from checkfu.wire.credentials import Credential

SUITE_VERSION = "checkfu-conformance 2"
"""Version 2 exercises every optional member and lifecycle assurance the envelope declares (issue 30)."""
COMFORTABLE = Resources(cpu_millis=500, memory_mib=128, disk_mib=64, pids=64)
"""What a sandbox running a shell and a few probes needs; clipped into the envelope's range."""
CONFORMANCE_WINDOW = 256 << 10
"""The output credit the suite grants a service's open process: small, so a modest echo outruns it and the
service must wait for the suite's grants (the runner grants ``DEFAULT_WINDOW``; any grant binds a service)."""


@dataclass
class Report:
    target: str
    envelope: SandboxProviderCapabilities
    cases: list[CaseResult]
    started_at: float
    finished_at: float
    suite_version: str = SUITE_VERSION

    @property
    def envelope_digest(self) -> str:
        return canonical_digest(self.envelope)

    @property
    def failed(self) -> list[CaseResult]:
        return [c for c in self.cases if c.outcome == "fail"]

    @property
    def ok(self) -> bool:
        return not self.failed

    def tally(self) -> dict[str, int]:
        return {o: sum(1 for c in self.cases if c.outcome == o) for o in ("pass", "fail", "skip")}

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "suite_version": self.suite_version,
            "target": self.target,
            "execution_target": self.envelope.target.model_dump(),
            "envelope_digest": self.envelope_digest,
            "tally": self.tally(),
            "seconds": round(self.finished_at - self.started_at, 3),
            "cases": [c.as_json() for c in self.cases],
        }

    def write_json(self, path: Path) -> None:
        path.write_text(json.dumps(self.as_json(), indent=2) + "\n", encoding="utf-8")

    def write_junit(self, path: Path) -> None:
        path.write_bytes(self.junit_xml())

    def junit_xml(self) -> bytes:
        """The report as a JUnit XML document (UTF-8, with its declaration)."""
        suite = ET.Element(
            "testsuite",
            name="checkfu conformance",
            tests=str(len(self.cases)),
            failures=str(len(self.failed)),
            skipped=str(self.tally()["skip"]),
            time=f"{self.finished_at - self.started_at:.3f}",
        )
        for c in self.cases:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"checkfu.conformance.{self.envelope.provider}",
                name=f"case {c.number}: {c.name}",
                time=f"{c.seconds:.3f}",
            )
            if c.outcome == "fail":
                ET.SubElement(case, "failure", message=c.reason).text = "\n".join(c.evidence)
            elif c.outcome == "skip":
                ET.SubElement(case, "skipped", message=c.reason)
            if c.evidence:
                ET.SubElement(case, "system-out").text = "\n".join(c.evidence)
        root = ET.Element("testsuites")
        root.append(suite)
        xml: bytes = ET.tostring(root, encoding="utf-8", xml_declaration=True)
        return xml


def host_platform_value() -> Platform:
    machine = host_platform.machine().lower()
    return Platform(os="linux", architecture="arm64" if machine in ("aarch64", "arm64") else "amd64")


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


async def resolve_target(target: str, credential: Credential | None = None) -> Adapter:
    """The adapter ``target`` names: an installed provider (trusted as the registry trusts it) or a service.

    Raises:
        SandboxAdapterUnavailable: nothing by that name is installed, or it could not start.
        SandboxError: the service's envelope does not decode, or describe failed.
    """
    if is_url(target):
        return await adapter_from_factory(
            lambda: RemoteProvider(target, credential, window=CONFORMANCE_WINDOW), target, {}
        )
    registry: Registry = await load_registry(entry_point_names=[target])
    found = registry.by_provider(target)
    if len(found) != 1:
        why = "; ".join(f"{k}: {v}" for k, v in registry.unavailable.items()) or "no such provider is installed"
        raise SandboxAdapterUnavailable(f"cannot test {target!r}: {why}", field="target")
    return found[0]


def _known_image(envelope: SandboxProviderCapabilities) -> str | None:
    if envelope.image_mode == "fixed":
        return envelope.fixed_base_images[0]
    if envelope.provider == "docker":
        from checkfu.providers.docker import pin_base_image  # noqa: PLC0415 - only the Docker tier pins

        return pin_base_image("checkfu/busybox:1")
    if envelope.provider == "memory":
        from checkfu.testing.memory import BASE_IMAGE  # noqa: PLC0415

        return BASE_IMAGE
    return None


def default_profile(envelope: SandboxProviderCapabilities) -> SandboxProfile:
    """A profile the envelope can serve, for a provider whose images the suite knows.

    Raises:
        SandboxProfileInvalid: the provider builds images from profiles and the suite knows none of its
            images: give one with ``--profile``.
    """
    image = _known_image(envelope)
    if image is None:
        raise SandboxProfileInvalid(
            f"{envelope.provider} builds images from profiles and the suite knows none it has: give a profile "
            "with --profile FILE whose base_image the provider holds",
            field="base_image",
        )
    lo, hi = envelope.minimum_resources, envelope.maximum_resources
    dims = {
        d: min(max(getattr(COMFORTABLE, d), getattr(lo, d)), getattr(hi, d))
        for d in ("cpu_millis", "memory_mib", "disk_mib", "pids")
    }
    mode = "none" if "none" in envelope.network_modes else envelope.network_modes[0]
    retention = "ephemeral_zdr" if "ephemeral_zdr" in envelope.retention_modes else envelope.retention_modes[0]
    return SandboxProfile(
        tier=envelope.tiers[0],
        base_image=image,
        network_policy=NetworkPolicy(mode=mode),
        resource_limits=Resources(**dims),
        retention_mode=retention,
    )


Progress = Callable[[Case, CaseResult | None], None]
"""Called as each case starts (result ``None``) and ends."""


@dataclass
class Suite:
    adapter: Adapter
    profile: SandboxProfile | None
    target: str
    secret: str | None = None
    only: tuple[int, ...] = ()
    platform: Platform = field(default_factory=host_platform_value)
    profile_problem: str = "no profile was given"

    async def run(self, progress: Progress | None = None) -> Report:
        ctx = Context(
            self.adapter, self.profile, self.platform, secret=self.secret, profile_problem=self.profile_problem
        )
        results: list[CaseResult] = []
        started = time.time()
        try:
            for case in CASES:
                if self.only and case.number not in self.only:
                    continue
                if progress is not None:
                    progress(case, None)
                result = await run_case(case, ctx)
                results.append(result)
                if progress is not None:
                    progress(case, result)
        finally:
            ctx.close()
        return Report(self.target, self.adapter.envelope, results, started, time.time())


async def run_suite(
    target: str,
    *,
    credential: Credential | None = None,
    profile: SandboxProfile | None = None,
    progress: Progress | None = None,
    only: tuple[int, ...] = (),
) -> Report:
    """Resolve ``target``, choose a profile, run the cases.

    Raises:
        SandboxError: the target cannot be reached or described, or no profile can be chosen.
    """
    adapter = await resolve_target(target, credential)
    chosen, problem = profile, ""
    if chosen is None:
        try:
            chosen = default_profile(adapter.envelope)
        except SandboxProfileInvalid as exc:
            problem = exc.message
    suite = Suite(
        adapter, chosen, target, secret=credential.secret if credential else None, only=only, profile_problem=problem
    )
    return await suite.run(progress)
