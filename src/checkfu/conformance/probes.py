"""What the cases run inside a sandbox, through ``exec`` (the one member every provider serves).

Each probe tries the forms a sandbox may understand, in order: a POSIX shell first,
then the bare commands a minimal sandbox has (``cat``, ``env``, ``ls``, ``write``,
``nc``). A form that is not there answers exit 127 and the next is tried. A probe
that finds no form it can run says so: a case never passes for want of a tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from checkfu.contract.members import ExecResult
from checkfu.runner.driver import Instance, RunSession

NOT_FOUND = (126, 127)
PROBE_TIMEOUT = 30.0

CONNECT = r"""
h="$1"; p="$2"
if command -v python3 >/dev/null 2>&1; then
  exec python3 -c 'import socket,sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
except OSError as e:
    print("blocked:", e); sys.exit(1)
print("connected")' "$h" "$p"
fi
if command -v nc >/dev/null 2>&1; then
  if nc -w 3 "$h" "$p" </dev/null >/dev/null 2>&1; then echo connected; exit 0; fi
  echo "blocked"; exit 1
fi
if [ -n "$BASH_VERSION" ]; then
  if (exec 3<>"/dev/tcp/$h/$p") 2>/dev/null; then echo connected; exit 0; fi
  echo "blocked"; exit 1
fi
exit 127
"""


class NoProbe(Exception):
    """No form of a probe could run in this sandbox."""


@dataclass(frozen=True)
class Ran:
    argv: tuple[str, ...]
    result: ExecResult

    @property
    def code(self) -> int:
        return self.result.exit_code

    @property
    def out(self) -> bytes:
        return self.result.stdout

    def __str__(self) -> str:
        err = self.result.stderr.decode("utf-8", "replace").strip()[:200]
        return f"{' '.join(self.argv)[:80]} -> exit {self.code}" + (f" ({err})" if err else "")


async def first(
    session: RunSession, inst: Instance, forms: Sequence[Sequence[str]], *, env: dict[str, str] | None = None
) -> Ran:
    """Run the first form the sandbox has.

    Raises:
        NoProbe: every form answered 'not found'.
    """
    tried: list[str] = []
    for form in forms:
        res = await session.exec(inst, list(form), env=env, timeout=PROBE_TIMEOUT)
        ran = Ran(tuple(form), res)
        if res.exit_code not in NOT_FOUND:
            return ran
        tried.append(str(ran))
    raise NoProbe("; ".join(tried))


async def read_file(session: RunSession, inst: Instance, path: str) -> bytes | None:
    ran = await first(session, inst, [["cat", path]])
    return ran.out if ran.code == 0 else None


async def write_file(session: RunSession, inst: Instance, path: str, text: str) -> Ran:
    return await first(
        session,
        inst,
        [["sh", "-c", 'printf %s "$1" > "$2"', "sh", text, path], ["write", path, text]],
    )


async def writable_dir(session: RunSession, inst: Instance) -> str:
    """A directory the sandbox user may write in: its home, else /tmp."""
    try:
        ran = await first(
            session,
            inst,
            [
                [
                    "sh",
                    "-c",
                    'for d in "$HOME" /tmp; do if [ -d "$d" ] && [ -w "$d" ]; then echo "$d"; exit 0; fi; done; exit 1',
                ]
            ],
        )
    except NoProbe:
        return "/tmp"  # a sandbox with no shell: its own write command decides
    found = ran.out.decode("utf-8", "replace").strip()
    return found if ran.code == 0 and found.startswith("/") else "/tmp"


async def environment(session: RunSession, inst: Instance) -> str:
    ran = await first(session, inst, [["env"]])
    return ran.out.decode("utf-8", "replace")


async def listing(session: RunSession, inst: Instance, path: str) -> str | None:
    ran = await first(session, inst, [["ls", "-a", path], ["ls", path]])
    return ran.out.decode("utf-8", "replace") if ran.code == 0 else None


async def connect(session: RunSession, inst: Instance, host: str, port: int) -> Ran:
    """Try a TCP connection from inside: exit 0 means the sandbox says it connected."""
    return await first(session, inst, [["sh", "-c", CONNECT, "sh", host, str(port)], ["nc", host, str(port)]])
