"""The provider author kit as written to disk, and its README: how a stranger builds a conforming
provider from the kit alone.

``export_kit(directory)`` writes the wire's schemas and vectors (``checkfu.wire.kit.build_kit``)
and the README. ``readme(files)`` writes that from the kit's own files and the code's constants,
so its tables (defaults, error codes and statuses, frame tags, the digest's worked example, the
conformance cases) cannot drift from what the runner does. The prose is the contract's; where it
names a limit or a rule, the constant it comes from is used. It lives here, above the wire, because
it states both the wire and the conformance cases.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from checkfu.conformance.cases import CASES, ECHO_FLOOR, ITEMS, NOT_EXERCISED, PATIENCE, declared_by
from checkfu.conformance.suite import CONFORMANCE_WINDOW, SUITE_VERSION
from checkfu.contract.codec import MAX_DOCUMENT_BYTES
from checkfu.contract.envelope import MEMBERS, SandboxProviderCapabilities
from checkfu.contract.errors import ERROR_CLASSES
from checkfu.contract.frames import DEFAULT_WINDOW, MAX_DATA, TAG_ERR, TAG_OUT, TAG_STDIN
from checkfu.contract.lifecycle import TRANSITIONS
from checkfu.contract.model import MAX_SAFE_INT
from checkfu.contract.mounts import MAX_FILE_BYTES, PATH_RULE
from checkfu.contract.paths import MAX_PATH_BYTES
from checkfu.core.job import TIMEOUT_EXIT
from checkfu.core.session import Limits
from checkfu.wire.client import DEADLINES
from checkfu.wire.credentials import OPERATION_SECRET
from checkfu.wire.errors import STATUS
from checkfu.wire.files import FILES_MEDIA_TYPE, MAX_HEAD_BYTES, REQUEST_HEADER
from checkfu.wire.kit import (
    BEYOND_SCHEMA,
    FRAME_MESSAGES,
    JSON_RULES,
    KIT_VERSION,
    build_kit,
    clause_fields,
    largest_request_header,
    message_types,
    object_codes,
)
from checkfu.wire.limits import RequestLimits
from checkfu.wire.operations import OPERATION_TTL
from checkfu.wire.server import MAX_WRITE_BYTES, STDIN_WINDOW

DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The search path the in-tree providers use when a request's ``env`` has no ``PATH`` (their own constants:
``providers.docker.process.DEFAULT_PATH``, ``providers.host_process.spawning.BASE_PATH``; a test holds them equal)."""

BEYOND_SCHEMA_TEXT: dict[str, str] = {
    "minimum-not-above-maximum": (
        "In `SandboxProviderCapabilities`, for each dimension in the order `cpu_millis`, `memory_mib`, "
        "`disk_mib`, `pids`: if `minimum_resources.D` is greater than `maximum_resources.D`, refuse with "
        "`SandboxEnvelopeInvalid`, field `minimum_resources.D` (the first such dimension). Equal is fine. "
        "JSON Schema cannot compare two values of one document."
    ),
    "path-staged-once": (
        "In a `MountPlan` (alone, or at `mounts.K` of a provision, clone or resume request), walk `files` in "
        "order, remembering each file's path and every directory above it (each proper prefix that ends "
        "before a `/`). A file whose path is an earlier file's path, or a directory above an earlier file, is "
        "refused with `SandboxPathRejected`, field `files.I.path`. After the walk, a path that is both a file "
        "and a directory above a later file is refused with `SandboxPathRejected`, field `files`. "
        "(`uniqueItems` compares whole file objects, so it cannot see two files with one path.)"
    ),
    "mount-targets-apart": (
        "In a provision, clone or resume request, for each pair of mounts `I < J` (I outer, J inner, in order), "
        "if one target is the other or below it (`a == b` or `a` starts with `b + '/'`), refuse with "
        "`SandboxPathRejected`, field `mounts.J.target`, for the first such pair."
    ),
    "profile-digest": (
        "In a materialize, provision, clone or resume request, `profile_digest` must equal the digest of "
        "`profile` as the section *The profile digest* below computes it (defaults filled in); otherwise "
        "refuse with `SandboxDigestMismatch`, field `profile_digest`. Check it after the profile itself decodes."
    ),
    "path-utf8-bytes": (
        f"Every sandbox path (a path, a `cwd`, a mount target, a mount file's path) is at most {MAX_PATH_BYTES} "
        f"bytes once encoded as UTF-8. The schema's `maxLength: {MAX_PATH_BYTES}` counts characters, so it "
        "admits a path of up to four times as many bytes; count the bytes and refuse a longer path with "
        "`SandboxPathRejected`, field the path's. (A byte count is a weighted sum over characters, which no "
        "practical pattern expresses.)"
    ),
    "integers-written-as-integers": (
        'Where the schema says `"type": "integer"`, the JSON number must be written as an integer: digits '
        "with an optional leading `-`, no fraction and no exponent. `8.0`, `8e0` and `8E+0` are refused as a value "
        "of the wrong type at that place, with the code Step 2 gives one there: the code of the innermost object "
        "containing the value that owns a code, else the message's own (so `profile.resource_limits.memory_mib: "
        "256.0` in a `MaterializeRequest` is `SandboxProfileInvalid`, `lease.lease_epoch: 1.0` is the request's "
        "`SandboxProtocolViolation`), and the field's path. JSON Schema 2020-12 "
        "counts `8.0` as an integer, and a validator working on parsed values cannot tell `8.0` from `8` (in "
        "JavaScript they are the same value), so check the number as written, in your JSON parser."
    ),
    "timestamp-real-date": (
        "A timestamp (`expires_at` of a `SnapshotResult`) that matches the schema's pattern must also name a "
        "real date: the pattern lets every month have 31 days and every February a 29th. Parse it as an RFC 3339 "
        "date and time in UTC and refuse one that is not a real date with the code of the message that owns "
        "the field (`SandboxResultInvalid`), field `expires_at`."
    ),
}

JSON_RULES_TEXT: dict[str, str] = {
    "not-json": "the body is exactly one JSON value, in UTF-8",
    "nan": "`NaN`, `Infinity` and `-Infinity` are not JSON and are refused",
    "duplicate-key": "a key written twice in one object, at any depth, is refused, even with the same value",
    "lone-surrogate": "a `\\uD800`-`\\uDFFF` escape that is not half of a pair is refused",
}


def _code(value: Any) -> str:
    return f"`{json.dumps(value, ensure_ascii=False)}`"


MEANINGS: dict[tuple[str, str], str] = {
    ("ReadFilesHead", "missing"): "asked-for paths with no file there",
    ("ResumePoint", "ended"): "the output streams whose end the client has received",
    ("StartFrame", "resume"): "where a reattaching client resumes; null or omitted for a new operation",
}
"""Meanings for optional fields whose models carry no description of their own."""


def _defaults(files: dict[str, Any]) -> list[str]:
    """One row per optional field of every message and every object inside one."""
    rows: dict[tuple[str, str], str] = {}
    for path, doc in sorted(files.items()):
        if not path.startswith("schemas/"):
            continue
        objects = [doc, *doc.get("$defs", {}).values()]
        for obj in objects:
            title = obj.get("title")
            props = obj.get("properties")
            if not title or not isinstance(props, dict):
                continue
            required = set(obj.get("required", []))
            for name, prop in props.items():
                if name in required:
                    continue
                default = _code(prop["default"]) if "default" in prop else "see *meaning*"
                meaning = prop.get("description") or MEANINGS.get((title, name), "")
                if not meaning and "$ref" in prop:
                    meaning = f"a `{prop['$ref'].rsplit('/', 1)[1]}` object"
                rows[(title, name)] = f"| `{title}` | `{name}` | {default} | {meaning} |"
    return [rows[k] for k in sorted(rows)]


def _message_codes() -> list[str]:
    """Each message's own code: what a fault reports when no object inside the message owns one."""
    by_code: dict[str, list[str]] = {}
    for name, model in message_types().items():
        by_code.setdefault(model.decode_error.code, []).append(name)
    by_code.setdefault("SandboxProtocolViolation", []).extend(FRAME_MESSAGES)
    return [f"| `{code}` | {', '.join(f'`{n}`' for n in sorted(names))} |" for code, names in sorted(by_code.items())]


def _object_codes(files: dict[str, Any]) -> list[str]:
    """Each object that owns a code inside another message, and the messages it sits in."""
    homes: dict[str, list[str]] = {}
    for name, entry in files["index.json"]["messages"].items():
        if name in FRAME_MESSAGES:
            continue
        for title in files[entry["schema"]].get("$defs", {}):
            homes.setdefault(title, []).append(name)
    return [
        f"| `{title}` | `{code}` | {', '.join(f'`{n}`' for n in sorted(homes.get(title, [])))} |"
        for title, code in object_codes().items()
    ]


def _envelope_rules(files: dict[str, Any]) -> list[str]:
    """The envelope's nine rules: those in its schema by their ``$comment``, and the others."""
    stated = {
        int(r["$comment"].split(":")[0].removeprefix("rule ")): (
            r["$comment"].split(": ", 1)[1].rsplit("; field: ", 1)[0],
            clause_fields(r),
            next(iter(r["if"].get("properties", {}))),
        )
        for r in files["schemas/SandboxProviderCapabilities.schema.json"]["allOf"]
    }
    others = {
        4: "`minimum_resources` <= `maximum_resources` on every dimension, all positive: positivity in the "
        "schema, the comparison beyond it (`minimum-not-above-maximum`)",
        5: "`max_mounts` is a non-negative integer (more than 64 is accepted; 64 is the effective ceiling): "
        "in the schema",
        9: "`platforms`: `os` is `linux`, `architecture` `amd64` or `arm64`: in the schema",
    }
    assert set(stated) | set(others) == set(range(1, 10)), stated
    out = []
    for n in range(1, 10):
        if n not in stated:
            out.append(f"{n}. {others[n]}")
            continue
        text, (field,), if_side = stated[n]
        on_if_side = field == if_side or field.startswith(if_side + ".")
        side = " (the `if` side's field, not the one its `then` constrains)" if on_if_side else ""
        out.append(f"{n}. {text}: an `if`/`then` clause of the schema; refused with field `{field}`{side}")
    return out


def _statuses() -> list[str]:
    return [f"| `{code}` | {status} |" for code, status in sorted(STATUS.items(), key=lambda kv: (kv[1], kv[0]))]


def _states() -> list[str]:
    """Each instance member: the states it is allowed in and the state it leaves, from the lifecycle table."""
    rows = []
    for member in MEMBERS:
        allowed = {state: after for state, moves in TRANSITIONS.items() for m, after in moves.items() if m == member}
        if not allowed:
            continue
        moves = ", ".join(f"`{before}` -> `{after}`" for before, after in allowed.items())
        rows.append(f"| `{member}` | {moves} |")
    return rows


def _members_section() -> str:
    """What a provider does with each request: the contract's sections 5 to 7 and what the runner checks."""
    retryable = " and ".join(f"`{c}`" for c, cls in sorted(ERROR_CLASSES.items()) if cls.default_retryable)
    output_cap = Limits().max_output_bytes
    header = largest_request_header()
    limits = RequestLimits()
    return f"""
## What each member must do

The schemas say what a message may hold; this says what a provider does with one, from the
contract (its sections 5 to 7) and from what the runner checks on every answer. Where the
runner leaves a choice to the provider, it says so.

### Every call

- **The execution target.** Every request but `describe` names `target`. Compare it with
  your envelope's `provider`, `provider_revision`, `materialization_revision` and
  `placement`: a request naming another target is refused with `SandboxIdentityMismatch`,
  field `target` (what the in-tree providers answer; naming the first part that differs,
  `target.provider_revision` say, is as good).
- **Echoes.** Every result echoes the request's `target` and `lease` and, where it has them,
  the `allocation_key` and `instance_id` it acts on. The runner compares each with its own
  record: another target, key or instance is `SandboxIdentityMismatch`, another lease or an
  older epoch `SandboxLeaseFenced`, and a new instance's id (from `provision`, `clone`,
  `resume`) must differ from every id it already holds.
- **Leases.** Echo the lease you were sent. The runner fences itself (a runner whose lease
  was taken over stops at its next call); a provider may also refuse a request whose
  `lease_epoch` is below one it has seen for the same `lease_id` (`SandboxLeaseFenced`),
  and nothing requires it to.
- **State.** An instance moves only as this table (the runner's) says; a member called in
  any other state is `SandboxStateConflict`. An instance that does not exist, or not under
  the request's `allocation_key`, is `SandboxNotFound`. A member your envelope does not
  declare is `SandboxOperationUnsupported` (the runner never calls one).

| member | allowed: state before -> after |
| --- | --- |
{chr(10).join(_states())}

### Member by member

- **`describe`**: your envelope, the same on every call of one revision.
- **`materialize`**: turn the profile into an image: answer the image, the `profile_digest`
  and your envelope's `materialization_revision` (the runner checks both), `built` true only
  when this call built it. Idempotent per profile digest. A profile, platform or mount count
  your envelope cannot serve is `SandboxCapabilityUnavailable`.
- **`provision`** (and `clone`, `resume`): a new instance in `provisioning` under the
  request's `allocation_key`. Label everything you create with the allocation key and the
  `runner_tag` before you answer: the runner journals the key before it asks, and after any
  fault (an error, a timeout, an answer that fails a check) it reclaims the key with
  `compensate`, trusting nothing you said about it.
- **`writeFile`**: stage the bytes at `path`, with `mode`, during `provisioning` only. The
  runner writes exactly the files of the request's mount plans: each planned file once, at
  its mount's `target` + `/` + the file's `path`, with the plan's `mode`, all of them before
  it calls `activate`. `size` is the number of bytes and `digest` their `sha256:` (even
  when the plan gave the file a `git:` blob id). The runner never sends a path outside every
  mount target (it refuses one itself, `SandboxPathRejected`, before any call); refuse a
  path that is not below a mount target with `SandboxPathRejected`, field `path`, as the
  in-tree providers do. Bytes that do not have the stated size or digest are
  `SandboxDigestMismatch` (field `size` or `digest`). Whether you also refuse a path of no
  planned file, or hold `activate` until every planned file arrived, is your choice: the
  runner never gives you cause.
- **`activate`**: make the staged files real at their targets (sealed, if your envelope
  claims `mounts_sealed`) and start the instance: `active`.
- **`exec`**: run `argv` (no shell unless `argv` names one) with `env` as its environment,
  in `cwd` (null or omitted: a directory of your choosing; the in-tree providers take `/`,
  the sandbox user's home, or the instance's work directory), with `stdin`'s bytes and then
  end of file, to completion (when `env` has no `PATH`, or `cwd` is not a directory: *(g)*
  under *What the contract leaves open, answered*):
  - `exit_code` is the process's exit status. A process killed by signal N exits
    **128 + N**, as a shell reports it (what the in-tree providers answer; a negative code
    is legal JSON, but no convention the runner shows users). A program that cannot be
    found is 127, one that cannot be executed 126, with the reason on stderr.
  - At `timeout_ms`, end the process and everything it started, and answer
    `timed_out: true`, with `exit_code` **{TIMEOUT_EXIT}** (as `timeout(1)` does, and the
    memory provider) or the status the kill left (128 + 9 = 137). The runner reports a
    timed-out command as exit {TIMEOUT_EXIT} whatever `exit_code` says.
  - `max_output_bytes` caps **each** stream separately: keep the first `max_output_bytes`
    bytes of stdout and of stderr, drop the rest, and set `stdout_truncated` or
    `stderr_truncated`. The runner refuses a stream longer than it asked for
    (`SandboxBoundExceeded`). By default it asks for at most {output_cap >> 20} MiB per
    stream, so a result stays within the {MAX_DOCUMENT_BYTES >> 20} MiB document limit
    (base64 adds a third).
- **`inspect`**: the instance's current state. After `release` it is `released` (or the
  instance is gone: `SandboxNotFound`); the runner refuses any other state than its own
  record.
- **`release`**: end every process and release the instance: `released`. `destroyed` must
  be true when your envelope claims `release_destroys` or the profile's retention is
  `ephemeral_zdr` (the runner refuses `false` then: `SandboxResultInvalid`, field
  `destroyed`). If you claim `release_idempotent`, a second release answers the same
  identity.
- **`compensate`**: reclaim everything labelled with the request's `allocation_key` and
  `runner_tag` (instances, processes, snapshots, half-made ones, whatever you remember of
  them or not), trusting nothing you answered earlier; idempotent: a key with nothing left
  answers `reclaimed: 0`. It may come in any state, after a crash of either side.
- **`snapshot`** (only where `snapshots` is true): freeze the instance's files under the
  request's `snapshot_allocation_key`. With `keep_seconds`, answer `expires_at`: an RFC 3339
  instant in UTC with `Z`, at most `keep_seconds` from when you read the request and after
  the moment you answer. The runner refuses (`SandboxResultInvalid`, field `expires_at`) an
  expiry already past, one later than asked (30 s of slack for clocks), and a null one when a
  lifetime was asked; without `keep_seconds` you may still state your own retention, or null
  for kept until `deleteSnapshot`. With `snapshot_custody: provider` the bytes are yours and
  so is deleting them once `expires_at` passes (the runner asks nothing then, and later
  compensates a key you still list); with `runner` custody the runner calls `deleteSnapshot`
  once it passes, and you may delete it yourself first (answer `deleted: false` then).
- **`listDir`** (only where `list_dir` is true): what is at `path` (`kind`: `dir`, `file`,
  `symlink`, `other`, or `missing` for nothing; a final symlink is never followed) and, for a
  directory, its entries (all below it with `recursive`), each with its `kind`, `size` and
  `mode`, at most `max_entries` of them, `truncated` true when there were more. Nothing
  there, a file, a link: each is an answer, not an error. The runner refuses an entry
  outside `path` (`SandboxPathRejected`) and more than `max_entries` (`SandboxBoundExceeded`).
- **`readFiles`** (only where `operations` has it): each asked path exactly once, as a file
  (`path`, `mode`, `digest`, the bytes) or in `missing`; for directories and `max_bytes`:
  *(h)* below.
- **`openProcess`** (only where `operations` has it): start `argv` as `exec` would, and
  stream: *openProcess* above, and *(c)* to *(f)* below.
- **`listAllocations`** (only where `operations` has it): everything you hold labelled with
  the request's `runner_tag`, each with its `allocation_key`, `kind` and `object_id`. With
  `enumerates_allocations` you promise the list is complete: conformance checks that a live
  instance is on it and a reclaimed one is not.

### Errors, and what the runner makes of them

- **Any error you answer is your fault, to the runner.** Whatever the code, the runner
  reports `SandboxProviderFailed` naming the code you sent, and, for a call on an
  allocation (`provision`, `clone`, `resume`, `snapshot`, and every call naming an
  instance), compensates that allocation key. Refuse only what is wrong; never use an
  error to mean "nothing to do". (A timeout is the runner's `SandboxProviderTimeout`; an
  answer that fails its checks keeps the code of the check.)
- **`retryable`**: send each code's default unless you know better. By default only
  {retryable} are retryable; a retryable error that would be `500`
  is sent as `503`. The runner records `retryable`; it does not retry a call on its
  strength.

### Sizes

- The {MAX_DOCUMENT_BYTES >> 20} MiB document limit applies to JSON bodies (requests, results,
  error bodies) and to the JSON in the `{REQUEST_HEADER}` header. It does **not** apply to
  `writeFile`'s raw body: the runner's own service reads at most `size` + 1 bytes of it
  (`size` bounded there at {MAX_WRITE_BYTES >> 40} TiB), refusing a longer body with
  `SandboxProtocolViolation`, field `body`, and hands what it read to the provider, which
  refuses any length but `size` with `SandboxDigestMismatch`, field `size`. A mount file is
  at most {MAX_FILE_BYTES >> 30} GiB: stream the body rather than hold it.
- The longest `{REQUEST_HEADER}` header the runner can send is {header} bytes (every field
  at its longest, a path of 4095 control characters escaped as `\\u00XX`). Accept at least
  32 KiB of header. The runner's own service refuses a head (the request line and every
  header line) over {limits.head_bytes >> 10} KiB or with over {limits.header_lines} header lines with `431`, one not
  complete {limits.head_seconds:g} s after its first byte with `408` (both `SandboxProtocolViolation`, field
  `headers`, before the credential is looked at), and closes a connection whose body pauses
  for {limits.idle_seconds:g} s: bound yours too, for a client needs no credential to send a head.
- **`Content-Type`**: the runner always sends `application/json` (for `describe`, the body
  `{{}}`) and, for `writeFile`, `application/octet-stream`. The runner's own service does
  not read `Content-Type`: it decodes each body as its member says, whatever the header.
  Refusing another type (`400`, `SandboxProtocolViolation`, field `Content-Type`) is as
  conformant: the runner never sends one.

### The credential

The secret you run `checkfu provider test`, `verify` and `enroll` with is a bootstrap.
Enrollment **issues a new credential** (a file of mode 0600 under the runner's state
directory, `credentials/`), and from then on the runner presents only that one (`checkfu run
--provider URL`). Give it to your service, for example by restarting it with it (the
runner's own service reads `--credential-file` or `CHECKFU_PROVIDER_CREDENTIAL`); accepting
the bootstrap as well, for a while, is up to you.

### The plane route

This version of the contract carries **no plane route**: no message names an address, a
proxy or a socket through which a sandbox reaches the model gateway. A provider at network
`none` offers none (loopback only) and is conformant: conformance case 5 checks that nothing
inside reaches an address the runner can reach, and a sandbox with no route passes it. A
future version that adds a route will say how it is offered.
"""


# The envelope digest, conformance, and the questions a stranger asked ---------------------------------------------


def _envelope_defaults() -> list[str]:
    """Every optional field of the envelope and its default, from the model."""
    out = []
    for name, info in SandboxProviderCapabilities.model_fields.items():
        if info.is_required():
            continue
        if name == "lifecycle_assurances":
            out.append(
                "`lifecycle_assurances`: an object with all five keys, each `false`, except `release_destroys`, "
                "`true` beside `ephemeral_zdr` (rule 7), whether the object or only that key is left out"
            )
            continue
        out.append(
            f"`{name}`: {_code(SandboxProviderCapabilities.model_fields[name].get_default(call_default_factory=True))}"
        )
    return out


def _envelope_digest_section(files: dict[str, Any]) -> str:
    example = files["envelope-digest-example.json"]
    written = json.dumps(example["envelope_as_written"], indent=2)
    defaults = "\n".join(f"  - {d}" for d in _envelope_defaults())
    return f"""
## The envelope digest

Conformance evidence and enrollment are bound to one envelope by its digest: the evidence's
subject digest (the hex alone) and its predicate's `envelope_digest` (with `sha256:`), and the
digest an enrollment records. A new revision, or any change to the envelope, needs new evidence.
It is computed as the profile digest is, over the envelope:

`envelope_digest` is `sha256:` and the lowercase hex SHA-256 of the RFC 8785 (JCS) canonical JSON
of the **decoded** envelope, the value of `envelope` in your `describe` answer (not the
`{{"envelope": ...}}` around it, not your body's spacing or key order):

- every optional field present, at its default when you left it out:
{defaults}
- every array in the order you wrote it: the decoder refuses duplicates but sorts nothing, so
  `["none", "allowlist"]` and `["allowlist", "none"]` are two envelopes with two digests (keep
  the order stable from one revision to the next);
- integers as plain digits, booleans as `true`/`false`, object keys sorted by their UTF-16 code
  units, no whitespace, strings in their shortest JSON escapes (as for the profile);
- as the runner decodes what it is served: the runner's own service (`checkfu provider serve`)
  restates a `runner_enforced` axis as `provider_attested` before it answers, so the digest is of
  the envelope as served (and a third party may claim no `runner_enforced` axis anyway).

`envelope-digest-example.json` works one envelope through, the seed's day-one tier with every
optional field left out. As written:

```json
{written}
```

canonical bytes (UTF-8, exactly these, no trailing newline):

```
{example["canonical"]}
```

digest:

```
{example["digest"]}
```
"""


def _exercised_by() -> list[str]:
    """One row per optional member and lifecycle assurance: the case that exercises it, or why none can."""
    how = {
        "openProcess": "stdin past every credit window echoed whole, exit after all output; a failing status as "
        "exec's; kill; over the wire, a dropped connection reattached",
        "readFiles": "a file's bytes; a directory and nothing missing; over `max_bytes` refused",
        "listDir": "entries with kind and size; `max_entries` truncates; a file; nothing",
        "listAllocations": "answers for the runner tag",
        "snapshot": "resumed with its files (6); an expiry within `keep_seconds` (8)",
        "deleteSnapshot": "a deleted snapshot cannot be resumed",
        "clone": "a new identity, writes kept apart",
        "resume": "a snapshot's files (6); a deleted, foreign or ephemeral one refused (8)",
        "release_destroys": "release answers destroyed; inspect says released or gone (4); an ephemeral_zdr "
        "instance's snapshots die with it (8)",
        "release_idempotent": "a second release, the same identity",
        "reaps_process_tree": "a process tree left running at release ends (needs `openProcess` to watch it)",
        "enumerates_allocations": "the live instance listed, reclaimed ones not",
    }
    rows = []
    for item in ITEMS:
        cases = [str(c.number) for c in CASES if item in c.items]
        if item in NOT_EXERCISED:
            rows.append(f"| `{item}` | `{declared_by(item)}` | none | not exercised: {NOT_EXERCISED[item]} |")
        else:
            rows.append(f"| `{item}` | `{declared_by(item)}` | {', '.join(cases)} | {how[item]} |")
    return rows


def _conformance_section() -> str:
    blocks = []
    for case in CASES:
        runs = "always" if case.requires == "-" else f"when the envelope declares {case.requires}, else skipped"
        checks = "\n".join(f"| {c.does} | {c.when} |" for c in case.checks)
        blocks.append(
            f"""### Case {case.number}: {case.name}

Runs {runs}.

| check | turned on by |
| --- | --- |
{checks}
"""
        )
    cases = "\n".join(blocks)
    items = "\n".join(_exercised_by())
    return f"""
## Conformance: the nine cases

`checkfu provider test URL` runs them ({SUITE_VERSION}); `checkfu provider verify URL --key KEY`
runs them and signs the report as evidence; enrollment takes evidence of this suite version
with no failed case. Every case drives your service through the runner's own door, so it is held
to every check a Run makes (decoding, echoes, leases, paths, bounds, deadlines), and then to the
case's own checks below.

What runs is decided by your envelope. A case whose requirement you do not declare is skipped,
naming the field. Inside a case that runs, a check of an optional member or lifecycle assurance
runs only where you declare it, and an undeclared member is never called. A declared one that
fails fails its case, and the reason starts with it and the field that declared it:
`openProcess (declared by operations): openProcess: the provider raised
SandboxOperationUnsupported: ...`. Case 2 tries each declared member even after another failed
(on a new instance when a failure cost the first: the runner reclaims an instance after any
error), so every broken one is named. Each case records the declared members and assurances it
exercised and saw hold (`exercised`) or fail (`faulted`); the evidence signs both, and the grade
card shows them.

{cases}
### Each optional member and assurance, and the case that exercises it

| declared | by | case | what is checked |
| --- | --- | --- | --- |
{items}

### How the suite drives you

- Over a URL it grants {CONFORMANCE_WINDOW >> 10} KiB of output credit per open process (the
  runner grants {DEFAULT_WINDOW >> 20} MiB): an echo of {ECHO_FLOOR >> 20} MiB and more outruns
  it, so you must wait for its grants; it sends more stdin than your first grant, so it must
  wait for yours.
- It waits {PATIENCE:g} s for what must end (a timed-out command, a killed process, the processes
  of a released instance) before it says it did not.
- Inside the sandbox it runs `echo`, `cat`, `env`, `ls` and `sleep`, and `sh -c` where there is
  one (writing files with `mkdir -p` and `printf`; without a shell, a `write PATH TEXT`
  command); a check that finds no way to probe fails, saying so: a case never passes for want of
  a tool.
"""


FEATURES: tuple[tuple[str, str, str], ...] = (
    ("`checkfu run` output as it comes", "`openProcess`", "`exec`: the output arrives at the end"),
    ("`checkfu run -i` (stdin streamed)", "`openProcess`", "refused at selection: `SandboxCapabilityUnavailable`"),
    ("`checkfu run -t` (a terminal)", "`openProcess` and `terminal`", "refused at selection"),
    ("`checkfu exec ID -- CMD` streamed, `-i`", "`openProcess`", "`exec`: `-i` reads all of stdin first"),
    ("`checkfu run --capture PATH` of a file", "`readFiles`", "the capture fails after the command"),
    ("`--capture` of a directory", "`listDir` and `readFiles`", "read as one file: it comes back missing"),
    ("`checkfu cp ID:PATH LOCAL`", "`listDir` and `readFiles`", "refused"),
    ("`checkfu cp LOCAL ID:PATH`", "`listDir`, and `exec` of a POSIX `sh`", "refused"),
    ("SDK `files.write`", "`exec` of a POSIX `sh`", "the write fails"),
    ("SDK `files.read` / `files.list`", "`readFiles` / `listDir`", "refused"),
    ("SDK `run(..., on_stdout=...)` / `spawn`", "`openProcess`", "`run` hands output over at the end / refused"),
    ("a durable profile (`retention_mode: durable`)", "`durable` retention and `snapshots`", "refused at selection"),
    ("`checkfu snapshot`, `resume`, `clone`", "`snapshots`", "refused"),
    ("`--mount SRC:TARGET:rw`", "`writable_mounts`", "refused at selection"),
    ("a mount holding a symlink", "`mount_symlinks`", "refused at selection"),
    (
        "the orphan sweep of `checkfu runner reconcile`",
        "`listAllocations` and `enumerates_allocations`",
        "only what the journal recorded is reclaimed",
    ),
)
"""Runner features, what each needs the envelope to declare, and what happens without it (answer (k))."""


def _answers_section() -> str:
    limits = Limits()
    features = "\n".join(f"| {feature} | {needs} | {without} |" for feature, needs, without in FEATURES)
    return f"""
## What the contract leaves open, answered

Each answer is what the runner and its own service do; the tests hold the two to these words.

### (a) A fault inside a nullable field

A field that may be `null` (`cwd`, `tty`, `keep_seconds`, `expires_at`, a start frame's
`resume`) is an `anyOf` of its value and `null` in the schema. `null` always passes. Any other
value is judged as if the field were not nullable, and its fault is named by the plain dotted
path, never by a branch of the `anyOf`: `tty.rows` for `"tty": {{"rows": 0, "cols": 80}}`,
`cwd` for a relative `cwd` (the path rule: `SandboxPathRejected`) and for `"cwd": 5` (the
message's own code), `keep_seconds` for `0`. The code follows Step 2 as for any field. A validator
that reports an error for each branch of the `anyOf` (Ajv does) must report the non-null
branch's. Inside an `openProcess` frame the same fault is `request.tty.rows`,
`SandboxProtocolViolation`.

### (b) Integers written as integers: the code

`8.0`, `8e0` and `8E+0` where an integer is due are a value of the wrong type at that place, with
the code Step 2 gives such a value there: the innermost object around it that owns a code, else
the message's own. `profile.resource_limits.memory_mib: 256.0` in a `MaterializeRequest` is
`SandboxProfileInvalid` (`422`); `lease.lease_epoch: 1.0` is the request's
`SandboxProtocolViolation` (`400`). The field is the value's path. (Earlier kits said "the code of
the message that owns the field", which is wrong for a field inside a profile.)

### (c) What the {DEADLINES["openProcess"]:g} s `openProcess` deadline bounds

One connection's start: from opening it (TCP, TLS, the WebSocket upgrade) to your `start` (or
`error`) answering the client's `start`, which you send once the provider started the process.
Each reattach gets it again (connect, `start`, your `start`, the stdin resent), and the runner
holds its whole call to open the process, every attempt included, to the same bound. It does
**not** bound the process:
it may run and stream for as long as it likes (the runner ends a command at its own timeout with
a `kill` frame), and it does not bound the gap between frames. The runner's client sends a
WebSocket ping every 20 s and takes a connection with no pong for 20 s as dropped (it reattaches):
answer pings, as WebSocket libraries do.

### (d) The close code after an `error` frame

`1000`. The side that sends `error` then closes with 1000 (normal closure): the frame, not the
code, says what went wrong, and nothing comes after it. The runner's service does so for every
refusal (no credential, a bad first frame, an unknown operation). The runner's client, once it
has an `error`, stops reading and may drop the connection with no close frame: wait for none, and
read nothing into the code. After `exit`, the client closes with 1000, and the server forgets the
operation; a connection that ends any other way leaves it for a reattach
({OPERATION_TTL:g} s).

### (e) Reattaching to an unknown operation

A `start` with `resume` for an `operation_id` you do not hold (never seen, forgotten after a
restart or its {OPERATION_TTL:g} s, or started by a client that sent another
`{OPERATION_SECRET}`) is answered with an `error` frame, `SandboxNotFound`, field
`operation_id`, then close 1000. Never start a process for a `start` that carries `resume`. The
runner's client then ends the process's events with that error (the runner reports
`SandboxProviderFailed` naming `SandboxNotFound` and reclaims the instance); it never makes up an
exit.

### (f) Stdin credit on reattach

Credit belongs to a connection: none carries over. Your `start` on a reattach carries `stdin`,
the stdin bytes you have received for the operation over every connection, and `window`, a fresh
grant: the runner's service grants {STDIN_WINDOW} bytes less the stdin it holds and has not yet
written to the process (at least 1). The client sends again only what it sent past `stdin`, then
`stdin_end` if it had sent it and `kill` if it had asked for one, all within the fresh grant and
before anything new; a byte below `stdin` is never sent twice. Output likewise: the client's
reattach `start.window` is a fresh grant for out and err, and you send again everything after its
`resume` point.

### (g) A missing `cwd` or `PATH`

- `cwd` null or omitted: a directory of your choosing (Docker: the sandbox user's home; host
  process: the instance's work directory; memory: `/`).
- `cwd` that is not a directory in the sandbox: answer as a program that cannot be started,
  exit 126 with the reason in the output (the Docker tier), or refuse the call with
  `SandboxPathRejected`, field `cwd` (the host-process tier). Both are in contract; the first
  keeps the sandbox, for the runner reclaims an instance after any error (the memory test
  provider answers 127).
- `env` with no `PATH`: look `argv[0]` up (when it has no `/`) in
  `{DEFAULT_PATH}`, as the in-tree providers do. The runner
  sends exactly the user's `-e` variables, usually none, and conformance runs `echo`, `cat`
  and `sh` with no `env` at all. The in-tree providers also put a `PATH` (the image's own, or
  that one) and a `HOME` in the process's environment (Docker a `HOSTNAME` too): plain
  variables like these may be added; a credential never (case 3 looks for one).

### (h) `readFiles` for directories and over `max_bytes`

A path with no regular file there (a directory, a symlink, which is never followed, a device,
nothing at all) is answered in `missing`, not as an error and not as a file. Files that together
hold more than `max_bytes` are refused whole: `SandboxBoundExceeded`, field `max_bytes`
(`413`); never a part of a file, never some of the files. The runner asks for at most
{limits.max_read_bytes >> 20} MiB per call; its capture reads sizes with `listDir` first (where declared) and
batches within that bound, because a refusal, like any error, costs the instance.

### (i) The HTTP method of `/v1/openProcess`

`GET`, with the WebSocket upgrade (`Connection: Upgrade`, `Upgrade: websocket`). After the
credential (`401` first, as everywhere): any other method is `405` with `Allow: GET` and
`SandboxProtocolViolation`, field `method`; a `GET` without the upgrade is `400`, the same code
and field. Every other member takes `POST` only (`405`, `Allow: POST`). A service that does not
serve `openProcess` may answer the upgrade `501` `SandboxOperationUnsupported` with the error
body: the runner's client raises that error at once instead of retrying.

### (j) What "enumeration" means

In the seed's tier table, *enumeration* is `list_dir`: enumerating a mounted tree with `listDir`.
The durable tier needs it; the grade card names it "enumeration (list_dir)" when it is missing.
It is not `listAllocations`, which enumerates what you hold for a runner tag (with the assurance
`enumerates_allocations` that the list is complete): that serves orphan reconciliation, and no
tier requires it.

### (k) Which runner features need which members

A feature refused at selection is refused before anything is allocated
(`SandboxCapabilityUnavailable`, naming the field: `stdin`, `tty`, `mounts`,
`profile.retention_mode`); one refused later is refused by the runner before it calls you
(`SandboxOperationUnsupported`, naming the member): it never calls what you do not declare.

| feature | needs | without it |
| --- | --- | --- |
{features}
"""


def readme(files: dict[str, Any]) -> str:
    """The README of the kit whose files are ``files`` (as ``build_kit`` returns them)."""
    assert set(BEYOND_SCHEMA_TEXT) == set(BEYOND_SCHEMA)
    assert set(JSON_RULES_TEXT) == set(JSON_RULES)
    example = files["digest-example.json"]
    written = json.dumps(example["profile_as_written"], indent=2)
    decoded = json.dumps(example["profile_decoded"], indent=2)
    beyond = "\n".join(
        f"{i}. **`{name}`**: {BEYOND_SCHEMA[name]}.\n   {BEYOND_SCHEMA_TEXT[name]}"
        for i, name in enumerate(BEYOND_SCHEMA, 1)
    )
    json_rules = "\n".join(f"- **`{name}`**: {JSON_RULES_TEXT[name]}." for name in JSON_RULES)
    deadlines = ", ".join(f"`{m}` {s:g} s" for m, s in DEADLINES.items())
    envelope_rules = "\n".join(_envelope_rules(files))
    return f"""# checkfu provider author kit ({KIT_VERSION})

Everything a provider written in any language needs, without Python: the JSON Schema of
every wire message, golden vectors (valid and invalid, each invalid one with the error code
and field a conforming decoder reports), the rules no schema can express, the profile
digest worked byte by byte, and the wire form (HTTP for the members, a WebSocket for
`openProcess`). The schemas and vectors are generated from the models the runner decodes
with; the project's tests run every vector through its decoders and through Ajv, a JSON
Schema validator of another language, so the kit and the code cannot disagree.

## How to use it

1. Read `index.json`. `members` maps each of the seventeen lifecycle members to its request
   and result message. `messages` lists every message: its schema, the member and role it
   belongs to, its `code` (the code a decode failure of that message reports, unless an
   object inside it owns one: `object_codes`; see *Step 2*), and its vectors. `ClientFrame`
   and `ServerFrame` are the `openProcess` text frames each side sends (`frame_types` names
   the schema of each frame type; `frame_schemas` lists them). `beyond_schema` and
   `json_rules` name the rules of the two sections below; `digest_example` and
   `envelope_digest_example` name the worked examples of the profile and envelope digests;
   `openapi` names the OpenAPI document of the service.
2. Decode every message in three steps, in this order: the **JSON text rules**, then the
   **schema**, then the **rules beyond the schema**. Then fill in every **default** (the
   table below): that is the decoded value.
3. Run the vectors (below) against your decoder until all pass: each valid document
   decodes, each invalid one is refused with exactly `expect.code` and `expect.field`.
4. Compute profile digests as *The profile digest* says, and check yours against
   `digest-example.json` and every valid vector that carries a `profile_digest`; compute
   your envelope's digest (what evidence and enrollment bind to) as *The envelope digest*
   says, and check it against `envelope-digest-example.json`.
5. Serve the members as *The HTTP wire form* says, and `openProcess` (if your envelope
   declares it) as *openProcess* says, doing what *What each member must do* says.
   Advertise an envelope that decodes under these rules, and declare only what you serve:
   conformance exercises every optional member and lifecycle assurance you declare
   (*Conformance: the nine cases*), and the grade card shows which held.

## Files

- `schemas/NAME.schema.json`: JSON Schema, draft 2020-12 (`$schema` says so; `$id` is
  `urn:checkfu:{KIT_VERSION}:NAME`). Every `$ref` is local; nothing needs fetching. Each
  schema states every field constraint and every cross-field rule JSON Schema can express
  (as `allOf` of `if`/`then` clauses, each with a `$comment` naming the rule and, after
  `; field: `, the field a refusal names). Every sandbox path's `pattern` sits beside a
  `$comment` beginning `{PATH_RULE}:`.
- `vectors/NAME/valid-N.json`: `{{"message", "valid": true, "description", "document"}}`: a
  document your decoder must accept.
- `vectors/NAME/invalid-SLUG.json`: `{{"message", "valid": false, "description", "expect":
  {{"code", "field"}}, "refused_by", ...}}` and either `document` (a JSON value) or
  `document_text` (the exact text, for what a JSON value cannot carry: a duplicate key, `NaN`,
  `8.0`, an unpaired surrogate). Each has exactly one fault. `refused_by` says which step
  refuses it:
  - `"json"`: a JSON text rule, named in `json_rule`;
  - `"schema"`: the schema alone;
  - `"rule"`: a rule beyond the schema, named in `beyond_schema` (the schema accepts the
    document: only that rule refuses it).
- `digest-example.json`: one profile as written, as decoded, its canonical bytes and digest.
- `envelope-digest-example.json`: the same for one envelope (`envelope_as_written`,
  `envelope_decoded`, `canonical`, `digest`).
- `openapi.json`: the OpenAPI 3.1 document the runner's own service serves at
  `GET /openapi.json` (every member's path, request, result and error responses). The
  schemas above, not this document, are what a decoder is held to.

`expect.field` is the dotted path of the value at fault from the top of the message: object
keys by name, array items by index (`platforms.0.os`, `mounts.1.target`, `env.NOT-A-NAME`);
a missing or unknown field is named by its own name. When the document as a whole is at
fault (a JSON text rule, or not an object), a message names `null`, but an `openProcess`
text frame names `frame` for a JSON text rule and `type` for a frame that is not an object
(*Frames* in Step 2 says the whole rule). Report the first fault you find; every vector has
only one.

## Step 1: the JSON text rules

Every message (and every `openProcess` text frame) is I-JSON (RFC 7493), at most
{MAX_DOCUMENT_BYTES} bytes ({MAX_DOCUMENT_BYTES >> 20} MiB). A message that breaks one of
these is refused with the message's own code (`code` in `index.json`), field `null`; a text
frame, with `SandboxProtocolViolation`, field `frame`:

{json_rules}

Integers are within +/-(2^53 - 1) = +/-{MAX_SAFE_INT} (the schemas say so with `minimum` and
`maximum`) and are written as integers (a rule beyond the schema, below). Bytes travel as
standard, padded base64 (RFC 4648 section 4; the schemas' `pattern` says exactly which
strings are base64).

## Step 2: the schema

Validate with any draft 2020-12 validator. Two things to know about validators:

- Patterns are ECMA-262 regular expressions, as JSON Schema specifies: `$` is the end of the
  string. Python's `re.search` (which some Python validators use) lets `$` match before a
  final newline, so `"acme\\n"` would pass `^[a-z0-9][a-z0-9._-]{{0,254}}$` there; use
  `\\Z` or `fullmatch`, or a validator that follows ECMA-262. The vector
  `SandboxProviderCapabilities/invalid-provider-trailing-newline` catches this.
- `uniqueItems` compares items by value, objects included (`platforms` holds objects).

A document the schema refuses is refused with one code and the path of the field at fault.
In a message (frames below), the code is, in this order:

1. `SandboxPathRejected` when the value at fault is a sandbox path that breaks the **path
   rule** (absolute, normalized, no `.` or `..` or empty segment, no NUL; at most
   {MAX_PATH_BYTES} characters by `maxLength` and {MAX_PATH_BYTES} bytes of UTF-8 by
   `path-utf8-bytes`). Each schema marks every such value with a `$comment` that begins
   `{PATH_RULE}:` beside its `pattern` and `maxLength`; a path over `maxLength` in
   characters is refused as the path rule (`SandboxPathRejected`, vectors
   `WriteFileRequest/invalid-path-over-4096-characters` and
   `MountPlan/invalid-path-over-4096-characters`), exactly as one over {MAX_PATH_BYTES}
   bytes is. A path that is not a string at all is the containing object's code, as
   below. (Other patterns are marked the same way, for the reader: `base64 rule:`,
   `destination rule:`, `pin rule:`. They have no code of their own.)
2. Otherwise, the code of the innermost object **containing** the value at fault (the value
   itself does not count) that owns a code: `object_codes` in `index.json`, this table. A bad
   field inside the profile of a provision request is `SandboxProfileInvalid`; the profile
   missing from the request, or not an object, is the request's own code:

| object | code | sits in |
| --- | --- | --- |
{chr(10).join(_object_codes(files))}

3. Otherwise, the message's own code (`code` in `index.json`):

| code | messages |
| --- | --- |
{chr(10).join(_message_codes())}

A cross-field rule written as an `if`/`then` clause is refused with the code of the object
the clause is on (`SandboxEnvelopeInvalid` for the envelope's, `SandboxProfileInvalid` for
`NetworkPolicy`'s, `SandboxResultInvalid` for `ListDirResult`'s) and the field its
`$comment` names after `; field: `, relative to that object (several fields,
comma-separated, are in the order to check them: name the first one broken). That is not
always the field a validator reports: for the envelope's rules 2, 3, 6 and 8 it is the
field of the `if` side (see the list below).

### Frames

An `openProcess` text frame is judged as a frame, whatever sits inside it: every fault is
`SandboxProtocolViolation`, never another code. A bad `started.process_id` in a server
`start` is `SandboxProtocolViolation`, not the `SandboxResultInvalid` of a `ProcessStarted`
result (vector `ServerFrame/invalid-started-without-process-id`), and a `request.cwd` that
breaks the path rule in a client `start` is `SandboxProtocolViolation`, not
`SandboxPathRejected`. The field, as the runner's frame parser names it:

- `frame`: the text breaks a JSON text rule (not JSON, `NaN`, a duplicate key, an unpaired
  surrogate escape), or a fault has no path inside the frame;
- `type`: the frame is not a JSON object, has no `type`, or its `type` is not a string, not
  a frame type, or a type only the other side sends;
- otherwise the dotted path inside the frame, as for a message (`bytes`, `request.argv`,
  `started.process_id`; `x` for an unknown field `x`).

A binary frame that is empty or has an unknown tag is field `frame`; one with a tag only the
other side sends names the stream (`stdin`, `out`, `err`).

## Step 3: the rules beyond the schema

Exactly these rules cannot be expressed in JSON Schema; a conforming decoder applies each
after the schema passes. Every vector with `"refused_by": "rule"` names one of them in
`beyond_schema`:

{beyond}

Every other rule the runner applies is in the schemas.

### The capability envelope's cross-field rules

The nine rules of the envelope (`SandboxProviderCapabilities`), and where each is stated:

{envelope_rules}

## Step 4: defaults

A field left out decodes to its default, and the decoded value holds it (so it is in the
canonical form and the digest). Silence is never a capability claim: each optional field of
the envelope defaults to its weakest value. One default is conditional:
`lifecycle_assurances.release_destroys` is **true** when the envelope's `retention_modes`
include `ephemeral_zdr` (that retention means release always destroys) and **false**
otherwise, whether the whole `lifecycle_assurances` object or only that key is left out; an
explicit `false` beside `ephemeral_zdr` is a contradiction and is refused. Every optional
field of every message and every object inside one:

| object | field | default | meaning |
| --- | --- | --- | --- |
{chr(10).join(_defaults(files))}

The envelope's optional fields, in words: `snapshot_custody` (`runner`: snapshot bytes die
with the runner host, or `provider`), `egress_certification` (your egress grade;
`unsupported` unless your envelope includes `allowlist`: an `allowlist` with the grade left
out is an uncertified allowlist, which is legal and graded as such), `list_dir` (whether you
serve `listDir`), `operations` (which of `openProcess`, `readFiles`, `listAllocations` you
serve), `lifecycle_assurances` (five promises about reclamation: `release_destroys`,
`release_idempotent`, `reaps_process_tree`, `cold_compensation`, `enumerates_allocations`)
and `user_namespace` (whether each sandbox runs in a user namespace of its own, so uid 0
inside is not uid 0 on the host).

## The profile digest

`profile_digest` is `sha256:` and the lowercase hex SHA-256 of the RFC 8785 (JCS) canonical
JSON of the **decoded** profile: the profile with **every default filled in**, including an
empty `packages` map and an empty `network_policy.allowlist`. Two spellings of one profile
(keys in another order, a default written out or left out) therefore share a digest. A
manager listed with an empty list stays in `packages` as written (`{{"apt": []}}` is not
`{{}}`). In the canonical form, object keys are sorted by their UTF-16 code units, there is
no whitespace, strings use the shortest JSON escapes, and integers are plain digits.

The example in `digest-example.json`, as written:

```json
{written}
```

decoded, every default filled in:

```json
{decoded}
```

canonical bytes (UTF-8, exactly these, no trailing newline):

```
{example["canonical"]}
```

digest:

```
{example["digest"]}
```

Taking the digest of the profile as written (without `packages` and `allowlist`) gives
another digest; the vector `ProvisionRequest/invalid-profile-digest-of-the-profile-as-written`
is refused for exactly that.

## The HTTP wire form

One HTTP service per provider, at a base URL the runner is given (`http://host:port` or
`https://...`).

- **Members**: `POST <base>/v1/<member>` for each of the seventeen members except
  `openProcess`, with `Content-Type: application/json` and the member's request message as the
  body (`describe`: an empty body or `{{}}`). Success is `200` with `Content-Type:
  application/json` and the member's result message.
- **Credential**: every `/v1` request, the `openProcess` upgrade included, carries
  `Authorization: Bearer <credential>`, the credential issued at enrollment (1 to 4096
  printable characters, no spaces; it replaces the one you were tested with: see *The
  credential* below). Compare it in constant time. A request without an accepted credential
  is answered `401` with `SandboxUnauthenticated`, field `authorization`, before anything
  else is looked at.
- **writeFile** carries raw bytes: the body is the file's bytes (`Content-Type:
  application/octet-stream`), exactly `size` of them, and the `WriteFileRequest` travels as
  one line of ASCII JSON (non-ASCII and control characters escaped as `\\uXXXX`) in the
  `{REQUEST_HEADER}` header. A missing header is `SandboxProtocolViolation`, field
  `{REQUEST_HEADER}`; a header that does not decode is refused as a `WriteFileRequest`
  document is; bytes that do not have the stated size or SHA-256 are
  `SandboxDigestMismatch`. The result is JSON as usual. How large the header and the body
  may be: *Sizes* below.
- **readFiles** answers `200` with `Content-Type: {FILES_MEDIA_TYPE}`: one line of JSON, a
  `ReadFilesHead` (schema `schemas/ReadFilesHead.schema.json`: the result without the bytes,
  each file with `path`, `mode`, `digest` and `size`), then `\\n`, then each file's bytes in
  the head's order, exactly `size` of each, and nothing after. The runner refuses a head
  line over {MAX_HEAD_BYTES >> 20} MiB or one whose sizes add up to more than the request's
  `max_bytes` (`SandboxResultInvalid`, field `files`), a body cut short or running on
  (`SandboxProtocolViolation`, field `files`), and a file whose bytes do not have its digest.
- **Errors**: any status but `200` carries the error body `{{"error": {{"code", "message",
  "retryable", "field"?}}}}` (schema `schemas/WireError.schema.json`; `field` is left out when
  there is none) with `Content-Type: application/json`. The receiver rebuilds the error from
  `code` (an unknown code is `SandboxProviderFailed`), never from the status; a non-`200`
  answer without this body is `SandboxProtocolViolation`. Statuses, by code (a retryable
  error that would be `500` is sent as `503`):

| code | status |
| --- | --- |
{chr(10).join(_statuses())}

  A path under `/v1` that names no member is `501` `SandboxOperationUnsupported` (field
  `path`); a method other than `POST` is `405` with `Allow: POST` and
  `SandboxProtocolViolation` (field `method`), except at `/v1/openProcess`, which is a
  WebSocket: there any method but `GET` is `405` with `Allow: GET`, and a `GET` without the
  upgrade `400` (*(i)* under *What the contract leaves open, answered*); a JSON body over
  {MAX_DOCUMENT_BYTES >> 20} MiB is `SandboxProtocolViolation` (field `body`). A member your
  envelope does not declare answers `SandboxOperationUnsupported`.
- **Deadlines**: the runner bounds each call ({deadlines}; `exec` adds its request's
  `timeout_ms`); a call past its deadline is `SandboxProviderTimeout`.
- **OpenAPI**: the runner's own service answers `GET <base>/openapi.json` with the OpenAPI
  3.1 document of the service (`openapi.json` in this kit), **without** a credential: it
  is outside `/v1` and says nothing about any sandbox. The runner never asks for it;
  serving it is optional, and a provider that serves it may serve this kit's file as it is.

## openProcess

`GET <base>/v1/openProcess` upgraded to a WebSocket (`ws://` or `wss://`), with the
`Authorization` header. One WebSocket message is one frame.

An operation belongs to the client that started it. The runner makes a secret for each
operation and sends it as the `{OPERATION_SECRET}` header (22 to 128 base64url characters) on
every connection of that operation, the first `start` and every reattach. Bind the operation
to the secret of the connection that started it, compare in constant time, and answer a
`start` for a known `operation_id` that comes with another secret, or none, exactly as you
answer a reattach to an id you never saw: `SandboxNotFound`, field `operation_id`. Holding the
credential and learning an id must not let another client read, write or kill the process. A
malformed secret is `SandboxProtocolViolation` naming the header. An operation started
without the header (a client older than it) belongs to nobody: no connection may reattach to it.

### Text frames

JSON objects with a `type`; `schemas/ClientFrame.schema.json` and
`schemas/ServerFrame.schema.json` are the frames each side may send (exactly one frame
schema matches a valid frame).

- client: `start` (the client-chosen `operation_id`, the `OpenProcessRequest`, `window`: the
  first credit for out and err together, and `resume` when reattaching), `stdin_end`,
  `window`, `kill`, `resize` (`rows`, `cols`: a new window for a process started with `tty`);
- server: `start` (the `ProcessStarted` result, `window`: the first stdin credit, `stdin`:
  how many stdin bytes it has received for this operation), `out_end`, `err_end`, `exit`
  (`exit_code`), `window`, `error` (a vocabulary error, as in the HTTP error body; it ends the
  conversation).

A frame of an unknown type, a type the sender may not send, or with a bad field is refused
with `SandboxProtocolViolation` naming the field (`type` for the type; *Frames* in Step 2
says which field exactly); the receiver sends an `error` frame and closes.

### Binary data frames

The bytes of stdin, stdout and stderr travel as binary messages: one tag byte, then the
bytes (the payload, possibly empty):

| tag | stream | sent by |
| --- | --- | --- |
| `0x{TAG_STDIN:02x}` | stdin | client |
| `0x{TAG_OUT:02x}` | out (stdout) | server |
| `0x{TAG_ERR:02x}` | err (stderr) | server |

An empty binary message or an unknown tag is `SandboxProtocolViolation` (field `frame`); a
tag the sender may not send is `SandboxProtocolViolation` naming the stream. A payload over
{MAX_DATA} bytes ({MAX_DATA >> 20} MiB) is `SandboxBoundExceeded` (field `data`). There are no
`stdin`, `out` or `err` text frames.

### Order

The client's first frame is `start`; the server answers `start` (or `error`). Nothing comes
before `start` or after `exit` or `error`; there is one `start` per connection. No data after
its stream's end (`stdin_end`, `out_end`, `err_end`), no end twice, and `exit` only after both
`out_end` and `err_end`. Any breach is `SandboxProtocolViolation`. `kill` asks the server to
end the process and everything it started; the ends and `exit` follow as usual. After
`exit` the client closes the WebSocket with code 1000.

A request with `tty` (`{{"rows", "cols"}}`, only where the envelope declares `terminal`) gives
the process a pseudo-terminal as stdin, stdout and stderr: everything it writes is `out`,
`err` ends at once, `stdin_end` is the terminal's end-of-file character (`^D`), and `resize`
changes the window (the process gets `SIGWINCH`). A `resize` for a process without `tty` is
ignored.

### Credit and windows

Data flows within credit, separately in each direction, counted in payload bytes (the tag
byte does not count):

- the server may send out and err data (together) up to the credit the client granted: first
  the client's `start.window`, then each client `window` frame adds its `bytes`;
- the client may send stdin data up to the server's `start.window` plus each server `window`.

Each data frame spends its payload size. A frame over the remaining credit is
`SandboxProtocolViolation` (field `window`): a sender splits data to fit and waits for a
grant. A grant also acknowledges: the receiver grants as it consumes what arrived, so a
`window` of `n` says that `n` more bytes were consumed. The runner's clients grant
{DEFAULT_WINDOW} bytes ({DEFAULT_WINDOW >> 20} MiB) at start.

### Reattaching

An operation outlives its connection. If the connection drops before `exit`, the client
opens a new one and sends `start` with the same `operation_id` and request and `resume`
(`ResumePoint`: `out` and `err`, the bytes of each it has received, and `ended`, the streams
whose end it has received). The server attaches to the running process (a `start` never
starts a process twice; one naming a known `operation_id` with another request is
`SandboxProtocolViolation`, field `operation_id`), sends again everything after the resume
point, and answers `start` with `stdin`: the stdin bytes it holds, so the client resends only
the rest (and `stdin_end` if it had sent it). The server keeps an operation whose client went
away without closing for {OPERATION_TTL:g} s, and forgets it once the client closes normally
after `exit`.
{_members_section()}{_envelope_digest_section(files)}{_conformance_section()}{_answers_section()}"""


def export_kit(directory: Path) -> int:
    """Write the kit under ``directory``; returns the number of files written."""
    files = build_kit()
    for rel, value in files.items():
        target = directory / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")
    (directory / "README.md").write_text(readme(files), encoding="utf-8")
    return len(files) + 1
