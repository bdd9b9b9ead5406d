"""Namespaces, the management bridge and the ``thunderbolt0`` veth pair.

Management traffic (SSH, the gateway reaching the replicas) crosses a bridge in
the machine's own namespace; the workstations' TP traffic crosses only the
veth pair named ``thunderbolt0``, so a driver reload never cuts the operator's
session, as on a real site where management has its own network.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from lab.topology import (
    BRIDGE,
    BRIDGE_ADDRESS,
    HOSTS,
    IPTABLES_CHAINS,
    LINK_INTERFACE,
    LINK_PREFIX,
    LINK_SPEED_GBPS,
    WORKSTATIONS,
    LabHost,
)

NETNS_DIR = Path("/run/netns")


def run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise with its own words, not a bare exit code."""
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip() or result.stdout}")
    return result


def in_netns(namespace: str, *command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run("nsenter", f"--net={NETNS_DIR / namespace}", *command, check=check)


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def netns_pids(name: str) -> list[int]:
    if not netns_exists(name):
        return []
    out = run("ip", "netns", "pids", name, check=False).stdout
    return [int(pid) for pid in out.split()]


def link_exists(name: str) -> bool:
    return run("ip", "link", "show", name, check=False).returncode == 0


def delete_link(name: str) -> bool:
    """
    Delete a link; whether this call deleted it. A veth whose other end was in a
    namespace just deleted goes away with it, asynchronously: gone is not an error.
    """
    deleted = run("ip", "link", "delete", name, check=False)
    if deleted.returncode != 0 and link_exists(name):
        raise RuntimeError(f"ip link delete {name}: {deleted.stderr.strip()}")
    return deleted.returncode == 0


def set_link_rate(namespace: str, gbps: float) -> None:
    """Cap the veth at the trained rate; tbf is what this kernel has (no netem)."""
    in_netns(
        namespace, "tc", "qdisc", "replace", "dev", LINK_INTERFACE, "root", "tbf",
        "rate", f"{gbps:g}gbit", "burst", "16mb", "latency", "50ms",
    )


def parking(host: LabHost) -> str:
    """
    Where a workstation's ``thunderbolt0`` waits while its driver is unloaded: a
    namespace of its own, so that the host sees no such interface, as after a
    real ``rmmod``, and the peer's end loses carrier.
    """
    return f"tbpark-{host.name}"


def unplug(host: LabHost) -> None:
    """The driver's net device goes away; moving it out of the namespace flushes its address."""
    in_netns(host.name, "ip", "link", "set", LINK_INTERFACE, "netns",
             str(NETNS_DIR / parking(host)))


def plug(host: LabHost) -> None:
    """A load makes the net device anew: it comes back down, with no address."""
    in_netns(parking(host), "ip", "link", "set", LINK_INTERFACE, "netns",
             str(NETNS_DIR / host.name))


def create() -> None:
    """Build namespaces, bridge and links from nothing."""
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    for host in HOSTS:
        _create_host(host)
    for host in WORKSTATIONS:
        run("ip", "netns", "add", parking(host))
    first, second = WORKSTATIONS
    in_netns(
        first.name, "ip", "link", "add", LINK_INTERFACE, "mtu", "65520", "type", "veth",
        "peer", "name", LINK_INTERFACE, "mtu", "65520", "netns", f"{NETNS_DIR / second.name}",
    )
    for host in WORKSTATIONS:
        in_netns(host.name, "ip", "addr", "add", f"{host.link_address}/{LINK_PREFIX}",
                 "dev", LINK_INTERFACE)
        set_link_rate(host.name, LINK_SPEED_GBPS)
        for hook, chain in IPTABLES_CHAINS.items():
            direction = "-i" if hook == "INPUT" else "-o"
            in_netns(host.name, "iptables", "-w", "-N", chain)
            in_netns(host.name, "iptables", "-w", "-A", hook, direction, LINK_INTERFACE,
                     "-j", chain)


def _create_host(host: LabHost) -> None:
    run("ip", "netns", "add", host.name)
    run("ip", "link", "add", host.management_veth, "type", "veth", "peer", "name", "eth0",
        "netns", host.name)
    run("ip", "link", "set", host.management_veth, "master", BRIDGE, "up")
    in_netns(host.name, "ip", "addr", "add", f"{host.management_address}/24", "dev", "eth0")
    in_netns(host.name, "ip", "link", "set", "eth0", "up")
    in_netns(host.name, "ip", "link", "set", "lo", "up")


def destroy(hosts: Sequence[LabHost] = HOSTS) -> list[str]:
    """Remove whatever of the lab's network exists; a half-built lab is fine."""
    removed = []
    for host in hosts:
        if host.workstation and netns_exists(parking(host)):
            run("ip", "netns", "delete", parking(host))
            removed.append(f"netns {parking(host)}")
        if netns_exists(host.name):
            # Deleting the namespace takes its veths, qdiscs and iptables rules along.
            run("ip", "netns", "delete", host.name)
            removed.append(f"netns {host.name}")
        if link_exists(host.management_veth) and delete_link(host.management_veth):
            removed.append(f"link {host.management_veth}")
    if link_exists(BRIDGE):
        run("ip", "link", "delete", BRIDGE)
        removed.append(f"bridge {BRIDGE}")
    return removed
