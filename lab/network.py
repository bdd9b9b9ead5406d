"""Namespaces, the management bridge and the Thunderbolt cable.

Management traffic (SSH, the gateway reaching the replicas) crosses a bridge in
the machine's own namespace; the workstations' TP traffic crosses only the
cable, so a driver reload never cuts the operator's session, as on a real site
where management has its own network.

The cables are a namespace of their own: each workstation's ``thunderbolt0`` is
a veth whose other end is a port of its pair's bridge there, one bridge a pair.
What a driver decides about a frame in flight is shaped there, by
:mod:`lab.kernel`:

- the sender's side, on its ``thunderbolt0``: the wire's rate, or the pace of
  the credits its peer returns; a queue there is the sender's own, so a full one
  holds the socket back and loses nothing;
- the receiver's ring, on its port of the cable: frames drain at the rate the
  receive path empties it, into a ring of :data:`RING_BYTES`; what arrives
  while it is full is lost on the way, so the sender's TCP really retransmits,
  as it does when a real receiver overruns.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from lab.topology import (
    BRIDGE,
    BRIDGE_ADDRESS,
    CABLE,
    EVERY_HOST,
    FRAME_BYTES,
    LINK_INTERFACE,
    LINK_PREFIX,
    NAPI_POLL_WEIGHT,
    RING_BYTES,
    RX_DRAIN_GBPS,
    TX_STALL_CHAIN,
    LabError,
    LabHost,
    LabPair,
    init_system,
    read_pid,
)

NETNS_DIR = Path("/run/netns")


def run(*command: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a command; on failure raise with its own words, not a bare exit code."""
    result = subprocess.run(command, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: {result.stderr.strip() or result.stdout}")
    return result


def in_host(host: LabHost, *command: str) -> subprocess.CompletedProcess[str]:
    """
    Run a command inside a host's namespaces, as its own processes see the world:
    a systemd host's PID namespace too, or systemctl cannot reach its systemd.
    """
    pid = read_pid(f"host-{host.name}")
    if pid is None:
        raise LabError(f"host {host.name} is not running; run `python -m lab up`")
    if init_system() == "systemd":
        # The recorded pid is unshare's; the host's PID 1 is its only child.
        pid = int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
    return subprocess.run(["nsenter", "-t", str(pid), "-m", "-u", "-n", "-p", *command],
                          capture_output=True, text=True)


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


def shape_sender(host: LabHost, gbps: float | None) -> None:
    """
    How fast the host's frames leave: tbf on its ``thunderbolt0`` (this kernel
    has no netem), whose bucket is the TX ring, sent back to back; ``None``, as
    fast as the host hands them over. A queue here is the sender's, so it
    pushes back on the socket and loses nothing.
    """
    if gbps is None:
        in_netns(host.name, "tc", "qdisc", "del", "dev", LINK_INTERFACE, "root", check=False)
        return
    in_netns(
        host.name, "tc", "qdisc", "replace", "dev", LINK_INTERFACE, "root", "tbf",
        "rate", f"{gbps:g}gbit", "burst", f"{RING_BYTES}b", "latency", "50ms",
    )


def shape_ring(host: LabHost, overruns: bool) -> None:
    """
    The host's receive ring, on its port of the cable. Overrunning: a tbf that
    drains at the receive path's rate, one NAPI poll's frames at a time, and
    holds one ring of frames; what does not fit is lost. Otherwise (the sender
    waits for credits) nothing is held here.
    """
    if overruns:
        in_netns(CABLE, "tc", "qdisc", "replace", "dev", host.cable_port, "root", "tbf",
                 "rate", f"{RX_DRAIN_GBPS:g}gbit", "burst", f"{NAPI_POLL_WEIGHT * FRAME_BYTES}b",
                 "limit", f"{RING_BYTES}b")
    else:
        in_netns(CABLE, "tc", "qdisc", "del", "dev", host.cable_port, "root", check=False)


def ring_drops(host: LabHost) -> int:
    """The frames the host's receive ring lost since its shaping was last set."""
    out = in_netns(CABLE, "tc", "-s", "-j", "qdisc", "show", "dev", host.cable_port).stdout
    return sum(qdisc.get("drops", 0) for qdisc in json.loads(out or "[]")
               if qdisc.get("root"))


def set_carrier(host: LabHost, on: bool) -> None:
    """The host's ``thunderbolt0`` has carrier while the cable's end of it is up."""
    in_netns(CABLE, "ip", "link", "set", host.cable_port, "up" if on else "down")


def stall_transmit(host: LabHost, stalled: bool) -> None:
    """A controller that returns no TX credits: the host's frames never leave."""
    in_netns(host.name, "iptables", "-w", "-F", TX_STALL_CHAIN)
    if stalled:
        in_netns(host.name, "iptables", "-w", "-A", TX_STALL_CHAIN, "-j", "DROP")


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


def create(pairs: Sequence[LabPair], gateway: LabHost) -> None:
    """Build namespaces, bridges and links from nothing: each pair's, and the gateway's."""
    run("ip", "link", "add", BRIDGE, "type", "bridge")
    run("ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")
    for host in (*(host for pair in pairs for host in pair.workstations), gateway):
        _create_host(host)
    _create_cables()
    for pair in pairs:
        in_netns(CABLE, "ip", "link", "add", pair.cable_bridge, "type", "bridge")
        in_netns(CABLE, "ip", "link", "set", pair.cable_bridge, "up")
        for host in pair.workstations:
            _plug_in(host, pair.cable_bridge)


def _plug_in(host: LabHost, cable_bridge: str) -> None:
    """A workstation's ``thunderbolt0``, a veth whose other end is a port of its cable's bridge."""
    run("ip", "netns", "add", parking(host))
    # Down until the lab kernel sees the peer's link up: the cable's end of
    # a veth carries the peer's carrier to this one.
    in_netns(CABLE, "ip", "link", "add", host.cable_port, "mtu", "65520", "type", "veth",
             "peer", "name", LINK_INTERFACE, "mtu", "65520",
             "netns", f"{NETNS_DIR / host.name}")
    in_netns(CABLE, "ip", "link", "set", host.cable_port, "master", cable_bridge)
    in_netns(host.name, "ip", "addr", "add", f"{host.link_address}/{LINK_PREFIX}",
             "dev", LINK_INTERFACE)
    in_netns(host.name, "iptables", "-w", "-N", TX_STALL_CHAIN)
    in_netns(host.name, "iptables", "-w", "-A", "OUTPUT", "-o", LINK_INTERFACE,
             "-j", TX_STALL_CHAIN)


def _create_cables() -> None:
    """The cables' namespace; no address, and no IPv6 of its own to talk with."""
    run("ip", "netns", "add", CABLE)
    for scope in ("all", "default"):
        in_netns(CABLE, "sysctl", "-qw", f"net.ipv6.conf.{scope}.disable_ipv6=1")


def _create_host(host: LabHost) -> None:
    run("ip", "netns", "add", host.name)
    run("ip", "link", "add", host.management_veth, "type", "veth", "peer", "name", "eth0",
        "netns", host.name)
    run("ip", "link", "set", host.management_veth, "master", BRIDGE, "up")
    in_netns(host.name, "ip", "addr", "add", f"{host.management_address}/24", "dev", "eth0")
    in_netns(host.name, "ip", "link", "set", "eth0", "up")
    in_netns(host.name, "ip", "link", "set", "lo", "up")


def destroy(hosts: Sequence[LabHost] = EVERY_HOST) -> list[str]:
    """
    Remove whatever of the lab's network exists, whatever its pairs; a half-built
    lab is fine.
    """
    removed = []
    if netns_exists(CABLE):
        # The cable's veths go with it, and so do their ends in the workstations.
        run("ip", "netns", "delete", CABLE)
        removed.append(f"netns {CABLE}")
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
