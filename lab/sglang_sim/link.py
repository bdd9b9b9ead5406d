"""The TP2 link's sockets and NCCL's choice of interface.

NCCL's Socket transport is plain TCP on the interface ``NCCL_SOCKET_IFNAME``
names; unset, NCCL picks one itself: the first that is neither loopback nor
docker nor virbr, in the kernel's order, which on a workstation is the LAN
port, not ``thunderbolt0`` (created later, at hotplug). Which sockets a group
opens, and in which process, is :mod:`lab.sglang_sim.group`'s.

Every forward pass's all-reduces travel on NCCL's data connections as NCCL
moves them (:mod:`lab.sglang_sim.nccl`): both ranks send at once, on every
channel the message reaches and every socket of its connections, in NCCL's
messages, each preceded by its size as NCCL's Socket transport writes it. So
a pass takes as long as the real link needs to carry it both ways,
retransmissions included. A broken connection aborts both ranks, as an NCCL
error does.

Rank 0 runs the scheduler; rank 1 follows it: before a pass's all-reduces,
rank 0 names the pass's GPU time and its all-reduces' size and count in a
frame on channel 0 (real ranks both know them from the model), and both ranks
spend that time before the all-reduces, as both GPUs compute their share at
once. Rank 0 also passes on ``/start_profile`` and ``/stop_profile``, as
SGLang's scheduler broadcasts its requests to the TP group: each rank records
its own kernels (:mod:`lab.sglang_sim.profiler`). Frames are a kind byte and a
length; the payload is that many zero bytes, or for ``ENDPOINT`` an address as
``ip:port``, for ``ALLREDUCE`` the GPU time, size, count and element size, for
``PROFILE`` a JSON request (rank 1 answers with the path of its trace).
"""

import fcntl
import json
import logging
import os
import select
import socket
import struct
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from lab.sglang_sim import nccl_log
from lab.sglang_sim.nccl import ChannelPlan, Transport, plan_allreduce, wire_segments
from lab.sglang_sim.profiler import ALLREDUCE_KERNEL, Profiler
from operations.serving.transport import UBUNTU_CONGESTION_CONTROL

logger = logging.getLogger(__name__)

READY, ALLREDUCE, HEARTBEAT, ENDPOINT, PROFILE = 1, 2, 3, 4, 5
HEADER = struct.Struct("!BQ")
# An ALLREDUCE frame's payload: the pass's GPU seconds, then one all-reduce's
# bytes, how many in a row, the element size.
ANNOUNCE = struct.Struct("!dQIB")
# What precedes each NCCL message on its control socket: its size, a C int in host order.
MESSAGE_SIZE = struct.Struct("=i")
# ioctl(2) request for an interface's IPv4 address (linux/sockios.h).
SIOCGIFADDR = 0x8915
RENDEZVOUS_TIMEOUT_SECONDS = 120.0
PROGRESS_SECONDS = 5.0
CONNECT_RETRY_SECONDS = 0.5
CHUNK_BYTES = 1 << 20


class PeerLost(ConnectionError):
    """The other rank is gone or the link stopped carrying data."""


def socket_ifname(value: str | None) -> str | None:
    """The interface ``NCCL_SOCKET_IFNAME`` names: ``name`` or ``=name`` (exact)."""
    if not value:
        return None
    name = value.removeprefix("=")
    if name.startswith("^") or "," in name or not name:
        raise ValueError(
            f"NCCL_SOCKET_IFNAME={value!r}: the simulator supports one interface "
            "name ('thunderbolt0' or '=thunderbolt0'), not lists or exclusions"
        )
    return name


def interface_address(ifname: str) -> str:
    """The interface's IPv4 address (``OSError`` if it has none)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("256s", ifname.encode()[:15])
        answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, request)
    return socket.inet_ntoa(answer[20:24])


def nccl_interface(ifname: str | None) -> str:
    """The interface NCCL's Socket transport uses: ``ifname``, else NCCL's own pick."""
    if ifname:
        return ifname
    for _, name in socket.if_nameindex():
        if name.startswith(("lo", "docker", "virbr")):
            continue
        try:
            interface_address(name)
        except OSError:
            continue
        return name
    return "lo"


def nic_vendor(ifname: str, sysfs: Path = Path("/sys/class/net")) -> str | None:
    """
    The interface's PCI vendor, as NCCL's Socket transport reads it to choose
    its sockets; ``None`` for an interface with none (a Thunderbolt link's
    device is an XDomain service, loopback has no device).
    """
    try:
        return (sysfs / ifname / "device" / "vendor").read_text().strip()[:6]
    except OSError:
        return None


def nic_speed_mbps(ifname: str, sysfs: Path = Path("/sys/class/net")) -> int | None:
    """
    The interface's speed, as NCCL's Socket transport reads it for its
    tuner; ``None`` where it reads none (thunderbolt_net reports no link
    speed before Linux 7.0; loopback none at all).
    """
    try:
        speed = int((sysfs / ifname / "speed").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return speed if speed > 0 else None


def ubuntus_congestion_control(sock: socket.socket) -> socket.socket:
    """
    Ask for the congestion control an Ubuntu host runs (CUBIC), as its TP
    group's sockets would; a kernel without it leaves the socket the default,
    which ``ss -ti`` then shows. A listener's connections inherit it.
    """
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION,
                        UBUNTU_CONGESTION_CONTROL.encode())
    except OSError as error:
        logger.warning("TCP congestion control %s unavailable (%s): the socket keeps the "
                       "default", UBUNTU_CONGESTION_CONTROL, error.strerror)
    return sock


def tcp_socket(ifname: str | None = None) -> socket.socket:
    sock = ubuntus_congestion_control(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
    if ifname:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
        except OSError as error:
            sock.close()
            message = f"cannot bind to interface {ifname} (NCCL_SOCKET_IFNAME): {error}"
            raise OSError(message) from error
    return sock


def nccl_endpoint(ifname: str | None) -> tuple[str, str]:
    """
    NCCL's interface and its address, logged as ``NCCL_DEBUG=INFO`` logs them. NCCL
    takes the interface's first address, or the first of ``NCCL_SOCKET_FAMILY``;
    the simulator's sockets are IPv4 only, so it refuses ``AF_INET6``.
    """
    family = os.environ.get("NCCL_SOCKET_FAMILY")
    if family not in (None, "AF_INET"):
        raise ValueError(f"NCCL_SOCKET_FAMILY={family!r}: the simulator's NCCL speaks IPv4 "
                         "only (unset, or AF_INET)")
    if not ifname:
        logger.info("NCCL_SOCKET_IFNAME is not set: NCCL picks the interface itself")
    chosen = nccl_interface(ifname)
    address = interface_address(chosen)
    nccl_log.info(f"NET/Socket : Using [0]{chosen}:{address}<0>", "INIT", "NET")
    nccl_log.info("Using network Socket", "INIT")
    return chosen, address


def listener(address: str, port: int = 0, backlog: int = 16) -> socket.socket:
    """A listening TCP socket at ``address:port`` (any port for 0), as NCCL binds its own."""
    return ubuntus_congestion_control(socket.create_server((address, port), backlog=backlog))


def accept(listening: socket.socket, what: str) -> tuple[socket.socket, tuple]:
    """The next connection, with progress, bounded by the rendezvous timeout."""
    listening.settimeout(PROGRESS_SECONDS)
    started = time.monotonic()
    while True:
        try:
            sock, peer = listening.accept()
        except TimeoutError:
            waited = time.monotonic() - started
            if waited >= RENDEZVOUS_TIMEOUT_SECONDS:
                raise TimeoutError(f"no {what} within {waited:.0f} s") from None
            logger.info("Waiting for %s (%.0f s)", what, waited)
            continue
        sock.settimeout(None)
        return sock, peer


def connect(sockaddr: tuple, ifname: str | None, what: str,
            source: str | None = None) -> socket.socket:
    """A connection to ``sockaddr``, retried while nothing listens there yet."""
    started = last_report = time.monotonic()
    while True:
        sock = tcp_socket(ifname)
        sock.settimeout(PROGRESS_SECONDS)
        try:
            if source:
                sock.bind((source, 0))
            sock.connect(sockaddr)
        except OSError as error:
            sock.close()
            now = time.monotonic()
            if now - started >= RENDEZVOUS_TIMEOUT_SECONDS:
                raise TimeoutError(f"{what} did not answer within {now - started:.0f} s: "
                                   f"{error}") from error
            if now - last_report >= PROGRESS_SECONDS:
                logger.info("Waiting for %s (%.0f s): %s", what, now - started, error)
                last_report = now
            time.sleep(CONNECT_RETRY_SECONDS)
            continue
        sock.settimeout(None)
        return sock


def address_of(text: str) -> tuple[str, int]:
    """``ip:port`` as a socket address."""
    host, _, port = text.rpartition(":")
    return host, int(port)


class PeerLink:
    """
    Framed zero payloads to the other rank: sent on one TCP connection, received
    on another (NCCL's bootstrap ring), or both on one.
    """

    def __init__(self, sock: socket.socket, receive_sock: socket.socket | None = None) -> None:
        self._sockets = [sock] if receive_sock is None else [sock, receive_sock]
        for each in self._sockets:
            each.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._receive_sock = sock, receive_sock or sock
        self._zeros = memoryview(bytes(CHUNK_BYTES))
        self._scratch = memoryview(bytearray(CHUNK_BYTES))

    def set_timeout(self, seconds: float | None) -> None:
        """Bound every later send and receive, like the NCCL watchdog."""
        for each in self._sockets:
            each.settimeout(seconds)

    def send(self, kind: int, nbytes: int = 0) -> None:
        self._sendall(HEADER.pack(kind, nbytes))
        for start in range(0, nbytes, CHUNK_BYTES):
            self._sendall(self._zeros[:min(CHUNK_BYTES, nbytes - start)])

    def send_text(self, kind: int, text: str) -> None:
        data = text.encode()
        self._sendall(HEADER.pack(kind, len(data)) + data)

    def receive_text(self, kind: int) -> str:
        _, nbytes = self._header(kind)
        return self._read(nbytes).decode()

    def receive(self, kind: int | None = None) -> tuple[int, int]:
        """
        The next frame's kind and payload length (of ``kind``, if given); the
        payload itself is discarded.
        """
        received, nbytes = self._header(kind)
        self._discard(nbytes)
        return received, nbytes

    def expect(self, kind: int) -> int:
        return self.receive(kind)[1]

    def _sendall(self, data: bytes | memoryview) -> None:
        try:
            self._sock.sendall(data)
        except OSError as error:
            raise PeerLost(f"send to peer rank failed: {error}") from error

    def _header(self, kind: int | None) -> tuple[int, int]:
        received, nbytes = HEADER.unpack(self._read(HEADER.size))
        if kind is not None and received != kind:
            raise PeerLost(f"protocol error: expected frame {kind}, got {received}")
        return received, nbytes

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            count = self._read_into(size - len(data))
            data += self._scratch[:count]
        return bytes(data)

    def _discard(self, nbytes: int) -> None:
        while nbytes:
            nbytes -= self._read_into(min(nbytes, CHUNK_BYTES))

    def _read_into(self, size: int) -> int:
        try:
            count = self._receive_sock.recv_into(self._scratch[:size])
        except OSError as error:
            raise PeerLost(f"receive from peer rank failed: {error}") from error
        if not count:
            raise PeerLost("connection closed by peer rank")
        return count


class _Segment:
    """
    Part of one NCCL message on one socket: on a control socket the message's
    size first (what is still to be sent, or still to arrive), then data.
    """

    def __init__(self, channel: int, message: int, nbytes: int, size: int | None) -> None:
        self.channel, self.message = channel, message
        self.header = memoryview(MESSAGE_SIZE.pack(size) if size is not None else b"")
        self.remaining = nbytes - len(self.header)


class NcclLink(PeerLink):
    """
    The group's data connections, every channel's, one way each: this rank
    sends on the sockets it opened (``send``) and receives on the peer's
    (``receive``); each connection is its control socket, then its data
    sockets. Frames travel on channel 0's control sockets.
    """

    def __init__(self, rank: int, transport: Transport,
                 send: Sequence[Sequence[socket.socket]],
                 receive: Sequence[Sequence[socket.socket]]) -> None:
        super().__init__(send[0][0], receive[0][0])
        self._rank, self._transport = rank, transport
        self._send, self._receive = send, receive
        self._all = [each for connection in (*send, *receive) for each in connection]
        for each in self._all:
            each.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Each connection's data-socket rotation, as NCCL's comm->nextSock.
        self._rotation = {("send", c): 0 for c in range(len(send))}
        self._rotation.update({("receive", c): 0 for c in range(len(receive))})
        self._timeout: float | None = None
        self.profiler = Profiler(rank)

    def set_timeout(self, seconds: float | None) -> None:
        self._timeout = seconds
        for each in self._all:
            each.settimeout(seconds)

    def forward(self, seconds: float, nbytes: int, count: int = 1,
                element_bytes: int = 2) -> int:
        """
        Rank 0's side of a forward pass: ``seconds`` of GPU time on both ranks,
        then ``count`` all-reduces of ``nbytes``, one after the other; the
        payload moved, both ways (each rank sends ``nbytes`` and receives as
        much for each).
        """
        payload = ANNOUNCE.pack(seconds, nbytes, count, element_bytes)
        self._sendall(HEADER.pack(ALLREDUCE, len(payload)) + payload)
        self._run(seconds, nbytes, count, element_bytes)
        return 2 * nbytes * count

    def start_profile(self, output_dir: str | None, profile_id: str,
                      activities: list[str] | None = None) -> str | None:
        """Both ranks start recording; why not, if this rank already records."""
        if refused := self.profiler.start_profile(output_dir, profile_id, activities):
            return refused
        self._ask_peer({"start": True, "output_dir": output_dir, "profile_id": profile_id,
                        "activities": activities})
        return None

    def stop_profile(self) -> list[str] | None:
        """Both ranks write their traces: their paths, or ``None`` if none was recording."""
        written = self.profiler.stop_profile()
        if written is None:
            return None
        return [*written, self._ask_peer({"start": False})]

    def _ask_peer(self, request: dict) -> str:
        self.send_text(PROFILE, json.dumps(request))
        return self.receive_text(PROFILE)

    def heartbeat(self) -> None:
        """An empty exchange, so an idle rank 0 still notices a dead peer."""
        self.send(HEARTBEAT)
        self.expect(HEARTBEAT)

    def echo_forever(self) -> None:
        """Rank 1's side: join every all-reduce, answer every other frame in kind."""
        while True:
            kind, nbytes = self._header(None)
            if kind == ALLREDUCE:
                self._run(*ANNOUNCE.unpack(self._read(nbytes)))
            elif kind == PROFILE:
                self.send_text(PROFILE, self._profile(json.loads(self._read(nbytes))))
            else:
                self._discard(nbytes)
                self.send(kind, nbytes)

    def _profile(self, request: dict) -> str:
        """Rank 1's side of rank 0's profile request: the path of the trace it wrote, if any."""
        if request["start"]:
            self.profiler.start(request["output_dir"], request["profile_id"],
                                request["activities"])
            return ""
        return str(self.profiler.stop() or "")

    def _run(self, seconds: float, nbytes: int, count: int, element_bytes: int) -> None:
        """The pass's GPU time, then its all-reduces, each a kernel of the profile."""
        self.profiler.compute(seconds)
        plan = plan_allreduce(nbytes, self._rank, self._transport, element_bytes)
        for each in self._all:
            each.setblocking(False)
        try:
            for _ in range(count):
                started = time.time()
                self.carry(plan)
                self.profiler.kernel(ALLREDUCE_KERNEL, started, time.time(),
                                     **{"In msg nelems": nbytes // element_bytes})
        finally:
            for each in self._all:
                each.settimeout(self._timeout)

    def carry(self, plan: tuple[ChannelPlan, ...]) -> None:
        """
        One all-reduce: every channel's sends and receives progressed at once
        on non-blocking sockets, as NCCL's proxy thread progresses them, each
        send held until the peer's messages it waits for have arrived. A send
        goes as soon as it may; the loop waits only for what is still to come
        (or for room to send).
        """
        outgoing: dict[socket.socket, deque[_Segment]] = {}
        incoming: dict[socket.socket, deque[_Segment]] = {}
        arrived = [0] * len(plan)
        released = [0] * len(plan)
        unfinished = [[0] * len(channel.receives) for channel in plan]
        for c, channel in enumerate(plan):
            for message, size in enumerate(channel.receives):
                for index, nbytes in self._segments("receive", c, size):
                    incoming.setdefault(self._receive[c][index], deque()).append(
                        _Segment(c, message, nbytes, size if index == 0 else None))
                    unfinished[c][message] += 1

        def release(c: int) -> None:
            sends = plan[c].sends
            ready = set()
            while released[c] < len(sends) and sends[released[c]].after <= arrived[c]:
                size = sends[released[c]].nbytes
                for index, nbytes in self._segments("send", c, size):
                    sock = self._send[c][index]
                    outgoing.setdefault(sock, deque()).append(
                        _Segment(c, released[c], nbytes, size if index == 0 else None))
                    ready.add(sock)
                released[c] += 1
            for sock in ready:
                self._push(sock, outgoing[sock])

        for c in range(len(plan)):
            release(c)
        poller = select.poll()
        timeout = -1 if self._timeout is None else int(self._timeout * 1000)
        while any(outgoing.values()) or any(incoming.values()):
            watched = {}
            for sock, queue in (*outgoing.items(), *incoming.items()):
                if queue:
                    watched[sock.fileno()] = sock
                    poller.register(sock, select.POLLOUT if sock in outgoing else select.POLLIN)
            events = poller.poll(timeout)
            for fd in watched:
                poller.unregister(fd)
            if not events:
                raise PeerLost(f"the peer rank made no progress for {self._timeout:.0f} s")
            for fd, _ in events:
                sock = watched[fd]
                if sock in outgoing:
                    self._push(sock, outgoing[sock])
                    continue
                channels = set()
                for c, message in self._pull(sock, incoming[sock]):
                    unfinished[c][message] -= 1
                    channels.add(c)
                for c in channels:
                    while arrived[c] < len(unfinished[c]) and not unfinished[c][arrived[c]]:
                        arrived[c] += 1
                    release(c)

    def _segments(self, direction: str, channel: int, size: int) -> list[tuple[int, int]]:
        key = (direction, channel)
        segments, self._rotation[key] = wire_segments(size, self._transport.data_sockets,
                                                      self._rotation[key])
        return segments

    def _push(self, sock: socket.socket, queue: deque[_Segment]) -> None:
        """Send as much of the queued segments as the socket takes, in one call."""
        pieces, room = [], CHUNK_BYTES
        for segment in queue:
            if room <= 0:
                break
            if segment.header:
                pieces.append(segment.header)
            data = min(segment.remaining, room)
            pieces.append(self._zeros[:data])
            room -= len(segment.header) + data
        try:
            count = sock.sendmsg(pieces)
        except BlockingIOError:
            return
        except OSError as error:
            raise PeerLost(f"send to peer rank failed: {error}") from error
        while count:
            segment = queue[0]
            taken = min(count, len(segment.header))
            segment.header = segment.header[taken:]
            count -= taken
            taken = min(count, segment.remaining)
            segment.remaining -= taken
            count -= taken
            if not segment.header and not segment.remaining:
                queue.popleft()

    def _pull(self, sock: socket.socket, queue: deque[_Segment]) -> list[tuple[int, int]]:
        """Read what the queued segments still lack; the channel and message of each completed."""
        wanted = sum(len(segment.header) + segment.remaining for segment in queue)
        try:
            count = sock.recv_into(self._scratch[:min(CHUNK_BYTES, wanted)])
        except BlockingIOError:
            return []
        except OSError as error:
            raise PeerLost(f"receive from peer rank failed: {error}") from error
        if not count:
            raise PeerLost("connection closed by peer rank")
        completed, offset = [], 0
        while offset < count:
            segment = queue[0]
            taken = min(count - offset, len(segment.header))
            if self._scratch[offset:offset + taken] != segment.header[:taken]:
                raise PeerLost(f"protocol error: channel {segment.channel}'s message "
                               f"{segment.message} is not of the planned size")
            segment.header = segment.header[taken:]
            offset += taken
            taken = min(count - offset, segment.remaining)
            segment.remaining -= taken
            offset += taken
            if not segment.header and not segment.remaining:
                queue.popleft()
                completed.append((segment.channel, segment.message))
        return completed
