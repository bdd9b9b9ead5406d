"""The TP2 link: rendezvous at ``--dist-init-addr`` and one all-reduce per decode step.

NCCL's Socket transport is plain TCP on the interface named by
``NCCL_SOCKET_IFNAME``; so is this. Rank 0 sends each step's payload and waits
for rank 1 to send as much back, so a step takes as long as the real link needs
to carry it, retransmissions included. A broken connection aborts both ranks,
as an NCCL error does.

Frames are a kind byte and a length; the payload is that many zero bytes.
"""

import logging
import socket
import struct
import time

logger = logging.getLogger(__name__)

READY, ALLREDUCE, HEARTBEAT = 1, 2, 3
HEADER = struct.Struct("!BQ")
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


def _tcp_socket(family: int, ifname: str | None) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM)
    if ifname:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, ifname.encode())
        except OSError as error:
            sock.close()
            message = f"cannot bind to interface {ifname} (NCCL_SOCKET_IFNAME): {error}"
            raise OSError(message) from error
    return sock


def _address(host: str, port: int) -> tuple[int, tuple]:
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    return family, sockaddr


def _log_interface(ifname: str | None) -> None:
    if ifname:
        logger.info("NCCL_SOCKET_IFNAME: using interface %s for the TP group", ifname)
    else:
        logger.info("NCCL_SOCKET_IFNAME is not set: the TP group uses the default route")


def accept_peer(host: str, port: int, ifname: str | None) -> "PeerLink":
    """Rank 0: listen at the rendezvous address until rank 1 joins."""
    _log_interface(ifname)
    family, sockaddr = _address(host, port)
    with _tcp_socket(family, ifname) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(sockaddr)
        listener.listen(1)
        listener.settimeout(PROGRESS_SECONDS)
        started = time.monotonic()
        while True:
            try:
                sock, peer = listener.accept()
                break
            except TimeoutError:
                waited = time.monotonic() - started
                if waited >= RENDEZVOUS_TIMEOUT_SECONDS:
                    raise TimeoutError(
                        f"rank 1 did not join at {host}:{port} within {waited:.0f} s"
                    ) from None
                logger.info("Waiting for rank 1 to join at %s:%d (%.0f s)", host, port, waited)
    logger.info("Rank 1 joined from %s:%d", peer[0], peer[1])
    return PeerLink(sock)


def connect_peer(host: str, port: int, ifname: str | None) -> "PeerLink":
    """Rank 1: connect to rank 0's rendezvous, retrying while it is not up yet."""
    _log_interface(ifname)
    family, sockaddr = _address(host, port)
    started = last_report = time.monotonic()
    while True:
        sock = _tcp_socket(family, ifname)
        sock.settimeout(PROGRESS_SECONDS)
        try:
            sock.connect(sockaddr)
        except OSError as error:
            sock.close()
            now = time.monotonic()
            if now - started >= RENDEZVOUS_TIMEOUT_SECONDS:
                raise TimeoutError(
                    f"rank 0 did not answer at {host}:{port} within {now - started:.0f} s: "
                    f"{error}"
                ) from error
            if now - last_report >= PROGRESS_SECONDS:
                logger.info("Waiting for rank 0 at %s:%d (%.0f s): %s",
                            host, port, now - started, error)
                last_report = now
            time.sleep(CONNECT_RETRY_SECONDS)
            continue
        logger.info("Joined rank 0 at %s:%d from %s", host, port, sock.getsockname()[0])
        sock.settimeout(None)
        return PeerLink(sock)


class PeerLink:
    """One TCP connection between the two ranks, carrying framed zero payloads."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock = sock
        self._zeros = memoryview(bytes(CHUNK_BYTES))
        self._scratch = memoryview(bytearray(CHUNK_BYTES))

    def set_timeout(self, seconds: float | None) -> None:
        """Bound every later send and receive, like the NCCL watchdog."""
        self._sock.settimeout(seconds)

    def send(self, kind: int, nbytes: int = 0) -> None:
        try:
            self._sock.sendall(HEADER.pack(kind, nbytes))
            for start in range(0, nbytes, CHUNK_BYTES):
                self._sock.sendall(self._zeros[:min(CHUNK_BYTES, nbytes - start)])
        except OSError as error:
            raise PeerLost(f"send to peer rank failed: {error}") from error

    def receive(self) -> tuple[int, int]:
        """The next frame's kind and payload length; the payload itself is discarded."""
        kind, nbytes = HEADER.unpack(self._read(HEADER.size))
        remaining = nbytes
        while remaining:
            remaining -= self._read_into(min(remaining, CHUNK_BYTES))
        return kind, nbytes

    def expect(self, kind: int) -> int:
        received, nbytes = self.receive()
        if received != kind:
            raise PeerLost(f"protocol error: expected frame {kind}, got {received}")
        return nbytes

    def allreduce(self, nbytes: int) -> int:
        """Rank 0's side of one step's exchange; the bytes moved both ways."""
        self.send(ALLREDUCE, nbytes)
        return nbytes + self.expect(ALLREDUCE)

    def heartbeat(self) -> None:
        """An empty exchange, so an idle rank 0 still notices a dead peer."""
        self.send(HEARTBEAT)
        self.expect(HEARTBEAT)

    def echo_forever(self) -> None:
        """Rank 1's side: answer every exchange in kind until the link breaks."""
        while True:
            kind, nbytes = self.receive()
            self.send(kind, nbytes)

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            count = self._read_into(size - len(data))
            data += self._scratch[:count]
        return bytes(data)

    def _read_into(self, size: int) -> int:
        try:
            count = self._sock.recv_into(self._scratch[:size])
        except OSError as error:
            raise PeerLost(f"receive from peer rank failed: {error}") from error
        if not count:
            raise PeerLost("connection closed by peer rank")
        return count
