"""The host-process tier: the harness as a bare process of the runner host. Weak, and loud about it.

``create`` is the entry point (``checkfu.providers``: ``host-process``). The
envelope it advertises is decided at construction from what the host allows;
see ``checkfu.providers.host_process.envelope`` for what each choice means.
"""

from __future__ import annotations

from checkfu.contract.errors import SandboxAdapterUnavailable
from checkfu.providers.host_process.envelope import (
    MATERIALIZATION_REVISION,
    PLACEMENT,
    PROVIDER,
    PROVIDER_REVISION,
    WHY_NOT_ENFORCED,
)
from checkfu.providers.host_process.provider import CGROUP_MODES, CgroupMode, HostProcessProvider

__all__ = [
    "CGROUP_MODES",
    "MATERIALIZATION_REVISION",
    "PLACEMENT",
    "PROVIDER",
    "PROVIDER_REVISION",
    "WHY_NOT_ENFORCED",
    "CgroupMode",
    "HostProcessProvider",
    "create",
]

OPTIONS = ("state_dir", "cgroups", "kill_grace_ms", "drain_grace_ms")


def _milliseconds(name: str, text: str) -> float:
    if not text.isdigit():
        raise SandboxAdapterUnavailable(f"{name}: {text!r} is not a whole number of milliseconds", field=name)
    return int(text) / 1000


def create(**options: str) -> HostProcessProvider:
    """Build the provider from string options: ``state_dir``, ``cgroups`` (auto|off|require),
    ``kill_grace_ms``, ``drain_grace_ms``.

    Raises:
        SandboxAdapterUnavailable: an unknown or malformed option, or a provider that cannot be built here.
    """
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise SandboxAdapterUnavailable(
            f"{unknown[0]}: unknown option of host-process (known: {', '.join(OPTIONS)})", field=unknown[0]
        )
    mode = options.get("cgroups", "auto")
    if mode not in CGROUP_MODES:
        raise SandboxAdapterUnavailable(f"cgroups: {mode!r} is not one of {', '.join(CGROUP_MODES)}", field="cgroups")
    chosen: CgroupMode = "auto" if mode == "auto" else "off" if mode == "off" else "require"
    return HostProcessProvider(
        state_dir=options.get("state_dir") or None,
        cgroups=chosen,
        kill_grace=_milliseconds("kill_grace_ms", options.get("kill_grace_ms", "500")),
        drain_grace=_milliseconds("drain_grace_ms", options.get("drain_grace_ms", "100")),
    )
