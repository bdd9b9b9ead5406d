"""Where the lab's hosts, links, files and processes live.

Everything the lab creates on the machine is named here, so that ``down`` can
remove exactly what ``up`` made and nothing else.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class LabError(RuntimeError):
    """The lab cannot do what was asked; the message says what to do."""


REPO = Path(__file__).resolve().parents[1]
STATE = Path(os.environ.get("TWINBOLT_LAB_STATE", REPO / ".lab"))
PYTHON = REPO / ".venv" / "bin" / "python"
# Which checkout's state directory holds the running lab's pid files. The lab's
# names are the machine's, not a checkout's: a lab brought up from another clone
# must find the processes this one started, or its kernel ticks on beside theirs.
OWNER_FILE = Path("/run/twinbolt-lab/owner")

BRIDGE = "tblab0"
BRIDGE_ADDRESS = "10.66.0.1/24"
LINK_INTERFACE = "thunderbolt0"
LINK_PREFIX = 16
# Where a transmitting side's frames are held back when its TX credits never return.
TX_STALL_CHAIN = "TBLAB_TX"
# The cables: a namespace of their own, where each pair's bridge joins its
# workstations' thunderbolt0 veths, so that what happens to a frame on its way
# (the receiver's ring overrunning) happens neither in the sender's stack nor in
# the receiver's. Each pair's bridge is named with the pair (LabPair).
CABLE = "tbcable"

# The field report's link: one USB4 lane trained at 20 Gb/s.
LINK_SPEED_GBPS = 20.0
DEGRADED_SPEED_GBPS = 10.0
LINK_LANES = 1
RETRAIN_SECONDS = 1.0

# thunderbolt_net's rings (drivers/net/thunderbolt/main.c): TBNET_RING_SIZE
# frames of TBNET_FRAME_SIZE bytes each, on the TX side and on the RX side; a
# 64 KiB packet travels as 16 frames. The NHI puts what its TX ring holds on the
# wire back to back, so a sender runs up to one ring ahead of the wire's rate.
RING_FRAMES = 256
FRAME_BYTES = 4096
RING_BYTES = RING_FRAMES * FRAME_BYTES
# How fast a receiver empties its ring: one NAPI poll takes at most
# NAPI_POLL_WEIGHT frames (the kernel's default, which thunderbolt_net uses), and
# the NHI raises the ring's interrupt at most once per 128 us (nhi.c's interrupt
# throttling). So 64 frames per 128 us: 16.384 Gbit/s, below the 20 Gb/s the
# lane trained at, which is how a sender can outrun its receiver.
NAPI_POLL_WEIGHT = 64
RX_INTERRUPT_THROTTLE_SECONDS = 128e-6
RX_DRAIN_GBPS = NAPI_POLL_WEIGHT * FRAME_BYTES * 8 / RX_INTERRUPT_THROTTLE_SECONDS / 1e9

MODULE_NAME = "thunderbolt_net"
# Each workstation's Thunderbolt controller, a PCI device: domain0 is its child,
# as on a real host, where /sys/bus/thunderbolt/devices/domain0 links to
# /sys/devices/pci…/<NHI>/domain0.
NHI_SLOT = "0000:05:00.0"
# As Ubuntu since 23.10 installs it: zstd-compressed, which readelf cannot read.
STOCK_MODULE_RELPATH = "kernel/drivers/net/thunderbolt/thunderbolt_net.ko.zst"
GPU_NAME = "NVIDIA GeForce RTX 5090"
GPU_MEMORY_MIB = 32607

LARGE_BACKEND_SERVICE = "lab-large"
LARGE_BACKEND_PORT = 31000

# The unprivileged account a site's admin would use: passwordless sudo, nothing
# else. The inventory reaches each pair's rank 0 and gw as this user, rank 1 as root.
OPERATOR = "twinbolt"
OPERATOR_UID = 2990
OPERATOR_HOME = "/var/lib/twinbolt-operator"


# Which init system the hosts boot: systemd, as on a site's Ubuntu hosts, unless
# `python -m lab up --init runit` chose runit. Kept while the lab exists, so the
# lab's group data tells twinbolt what the hosts run.
INIT_SYSTEMS = ("systemd", "runit")
# The SGLang servers' keys on the operator's side, as a site keeps them
# ([serving] api_key_file and admin_api_key_file); `up` makes them.
SGLANG_KEYS = {"api_key_file": STATE / "keys" / "sglang_api_key",
               "admin_api_key_file": STATE / "keys" / "sglang_admin_key"}
INIT_FILE = STATE / "init"


def init_system() -> str:
    """The init system the lab's hosts boot (or will boot): ``systemd`` unless chosen."""
    try:
        return INIT_FILE.read_text().strip()
    except FileNotFoundError:
        return "systemd"


# How many pairs `python -m lab up --pairs N` built: kept while the lab exists,
# as the init system is, so that every later command, the lab kernel, the
# simulators and the inventory know which hosts there are.
PAIRS_FILE = STATE / "pairs"


@dataclass(frozen=True)
class LabHost:
    """One simulated host: a namespace pair, its management address and its role."""

    name: str
    management_address: str
    workstation: bool
    link_address: str | None = None
    peer: str | None = None
    unique_id: str = ""
    ssh_user: str = "root"
    # The pair a workstation belongs to, by name; the gateway's is None.
    pair: str | None = None

    @property
    def root(self) -> Path:
        """The host's private files, bind-mounted over its real paths."""
        return STATE / "hosts" / self.name

    @property
    def management_veth(self) -> str:
        return f"tblab-{self.name}"

    @property
    def cable_port(self) -> str:
        """The cable's end of the host's ``thunderbolt0``: the host's receive ring sits on it."""
        return f"tb-{self.name}"


@dataclass(frozen=True)
class LabPair:
    """
    Two workstations, rank 0 first, and the cable between them: a bridge of its
    own in the cable's namespace, so that each pair's frames, rings and carrier
    are its own.
    """

    name: str
    workstations: tuple[LabHost, LabHost]
    cable_bridge: str


# As on a real site, some hosts are reached as the operator with sudo (each
# pair's rank 0, and the gateway), others as root. Each cable is a link network
# of its own.
PAIRS: tuple[LabPair, ...] = (
    LabPair("a", (
        LabHost("wsa", "10.66.0.11", True, "169.254.77.1", "wsb",
                "d1e5a000-0000-4a00-8000-00000000a0a0", OPERATOR, "a"),
        LabHost("wsb", "10.66.0.12", True, "169.254.77.2", "wsa",
                "d1e5b000-0000-4b00-8000-00000000b0b0", "root", "a"),
    ), "cable0"),
    LabPair("b", (
        LabHost("wsc", "10.66.0.14", True, "169.254.78.1", "wsd",
                "d1e5c000-0000-4c00-8000-00000000c0c0", OPERATOR, "b"),
        LabHost("wsd", "10.66.0.15", True, "169.254.78.2", "wsc",
                "d1e5d000-0000-4d00-8000-00000000d0d0", "root", "b"),
    ), "cable1"),
)
GATEWAY = LabHost("gw", "10.66.0.13", False, ssh_user=OPERATOR)
# Every host any lab has, whatever its pairs: what `down` and the repair of a
# stale lab look for, since the record of the pairs may be gone or wrong.
EVERY_HOST: tuple[LabHost, ...] = (
    *(host for pair in PAIRS for host in pair.workstations), GATEWAY)


def pair_count() -> int:
    """How many pairs the lab has (or will have): one unless `lab up --pairs N` chose more."""
    try:
        return int(PAIRS_FILE.read_text())
    except FileNotFoundError:
        return 1


def lab_pairs(count: int | None = None) -> tuple[LabPair, ...]:
    """The lab's pairs, or the first ``count`` of those it can build."""
    return PAIRS[:count or pair_count()]


def workstations(count: int | None = None) -> tuple[LabHost, ...]:
    """The lab's workstations, pair by pair, rank 0 first in each."""
    return tuple(host for pair in lab_pairs(count) for host in pair.workstations)


def hosts(count: int | None = None) -> tuple[LabHost, ...]:
    """The lab's hosts: its workstations, then the gateway in front of every pair."""
    return (*workstations(count), GATEWAY)


def host_named(name: str) -> LabHost:
    """Look a lab host up by name, with an error that lists the real ones."""
    for host in EVERY_HOST:
        if host.name == name:
            return host
    raise KeyError(f"no lab host {name!r}; lab hosts are "
                   f"{', '.join(h.name for h in EVERY_HOST)}")


def pair_named(name: str) -> LabPair:
    for pair in PAIRS:
        if pair.name == name:
            return pair
    raise KeyError(f"no lab pair {name!r}; lab pairs are {', '.join(p.name for p in PAIRS)}")


def pair_of(host: LabHost) -> LabPair:
    """The pair a workstation belongs to, whose cable it is plugged into."""
    if host.pair is None:
        raise LabError(f"{host.name} has no Thunderbolt link; name a workstation")
    return pair_named(host.pair)


def replace_text(path: Path, text: str) -> None:
    """
    Write a state file the lab kernel polls by renaming a finished copy over it:
    a reader sees the old text or the new, never the empty file a write in place
    shows between its truncation and its write (a ``float("")`` that killed the
    kernel mid-suite).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(text)
    partial.rename(path)


def pid_file(name: str, state: Path = STATE) -> Path:
    return state / "pids" / f"{name}.pid"


def read_pid(name: str, state: Path = STATE) -> int | None:
    """The pid recorded for one of the lab's processes, if it is still alive."""
    try:
        pid = int(pid_file(name, state).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return pid if alive(pid) else None


def owner() -> Path | None:
    """The state directory of the checkout that brought the running lab up, if recorded."""
    try:
        return Path(OWNER_FILE.read_text().strip())
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie that only waits to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        # Gone before the open, or between the open and the read (ESRCH).
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"
