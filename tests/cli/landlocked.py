"""A command run under Landlock: a confinement the kernel shows nowhere in ``/proc``, owned by the tests.

Usage: ``python landlocked.py DIR... -- ARGV...`` restricts this process so that it may write or make regular files
only beneath each DIR (and ``/dev``), then executes ARGV. Run as root it sets no ``no_new_privs`` (root may restrict
itself without it), so Landlock is the one thing its context differs in. Exits 3 when the kernel has no Landlock.
"""

from __future__ import annotations

import ctypes
import os
import struct
import sys

CREATE_RULESET, ADD_RULE, RESTRICT_SELF = 444, 445, 446  # the same number on every architecture
WRITE_FILE, MAKE_REG = 1 << 1, 1 << 8
PATH_BENEATH = 1


def restrict(allowed: list[str]) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    handled = WRITE_FILE | MAKE_REG
    attr = ctypes.create_string_buffer(struct.pack("QQQ", handled, 0, 0))
    ruleset = libc.syscall(CREATE_RULESET, attr, 24, 0)
    if ruleset < 0:
        sys.exit(3)
    for path in [*allowed, "/dev"]:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        rule = ctypes.create_string_buffer(struct.pack("=Qi", handled, fd))  # struct landlock_path_beneath_attr
        if libc.syscall(ADD_RULE, ruleset, PATH_BENEATH, rule, 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule {path}")
        os.close(fd)
    if libc.syscall(RESTRICT_SELF, ruleset, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self")


if __name__ == "__main__":
    split = sys.argv.index("--")
    restrict(sys.argv[1:split])
    argv = sys.argv[split + 1 :]
    os.execv(argv[0], argv)
