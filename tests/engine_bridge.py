"""A bridge of its own for a test's private ``dockerd``.

A ``dockerd`` started with ``--bridge none`` deletes the host's ``docker0`` as it starts
(moby removes the default bridge interface whenever the bridge is disabled), so every
container of the shared engine that needs a bridge (an allowlist sandbox's egress proxy,
say) stops starting for every other test and runner on the machine. A private engine
therefore gets a bridge made here, named ``cfpd<hex>``, with an address in 198.18.0.0/15
(the range set aside for benchmarking, RFC 2544, never routed), and is started with
``--bridge`` naming it and ``--iptables=false --ip-masq=false``: it touches no interface,
rule or forwarding setting of the host's. The bridge is deleted with the engine.
"""

from __future__ import annotations

import ipaddress
import secrets
import subprocess


def _in_use() -> set[ipaddress.IPv4Network]:
    out = subprocess.run(["ip", "-4", "-o", "addr", "show"], capture_output=True, text=True, check=True).stdout
    return {ipaddress.ip_interface(line.split()[3]).network for line in out.splitlines() if len(line.split()) > 3}


def make_bridge() -> str:
    """Create and bring up a bridge of our own with a free /24 of 198.18.0.0/15; returns its name."""
    name = f"cfpd{secrets.token_hex(4)}"  # 12 characters: an interface name has at most 15
    used = _in_use()
    for third in range(2, 512):
        net = ipaddress.ip_network(f"198.{18 + third // 256}.{third % 256}.0/24")
        if not any(net.overlaps(other) for other in used):
            break
    else:
        raise RuntimeError("no free /24 in 198.18.0.0/15 for a private engine's bridge")
    subprocess.run(["ip", "link", "add", name, "type", "bridge"], check=True, capture_output=True)
    try:
        subprocess.run(["ip", "addr", "add", f"{net[1]}/24", "dev", name], check=True, capture_output=True)
        subprocess.run(["ip", "link", "set", name, "up"], check=True, capture_output=True)
    except BaseException:
        remove_bridge(name)
        raise
    return name


def remove_bridge(name: str) -> None:
    """Delete a bridge ``make_bridge`` made (never anything else: the name must be ours)."""
    assert name.startswith("cfpd"), name
    subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)
