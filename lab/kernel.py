"""The lab kernel: what the Thunderbolt hardware and driver would do, as a loop.

One process for the whole lab reconciles, every tick, what the simulated
module state asks for with what the network shows, on each workstation with its
own peer across its pair's cable; a fault bites the hosts it is on for:

- an unloaded ``thunderbolt_net`` takes ``thunderbolt0`` away (the peer loses
  carrier); a load creates it anew, without an address, and brings it up
  after a retrain delay at 20 Gb/s (10 Gb/s under ``link_10g``); the host's
  network manager applies the address about 2 s after the link comes up (not
  under ``no_network_manager``);
  switching ``link_10g`` off is re-seating the cable: a link that trained at
  10 Gb/s goes down and retrains;
- the cable (:mod:`lab.cable`): pulled out, the peer leaves both hosts' sysfs
  and ``thunderbolt0`` goes away on both sides, the module staying loaded;
  put back, the link trains at the rate given on a new ``thunderbolt0``; a
  suspended host keeps its own ``thunderbolt0`` while its peer loses the
  link, which retrains when the host resumes;
- each side's XDomain sysfs shows the peer (``0-3``, beside the host router and
  a dock) and, while the peer's driver is loaded, its ``network`` service and
  capabilities (``prtcstns``);
- each host's controller is a PCI device with a real NHI's ids under
  ``/sys/bus/pci/devices``, ``domain0`` its child: an Intel JHL8540, or on a
  pair's rank 1 under ``asm4242`` an ASMedia ASM4242, which never returns TX
  credits; its host router ``0-0`` shows the NVM firmware it runs
  (``nvm_version``: pair b's a later one than pair a's), which under
  ``tx_credit_stall`` is a firmware of its own that never returns TX credits;
- each receiver empties its ring of 256 4 KiB frames at the rate its receive
  path drains (:data:`lab.topology.RX_DRAIN_GBPS`, below the trained rate);
  a sender on the wire's rate outruns it once its arrivals no longer fit, and
  what does not fit is lost on the cable, so TCP really retransmits and the
  receiver counts the packets it lost as missed frames (:mod:`lab.network`);
- the candidate with ``tx_e2e=1`` towards a peer that advertises E2E waits for
  the receiver's credits: it sends no faster than the receiver drains, at most
  one ring ahead, and nothing is lost; ``e2e=0`` sends as stock does; with a
  controller at either end that returns no credits, it transmits nothing;
- each side has carrier while the other's link is up;
- ``/sys/class/net/thunderbolt0/statistics`` shows the veth's real byte and
  packet counters since the driver loaded, plus receiver errors equal to the
  packets its ring really lost.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from lab import cable, faults, network
from lab.network import in_netns
from lab.topology import (
    DEGRADED_SPEED_GBPS,
    LINK_INTERFACE,
    LINK_LANES,
    LINK_PREFIX,
    LINK_SPEED_GBPS,
    MODULE_NAME,
    NHI_SLOT,
    RETRAIN_SECONDS,
    RX_DRAIN_GBPS,
    LabHost,
    host_named,
    pair_of,
    read_pid,
    replace_text,
    workstations,
)

TICK_SECONDS = 0.1
MANAGER_SECONDS = 2.0
E2E, MATCH_FRAGS_ID, FRAMES_64K = 0x1, 0x2, 0x4
NET_DEV_FIELDS = ("rx_bytes", "rx_packets", "rx_errs", "rx_drop", "rx_fifo", "rx_frame",
                  "rx_compressed", "rx_multicast", "tx_bytes", "tx_packets")


@dataclass
class ModuleState:
    """What ``/sys/module/thunderbolt_net`` of one host says."""

    loaded_at: float | None
    parameters: dict[str, str]

    @classmethod
    def read(cls, host: LabHost) -> ModuleState:
        module = host.root / "sys-module" / MODULE_NAME
        try:
            loaded_at = (module / "initstate").stat().st_mtime
            parameters = {p.name: p.read_text().strip() for p in (module / "parameters").iterdir()}
        except FileNotFoundError:
            return cls(None, {})
        return cls(loaded_at, parameters)

    @property
    def loaded(self) -> bool:
        return self.loaded_at is not None

    def flag(self, name: str) -> bool:
        return self.parameters.get(name) == "Y"


@dataclass
class HostLink:
    """The lab kernel's memory of one workstation's side of the link."""

    host: LabHost
    loaded_at: float | None = None
    # The load that made the current thunderbolt0: a reload makes another.
    device_loaded_at: float | None = None
    up: bool | None = None
    replugged_at: float = 0.0
    # When the link last came up, until the network manager has applied the address.
    up_at: float | None = None
    # How this side sends, as last applied to a device that still exists.
    sending: Sending | None = None
    # Whether this side's receive ring can overrun, and whether its peer sees carrier.
    overruns: bool | None = None
    peer_carrier: bool | None = None
    base: dict[str, int] = field(default_factory=dict)
    # Packets the ring lost under shapings since replaced, under the current one,
    # and by the last load.
    dropped_carried: int = 0
    dropped_current: int = 0
    dropped_at_load: int = 0
    last_rx_packets: int = -1
    written: dict[str, str] = field(default_factory=dict)

    @property
    def dropped(self) -> int:
        return self.dropped_carried + self.dropped_current


@dataclass(frozen=True)
class Sending:
    """
    How one side's frames go out: its pace (``None``: as fast as the host hands
    them over), whether it waits for credits, whether it stalls.
    """

    gbps: float | None
    credits: bool
    stalled: bool


def advertises_e2e(module: ModuleState, host: LabHost) -> bool:
    """Whether ``host``, whose module this is, offers E2E to its peer."""
    return (module.loaded and module.flag("e2e")
            and not faults.is_on("peer_no_e2e", host.name))


def tx_e2e_active(sender: ModuleState, receiver: ModuleState, receiver_host: LabHost) -> bool:
    """The candidate's TX E2E takes effect only with RX E2E on and a peer that has it."""
    return (sender.flag("tx_e2e") and sender.flag("e2e")
            and advertises_e2e(receiver, receiver_host))


def write_if_changed(path: Path, value: str, cache: dict[str, str]) -> None:
    if cache.get(str(path)) != value:
        replace_text(path, value + "\n")
        cache[str(path)] = value


def xdomain_dir(host: LabHost) -> Path:
    return host.root / "sys-bus" / "thunderbolt" / "devices"


# As on a real workstation, the peer is not the only device with a link: the
# host router and a dock (device routers) sit at lower indices, the dock with
# its own, faster link. Only the peer's uevent names it an XDomain.
XDOMAIN_DEVTYPE = "thunderbolt_xdomain"
PEER_DEVICE = "0-3"
DEVICE_ROUTERS = {
    "0-0": {"uevent": "DEVTYPE=thunderbolt_device"},
    "0-1": {"uevent": "DEVTYPE=thunderbolt_device", "device_name": "TB4 Dock",
            "vendor_name": "twinbolt lab", "rx_speed": "20.0 Gb/s", "tx_speed": "20.0 Gb/s",
            "rx_lanes": "2", "tx_lanes": "2"},
}


@dataclass(frozen=True)
class Controller:
    """
    A Thunderbolt/USB4 host controller: its NHI's PCI ids, its host router's, the
    NVM firmware the router runs (``nvm_version``, the kernel's ``%x.%x``), and the
    firmware of its own it runs under ``tx_credit_stall``, one that never returns
    TX credits: a stall the ledger records is then that firmware's, and the
    controller back on its healthy firmware is not refused for it.
    """

    vendor: str
    device: str
    router: dict[str, str]
    nvm_version: str
    stalling_nvm_version: str
    returns_tx_credits: bool = True


# Maple Ridge's NHI (8086:1137, as lspci -n shows it); the ASM4242 is the USB4
# host that upstream's revert of TX E2E names (1881f2efbf7f). The NVM versions
# are the lab's own.
JHL8540 = Controller("0x8086", "0x1137", {"vendor": "0x8087", "device": "0x1137",
                                          "vendor_name": "Intel", "device_name": "JHL8540"},
                     nvm_version="36.0", stalling_nvm_version="35.0")
# Pair b's controllers run a later NVM than pair a's: the compatibility ledger's
# matrix, keyed by controller and firmware, has a row for each pair.
PAIR_B_JHL8540 = replace(JHL8540, nvm_version="40.0")
PAIR_CONTROLLERS = {"a": JHL8540, "b": PAIR_B_JHL8540}
ASM4242 = Controller("0x1b21", "0x2425", {"vendor": "0x1b21", "device": "0x2425",
                                          "vendor_name": "ASMedia", "device_name": "ASM4242"},
                     nvm_version="2.1", stalling_nvm_version="2.0", returns_tx_credits=False)


def controller(host: LabHost) -> Controller:
    """
    The host's controller, its pair's: a rank 1's is an ASM4242 while ``asm4242``
    is on for it; under ``tx_credit_stall`` it runs its firmware that never
    returns TX credits.
    """
    pair = pair_of(host)
    chip = (ASM4242 if host == pair.workstations[1] and faults.is_on("asm4242", host.name)
            else PAIR_CONTROLLERS[pair.name])
    if faults.is_on("tx_credit_stall", host.name):
        return replace(chip, nvm_version=chip.stalling_nvm_version, returns_tx_credits=False)
    return chip


def write_device_routers(link: HostLink) -> None:
    """
    The NHI's ids and the routers, each tick: a fault switched changes the
    controller and its firmware before the next fact reads them.
    """
    chip = controller(link.host)
    nhi = link.host.root / "sys-bus" / "pci" / "devices" / NHI_SLOT
    write_if_changed(nhi / "vendor", chip.vendor, link.written)
    write_if_changed(nhi / "device", chip.device, link.written)
    host_router = {**chip.router, "nvm_version": chip.nvm_version}
    for device, values in {**DEVICE_ROUTERS, "0-0": host_router}.items():
        for name, value in values.items():
            write_if_changed(xdomain_dir(link.host) / device / name, value, link.written)


def remove_peer(link: HostLink) -> None:
    """The XDomain peer unplugged: its device and its service leave sysfs."""
    device = xdomain_dir(link.host) / PEER_DEVICE
    for gone in (device.with_name(f"{PEER_DEVICE}.0"), device):
        if gone.exists():
            shutil.rmtree(gone)
            link.written = {k: v for k, v in link.written.items() if not k.startswith(str(gone))}


def write_xdomain(link: HostLink, peer: LabHost, peer_module: ModuleState,
                  speed_gbps: float) -> None:
    devices = xdomain_dir(link.host)
    device = devices / PEER_DEVICE
    values = {
        "uevent": f"DEVTYPE={XDOMAIN_DEVTYPE}",
        "device_name": peer.name, "vendor_name": "twinbolt lab", "unique_id": peer.unique_id,
        "rx_speed": f"{speed_gbps:.1f} Gb/s", "tx_speed": f"{speed_gbps:.1f} Gb/s",
        "rx_lanes": str(LINK_LANES), "tx_lanes": str(LINK_LANES), "maxhopid": "15",
    }
    for name, value in values.items():
        write_if_changed(device / name, value, link.written)
    service = devices / f"{PEER_DEVICE}.0"
    if peer_module.loaded:
        capabilities = (MATCH_FRAGS_ID | FRAMES_64K
                        | (E2E if advertises_e2e(peer_module, peer) else 0))
        service_values = {"key": "network", "prtcid": "1", "prtcvers": "1", "prtcrevs": "1",
                          "prtcstns": f"0x{capabilities:08x}"}
        for name, value in service_values.items():
            write_if_changed(service / name, value, link.written)
    elif service.exists():
        for child in service.iterdir():
            child.unlink()
        service.rmdir()
        link.written = {k: v for k, v in link.written.items() if not k.startswith(str(service))}


def sending(link: HostLink, module: ModuleState, peer: LabHost, peer_module: ModuleState,
            speed_gbps: float) -> Sending:
    """
    With TX E2E in effect the sender holds each frame until the receiver's ring
    has room: it goes no faster than the receiver drains, and stalls outright
    when credits never come back. Otherwise a wire slower than the drain is
    shaped at its trained rate, and a faster one is not shaped at all: the
    receiver's ring, not the wire, is then the bottleneck, and this machine
    hands frames over at about the drain's rate (14 to 16 Gbit/s through the
    cable), so a tbf at the wire's 20 Gb/s would only cost the CPU it needs.
    """
    credits = tx_e2e_active(module, peer_module, peer)
    withheld = not (controller(link.host).returns_tx_credits
                    and controller(peer).returns_tx_credits)
    if credits:
        gbps: float | None = min(speed_gbps, RX_DRAIN_GBPS)
    else:
        gbps = speed_gbps if speed_gbps < RX_DRAIN_GBPS else None
    return Sending(gbps=gbps, credits=credits, stalled=credits and withheld)


def apply_sending(link: HostLink, wanted: Sending) -> None:
    """Shape the host's own side: only while its device is up, and only on a change."""
    if not link.up or link.sending == wanted:
        return
    network.shape_sender(link.host, wanted.gbps)
    network.stall_transmit(link.host, wanted.stalled)
    link.sending = wanted


def apply_ring(link: HostLink, overruns: bool) -> None:
    """The host's receive ring, which overruns unless its peer waits for credits."""
    if link.overruns == overruns:
        return
    # Replacing the ring's shaping resets its counter: carry what it counted.
    link.dropped_carried += network.ring_drops(link.host)
    link.dropped_current = 0
    network.shape_ring(link.host, overruns)
    link.overruns = overruns


def apply_carrier(link: HostLink, peer: HostLink) -> None:
    """A side has carrier while the other side's link is up, as across a real cable."""
    wanted = bool(peer.up)
    if link.peer_carrier != wanted:
        network.set_carrier(link.host, wanted)
        link.peer_carrier = wanted


def net_dev(host: LabHost) -> dict[str, dict[str, int]] | None:
    """The host's network devices and their counters; ``None`` while the host is down."""
    pid = read_pid(f"host-{host.name}")
    try:
        lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines() if pid else None
    except FileNotFoundError:
        lines = None
    if lines is None:
        return None
    devices = {}
    for line in lines[2:]:
        name, _, counters = line.partition(":")
        devices[name.strip()] = dict(zip(NET_DEV_FIELDS, map(int, counters.split()),
                                         strict=False))
    return devices


def read_net_dev(host: LabHost) -> dict[str, int] | None:
    return (net_dev(host) or {}).get(LINK_INTERFACE)


def write_statistics(link: HostLink) -> None:
    counters = read_net_dev(link.host)
    if counters is None:
        return
    if link.device_loaded_at != link.loaded_at:
        # A reload or a replug makes a new net device: its counters start from zero.
        link.base, link.loaded_at = dict(counters), link.device_loaded_at
        link.dropped_at_load = link.dropped
    if counters["rx_packets"] != link.last_rx_packets:
        # The ring loses only what arrives: skip tc while nothing did.
        link.dropped_current = network.ring_drops(link.host)
        link.last_rx_packets = counters["rx_packets"]
    dropped = link.dropped - link.dropped_at_load
    values = {
        name: counters[name] - link.base.get(name, 0)
        for name in ("rx_bytes", "rx_packets", "tx_bytes", "tx_packets")
    }
    # A packet the ring lost leaves the next frame out of sequence: thunderbolt_net
    # counts it a missed frame (tbnet_check_frame).
    values.update(rx_crc_errors=0, rx_missed_errors=dropped, rx_length_errors=0,
                  rx_over_errors=0, rx_errors=dropped, tx_errors=0, rx_dropped=0, tx_dropped=0)
    statistics = link.host.root / "statistics"
    for name, value in values.items():
        write_if_changed(statistics / name, str(value), link.written)


def set_up(link: HostLink, made_at: float | None, up: bool) -> None:
    """
    The host's ``thunderbolt0`` as its driver makes it: absent while unloaded or
    unplugged (the peer losing carrier), created anew, without an address, by each
    load or plug (even an ``rmmod; modprobe`` quicker than one tick): ``made_at``
    names the device that should exist, ``None`` for none; up once trained.
    """
    host = link.host
    devices = net_dev(host)
    if devices is None:
        return  # the host is rebooting
    present = made_at is not None
    exists = LINK_INTERFACE in devices
    if present and exists and link.device_loaded_at not in (None, made_at):
        network.unplug(host)
        exists = False
    link.device_loaded_at = made_at
    if present and not exists:
        network.plug(host)
        link.up, link.sending = None, None
        bind_statistics(host)
    if not present and exists:
        network.unplug(host)
        link.up, link.sending = None, None
    if not present or up == link.up:
        return
    if up:
        link.up_at = time.time()
    in_netns(host.name, "ip", "link", "set", LINK_INTERFACE, "up" if up else "down")
    link.up = up


def bind_statistics(host: LabHost) -> None:
    """
    The simulated receiver counters over the new device's statistics: a device
    made anew has a new sysfs directory, without the old bind mount.
    """
    pid = read_pid(f"host-{host.name}")
    if pid is not None:
        subprocess.run(["nsenter", "-t", str(pid), "-m", "mount", "--bind",
                        str(host.root / "statistics"),
                        f"/sys/class/net/{LINK_INTERFACE}/statistics"], capture_output=True)


def network_manager(link: HostLink) -> None:
    """
    The host's own network manager (netplan, NetworkManager, systemd-networkd),
    matched by the interface's name: it applies the address about
    ``MANAGER_SECONDS`` after the link comes up, unless ``no_network_manager``.
    """
    if (not link.up or link.up_at is None
            or faults.is_on("no_network_manager", link.host.name)
            or time.time() - link.up_at < MANAGER_SECONDS):
        return
    in_netns(link.host.name, "ip", "addr", "replace", f"{link.host.link_address}/{LINK_PREFIX}",
             "dev", LINK_INTERFACE)
    link.up_at = None


def device_made_at(link: HostLink, module: ModuleState, peer: LabHost, wire: cable.Cable,
                   asleep: list[str]) -> float | None:
    """
    Which ``thunderbolt0`` the host should have, by when it was made: none while
    its driver is unloaded or its peer is out of reach (unplugged, asleep); made
    anew by each load, each plug and each wake of its peer. A host asleep keeps
    its own device, as ``tbnet_suspend`` does.
    """
    if not module.loaded:
        return None
    if link.host.name in asleep:
        return link.device_loaded_at
    if not wire.plugged or peer.name in asleep:
        return None
    return max(module.loaded_at or 0.0, wire.since, cable.resumed_at(peer))


def tick(links: dict[str, HostLink], speeds: dict[str, float]) -> None:
    modules = {name: ModuleState.read(link.host) for name, link in links.items()}
    wires = {pair: cable.read(pair) for pair in {link.host.pair or "" for link in links.values()}}
    asleep = cable.suspended()
    now = time.time()
    for name, link in links.items():
        peer = host_named(link.host.peer or "")
        module, peer_module = modules[name], modules[peer.name]
        wire = wires[link.host.pair or ""]
        made_at = device_made_at(link, module, peer, wire, asleep)
        # A host asleep, or its peer: the pair's link is down, the other pairs' are not.
        connected = wire.plugged and not {name, peer.name} & set(asleep)
        ten = faults.is_on("link_10g", name)
        if link.up and speeds[name] < wire.rate_gbps and not ten:
            link.replugged_at = now
        trained_from = max(made_at or now, link.replugged_at, cable.resumed_at(link.host))
        trained = connected and made_at is not None and now - trained_from >= RETRAIN_SECONDS
        if trained and not link.up:
            # Training happens now, so a fault switched on before it bites here.
            speeds[name] = DEGRADED_SPEED_GBPS if ten else wire.rate_gbps
        set_up(link, made_at, trained)
        network_manager(link)
        write_device_routers(link)
        if connected:
            write_xdomain(link, peer, peer_module, speeds[name])
        else:
            remove_peer(link)
        apply_sending(link, sending(link, module, peer, peer_module, speeds[name]))
        apply_ring(link, overruns=not tx_e2e_active(peer_module, module, link.host))
    for link in links.values():
        apply_carrier(link, links[link.host.peer or ""])
        write_statistics(link)


def main() -> None:
    links = {host.name: HostLink(host) for host in workstations()}
    speeds = {host.name: LINK_SPEED_GBPS for host in workstations()}
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        tick(links, speeds)
        time.sleep(TICK_SECONDS)


if __name__ == "__main__":
    main()
