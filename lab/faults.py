"""Named faults the lab can switch on, each a file under the lab's state.

The lab kernel and the simulated servers read these files at the moment a fault
would bite (a link retrain, a draft model load, a request), so switching one on
needs no restart and switching it off leaves no trace.

A fault is on for every host, or for some: ``python -m lab fault NAME on
--pair b`` bites pair b's workstations while pair a's run on untouched. The file
is empty for every host, else it lists the hosts, one a line; whoever asks names
the host it speaks for (a simulator on a host, by the host's own name).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from lab.network import in_host
from lab.topology import (
    GATEWAY,
    LARGE_BACKEND_SERVICE,
    STATE,
    LabError,
    LabHost,
    hosts,
    init_system,
    replace_text,
    workstations,
)

FAULTS_DIR = STATE / "faults"

FAULTS: dict[str, str] = {
    "tx_credit_stall": "the controllers run an NVM firmware of their own (the host router's "
                       "nvm_version changes) that never returns TX credits: with tx_e2e=1 "
                       "nothing moves",
    "peer_no_e2e": "each workstation's peer advertises prtcstns without bit 0 (TBNET_E2E)",
    "link_10g": "the link retrains at 10 Gb/s",
    "draft_init_crash": "a TP rank exits while the draft model initializes",
    "rank_hang": "rank 0's scheduler stops: no generation completes, and its /health (SGLang "
                 "0.5.9's, a one-token generation) answers 503 after 20 s; rank 1's dummy "
                 "/health stays 200",
    "rank_hang_green_health": "rank 0's scheduler stops while its /health answers 200, as "
                              "SGLang releases before sgl-project/sglang#8444 (merged "
                              "2025-07-28) answer it, without generating",
    "fallback_down": "the gateway's alternate (large) backend is stopped",
    "sig_enforce": "the workstations' kernels refuse unsigned modules (Secure Boot)",
    "udev_autoload": "udev loads the stock module again about 100 ms after each rmmod",
    "no_network_manager": "nothing but twinbolt applies thunderbolt0's address after a load",
    "asm4242": "each pair's rank 1 (wsb, wsd) has an ASMedia ASM4242 (NHI 1b21:2425), which "
               "never returns TX credits: with tx_e2e nothing moves",
    "wrong_interface": "NCCL_SOCKET_IFNAME does not reach the TP ranks' NCCL: their traffic "
                       "takes the management network",
}


def check_name(name: str) -> None:
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; faults are: {', '.join(FAULTS)}")


# Faults of the gateway alone, which no pair's scope reaches.
GATEWAY_FAULTS = ("fallback_down",)


def switched_on(directory: Path, name: str, host: str | None = None) -> bool:
    """Whether the fault file ``name`` in ``directory`` bites ``host`` (or, for None, any host)."""
    scope = hosts_in_scope(directory / name)
    return scope is not None and (host is None or not scope or host in scope)


def hosts_in_scope(path: Path) -> list[str] | None:
    """The hosts a fault file names: ``[]`` for every host, ``None`` while the fault is off."""
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return None


def is_on(name: str, host: str | None = None) -> bool:
    """Whether fault ``name`` bites ``host``, or without one, any host."""
    return switched_on(FAULTS_DIR, name, host)


def active() -> list[str]:
    return [name for name in FAULTS if is_on(name)]


def described() -> list[str]:
    """Each active fault, with the hosts it bites unless it bites every host."""
    return [f"{name} ({', '.join(scope)})" if (scope := hosts_in_scope(FAULTS_DIR / name))
            else name for name in active()]


def switch(name: str, on: bool, only: Sequence[LabHost] | None = None) -> None:
    """
    Turn a fault on or off, for every host or for ``only`` those; ``fallback_down``
    also stops or starts the backend, ``sig_enforce`` sets each workstation's kernel.
    """
    check_name(name)
    if only is not None and name in GATEWAY_FAULTS:
        raise LabError(f"{name} is the gateway's fault: it bites no pair alone")
    scope = narrowed(hosts_in_scope(FAULTS_DIR / name), on,
                     None if only is None else [host.name for host in only])
    if scope is None:
        (FAULTS_DIR / name).unlink(missing_ok=True)
    else:
        # Renamed over the old: a reader never sees the empty file, every host's.
        replace_text(FAULTS_DIR / name, "".join(f"{host}\n" for host in scope))
    if name == "fallback_down":
        large_backend(running=not on)
    if name == "sig_enforce":
        for host in workstations():
            signature_enforcement(host.root, is_on(name, host.name))


def narrowed(scope: list[str] | None, on: bool, named: list[str] | None) -> list[str] | None:
    """
    A fault's hosts (``[]``: every host, ``None``: off) after switching it for
    ``named`` (``None``: every host). Switched off for some hosts while on for
    every one, it stays on for the lab's others.
    """
    if named is None:
        return [] if on else None
    if on:
        if scope == []:
            return []
        kept = scope or []
        return [*kept, *(host for host in named if host not in kept)]
    if scope is None:
        return None
    every = scope or [host.name for host in hosts()]
    return [host for host in every if host not in named] or None


def large_backend(running: bool) -> None:
    """Start or stop the gateway's alternate backend through the gateway's own init system."""
    if init_system() == "systemd":
        command = ["systemctl", "start" if running else "stop", f"{LARGE_BACKEND_SERVICE}.service"]
    else:
        command = ["sv", "up" if running else "down", f"/etc/service/{LARGE_BACKEND_SERVICE}"]
    result = in_host(GATEWAY, *command)
    if result.returncode != 0:
        raise RuntimeError(f"gw: {' '.join(command)} failed: {result.stderr.strip()}")


def signature_enforcement(root: Path, on: bool) -> None:
    """The kernel's ``sig_enforce`` parameter, under a workstation's ``/sys/module``."""
    parameter = root / "sys-module" / "module" / "parameters" / "sig_enforce"
    parameter.parent.mkdir(parents=True, exist_ok=True)
    parameter.write_text("Y\n" if on else "N\n")


def clear() -> None:
    """Every fault's file gone; ``lab down`` calls this, and ``lab up`` lays the hosts anew."""
    for name in FAULTS:
        (FAULTS_DIR / name).unlink(missing_ok=True)
