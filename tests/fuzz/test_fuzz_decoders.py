"""Fuzzed decoders: every decoder of bytes from outside answers, or refuses in the vocabulary.

Nine targets (``fuzz_targets.TARGETS``): the envelope, the profile as JSON and as TOML, the answer
to each of the seventeen members (the readFiles body included), the raw HTTP answer on the socket,
the openProcess frames, the adapters file, the evidence file and the Statement inside it. Three
ways for each:

- the corpus (``corpus/<target>/``) and every crasher ever found (``crashers/<target>/``) are
  replayed, always;
- hypothesis: arbitrary bytes, the seeds mutated byte-wise, and nesting, numbers and text known to
  break parsers;
- atheris (libFuzzer, coverage-guided over checkfu's decoders) in a child process, from the corpus.
  By default every target runs in one process (an input's first byte picks its target) for
  ``FUZZ_SECONDS`` per target (``CHECKFU_FUZZ_SECONDS``, default 2); with ``CHECKFU_SLOW=1`` each
  target also runs in a process of its own for ``CHECKFU_FUZZ_SECONDS`` or 60 s.

A crash is an input that made a non-vocabulary exception escape: the test fails with it and the
traceback. Fix the decoder, then keep the input in ``crashers/<target>/`` as its regression test.
What a run finds goes to a temporary directory; ``CHECKFU_FUZZ_KEEP=1`` on a per-target run merges
it (minimized by libFuzzer's ``-merge``) into the corpus. Each atheris run prints its execution
counts (``-s`` shows them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_targets import TARGETS, check, seeds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

HERE = Path(__file__).parent
CORPUS = HERE / "corpus"
CRASHERS = HERE / "crashers"
NAMES = sorted(TARGETS)

FUZZ_SECONDS = int(os.environ.get("CHECKFU_FUZZ_SECONDS", "2"))
SLOW_SECONDS = int(os.environ.get("CHECKFU_FUZZ_SECONDS", "60"))

HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
FAST = settings(max_examples=150, deadline=None, suppress_health_check=HEALTH)
LONG = settings(max_examples=3000, deadline=None, suppress_health_check=HEALTH)


def _inputs(root: Path) -> list[tuple[str, Path]]:
    return [(d.name, p) for d in sorted(root.iterdir()) if d.is_dir() for p in sorted(d.iterdir())]


# the corpus and the crashers ----------------------------------------------------------------------


def test_every_target_has_a_corpus_and_the_seeds_are_in_it() -> None:
    for name, made in seeds().items():
        held = {p.read_bytes() for p in (CORPUS / name).iterdir()}
        assert made, name
        assert set(made) <= held, f"{name}: a seed is not in the corpus (CHECKFU_FUZZ_KEEP=1 rewrites it)"
    assert {d.name for d in CORPUS.iterdir()} == set(TARGETS)


@pytest.mark.parametrize(("name", "path"), _inputs(CRASHERS), ids=lambda v: v.name if isinstance(v, Path) else v)
def test_a_crasher_stays_fixed(name: str, path: Path) -> None:
    check(TARGETS[name], path.read_bytes())


@pytest.mark.parametrize("name", NAMES)
def test_the_corpus_decodes_or_is_refused(name: str) -> None:
    for path in sorted((CORPUS / name).iterdir()):
        check(TARGETS[name], path.read_bytes())


# hypothesis ---------------------------------------------------------------------------------------

SEEDS = seeds()

OPENERS = [b"[", b'{"a":', b"[[", b'{"type":', b"a = [", b"a = {b = ", b"[[adapters]]\na = ["]
breakers = st.one_of(
    st.builds(lambda o, n: o * n, st.sampled_from(OPENERS), st.integers(1, 20_000)),
    st.sampled_from(
        [
            b"1" * 5000,
            b"1e999999",
            b"-0",
            b"NaN",
            b"Infinity",
            b'"\\ud800"',
            b'{"a":1,"a":2}',
            b"\xff\xfe[\x00",
            b"\x00\x00\x00[",
            b"a = 1979-05-27T07:32:00Z",
            b"a = 0x_1",
            b"a = inf",
            b"\x01",
            b"\x02" * 9,
            b"\x00\xff",
        ]
    ),
)


@st.composite
def mutated(draw: st.DrawFn, name: str) -> bytes:
    """A seed of ``name`` with bytes flipped, cut, repeated or spliced in."""
    data = bytearray(draw(st.sampled_from(SEEDS[name])))
    for _ in range(draw(st.integers(1, 8))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.integers(0, 4))
        if how == 0 and at < len(data):
            data[at] = draw(st.integers(0, 255))
        elif how == 1:
            del data[at : at + draw(st.integers(1, 64))]
        elif how == 2:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif how == 3:
            data[at:at] = data[at : at + draw(st.integers(1, 64))] * draw(st.integers(2, 50))
        else:
            data[at:at] = draw(breakers)
    return bytes(data)


def prefixed(name: str, body: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    """Targets whose first bytes choose (a member and status, a side): keep those bytes arbitrary."""
    if name in ("results", "frames"):
        return st.builds(lambda head, rest: head + rest, st.binary(min_size=2, max_size=2), body)
    return body


def inputs(name: str) -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=4096),
        mutated(name),
        prefixed(name, breakers),
        prefixed(name, st.text().map(lambda t: t.encode("utf-8", "surrogatepass"))),
    )


@pytest.mark.parametrize("name", NAMES)
def test_hypothesis_finds_nothing_but_vocabulary_errors(name: str) -> None:
    @FAST
    @given(data=inputs(name))
    def run(data: bytes) -> None:
        check(TARGETS[name], data)

    run()


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_hypothesis_finds_nothing_but_vocabulary_errors_long(name: str) -> None:
    @LONG
    @given(data=inputs(name))
    def run(data: bytes) -> None:
        check(TARGETS[name], data)

    run()


# atheris ------------------------------------------------------------------------------------------


def atheris_run(name: str, seconds: int, tmp: Path, corpus: Path | None = None) -> dict[str, int]:
    """Fuzz ``name`` (a target, or ``all``) for ``seconds`` from ``corpus``; returns the inputs run, by target.

    Fails with the crashing input and its traceback when a non-vocabulary exception escaped.
    """
    found, artifacts, counts = tmp / "found", tmp / "artifacts", tmp / "counts.json"
    found.mkdir()
    artifacts.mkdir()
    argv = [
        sys.executable,
        str(HERE / "atheris_main.py"),
        name,
        f"-max_total_time={seconds}",
        "-timeout=20",
        "-rss_limit_mb=3072",
        "-max_len=16384",
        f"-artifact_prefix={artifacts}/",
        str(found),
        str(corpus or CORPUS / name),
    ]
    proc = subprocess.run(
        argv,
        check=False,
        cwd=HERE,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=seconds + 180,
        env={**os.environ, "CHECKFU_FUZZ_COUNTS": str(counts)},
    )
    crashes = sorted(artifacts.iterdir())
    if proc.returncode != 0 or crashes:
        shown = "\n".join(f"{p.name}: {p.read_bytes()[:400]!r}" for p in crashes)
        where = f"crashers/{name}/" if name != "all" else "crashers/<NAMES[first byte]>/ (without the first byte)"
        pytest.fail(
            f"atheris found a crash in {name} (exit {proc.returncode}); keep it in {where} once fixed\n"
            f"{shown}\n{proc.stderr[-6000:]}"
        )
    done = re.search(r"Done (\d+) runs in (\d+) second", proc.stderr)
    assert done, proc.stderr[-2000:]
    runs = int(done.group(1))
    by_target: dict[str, int] = json.loads(counts.read_text()) if counts.exists() else {}
    if name != "all":
        by_target = {name: runs}
    print(f"atheris {name}: {runs} runs in {done.group(2)} s, {len(list(found.iterdir()))} new corpus inputs")
    print(f"  by target (to the last 256): {by_target}")
    if os.environ.get("CHECKFU_FUZZ_KEEP") == "1" and name != "all":
        _keep(name, found)
    return by_target


def _keep(name: str, found: Path) -> None:
    """Merge what the run found into the corpus, minimized by libFuzzer's ``-merge``."""
    merged = found.parent / "merged"
    merged.mkdir()
    atheris_main = str(HERE / "atheris_main.py")
    argv = [sys.executable, atheris_main, name, "-merge=1", str(merged), str(CORPUS / name), str(found)]
    subprocess.run(argv, cwd=HERE, capture_output=True, check=True, timeout=600)
    target = CORPUS / name
    for path in target.iterdir():
        if not path.name.startswith("seed-"):
            path.unlink()
    for path in merged.iterdir():
        if not (target / path.name).exists() and path.read_bytes() not in {p.read_bytes() for p in target.iterdir()}:
            shutil.copy(path, target / path.name)


def test_atheris_finds_nothing_but_vocabulary_errors(tmp_path: Path) -> None:
    """Every target, in one process (one start-up), from every corpus: ``FUZZ_SECONDS`` per target in all."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i, name in enumerate(NAMES):
        for path in (CORPUS / name).iterdir():
            (corpus / f"{name}-{path.name}").write_bytes(bytes((i,)) + path.read_bytes())
    runs = atheris_run("all", FUZZ_SECONDS * len(NAMES), tmp_path, corpus)
    assert all(runs.get(name, 0) > 0 for name in NAMES), runs


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_atheris_finds_nothing_but_vocabulary_errors_long(name: str, tmp_path: Path) -> None:
    assert atheris_run(name, SLOW_SECONDS, tmp_path)[name] > 0
