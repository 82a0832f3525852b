"""A pytest plugin: ``pytest --checkfu-provider=TARGET`` runs the nine cases inside your own test suite.

Each case becomes a test item (``checkfu-conformance::case N: name``): a skip is a
pytest skip with the envelope field that made it, a failure fails with the case's
reason and evidence. ``--checkfu-credential`` takes the service's credential (a file
or the value; default ``CHECKFU_PROVIDER_CREDENTIAL``), ``--checkfu-profile`` a
profile file. Without ``--checkfu-provider`` the plugin adds nothing.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from checkfu.conformance.cases import CASES, Case, CaseResult, Context, run_case
from checkfu.conformance.suite import default_profile, host_platform_value, resolve_target
from checkfu.contract.errors import SandboxProfileInvalid
from checkfu.contract.profile import SandboxProfile
from checkfu.wire.credentials import Credential, read_credential


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("checkfu", "checkfu provider conformance")
    group.addoption("--checkfu-provider", metavar="TARGET", help="run the nine conformance cases against TARGET")
    group.addoption("--checkfu-credential", metavar="FILE|SECRET", help="the provider service's credential")
    group.addoption("--checkfu-profile", metavar="FILE", help="a profile the provider can serve")


class _Suite:
    """The adapter and context, made once per session and shared by the case items."""

    def __init__(self, config: pytest.Config) -> None:
        self.target: str = config.getoption("--checkfu-provider")
        raw = config.getoption("--checkfu-credential")
        self.credential: Credential | None
        if raw is None:
            self.credential = read_credential()
        elif Path(raw).is_file():
            self.credential = read_credential(Path(raw))
        else:
            self.credential = Credential(raw)
        self.profile_path = config.getoption("--checkfu-profile")
        self.results: dict[int, CaseResult] = {}

    def run(self, case: Case) -> CaseResult:
        async def go() -> CaseResult:
            adapter = await resolve_target(self.target, self.credential)
            if self.profile_path:
                from checkfu.core.files import load  # noqa: PLC0415

                profile: SandboxProfile | None = load(SandboxProfile, Path(self.profile_path))
                problem = ""
            else:
                try:
                    profile, problem = default_profile(adapter.envelope), ""
                except SandboxProfileInvalid as exc:
                    profile, problem = None, exc.message
            secret = self.credential.secret if self.credential else None
            ctx = Context(adapter, profile, host_platform_value(), secret=secret, profile_problem=problem)
            try:
                return await run_case(case, ctx)
            finally:
                ctx.close()

        return asyncio.run(go())


class CaseItem(pytest.Item):
    def __init__(self, *, case: Case, suite: _Suite, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.suite = suite

    def runtest(self) -> None:
        result = self.suite.run(self.case)
        if result.outcome == "skip":
            pytest.skip(result.reason)
        if result.outcome == "fail":
            evidence = "".join(f"\n  saw: {line}" for line in result.evidence)
            raise CaseFailed(f"case {self.case.number} ({self.case.name}) failed: {result.reason}{evidence}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        if isinstance(excinfo.value, CaseFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo))

    def reportinfo(self) -> tuple[str, int, str]:
        return "checkfu-conformance", 0, f"case {self.case.number}: {self.case.name}"


class CaseFailed(Exception):
    pass


class ConformanceCollector(pytest.Collector):
    def collect(self) -> list[pytest.Item]:
        suite = _Suite(self.config)
        return [CaseItem.from_parent(self, name=f"case {c.number}: {c.name}", case=c, suite=suite) for c in CASES]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--checkfu-provider"):
        return
    collector = ConformanceCollector.from_parent(session, name="checkfu-conformance")
    items.extend(collector.collect())
