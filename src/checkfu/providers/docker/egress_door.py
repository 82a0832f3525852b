"""The door of an ``allowlist`` sandbox: the one way from its network namespace to its egress proxy.

This file stands alone, like ``egress_proxy.py``, and imports only what starts in
milliseconds (no ``asyncio``): the door runs on the path to a sandbox's first
command. The Docker provider runs its source (``python3 -I -S -c <source>
CONFIG``) in a container that joins the sandbox's network namespace, and no other
of its namespaces, once the sandbox runs.

The door refuses to open when the namespace has any interface but ``lo``.
Otherwise it binds ``127.0.0.1:PORT`` there, hands the listening socket to the
proxy through the Unix socket only the two of them mount (``SCM_RIGHTS``), waits
for the proxy's acknowledgement and exits 0. From then on the proxy, outside the
sandbox, accepts on that socket; the sandbox user can neither see nor signal it.

Exit status: 0 handed over; 3 the namespace holds more than ``lo``; 4 no proxy
answered on the Unix socket in time; 5 the proxy did not acknowledge.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

PORT = 3128
"""Where the door opens inside the sandbox: ``127.0.0.1:3128``."""


def run_door(config: dict[str, Any]) -> int:
    """Open ``127.0.0.1:PORT`` in this network namespace and hand it to the proxy at ``config["socket"]``."""
    interfaces = sorted(os.listdir("/sys/class/net")) if os.path.isdir("/sys/class/net") else ["?"]
    if interfaces != ["lo"]:
        print(f"refused: this namespace has {interfaces}, not only lo", flush=True)
        return 3
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", int(config.get("port", PORT))))
    listener.listen(1024)
    deadline = time.monotonic() + float(config.get("wait", 20))
    while True:
        control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            control.connect(str(config["socket"]))
            break
        except OSError as exc:
            control.close()
            if time.monotonic() > deadline:
                print(f"no proxy at {config['socket']}: {exc}", flush=True)
                return 4
            time.sleep(0.01)
    control.settimeout(10)
    socket.send_fds(control, [b"door"], [listener.fileno()])
    ack = control.recv(2)
    if ack != b"ok":
        print(f"the proxy did not take the door ({ack!r})", flush=True)
        return 5
    print(f"handed 127.0.0.1:{listener.getsockname()[1]} to the proxy", flush=True)
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: CONFIG_JSON", file=sys.stderr)
        return 2
    return run_door(json.loads(argv[1]))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
