"""The Thunderbolt cable of each pair, and the hosts' sleep: what a person does.

``python -m lab unplug HOST`` pulls HOST's pair's cable out of HOST, ``plug HOST [--rate
GBPS]`` puts it back, and ``suspend HOST --seconds N`` sleeps HOST for N seconds,
as ``rtcwake -m mem -s N`` would, and returns once it has woken. Each is a file
under the lab's state, read by the lab kernel every tick (``lab/kernel.py``), so
the link reacts as real hardware does:

- **unplugged**: the XDomain peer disappears from both hosts' sysfs and
  thunderbolt_net removes ``thunderbolt0`` on both sides (``tbnet_remove``), so
  in-flight TCP across it stalls; the module stays loaded with its parameters;
- **plugged**: the peer comes back, and the link trains at the rate given (a
  dock or a display attached at connect time can make a USB4 link train at
  10 Gb/s); a new ``thunderbolt0`` appears on each side, down and without an
  address, with counters from zero, until the host's network manager applies
  its address;
- **suspended**: every process of the host is frozen (SIGSTOP, as the kernel's
  freezer stops tasks), its controller is powered down, so its link drops and
  the peer loses the XDomain as on an unplug; its own ``thunderbolt0`` stays
  registered (``tbnet_suspend`` keeps the device). On resume the processes
  continue, the link retrains, and the loaded module keeps its parameters.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from lab.topology import (
    DEGRADED_SPEED_GBPS,
    LINK_SPEED_GBPS,
    STATE,
    LabHost,
    pair_of,
    read_pid,
    replace_text,
    workstations,
)

# One file a pair, by the pair's name: each cable is pulled and trains alone.
CABLES_DIR = STATE / "cables"
SUSPENDED_DIR = STATE / "suspended"
# The rates a USB4 lane trains at: Gen 3 (20 Gb/s) and Gen 2 (10 Gb/s).
RATES_GBPS = (LINK_SPEED_GBPS, DEGRADED_SPEED_GBPS)


@dataclass(frozen=True)
class Cable:
    """
    The cable as the lab kernel reads it: plugged or not, the rate it trains at
    since it was last plugged, and when that was (``0``: since ``lab up``).
    """

    plugged: bool = True
    rate_gbps: float = LINK_SPEED_GBPS
    since: float = 0.0
    # The host it was pulled out of, for status.
    unplugged_from: str | None = None


def cable_file(pair: str) -> Path:
    return CABLES_DIR / pair


def read(pair: str) -> Cable:
    """The state of the cable of ``pair`` (a pair's name); a cable never unplugged is in."""
    try:
        return Cable(**json.loads(cable_file(pair).read_text()))
    except FileNotFoundError:
        return Cable()


def write(pair: str, cable: Cable) -> None:
    replace_text(cable_file(pair), json.dumps(cable.__dict__) + "\n")


def unplug(host: LabHost) -> Cable:
    """Pull its pair's cable out of ``host``: the link goes away on both of the pair's sides."""
    unplugged = Cable(plugged=False, since=time.time(), unplugged_from=host.name)
    write(pair_of(host).name, unplugged)
    return unplugged


def plug(host: LabHost, rate_gbps: float = LINK_SPEED_GBPS) -> Cable:
    """Put its pair's cable back into ``host``: the link trains anew at ``rate_gbps``."""
    if rate_gbps not in RATES_GBPS:
        raise ValueError(f"a USB4 lane trains at {' or '.join(f'{r:g}' for r in RATES_GBPS)} "
                         f"Gb/s, not {rate_gbps:g}")
    plugged = Cable(plugged=True, rate_gbps=rate_gbps, since=time.time())
    write(pair_of(host).name, plugged)
    return plugged


def forget() -> None:
    """Every cable in and nobody asleep: ``lab up`` lays the hosts anew."""
    for directory in (CABLES_DIR, SUSPENDED_DIR):
        for marker in directory.glob("*"):
            marker.unlink()


def suspend_marker(host: LabHost) -> Path:
    return SUSPENDED_DIR / host.name


def suspended() -> list[str]:
    """The workstations asleep now."""
    return [host.name for host in workstations() if suspend_marker(host).exists()]


def resumed_at(host: LabHost) -> float:
    """When ``host`` last woke from a suspend (``0``: never); the lab kernel asks every tick."""
    try:
        return float(resume_marker(host).read_text())
    except FileNotFoundError:
        return 0.0


def mark_resumed(host: LabHost) -> None:
    replace_text(resume_marker(host), f"{time.time()}\n")


def resume_marker(host: LabHost) -> Path:
    return SUSPENDED_DIR / f"{host.name}.resumed"


def suspend(host: LabHost, seconds: float) -> float:
    """
    Sleep ``host`` for ``seconds``, then wake it; returns how long it slept.
    Its processes are stopped and continued by pid (its own process tree, never
    by name); a wake is certain even if this is interrupted.
    """
    if not host.workstation:
        raise ValueError(f"{host.name} has no Thunderbolt link; suspend a workstation")
    root = read_pid(f"host-{host.name}")
    if root is None:
        raise ValueError(f"{host.name} is not running; run `python -m lab up`")
    SUSPENDED_DIR.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    suspend_marker(host).write_text(f"{time.time()}\n")
    frozen: list[int] = []
    try:
        # Twice: a process forked while the first pass ran is stopped by the second.
        for _ in range(2):
            fresh = [pid for pid in process_tree(root) if pid not in frozen]
            signal_all(fresh, signal.SIGSTOP)
            frozen += fresh
        time.sleep(seconds)
    finally:
        signal_all(frozen, signal.SIGCONT)
        mark_resumed(host)
        suspend_marker(host).unlink(missing_ok=True)
    return time.monotonic() - started


def process_tree(root: int) -> list[int]:
    """
    ``root`` and every process it started, by ``/proc``'s children lists: the
    host's own processes, not the lab kernel's commands that visit its namespace.
    """
    tree, pending = [], [root]
    while pending:
        pid = pending.pop()
        tree.append(pid)
        try:
            for task in Path(f"/proc/{pid}/task").iterdir():
                pending += map(int, (task / "children").read_text().split())
        except (FileNotFoundError, ProcessLookupError):
            continue
    return tree


def signal_all(pids: list[int], stop: signal.Signals) -> None:
    for pid in pids:
        try:
            os.kill(pid, stop)
        except ProcessLookupError:
            pass
