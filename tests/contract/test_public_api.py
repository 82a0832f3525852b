"""The public surface of ``checkfu.contract``, pinned; and proof that importing it does no I/O.

The contract is pure data and rules: importing it must load no adapter, HTTP,
Docker or database module, and its own modules import nothing that opens a
file, a socket or a process.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import checkfu.contract

PUBLIC_NAMES = [
    "AUTHORITIES",
    "AXES",
    "ActivateRequest",
    "AllocationEntry",
    "Assessment",
    "Authority",
    "Axis",
    "CloneRequest",
    "CloneResult",
    "CompensateRequest",
    "CompensateResult",
    "DeleteSnapshotRequest",
    "DeleteSnapshotResult",
    "DescribeRequest",
    "DescribeResult",
    "DirEntry",
    "ERROR_CLASSES",
    "EnforcementStatement",
    "ErrorCode",
    "ExecRequest",
    "ExecResult",
    "ExecutionTarget",
    "FileContent",
    "HOST_IMAGE",
    "InspectRequest",
    "InstanceResult",
    "LABEL_ALLOCATION_KEY",
    "LABEL_RUNNER_TAG",
    "Lease",
    "LifecycleAssurances",
    "ListAllocationsRequest",
    "ListAllocationsResult",
    "ListDirRequest",
    "ListDirResult",
    "MAX_PATH_BYTES",
    "MAY_RAISE",
    "MEMBERS",
    "MESSAGES",
    "METHOD_NAMES",
    "MOUNT_CEILING",
    "MaterializeRequest",
    "MaterializeResult",
    "Member",
    "Model",
    "MountFile",
    "MountPlan",
    "NetworkPolicy",
    "OPTIONAL_MEMBERS",
    "OpenProcessRequest",
    "Platform",
    "ProcessEvent",
    "ProcessExit",
    "ProcessOutput",
    "ProcessStarted",
    "ProcessStream",
    "ProcessStreamEnd",
    "Provider",
    "ProvisionRequest",
    "REQUIRED_MEMBERS",
    "ReadFilesRequest",
    "ReadFilesResult",
    "ReleaseRequest",
    "ReleaseResult",
    "Resources",
    "ResumeRequest",
    "ResumeResult",
    "SNAPSHOT_TRANSITIONS",
    "SandboxAdapterAmbiguous",
    "SandboxAdapterUnavailable",
    "SandboxBoundExceeded",
    "SandboxCapabilityUnavailable",
    "SandboxDigestMismatch",
    "SandboxEnrollmentRefused",
    "SandboxEnvelopeInvalid",
    "SandboxError",
    "SandboxIdentityMismatch",
    "SandboxLeaseFenced",
    "SandboxNotFound",
    "SandboxOperationUnsupported",
    "SandboxPathRejected",
    "SandboxProfile",
    "SandboxProfileInvalid",
    "SandboxProtocolViolation",
    "SandboxProviderCapabilities",
    "SandboxProviderError",
    "SandboxProviderFailed",
    "SandboxProviderTimeout",
    "SandboxRequestError",
    "SandboxResultInvalid",
    "SandboxStateConflict",
    "SandboxStateError",
    "SandboxTransportError",
    "SandboxUnauthenticated",
    "SnapshotRequest",
    "SnapshotResult",
    "State",
    "TRANSITIONS",
    "Unmet",
    "WriteFileRequest",
    "WriteFileResult",
    "admit_path",
    "assess",
    "authority_rank",
    "canonical",
    "check_bound",
    "check_content",
    "check_echo",
    "check_equal",
    "check_lease",
    "check_new_identity",
    "check_read_files",
    "check_returned_paths",
    "check_state",
    "check_write",
    "counts_as_enforcement",
    "decode",
    "decode_value",
    "digest",
    "echo",
    "encode",
    "error_for_code",
    "is_within",
    "owner_labels",
    "path_problem",
    "require_capabilities",
    "revalidate",
    "sha256_digest",
    "snapshot_transition",
    "transition",
    "unmet_requirements",
]
"""A copy of ``checkfu.contract.__all__``, sorted. Changing the public API means changing this list."""

CONTRACT_DIR = Path(checkfu.contract.__file__).resolve().parent

FORBIDDEN_AT_IMPORT = (
    "docker",
    "httpx",
    "httpcore",
    "h11",
    "httptools",
    "starlette",
    "fastapi",
    "uvicorn",
    "websockets",
    "sqlalchemy",
    "sqlite3",
    "http.client",
    "urllib.request",
    "ssl",
    "typer",
    "rich",
    "checkfu.providers",
    "checkfu.core",
    "checkfu.runner",
    "checkfu.wire",
    "checkfu.cli",
    "checkfu.control",
    "checkfu.conformance",
    "checkfu.contract.examples",
)
"""Adapters, HTTP, Docker, databases, the CLI and every layer above the contract."""

FORBIDDEN_IMPORTS = {
    "socket",
    "subprocess",
    "os",
    "pathlib",
    "sqlite3",
    "http",
    "urllib",
    "asyncio",
    "io",
    "shutil",
    "tempfile",
    "multiprocessing",
    "threading",
    "select",
    "selectors",
    "ssl",
}
"""Standard-library modules that open files, sockets or processes; no contract module imports one."""


def test_all_is_pinned() -> None:
    assert sorted(checkfu.contract.__all__) == PUBLIC_NAMES


def test_all_has_no_duplicates() -> None:
    assert len(set(checkfu.contract.__all__)) == len(checkfu.contract.__all__)


@pytest.mark.parametrize("name", PUBLIC_NAMES)
def test_every_public_name_resolves(name: str) -> None:
    value = getattr(checkfu.contract, name)
    assert value is not None
    assert not isinstance(value, types.ModuleType)


def test_nothing_public_is_left_out_of_all() -> None:
    public = {
        n
        for n in dir(checkfu.contract)
        if not n.startswith("_") and not isinstance(getattr(checkfu.contract, n), types.ModuleType)
    }
    assert public == set(PUBLIC_NAMES)


def test_every_message_and_error_is_public() -> None:
    for request, result in checkfu.contract.MESSAGES.values():
        assert request.__name__ in PUBLIC_NAMES
        assert result.__name__ in PUBLIC_NAMES
    for code in checkfu.contract.ERROR_CLASSES:
        assert code in PUBLIC_NAMES


def test_py_typed_ships() -> None:
    assert (CONTRACT_DIR.parent / "py.typed").is_file()


def test_importing_the_contract_loads_no_adapter_http_docker_or_database_module() -> None:
    code = "import checkfu.contract, json, sys; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    loaded = json.loads(out.stdout)
    assert "checkfu.contract" in loaded
    offending = sorted(m for m in loaded for bad in FORBIDDEN_AT_IMPORT if m == bad or m.startswith(bad + "."))
    assert offending == []


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("__import__", "open"):
            found.add(f"<{node.func.id}()>")
    return found


CONTRACT_MODULES = sorted(p.name for p in CONTRACT_DIR.glob("*.py"))


def test_the_contract_modules_are_all_scanned() -> None:
    assert "envelope.py" in CONTRACT_MODULES
    assert "codec.py" in CONTRACT_MODULES
    assert len(CONTRACT_MODULES) >= 15


@pytest.mark.parametrize("module", CONTRACT_MODULES)
def test_no_contract_module_imports_io(module: str) -> None:
    imports = _imports(CONTRACT_DIR / module)
    tops = {name.split(".")[0] for name in imports}
    assert not (tops & FORBIDDEN_IMPORTS), sorted(tops & FORBIDDEN_IMPORTS)
    assert "<open()>" not in imports
    assert "<__import__()>" not in imports
    for name in imports:
        if name.startswith("checkfu"):
            assert name == "checkfu.contract" or name.startswith("checkfu.contract."), name
