"""Named faults the lab can switch on, each a file under the lab's state.

The lab kernel and the simulated servers read these files at the moment a fault
would bite (a link retrain, a draft model load, a request), so switching one on
needs no restart and switching it off leaves no trace.
"""

from __future__ import annotations

from pathlib import Path

from lab.network import in_host
from lab.topology import HOSTS, LARGE_BACKEND_SERVICE, STATE, host_named, init_system

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
    "asm4242": "wsb's controller is an ASMedia ASM4242 (NHI 1b21:2425), which never returns "
               "TX credits: with tx_e2e nothing moves",
    "wrong_interface": "NCCL_SOCKET_IFNAME does not reach the TP ranks' NCCL: their traffic "
                       "takes the management network",
}


def check_name(name: str) -> None:
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; faults are: {', '.join(FAULTS)}")


def is_on(name: str) -> bool:
    return (FAULTS_DIR / name).exists()


def active() -> list[str]:
    return [name for name in FAULTS if is_on(name)]


def switch(name: str, on: bool) -> None:
    """Turn a fault on or off; ``fallback_down`` also stops or starts the backend."""
    check_name(name)
    FAULTS_DIR.mkdir(parents=True, exist_ok=True)
    if on:
        (FAULTS_DIR / name).touch()
    else:
        (FAULTS_DIR / name).unlink(missing_ok=True)
    if name == "fallback_down":
        large_backend(running=not on)
    if name == "sig_enforce":
        for host in HOSTS:
            if host.workstation:
                signature_enforcement(host.root, on)


def large_backend(running: bool) -> None:
    """Start or stop the gateway's alternate backend through the gateway's own init system."""
    if init_system() == "systemd":
        command = ["systemctl", "start" if running else "stop", f"{LARGE_BACKEND_SERVICE}.service"]
    else:
        command = ["sv", "up" if running else "down", f"/etc/service/{LARGE_BACKEND_SERVICE}"]
    result = in_host(host_named("gw"), *command)
    if result.returncode != 0:
        raise RuntimeError(f"gw: {' '.join(command)} failed: {result.stderr.strip()}")


def signature_enforcement(root: Path, on: bool) -> None:
    """The kernel's ``sig_enforce`` parameter, under a workstation's ``/sys/module``."""
    parameter = root / "sys-module" / "module" / "parameters" / "sig_enforce"
    parameter.parent.mkdir(parents=True, exist_ok=True)
    parameter.write_text("Y\n" if on else "N\n")


def clear() -> None:
    """Every fault's file gone; ``lab down`` calls this, and ``lab up`` lays the hosts anew."""
    for name in active():
        (FAULTS_DIR / name).unlink(missing_ok=True)
