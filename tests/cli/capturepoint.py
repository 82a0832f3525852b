"""``checkfu``, held while a Docker sandbox is paused for a capture (a snapshot's or a clone's): a fault-injection
point owned by the tests. The shipped CLI has no such hook: this wraps docker-py's ``APIClient.pause``.

Usage: ``python capturepoint.py ARGS...`` runs ``checkfu ARGS...``; once the engine has paused a container, the
thread that paused it says ``capturepoint paused CONTAINER`` on stderr and waits until the file named by
``CAPTUREPOINT_RESUME_FILE`` exists (or two minutes pass), then goes on. The test signals the process meanwhile,
and sees the sandbox paused from outside (``docker inspect``).
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from docker.api.client import APIClient

from checkfu.cli import main


def hold_after_pause() -> None:
    original = APIClient.pause
    resume = os.environ.get("CAPTUREPOINT_RESUME_FILE", "")

    def pause(self: APIClient, container: Any) -> None:
        original(self, container)
        print(f"capturepoint paused {container}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (resume and os.path.exists(resume)):
            time.sleep(0.02)

    APIClient.pause = pause  # type: ignore[method-assign]


if __name__ == "__main__":
    hold_after_pause()
    sys.argv = ["checkfu", *sys.argv[1:]]
    main()
