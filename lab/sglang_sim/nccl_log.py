"""NCCL's INFO lines, as ``NCCL_DEBUG=INFO`` has NCCL write them, and only then.

NCCL writes to standard output (``src/debug.cc``): ``host:pid:tid [dev] NCCL
INFO message``, the host name cut at its first dot, ``dev`` the CUDA device.
A line is written when ``NCCL_DEBUG`` is ``INFO`` (in any case) and one of its
subsystems is among ``NCCL_DEBUG_SUBSYS``'s (default ``INIT,BOOTSTRAP,ENV``;
``ALL``; a leading ``^`` for all but those named). The simulator writes the
lines NCCL 2.27 writes as a two-rank socket group forms:

- ``NET/Socket : Using [0]<if>:<address><0>`` (``src/transport/net_socket.cc``,
  the address as ``src/misc/socket.cc`` prints it), INIT|NET;
- ``Using network Socket`` (``src/init.cc``), INIT;
- on rank 0, each channel's ring, ``Channel 00/02 : 0 1``
  (``src/graph/rings.cc``), INIT;
- each channel's connection each way, ``Channel 00/0 : 0[0] -> 1[0] [send]
  via NET/Socket/0`` and ``[receive]`` (``src/transport/net.cc``), INIT|NET.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

DEFAULT_SUBSYSTEMS = "INIT,BOOTSTRAP,ENV"
# One GPU per rank: CUDA device 0, NVML device 0.
DEVICE = 0


def enabled(subsystems: tuple[str, ...], environ: dict[str, str] | None = None) -> bool:
    """Whether NCCL writes a line of ``subsystems`` under ``environ``."""
    environ = os.environ if environ is None else environ
    if environ.get("NCCL_DEBUG", "").upper() != "INFO":
        return False
    chosen = environ.get("NCCL_DEBUG_SUBSYS", DEFAULT_SUBSYSTEMS).upper()
    inverted = chosen.startswith("^")
    named = set(chosen.removeprefix("^").split(","))
    if "ALL" in named:
        return not inverted
    return inverted != bool(named & set(subsystems))


def info(message: str, *subsystems: str) -> None:
    """One INFO line, with NCCL's prefix, when NCCL would write it."""
    if not enabled(subsystems):
        return
    host = socket.gethostname().split(".")[0]
    sys.stdout.write(f"{host}:{os.getpid()}:{threading.get_native_id()} [{DEVICE}] "
                     f"NCCL INFO {message}\n")
    sys.stdout.flush()


def channel_lines(rank: int, channels: int, ranks: int = 2) -> None:
    """The rings (rank 0) and each channel's connections, once they are connected."""
    peer = (rank + 1) % ranks
    for channel in range(channels):
        if rank == 0:
            info(f"Channel {channel:02d}/{channels:02d} : "
                 + " ".join(str(each) for each in range(ranks)), "INIT")
    for channel in range(channels):
        info(f"Channel {channel:02d}/0 : {rank}[{DEVICE}] -> {peer}[{DEVICE}] [send] via "
             "NET/Socket/0", "INIT", "NET")
        info(f"Channel {channel:02d}/0 : {peer}[{DEVICE}] -> {rank}[{DEVICE}] [receive] via "
             "NET/Socket/0", "INIT", "NET")
