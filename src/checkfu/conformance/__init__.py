"""Conformance: the nine cases of contract.md section 9, callable without pytest, and signed evidence.

``run_suite(target)`` resolves an installed provider's name or a service URL and runs
every case through the runner's own door and checks, returning a ``Report``; each
``CaseResult`` is a pass, a fail with its reason and the evidence seen, or a skip
naming the envelope field that made it. ``checkfu.conformance.evidence`` signs a
report as an in-toto Statement in a DSSE envelope and verifies one. The pytest
plugin (``pytest --checkfu-provider=TARGET``) runs the same cases in your own suite.
"""

from checkfu.conformance.cases import CASES, Case, CaseResult, Context, run_case
from checkfu.conformance.suite import SUITE_VERSION, Report, Suite, default_profile, resolve_target, run_suite

__all__ = [
    "CASES",
    "SUITE_VERSION",
    "Case",
    "CaseResult",
    "Context",
    "Report",
    "Suite",
    "default_profile",
    "resolve_target",
    "run_case",
    "run_suite",
]
