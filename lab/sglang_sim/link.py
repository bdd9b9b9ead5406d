"""The TP2 link's sockets and NCCL's choice of interface.

NCCL's Socket transport is plain TCP on the interface ``NCCL_SOCKET_IFNAME``
names; unset, NCCL picks one itself: the first that is neither loopback nor
docker nor virbr, in the kernel's order, which on a workstation is the LAN
port, not ``thunderbolt0`` (created later, at hotplug). Which sockets a group
opens, and in which process, is :mod:`lab.sglang_sim.group`'s.

Every decode step's all-reduces travel on NCCL's data connections: rank 0
sends the step's payload on the connection it opened to rank 1 and waits for
rank 1 to send as much back on the one rank 1 opened, so a step takes as long
as the real link needs to carry it, retransmissions included. A broken
connection aborts both ranks, as an NCCL error does.

Frames are a kind byte and a length; the payload is that many zero bytes, or
for ``ENDPOINT`` an address as ``ip:port``.
"""

import fcntl
import logging
import os
import socket
import struct
import time

logger = logging.getLogger(__name__)

READY, ALLREDUCE, HEARTBEAT, ENDPOINT = 1, 2, 3, 4
HEADER = struct.Struct("!BQ")
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


def tcp_socket(ifname: str | None = None) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
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
    NCCL's interface and its address, logged as NCCL_DEBUG=INFO logs them. NCCL
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
    logger.info("NCCL INFO NET/Socket : Using [0]%s:%s<0>", chosen, address)
    return chosen, address


def listener(address: str, port: int = 0) -> socket.socket:
    """A listening TCP socket at ``address:port`` (any port for 0), as NCCL binds its own."""
    return socket.create_server((address, port), backlog=16)


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
    on another (NCCL's send and receive connections), or both on one.
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
        remaining = nbytes
        while remaining:
            remaining -= self._read_into(min(remaining, CHUNK_BYTES))
        return received, nbytes

    def expect(self, kind: int) -> int:
        return self.receive(kind)[1]

    def allreduce(self, nbytes: int, count: int = 1) -> int:
        """Rank 0's side of ``count`` exchanges, one after the other; the bytes moved both ways."""
        moved = 0
        for _ in range(count):
            self.send(ALLREDUCE, nbytes)
            moved += nbytes + self.expect(ALLREDUCE)
        return moved

    def heartbeat(self) -> None:
        """An empty exchange, so an idle rank 0 still notices a dead peer."""
        self.send(HEARTBEAT)
        self.expect(HEARTBEAT)

    def echo_forever(self) -> None:
        """Rank 1's side: answer every exchange in kind until the link breaks."""
        while True:
            kind, nbytes = self.receive()
            self.send(kind, nbytes)

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

    def _read_into(self, size: int) -> int:
        try:
            count = self._receive_sock.recv_into(self._scratch[:size])
        except OSError as error:
            raise PeerLost(f"receive from peer rank failed: {error}") from error
        if not count:
            raise PeerLost("connection closed by peer rank")
        return count
