"""A command run under a seccomp filter that allows every system call, owned by the tests.

Usage: ``python seccomped.py -- ARGV...`` sets ``no_new_privs`` and adds one filter that allows everything to this
process, then executes ARGV. Two processes run so have the same seccomp mode and number of filters, which is all
``/proc`` shows of them, and different filters. Exits 3 when the kernel refuses the filter.
"""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW = 0x06, 0x7FFF0000  # BPF_RET | BPF_K, SECCOMP_RET_ALLOW


class SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]


class SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]


def allow_all() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    program = (SockFilter * 1)(SockFilter(RET_ALLOW[0], 0, 0, RET_ALLOW[1]))
    fprog = SockFprog(1, program)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        sys.exit(3)
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        sys.exit(3)


if __name__ == "__main__":
    argv = sys.argv[sys.argv.index("--") + 1 :]
    allow_all()
    os.execv(argv[0], argv)
