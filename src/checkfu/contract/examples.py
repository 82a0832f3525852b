"""Example values of every contract message: valid, minimal, and realistic.

Provider authors read them; the author kit exports them as golden vectors; the
tests build on them. Each function returns a fresh JSON-ready ``dict`` so a
caller can mutate it into an invalid vector.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from checkfu.contract.codec import decode_value
from checkfu.contract.enforcement import AXES
from checkfu.contract.profile import SandboxProfile

IMAGE_ID = "sha256:" + hashlib.sha256(b"checkfu example image").hexdigest()
HELLO = b"hello\n"
HELLO_SHA256 = "sha256:" + hashlib.sha256(HELLO).hexdigest()
HELLO_GIT = "git:ce013625030ba8dba906f756967f9e9ca394464a"


def target() -> dict[str, Any]:
    return {
        "provider": "acme-sandbox",
        "provider_revision": "acme-sandbox 1.4.2",
        "materialization_revision": "acme-images 7",
        "placement": "hosted",
    }


def lease() -> dict[str, Any]:
    return {"lease_id": "lease-0001", "lease_epoch": 3}


def resources(scale: int = 1) -> dict[str, Any]:
    return {"cpu_millis": 500 * scale, "memory_mib": 256 * scale, "disk_mib": 256 * scale, "pids": 64 * scale}


def day_one_envelope() -> dict[str, Any]:
    """The seed's day-one partner tier: ephemeral, network none, mounts, nothing optional."""
    t = target()
    return {
        **t,
        "tiers": ["container"],
        "platforms": [{"os": "linux", "architecture": "amd64"}],
        "image_mode": "profile",
        "fixed_base_images": [],
        "package_managers": ["apt", "pip"],
        "network_modes": ["none"],
        "retention_modes": ["ephemeral_zdr"],
        "snapshots": False,
        "enforcement": {
            "sandbox_isolation": "provider_attested",
            "root_read_only": "not_enforced",
            "non_root": "guest_observed",
            "no_new_privileges": "not_enforced",
            "capabilities_dropped": "not_enforced",
            "mounts_sealed": "provider_attested",
            "disk_limit": "provider_attested",
            "network_policy": "provider_attested",
            "resource_limits": "provider_attested",
        },
        "minimum_resources": resources(1),
        "maximum_resources": resources(8),
        "max_mounts": 8,
        "lifecycle_assurances": {"release_destroys": True, "cold_compensation": True},
    }


def seed_day_one_envelope() -> dict[str, Any]:
    """The day-one tier written from the seed's text alone: every required field, no optional one.

    ``lifecycle_assurances`` is omitted, so beside ``ephemeral_zdr`` its
    ``release_destroys`` decodes to true (rule 7); every other optional field
    decodes to its weakest value.
    """
    env = day_one_envelope()
    del env["lifecycle_assurances"]
    return env


def uncertified_allowlist_envelope() -> dict[str, Any]:
    """``allowlist`` egress without a grade: an uncertified allowlist, legal under rule 6."""
    env = day_one_envelope()
    env.update(provider="acme-allowlist", network_modes=["none", "allowlist"])
    return env


def parity_envelope() -> dict[str, Any]:
    """Everything declared: the shape of an in-tree Docker-parity envelope."""
    env = day_one_envelope()
    env.update(
        provider="example-parity",
        placement="local",
        retention_modes=["durable", "ephemeral_zdr"],
        network_modes=["none", "allowlist"],
        egress_certification="advisory_filter",
        snapshots=True,
        snapshot_custody="runner",
        list_dir=True,
        operations=["openProcess", "readFiles", "listAllocations"],
        lifecycle_assurances={
            "release_destroys": True,
            "release_idempotent": True,
            "reaps_process_tree": True,
            "cold_compensation": True,
            "enumerates_allocations": True,
        },
        enforcement={axis: "runner_enforced" for axis in AXES},
        max_mounts=64,
        user_namespace=True,
    )
    return env


def profile() -> dict[str, Any]:
    return {
        "tier": "container",
        "base_image": "debian@" + IMAGE_ID,
        "packages": {"apt": ["jq=1.6-2.1"], "pip": ["requests==2.31.0"]},
        "network_policy": {"mode": "none"},
        "resource_limits": resources(2),
        "retention_mode": "ephemeral_zdr",
    }


def minimal_profile() -> dict[str, Any]:
    """A profile with every optional field omitted: no ``packages``, no ``allowlist``.

    Its digest is taken with both filled in (an empty map and an empty list), as
    the author kit's README works through byte by byte.
    """
    return {
        "tier": "microvm",
        "base_image": IMAGE_ID,
        "network_policy": {"mode": "none"},
        "resource_limits": resources(1),
        "retention_mode": "ephemeral_zdr",
    }


def allowlist_profile() -> dict[str, Any]:
    """A profile with ``allowlist`` egress: a DNS name, an IPv4 and a bracketed IPv6 destination."""
    return {
        "tier": "container",
        "base_image": "registry.example/tools@" + IMAGE_ID,
        "packages": {"npm": ["left-pad@1.3.0"], "go": ["golang.org/x/tools@v0.1.0"]},
        "network_policy": {
            "mode": "allowlist",
            "allowlist": ["api.example.com:443", "10.0.0.7:8080", "[2001:db8::1]:65535"],
        },
        "resource_limits": resources(4),
        "retention_mode": "durable",
    }


def mount() -> dict[str, Any]:
    return {
        "target": "/workspace",
        "files": [
            {"path": "README", "mode": 0o644, "size": len(HELLO), "digest": HELLO_GIT},
            {"path": "src/run.sh", "mode": 0o755, "size": len(HELLO), "digest": HELLO_SHA256},
        ],
    }


def platform() -> dict[str, Any]:
    return {"os": "linux", "architecture": "amd64"}


def instance_call() -> dict[str, Any]:
    return {"target": target(), "lease": lease(), "allocation_key": "ak-0001", "instance_id": "i-42"}


def instance_echo(state: str = "provisioning") -> dict[str, Any]:
    return {**instance_call(), "state": state}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _call() -> dict[str, Any]:
    return {"target": target(), "lease": lease()}


def _echo() -> dict[str, Any]:
    return {"target": target(), "lease": lease()}


def _profile_bound(prof: dict[str, Any] | None = None) -> dict[str, Any]:
    prof = profile() if prof is None else prof
    return {
        **_call(),
        "profile": prof,
        "profile_digest": decode_value(SandboxProfile, prof).digest,
        "platform": platform(),
    }


def _allocating(key: str = "ak-0001") -> dict[str, Any]:
    return {
        **_profile_bound(),
        "allocation_key": key,
        "runner_tag": "runner-a",
        "mounts": [mount()],
        "root_image": IMAGE_ID,
    }


def _process() -> dict[str, Any]:
    return {**instance_call(), "argv": ["sh", "-c", "echo hello"], "env": {"LANG": "C.UTF-8"}, "cwd": "/workspace"}


def messages() -> dict[str, list[dict[str, Any]]]:
    """At least one valid example of every wire message, by message name."""
    return {name: [doc for _, doc in docs] for name, docs in described().items()}


ENVELOPE_EXAMPLES = {
    "the day-one tier of the seed, with two lifecycle assurances stated": day_one_envelope,
    "everything declared: the shape of a Docker-parity envelope": parity_envelope,
    "the day-one tier from the seed's text alone, no optional field (release_destroys decodes to true)": (
        seed_day_one_envelope
    ),
    "an uncertified allowlist: allowlist in network_modes, egress_certification omitted": (
        uncertified_allowlist_envelope
    ),
}


def described() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """Every valid example of every wire message with a line saying what it shows, by message name."""
    out: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, docs in _plain().items():
        out[name] = [(f"valid example {i}", doc) for i, doc in enumerate(docs)]
    out["SandboxProviderCapabilities"] = [(what, make()) for what, make in ENVELOPE_EXAMPLES.items()]
    return out


def _plain() -> dict[str, list[dict[str, Any]]]:
    ic = instance_call()
    return {
        "SandboxProviderCapabilities": [],
        "SandboxProfile": [profile(), minimal_profile(), allowlist_profile()],
        "MountPlan": [mount()],
        "DescribeRequest": [{}],
        "DescribeResult": [{"envelope": day_one_envelope()}],
        "MaterializeRequest": [
            _profile_bound(),
            _profile_bound(minimal_profile()),
            _profile_bound(allowlist_profile()),
        ],
        "MaterializeResult": [
            {
                **_echo(),
                "profile_digest": _profile_bound()["profile_digest"],
                "image": IMAGE_ID,
                "materialization_revision": "acme-images 7",
                "built": True,
            }
        ],
        "ProvisionRequest": [_allocating(), {**_allocating(), "mounts": []}],
        "InstanceResult": [instance_echo("provisioning"), instance_echo("active")],
        "WriteFileRequest": [
            {**ic, "path": "/workspace/README", "mode": 0o644, "size": len(HELLO), "digest": HELLO_SHA256}
        ],
        "WriteFileResult": [{**ic, "path": "/workspace/README", "size": len(HELLO), "digest": HELLO_SHA256}],
        "ActivateRequest": [ic],
        "ExecRequest": [{**_process(), "stdin": b64(b"input"), "timeout_ms": 30000, "max_output_bytes": 1 << 20}],
        "ExecResult": [
            {
                **ic,
                "exit_code": 0,
                "timed_out": False,
                "stdout": b64(HELLO),
                "stderr": "",
                "stdout_truncated": False,
                "stderr_truncated": False,
            }
        ],
        "InspectRequest": [ic],
        "ReleaseRequest": [ic],
        "ReleaseResult": [{**instance_echo("released"), "destroyed": True}],
        "CompensateRequest": [{**_call(), "allocation_key": "ak-0001", "runner_tag": "runner-a"}],
        "CompensateResult": [{**_echo(), "allocation_key": "ak-0001", "reclaimed": 2}],
        "OpenProcessRequest": [_process()],
        "ProcessStarted": [{**ic, "process_id": "p-1"}],
        "ReadFilesRequest": [{**ic, "paths": ["/workspace/README"], "max_bytes": 1 << 20}],
        "ReadFilesResult": [
            {
                **ic,
                "files": [{"path": "/workspace/README", "mode": 0o644, "digest": HELLO_SHA256, "data": b64(HELLO)}],
                "missing": [],
            }
        ],
        "ListAllocationsRequest": [{**_call(), "runner_tag": "runner-a"}],
        "ListAllocationsResult": [
            {
                **_echo(),
                "runner_tag": "runner-a",
                "allocations": [{"allocation_key": "ak-0001", "kind": "instance", "object_id": "c0ffee"}],
            }
        ],
        "ListDirRequest": [{**ic, "path": "/workspace", "recursive": True, "max_entries": 1000}],
        "ListDirResult": [
            {
                **ic,
                "path": "/workspace",
                "kind": "dir",
                "truncated": False,
                "entries": [
                    {"path": "/workspace/README", "kind": "file", "size": len(HELLO), "mode": 0o644},
                    {"path": "/workspace/src", "kind": "dir", "size": 0, "mode": 0o755},
                ],
            },
            {**ic, "path": "/workspace/out", "kind": "missing", "truncated": False, "entries": []},
            {**ic, "path": "/workspace/README", "kind": "file", "truncated": False, "entries": []},
        ],
        "SnapshotRequest": [
            {**ic, "snapshot_allocation_key": "ak-0002", "keep_seconds": 7 * 86400},
            {**ic, "snapshot_allocation_key": "ak-0002"},
        ],
        "SnapshotResult": [
            {**ic, "snapshot_allocation_key": "ak-0002", "snapshot_id": "s-7", "expires_at": "2026-12-08T22:05:42Z"},
            {**ic, "snapshot_allocation_key": "ak-0002", "snapshot_id": "s-7", "expires_at": None},
            {**ic, "snapshot_allocation_key": "ak-0002", "snapshot_id": "s-7"},
        ],
        "DeleteSnapshotRequest": [{**_call(), "snapshot_allocation_key": "ak-0002", "snapshot_id": "s-7"}],
        "DeleteSnapshotResult": [
            {**_echo(), "snapshot_allocation_key": "ak-0002", "snapshot_id": "s-7", "deleted": True}
        ],
        "CloneRequest": [{**_allocating("ak-0003"), "source_allocation_key": "ak-0001", "source_instance_id": "i-42"}],
        "CloneResult": [
            {
                **_echo(),
                "allocation_key": "ak-0003",
                "instance_id": "i-43",
                "state": "provisioning",
                "source_instance_id": "i-42",
            }
        ],
        "ResumeRequest": [{**_allocating("ak-0004"), "snapshot_allocation_key": "ak-0002", "snapshot_id": "s-7"}],
        "ResumeResult": [
            {
                **_echo(),
                "allocation_key": "ak-0004",
                "instance_id": "i-44",
                "state": "provisioning",
                "snapshot_id": "s-7",
            }
        ],
    }


def wire_error() -> dict[str, Any]:
    return {
        "error": {
            "code": "SandboxNotFound",
            "message": "instance i-42 is gone",
            "retryable": False,
            "field": "instance_id",
        }
    }


def read_files_head() -> dict[str, Any]:
    """The first line of a ``readFiles`` response body: everything but the bytes, which follow it."""
    return {
        **instance_call(),
        "files": [{"path": "/workspace/README", "mode": 0o644, "digest": HELLO_SHA256, "size": len(HELLO)}],
        "missing": ["/workspace/out"],
    }


def client_frames() -> list[tuple[str, dict[str, Any]]]:
    """Text frames of ``openProcess`` a client sends, each with what it shows."""
    return [
        ("start: a new operation, granting 8 MiB of out and err credit", _start()),
        (
            "start: reattach after a dropped connection, resuming after 6 bytes of out, err already ended",
            {**_start(), "resume": {"out": 6, "err": 0, "ended": ["err"]}},
        ),
        ("stdin_end: no more stdin", {"type": "stdin_end"}),
        ("window: 65536 more bytes of credit (and as many consumed)", {"type": "window", "bytes": 65536}),
        ("kill: end the process and everything it started", {"type": "kill"}),
        (
            "resize: the terminal of a process started with tty is now 50 rows by 132 columns",
            {"type": "resize", "rows": 50, "cols": 132},
        ),
    ]


def server_frames() -> list[tuple[str, dict[str, Any]]]:
    """Text frames of ``openProcess`` a server sends, each with what it shows."""
    return [
        (
            "start: the process runs; 8 MiB of stdin credit, no stdin received yet",
            {
                "type": "start",
                "operation_id": "op-1",
                "started": {**instance_call(), "process_id": "p-1"},
                "window": 8 << 20,
                "stdin": 0,
            },
        ),
        ("out_end: stdout is over", {"type": "out_end"}),
        ("err_end: stderr is over", {"type": "err_end"}),
        ("exit: the process exited 0 (after out_end and err_end)", {"type": "exit", "exit_code": 0}),
        ("window: 4096 more bytes of stdin credit", {"type": "window", "bytes": 4096}),
        ("error: the conversation ends with a vocabulary error", {"type": "error", **wire_error()}),
    ]


def _start() -> dict[str, Any]:
    return {"type": "start", "operation_id": "op-1", "request": _process(), "window": 8 << 20}
