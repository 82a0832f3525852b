"""Coverage-guided fuzzing of one decoder with atheris (libFuzzer): ``python atheris_main.py TARGET [libFuzzer args]``.

checkfu is instrumented as it is imported, so libFuzzer sees which branches of the decoders an
input reaches. A target that raises anything but a vocabulary error is a crash: libFuzzer writes
the input to ``<artifact_prefix>crash-<sha1>`` and exits non-zero. ``test_fuzz_decoders`` runs
this for a bounded time per target and turns every crash it finds into a failure.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path

import atheris

DECODERS = [
    "checkfu.contract",
    "checkfu.wire.client",
    "checkfu.wire.files",
    "checkfu.wire.http",
    "checkfu.core.files",
    "checkfu.core.documents",
    "checkfu.core.registry",
    "checkfu.conformance.evidence",
    "checkfu.control.enrollment",
]
"""What is instrumented for coverage: the decoders and what they call, not the whole product."""

with atheris.instrument_imports(include=DECODERS):
    import fuzz_targets


NAMES = sorted(fuzz_targets.TARGETS)


def main() -> None:
    """``TARGET`` is one of ``fuzz_targets.TARGETS``, or ``all``: the first byte of an input picks the target
    (``NAMES[byte % len(NAMES)]``) and the rest is its input, so one process (one start-up) fuzzes them all.

    With ``CHECKFU_FUZZ_COUNTS=FILE``, the inputs run for each target are written there as JSON as it goes.
    """
    name = sys.argv[1]
    counts = dict.fromkeys(NAMES, 0)
    tally = os.environ.get("CHECKFU_FUZZ_COUNTS")

    def one(data: bytes) -> None:
        if name == "all":
            if not data:
                return
            chosen, data = NAMES[data[0] % len(NAMES)], data[1:]
        else:
            chosen = name
        counts[chosen] += 1
        if tally and sum(counts.values()) % 256 == 0:
            Path(tally).write_text(json.dumps(counts))
        fuzz_targets.check(fuzz_targets.TARGETS[chosen], data)

    # libFuzzer runs argv[0] through the shell for -merge and -fork: make it this interpreter, this script, this target.
    myself = f"{shlex.quote(sys.executable)} {shlex.quote(str(Path(__file__).resolve()))} {shlex.quote(name)}"
    atheris.Setup([myself, *sys.argv[2:]], one)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
