"""Events of an open process, as a ``Provider`` yields them in-process.

The wire carries the same events as typed frames (``start``, ``stdin``,
``stdin_end``, ``out``, ``err``, ``out_end``, ``err_end``, ``exit`` and the
credit ``window``); see ``checkfu.wire.frames``.
"""

from __future__ import annotations

from typing import Literal

from checkfu.contract.model import Bytes, ExitCode, Model

Stream = Literal["out", "err"]


class ProcessOutput(Model):
    kind: Literal["output"] = "output"
    stream: Stream
    data: Bytes


class ProcessStreamEnd(Model):
    kind: Literal["stream_end"] = "stream_end"
    stream: Stream


class ProcessExit(Model):
    kind: Literal["exit"] = "exit"
    exit_code: ExitCode


ProcessEvent = ProcessOutput | ProcessStreamEnd | ProcessExit
