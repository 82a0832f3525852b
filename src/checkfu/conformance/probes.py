"""What the cases run inside a sandbox, through ``exec`` (the one member every provider serves).

Each probe tries the forms a sandbox may understand, in order: a POSIX shell first,
then the bare commands a minimal sandbox has (``cat``, ``env``, ``ls``, ``write``,
``nc``). The network probes go out the way a program would: through the proxy the
standard variables name (``HTTPS_PROXY``, ``ALL_PROXY``, ``HTTP_PROXY``), unless
told to bypass it. A form that is not there answers exit 127 and the next is tried. A probe
that finds no form it can run says so: a case never passes for want of a tool.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from checkfu.contract.members import ExecResult
from checkfu.core.driver import Instance, RunSession

NOT_FOUND = (126, 127)
PROBE_TIMEOUT = 30.0

CONNECT = r"""
h="$1"; p="$2"; how="${3:-auto}"
# how: auto (the proxy variables, and no_proxy, as a program reads them), proxy (the advertised proxy even for a
# no_proxy host), direct (bypassing any proxy). The answer names the way taken: "connected via proxy" or
# "connected directly"; a refusal or failure is "blocked: ...", exit 1.
if command -v python3 >/dev/null 2>&1; then
  exec python3 -c '
import os, socket, struct, sys
h, p, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def advertised():
    if how == "direct":
        return None
    for n in ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "http_proxy", "HTTP_PROXY"):
        if os.environ.get(n):
            value = os.environ[n]
            break
    else:
        return None
    if how == "auto":
        for x in (os.environ.get("no_proxy") or os.environ.get("NO_PROXY") or "").split(","):
            x = x.strip().lstrip(".")
            if x == "*" or (x and (h == x or h.endswith("." + x))):
                return None
    scheme, sep, rest = value.partition("://")
    if not sep:
        scheme, rest = "http", value
    hostport = rest.split("/")[0].rsplit("@", 1)[-1]
    ph, _, pp = hostport.rpartition(":")
    return scheme.lower(), ph.strip("[]"), int(pp) if pp.isdigit() else (1080 if scheme.startswith("socks") else 80)
target = ("[%s]:%d" if ":" in h else "%s:%d") % (h, p)
try:
    proxy = advertised()
    if proxy is None:
        s = socket.create_connection((h, p), timeout=3)
        rest = b""
    elif proxy[0].startswith("socks5"):
        s = socket.create_connection(proxy[1:], timeout=3)
        s.sendall(b"\x05\x01\x00")
        if s.recv(2) != b"\x05\x00":
            print("blocked: the SOCKS proxy wants authentication"); sys.exit(1)
        s.sendall(b"\x05\x01\x00\x03" + bytes([len(h)]) + h.encode() + struct.pack(">H", p))
        reply = s.recv(10)
        if len(reply) < 2 or reply[1] != 0:
            print("blocked: the SOCKS proxy answered", reply[1:2].hex() or "nothing"); sys.exit(1)
        rest = b""
    else:
        s = socket.create_connection(proxy[1:], timeout=3)
        s.sendall(("CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n" % (target, target)).encode())
        head = b""
        while b"\r\n\r\n" not in head:
            more = s.recv(4096)
            if not more:
                break
            head += more
        status, _, rest = head.partition(b"\r\n\r\n")
        first = status.split(b"\r\n")[0]
        if first.split(b" ")[1:2] != [b"200"]:
            print("blocked: the proxy answered", first.decode("latin-1")[:120], rest.decode("latin-1")[:160].strip())
            sys.exit(1)
    s.settimeout(3)
    try:
        rest += s.recv(64)
    except OSError:
        pass
    s.close()
except OSError as e:
    print("blocked:", e); sys.exit(1)
print("connected", "via proxy" if proxy else "directly", rest[:40])
' "$h" "$p" "$how"
fi
proxy=""
if [ "$how" != direct ]; then
  proxy="${https_proxy:-${HTTPS_PROXY:-${all_proxy:-${ALL_PROXY:-${http_proxy:-${HTTP_PROXY:-}}}}}}"
  case "$proxy" in socks*) proxy="${http_proxy:-${HTTP_PROXY:-}}";; esac  # below, only an HTTP proxy is spoken
  if [ "$how" = auto ]; then
    for x in $(echo "${no_proxy:-${NO_PROXY:-}}" | tr , ' '); do
      x="${x#.}"; case "$h" in "$x"|*."$x") proxy="";; esac
    done
  fi
fi
case "$h" in *:*) t="[$h]:$p";; *) t="$h:$p";; esac
if [ -n "$proxy" ]; then
  hp="${proxy#*://}"; hp="${hp%%/*}"; hp="${hp##*@}"; ph="${hp%:*}"; pp="${hp##*:}"
  req="CONNECT $t HTTP/1.1\r\nHost: $t\r\n\r\n"
  if command -v nc >/dev/null 2>&1; then
    out=$(printf "$req" | nc -w 3 "$ph" "$pp" 2>&1)
  elif [ -n "$BASH_VERSION" ]; then
    out=$(exec 3<>"/dev/tcp/$ph/$pp" && printf "$req" >&3 && timeout 3 cat <&3)
  else
    exit 127
  fi
  first=$(echo "$out" | head -n 1 | tr -d '\r')
  last=$(echo "$out" | tail -n 1)
  case "$first" in "HTTP/1."?" 200"*) echo "connected via proxy: $last"; exit 0;; esac
  echo "blocked: the proxy answered ${first:-nothing}: $last"; exit 1
fi
if command -v nc >/dev/null 2>&1; then
  if nc -w 3 "$h" "$p" </dev/null >/dev/null 2>&1; then echo connected directly; exit 0; fi
  echo "blocked"; exit 1
fi
if [ -n "$BASH_VERSION" ]; then
  if (exec 3<>"/dev/tcp/$h/$p") 2>/dev/null; then echo connected directly; exit 0; fi
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


async def write_new(session: RunSession, inst: Instance, path: str, text: str) -> Ran:
    """Write ``text`` to ``path``, making the directories above it (a sandbox's own ``write`` makes them)."""
    return await first(
        session,
        inst,
        [
            ["sh", "-c", 'mkdir -p "$(dirname "$2")" && printf %s "$1" > "$2"', "sh", text, path],
            ["write", path, text],
        ],
    )


async def has_shell(session: RunSession, inst: Instance) -> bool:
    """Whether the sandbox runs ``sh -c``."""
    ran = await session.exec(inst, ["sh", "-c", "exit 0"], timeout=PROBE_TIMEOUT)
    return ran.exit_code == 0


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


Route = Literal["auto", "proxy", "direct"]
"""How a probe goes out: as a program would (the proxy variables and ``no_proxy``), through the advertised proxy
whatever ``no_proxy`` says, or straight to the address, bypassing any proxy."""


async def connect(session: RunSession, inst: Instance, host: str, port: int, route: Route = "auto") -> Ran:
    """Try a TCP connection from inside: exit 0 means the sandbox says it connected ("via proxy" or "directly").

    With ``auto``, the probe honours ``HTTPS_PROXY``, ``ALL_PROXY``, ``HTTP_PROXY`` (and their lowercase forms)
    and ``NO_PROXY`` as a program does: ``CONNECT`` through an HTTP proxy, SOCKS5 through a ``socks5`` one.
    """
    forms = [["sh", "-c", CONNECT, "sh", host, str(port), route]]
    if route != "proxy":  # a sandbox without a shell: its bare nc, which knows no proxy
        forms.append(["nc", host, str(port)])
    return await first(session, inst, forms)


DNS = r"""
name="$1"; server="$2"; port="$3"
if command -v python3 >/dev/null 2>&1; then
  exec python3 -c '
import os, socket, struct, sys
name, server, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
query = struct.pack(">HHHHHH", os.getpid() & 0xFFFF, 0x0100, 1, 0, 0, 0)
query += b"".join(bytes([len(label)]) + label.encode() for label in name.split(".")) + b"\0\0\1\0\1"
s = socket.socket(socket.AF_INET6 if ":" in server else socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(3)
try:
    s.sendto(query, (server, port))
    answer = s.recv(512)
except OSError as e:
    print("no answer:", e); sys.exit(1)
print("answered, rcode", answer[3] & 15)
' "$name" "$server" "$port"
fi
if command -v nslookup >/dev/null 2>&1; then
  out=$(nslookup -port="$port" -timeout=2 -retry=1 "$name" "$server" 2>&1)
  case "$out" in
    *"timed out"*|*"no servers"*|*"write to"*|*"unreachable"*|*"refused"*) echo "no answer: $out" | head -n 2; exit 1;;
  esac
  echo "answered: $out" | head -n 3; exit 0
fi
exit 127
"""


async def dns_query(session: RunSession, inst: Instance, name: str, server: str, port: int = 53) -> Ran:
    """Send one DNS question for ``name`` straight to ``server``: exit 0 means some answer came back."""
    return await first(session, inst, [["sh", "-c", DNS, "sh", name, server, str(port)]])
