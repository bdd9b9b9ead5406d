"""One all-reduce as NCCL moves it between two ranks over its Socket transport.

Pure: the plan of what each rank sends and receives on each channel, in
which messages, and how each message spreads over a connection's sockets.
:class:`lab.sglang_sim.link.NcclLink` carries the plan over the group's real
sockets.

The source is the NCCL SGLang runs: SGLang 0.5.9 pins ``torch==2.9.1`` (its
wheel's metadata), whose Linux wheel requires ``nvidia-nccl-cu12==2.27.5``:
NVIDIA/nccl at tag ``v2.27.5-1``. Each constant below names the file it is
read from; none is fitted to a figure of the field report.

- **Channels** (``src/graph/connect.cc``, ``ncclTopoPostset``): the topology
  search finds one ring through the one NIC of a one-GPU host, and NCCL
  doubles the search's channels ("Duplication should be complete now",
  ``nChannels*2``). It doubles them again only for a ring faster than 45 GB/s
  or a GPUDirect unpack NIC, neither a Thunderbolt link; then caps them at
  ``NCCL_MAX_NCHANNELS`` and copies them up to ``NCCL_MIN_NCHANNELS``.
- **Sockets per connection** (``src/transport/net_socket.cc``): a connection
  is a control socket plus ``NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD``
  data sockets. Left unset, both are chosen from the NIC's PCI vendor: AWS
  (``0x1d0f``) gets 2 x 8, GCP (``0x1ae0``) 4 x 1, any other NIC 0 threads,
  so no data socket at all: the control socket carries every message.
- **A message on the wire** (``net_socket.cc``): the sender writes the size
  (an ``int``, ``SOCKET_CTRL_SIZE``) on the control socket, then the data: on
  the control socket too without data sockets (or inline, up to
  ``NCCL_SOCKET_INLINE`` bytes), else in tasks of ``max(64 KiB, size /
  nSocks)`` round-robin over the data sockets.
- **The split over channels** (``src/enqueue.cc``, ``scheduleCollTasksToPlan``):
  a collective's traffic (twice its size for an all-reduce) is shared in
  cells of 16 KiB of traffic: the first channel takes an even share over the
  channels the tuner gives the message (fewer for a small one), the next ones
  as much, the last what is left. So a small Simple all-reduce takes one
  channel and a large one all of them, evenly.
- **The ring** (``src/device/all_reduce.h``, ``runRing``): per loop of
  ``nranks`` chunks, a rank sends one chunk (reduce-scatter), reduces the
  peer's copy of the next and sends the result (all-gather), and receives the
  last. With two ranks each rank sends ``2 (n-1)/n = 1`` message's size and
  receives as much, both at once. A chunk is ``NCCL_BUFFSIZE / NCCL_STEPS x
  ALLREDUCE_CHUNKSTEPS`` (``src/init.cc``, ``src/include/device.h``,
  ``src/include/collectives.h``, ``calcCollChunking`` in ``enqueue.cc``),
  halved over the chunks of a last, partial loop.
- **Slices** (``src/device/prims_simple.h``, ``genericOp``): a chunk goes out
  in ``ALLREDUCE_CHUNKSTEPS / ALLREDUCE_SLICESTEPS`` slices, each one message
  of the proxy's, empty ones included; a slice is half the chunk, at least
  1/32 of ``ALLREDUCE_SLICESTEPS`` steps. The all-gather's slice waits for the
  peer's reduce-scatter slice it completes; the next loop waits for the whole
  of the last one.
- **The protocol** (``src/graph/tuning.cc``, ``ncclTopoTuneModel`` and
  ``ncclTopoGetAlgoTime``; ``enqueue.cc``, ``topoGetAlgoInfo``): the tuner
  takes the cheapest of latency + size / bandwidth. Between two hosts of one
  GPU the ring beats the tree at every size, and LL128 is off unless the NIC
  sits under the GPU's own PCIe switch, so it is ring LL against ring Simple.
  The ring's bandwidth is the search's speed for the NIC
  (``src/graph/search.cc``: the largest of the Blackwell inter-node speeds
  not above it); a socket NIC's speed is
  ``/sys/class/net/<if>/speed``, 10 Gb/s where that reads nothing (as
  thunderbolt0's does), so 1.2 GB/s. LL then costs 16.6 us + size / 0.6 GB/s
  and Simple 51 us + size / 1.2 GB/s: LL up to about 41 KB, a decode step's
  all-reduces. LL carries 8 bytes of data in each 16-byte line (data and
  flags, ``src/device/prims_ll.h``), so twice the bytes on the wire, in
  chunks of half an LL step, one message each (``calcCollChunking``).
- What is not modelled: a tuner plugin, ``NCCL_PROTO`` and ``NCCL_ALGO``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

logger = logging.getLogger(__name__)

RANKS = 2
SIMPLE, LL = "Simple", "LL"

# src/include/device.h: steps in a connection's buffer; MAXCHANNELS.
NCCL_STEPS = 8
MAX_CHANNELS = 64
# src/init.cc: DEFAULT_BUFFSIZE, the Simple protocol's buffer per connection.
BUFFSIZE = 4 << 20
# src/include/collectives.h: a ring all-reduce's chunk and slice, in steps.
ALLREDUCE_CHUNKSTEPS = NCCL_STEPS // 2
ALLREDUCE_SLICESTEPS = NCCL_STEPS // 4
# src/include/device.h, ncclProtoGrainSize: each protocol's grain.
GRAIN_BYTES = {SIMPLE: 512, LL: 16}
# src/init.cc: DEFAULT_LL_BUFFSIZE, NCCL_LL_LINES_PER_THREAD x NCCL_LL_MAX_NTHREADS
# x NCCL_STEPS lines of 16 bytes (src/include/device.h), 8 of them data.
LL_MAX_THREADS = 512
LL_BUFFSIZE = 8 * LL_MAX_THREADS * NCCL_STEPS * 16
LL_LINE_BYTES = 16
LL_LINE_DATA_BYTES = 8
# src/device/all_reduce.h: a partial loop's chunks align to 16 bytes.
CHUNK_ALIGN_BYTES = 16
# src/enqueue.cc: MinTrafficPerChannel; an all-reduce's traffic is twice its size.
MIN_TRAFFIC_PER_CHANNEL = 16 << 10
ALLREDUCE_TRAFFIC_PER_BYTE = 2
# src/graph/tuning.cc: a ring no faster than PCI_BW runs the Simple protocol on
# 256 threads, LL on NCCL_LL_MAX_NTHREADS; src/include/comm.h: the bytes a
# thread takes before the tuner adds a channel (LL's times the ranks, for a ring).
RING_THREADS = {SIMPLE: 256, LL: LL_MAX_THREADS}
THREAD_THRESHOLD = {SIMPLE: 64, LL: 8 * RANKS}
# src/graph/tuning.cc, the ring's cost: baseLat, then per inter-node step the
# network's tree latency (one GPU per host), in us; Simple's latency times 1.4
# from compute capability 8.0 ("plateau effect of ring"); LL at half the
# bandwidth. All-reduce between two hosts: 2 inter-node steps.
BASE_LATENCY_US = {SIMPLE: 8.4, LL: 6.6}
NET_LATENCY_US = {SIMPLE: 14.0, LL: 5.0}
INTER_NODE_STEPS = 2
RING_SIMPLE_PLATEAU = 1.4
LL_BANDWIDTH_SHARE = 0.5
# src/graph/search.cc: sm100SpeedArrayInter (GB/s), for an RTX 5090 (SM 12.0);
# src/transport/net_socket.cc: the speed assumed where a NIC reports none.
SPEEDS_GB_S = (48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0,
               2.4, 1.2, 0.24, 0.12)
DEFAULT_NIC_MBPS = 10_000
# src/graph/connect.cc: the search's one ring per NIC, doubled.
SEARCH_CHANNELS_ONE_NIC = 1
CHANNELS_PER_SEARCH_CHANNEL = 2
# src/transport/net_socket.cc.
MAX_SOCKETS = 64
MAX_THREADS = 16
SOCKET_CTRL_BYTES = 4
SOCKET_INLINE_BYTES = 128
SOCKET_MIN_TASK_BYTES = 64 << 10
# ncclNetSocketGetNsockNthread: (threads, sockets per thread) by PCI vendor.
AUTO_SOCKETS = {"0x1d0f": (2, 8), "0x1ae0": (4, 1)}
AUTO_SOCKETS_OTHER_NIC = (0, 1)


def _integer(environ: Mapping[str, str], name: str) -> int | None:
    """An NCCL integer parameter, ``None`` when unset (NCCL's -2)."""
    if name not in environ:
        return None
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"{name}={environ[name]!r} is not an integer") from None


@dataclass(frozen=True)
class Transport:
    """How many channels a two-rank ring opens, and the data sockets of each connection."""

    channels: int = SEARCH_CHANNELS_ONE_NIC * CHANNELS_PER_SEARCH_CHANNEL
    data_sockets: int = 0
    ring_gb_s: float = 1.2

    @classmethod
    def from_env(cls, environ: Mapping[str, str], vendor: str | None,
                 speed_mbps: int | None = None) -> Transport:
        """
        What NCCL 2.27.5 chooses for a NIC of PCI ``vendor`` (``None`` when the
        NIC has none, as a Thunderbolt link has not) and of ``speed_mbps``
        (``None`` when it reports none) under ``environ``.
        """
        threads = _integer(environ, "NCCL_SOCKET_NTHREADS")
        per_thread = _integer(environ, "NCCL_NSOCKS_PERTHREAD")
        if threads is not None and threads > MAX_THREADS:
            logger.warning("NET/Socket : NCCL_SOCKET_NTHREADS is greater than the maximum "
                           "allowed, setting to %d", MAX_THREADS)
            threads = MAX_THREADS
        auto_threads, auto_per_thread = AUTO_SOCKETS.get(vendor or "", AUTO_SOCKETS_OTHER_NIC)
        threads = auto_threads if threads is None else threads
        per_thread = auto_per_thread if per_thread is None else per_thread
        if threads * per_thread > MAX_SOCKETS:
            per_thread = MAX_SOCKETS // threads
        channels = SEARCH_CHANNELS_ONE_NIC * CHANNELS_PER_SEARCH_CHANNEL
        most = _integer(environ, "NCCL_MAX_NCHANNELS")
        if most is not None:
            channels = min(channels, min(max(most, 1), MAX_CHANNELS))
        least = _integer(environ, "NCCL_MIN_NCHANNELS")
        if least is not None:
            channels = max(channels, min(max(least, 0), MAX_CHANNELS))
        return cls(channels=channels, data_sockets=max(threads * per_thread, 0),
                   ring_gb_s=ring_speed(speed_mbps))


def ring_speed(speed_mbps: int | None) -> float:
    """The search's ring speed through a NIC of ``speed_mbps``, in GB/s."""
    nic = (speed_mbps if speed_mbps and speed_mbps > 0 else DEFAULT_NIC_MBPS) / 8000
    return next((speed for speed in SPEEDS_GB_S if speed <= nic), SPEEDS_GB_S[-1])


def protocol(nbytes: int, transport: Transport) -> str:
    """The protocol the tuner picks for one all-reduce of ``nbytes``: the cheaper one."""
    costs = {}
    for candidate in (LL, SIMPLE):
        latency = (BASE_LATENCY_US[candidate]
                   + INTER_NODE_STEPS * NET_LATENCY_US[candidate])
        bandwidth = transport.ring_gb_s
        if candidate == LL:
            bandwidth *= LL_BANDWIDTH_SHARE
        elif nbytes // (transport.channels * RANKS) >= 64:
            latency *= RING_SIMPLE_PLATEAU
        costs[candidate] = latency + nbytes / (1000 * bandwidth)
    return min(costs, key=costs.get)


def _divup(a: int, b: int) -> int:
    return -(-a // b)


def tuned_channels(nbytes: int, channels: int, proto: str = SIMPLE) -> int:
    """
    The channels the tuner gives one all-reduce (``enqueue.cc``,
    ``topoGetAlgoInfo``): one fewer while the message is smaller than
    ``channels x threads x`` the protocol's thread threshold.
    """
    while channels >= 2 and nbytes < channels * RING_THREADS[proto] * THREAD_THRESHOLD[proto]:
        channels -= 1
    return channels


def channel_bytes(nbytes: int, channels: int, proto: str = SIMPLE) -> list[int]:
    """
    One all-reduce's bytes on each of ``channels`` (``enqueue.cc``'s
    continuous byte distribution for a lone collective): cells of 16 KiB of
    traffic (LL's counted four times over: 2 KiB of data, else 8 KiB), as
    many per channel as an even share of the traffic over the tuned channels
    needs, the last cell short; channels past the message carry nothing.
    """
    per_byte = ALLREDUCE_TRAFFIC_PER_BYTE * (4 if proto == LL else 1)
    cell = _divup(_divup(MIN_TRAFFIC_PER_CHANNEL, per_byte), 16) * 16
    cells = _divup(nbytes, cell)
    if not cells:
        return [0] * channels
    traffic = max(MIN_TRAFFIC_PER_CHANNEL, ALLREDUCE_TRAFFIC_PER_BYTE * nbytes)
    traffic_per_channel = max(MIN_TRAFFIC_PER_CHANNEL,
                              traffic // tuned_channels(nbytes, channels, proto))
    per_channel = min(cells, _divup(traffic_per_channel, cell * per_byte))
    low = cells if channels == 1 else per_channel
    middle, high = divmod(cells - low, per_channel)
    if (1 + middle + (high != 0)) > channels:
        # More than the channels hold: the middle ones and the last share the rest.
        middle = channels - 2
        per_channel = (cells - low) // (middle + 1)
        high = per_channel + (cells - low) % (middle + 1)
    if not high and middle:
        high, middle = per_channel, middle - 1
    split = [low * cell] + [per_channel * cell] * middle + ([high * cell] if high else [])
    split[-1] -= cells * cell - nbytes
    return split + [0] * (channels - len(split))


def _chunk_elements(remaining: int, chunk: int, element_bytes: int) -> int:
    """A loop's chunk: a full one, or half of a last, partial loop, aligned to 16 bytes."""
    if remaining >= RANKS * chunk:
        return chunk
    align = CHUNK_ALIGN_BYTES // element_bytes
    return _divup(_divup(remaining, RANKS), align) * align


def slices(chunk_bytes: int, element_bytes: int) -> list[int]:
    """A chunk's messages: ``SlicePerChunk`` of them, the later ones possibly empty."""
    per_chunk = ALLREDUCE_CHUNKSTEPS // ALLREDUCE_SLICESTEPS
    nelem = chunk_bytes // element_bytes
    step = BUFFSIZE // NCCL_STEPS // element_bytes
    size = max(_divup(nelem, 16 * per_chunk) * 16, step * ALLREDUCE_SLICESTEPS // 32)
    out, offset = [], 0
    for _ in range(per_chunk):
        part = min(size, nelem - offset)
        out.append(part * element_bytes)
        offset += part
    return out


@dataclass(frozen=True)
class Send:
    """
    One message: its bytes on the wire, the all-reduce's data in them, and how
    many of the peer's messages must have arrived before it goes.
    """

    nbytes: int
    after: int
    data: int


def ll_lines(data_bytes: int) -> int:
    """An LL message's bytes: a 16-byte line for every 8 bytes of data or part of them."""
    return _divup(data_bytes, LL_LINE_DATA_BYTES) * LL_LINE_BYTES


def ring_sends(nbytes: int, rank: int, element_bytes: int, proto: str = SIMPLE) -> list[Send]:
    """
    What ``rank`` sends on one channel carrying ``nbytes`` of the all-reduce,
    message by message (``runRing`` for two ranks).
    """
    if proto == LL:
        chunk_bytes = LL_BUFFSIZE // NCCL_STEPS // 2
        per_chunk = 1
    else:
        chunk_bytes = BUFFSIZE // NCCL_STEPS * ALLREDUCE_CHUNKSTEPS
        per_chunk = ALLREDUCE_CHUNKSTEPS // ALLREDUCE_SLICESTEPS
    chunk_elements = chunk_bytes // GRAIN_BYTES[proto] * GRAIN_BYTES[proto] // element_bytes
    count = nbytes // element_bytes
    sends: list[Send] = []
    received = 0
    for start in range(0, count, RANKS * chunk_elements):
        remaining = count - start
        chunk = _chunk_elements(remaining, chunk_elements, element_bytes)
        scattered = (rank + 1) % RANKS
        # Step 0 sends the next rank's chunk; step 1 reduces this rank's own
        # chunk, which the peer's step 0 brings, and sends the sum back.
        for index in (scattered, rank):
            size = max(min(chunk, remaining - index * chunk), 0) * element_bytes
            first = index == rank
            parts = [size] if proto == LL else slices(size, element_bytes)
            for number, part in enumerate(parts):
                wire = ll_lines(part) if proto == LL else part
                sends.append(Send(wire, received + (number + 1 if first else 0), part))
        received += 2 * per_chunk
    return sends


@dataclass(frozen=True)
class ChannelPlan:
    """One channel's share of an all-reduce for one rank: its sends, the peer's sizes."""

    sends: tuple[Send, ...]
    receives: tuple[int, ...]


def plan_allreduce(nbytes: int, rank: int, transport: Transport,
                   element_bytes: int) -> tuple[ChannelPlan, ...]:
    """Every channel's messages, both ways, for ``rank``'s side of one all-reduce."""
    peer = (rank + 1) % RANKS
    proto = protocol(nbytes, transport)
    return tuple(
        ChannelPlan(tuple(ring_sends(share, rank, element_bytes, proto)),
                    tuple(send.nbytes for send in ring_sends(share, peer, element_bytes, proto)))
        for share in channel_bytes(nbytes, transport.channels, proto))


def wire_segments(nbytes: int, data_sockets: int, next_socket: int
                  ) -> tuple[list[tuple[int, int]], int]:
    """
    One message on its connection's sockets: ``(socket, bytes)``, socket 0
    the control socket (whose segment starts with the size) and 1.. the data
    sockets, which take the tasks round-robin from ``next_socket``, the
    connection's rotation, which the returned value continues.
    """
    inline = nbytes if nbytes <= SOCKET_INLINE_BYTES else 0
    if not data_sockets:
        return [(0, SOCKET_CTRL_BYTES + nbytes)], next_socket
    segments = [(0, SOCKET_CTRL_BYTES + inline)]
    task = max(SOCKET_MIN_TASK_BYTES, _divup(nbytes - inline, data_sockets))
    for offset in range(inline, nbytes, task):
        segments.append((1 + next_socket, min(task, nbytes - offset)))
        next_socket = (next_socket + 1) % data_sockets
    return segments, next_socket


def wire_bytes(plan: tuple[ChannelPlan, ...]) -> int:
    """What one rank puts on the wire for its side of the plan, sizes included."""
    return sum(SOCKET_CTRL_BYTES + send.nbytes for channel in plan for send in channel.sends)
