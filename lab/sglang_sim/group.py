"""The TP group's sockets, opened where and as the real process tree opens them.

SGLang's server process starts one scheduler process per local rank
(``multiprocessing``, spawned; it dies with its parent). The scheduler joins
``torch.distributed`` and NCCL, so it, not the server's process, holds every
socket of the group:

- **torch's store** (``TCPStore``): rank 0 hosts it on every address at
  ``--dist-init-addr``'s port and connects to it as a client too, so rank 0
  holds both ends of one connection (``A:P <-> A:port``); rank 1 connects to
  it across the link. It stays open for the group's life.
- **NCCL's bootstrap** (``bootstrap.cc``): rank 0 listens as the root and
  publishes its address through the store (the ``ncclUniqueId``); each rank
  tells the root its addresses and hears from it, on connections that close,
  and then keeps a ring: one connection to the next rank, one from the
  previous, which with two ranks are both the peer.
- **NCCL's proxy** (``proxy.cc``): each rank listens for its proxy thread and
  connects to it (``ncclProxyConnect``): one more connection with both ends
  on the rank's own host, on rank 1 too.
- **NCCL's data**: per channel, the receiver listens and sends the sender its
  address over the bootstrap ring; the sender connects its connection's
  sockets, data sockets first and the control socket last, each saying its
  index in one byte (``net_socket.cc``). Two ranks on one NIC make two
  channels, each with a connection each way; a connection is one socket
  unless ``NCCL_SOCKET_NTHREADS`` and ``NCCL_NSOCKS_PERTHREAD`` add data
  sockets (:class:`lab.sglang_sim.nccl.Transport`).
- **Gloo's pair** (the TP group's CPU group, which SGLang broadcasts over):
  one connection between the two ranks, from the address of
  ``GLOO_SOCKET_IFNAME``'s interface, else the address the host's name
  resolves to (127.0.1.1 on Debian and Ubuntu, which cannot reach the peer).

NCCL's sockets take the address of the interface NCCL would choose
(:func:`lab.sglang_sim.link.nccl_endpoint`): its listeners are bound to that
address, and its connections to the peer also to the interface itself (a
connection to the rank's own address is not: the kernel delivers it on
loopback). The store's connections follow the routing table to
``--dist-init-addr``. The all-reduces use every channel's connections
(:class:`lab.sglang_sim.link.NcclLink`).

The server's process asks the scheduler process for a forward pass's
all-reduces over a pipe, one message per pass (SGLang's processes talk over
ZeroMQ ``ipc://`` sockets, which ``ss -t`` does not show either).
"""

import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import threading
from multiprocessing.connection import Connection

from lab.sglang_sim import nccl_log
from lab.sglang_sim.link import (
    ENDPOINT,
    READY,
    NcclLink,
    PeerLink,
    PeerLost,
    accept,
    address_of,
    connect,
    interface_address,
    listener,
    nccl_endpoint,
    nic_speed_mbps,
    nic_vendor,
    ubuntus_congestion_control,
)
from lab.sglang_sim.nccl import MAX_SOCKETS, Transport
from lab.sglang_sim.profiler import LATENESS

logger = logging.getLogger(__name__)

WORLD_SIZE = 2
NCCL_ID_KEY = "nccl_unique_id"
GLOO_KEY = "gloo/tp/0"
# prctl(2): a signal for this process when the thread that made it exits.
PR_SET_PDEATHSIG = 1


def name_of(sock: socket.socket) -> str:
    """A socket's own address as ``ip:port``, as NCCL hands addresses around."""
    host, port = sock.getsockname()[:2]
    return f"{host}:{port}"


def every_address(port: int) -> socket.socket:
    """
    A listener on every address, as torch's libuv ``TCPStore`` server binds:
    IPv6 and IPv4 at once (``::``, not v6-only) where the host has IPv6, else IPv4.
    """
    try:
        sock = socket.create_server(("::", port), family=socket.AF_INET6, backlog=16,
                                    reuse_port=False, dualstack_ipv6=True)
    except (OSError, ValueError):
        return listener("", port)
    return ubuntus_congestion_control(sock)


class StoreServer:
    """Rank 0's ``TCPStore``: ``set KEY VALUE`` and ``get KEY`` (which waits) per line."""

    def __init__(self, port: int) -> None:
        self._values: dict[str, str] = {}
        self._changed = threading.Condition()
        self._connections: list[socket.socket] = []
        self._listener = every_address(port)
        threading.Thread(target=self._accept, name="store", daemon=True).start()

    def _accept(self) -> None:
        while True:
            sock, _ = self._listener.accept()
            self._connections.append(sock)
            threading.Thread(target=self._serve, args=(sock,), name="store-client",
                             daemon=True).start()

    def _serve(self, sock: socket.socket) -> None:
        with sock.makefile("rw") as stream:
            for line in stream:
                command, _, rest = line.rstrip("\n").partition(" ")
                if command == "set":
                    key, _, value = rest.partition(" ")
                    with self._changed:
                        self._values[key] = value
                        self._changed.notify_all()
                elif command == "get":
                    with self._changed:
                        self._changed.wait_for(lambda key=rest: key in self._values)
                        value = self._values[rest]
                    stream.write(value + "\n")
                    stream.flush()


class StoreClient:
    """A rank's connection to the store, open for the group's life as torch's is."""

    def __init__(self, host: str, port: int) -> None:
        self._sock = connect((host, port), None, f"the store at {host}:{port}")
        self._stream = self._sock.makefile("rw")

    def set(self, key: str, value: str) -> None:
        self._stream.write(f"set {key} {value}\n")
        self._stream.flush()

    def get(self, key: str) -> str:
        self._stream.write(f"get {key}\n")
        self._stream.flush()
        value = self._stream.readline()
        if not value:
            raise PeerLost("the store closed its connection")
        return value.rstrip("\n")


def bootstrap_root(root: socket.socket) -> None:
    """
    NCCL's root thread: hear every rank's ring and reply addresses, then tell
    each rank its next rank's ring address, on connections that close.
    """
    rings, replies = {}, {}
    for _ in range(WORLD_SIZE):
        sock, _ = accept(root, "every rank at NCCL's bootstrap root")
        with sock, sock.makefile("r") as stream:
            rank, ring, reply = stream.readline().split()
        rings[int(rank)], replies[int(rank)] = ring, reply
    root.close()
    for rank in range(WORLD_SIZE):
        with connect(address_of(replies[rank]), None, f"rank {rank}'s bootstrap") as sock:
            sock.sendall(f"{rings[(rank + 1) % WORLD_SIZE]}\n".encode())


class NcclGroup:
    """One rank's NCCL communicator: its bootstrap ring, its proxy and its data connections."""

    def __init__(self, rank: int, store: StoreClient, ifname: str | None) -> None:
        chosen, address = nccl_endpoint(ifname)
        if rank == 0:
            root = listener(address)
            store.set(NCCL_ID_KEY, name_of(root))
            threading.Thread(target=bootstrap_root, args=(root,), name="bootstrap-root",
                             daemon=True).start()
        ring_listener, reply_listener = listener(address), listener(address)
        with connect(address_of(store.get(NCCL_ID_KEY)), None, "NCCL's bootstrap root",
                     source=address) as sock:
            sock.sendall(f"{rank} {name_of(ring_listener)} {name_of(reply_listener)}\n".encode())
        reply, _ = accept(reply_listener, "NCCL's bootstrap root to answer")
        with reply, reply.makefile("r") as stream:
            next_ring = stream.readline().strip()
        reply_listener.close()
        self.ring = PeerLink(connect(address_of(next_ring), chosen, "the next rank's bootstrap",
                                     source=address),
                             accept(ring_listener, "the previous rank's bootstrap")[0])
        self._proxy = Proxy(address)
        self._rank = rank
        self._transport = Transport.from_env(os.environ, nic_vendor(chosen),
                                             nic_speed_mbps(chosen))
        self._send, self._receive = self._connect_channels(address, chosen)
        nccl_log.channel_lines(rank, self._transport.channels)

    def _connect_channels(self, address: str, ifname: str) -> tuple[list, list]:
        """
        Each channel's receiver listens and hands its address over the
        bootstrap ring; each connection is ``[control, data...]``.
        """
        sockets = 1 + self._transport.data_sockets
        listeners = [listener(address, backlog=MAX_SOCKETS + 1)
                     for _ in range(self._transport.channels)]
        for each in listeners:
            self.ring.send_text(ENDPOINT, name_of(each))
        peers = [self.ring.receive_text(ENDPOINT) for _ in listeners]
        send = [self._connect(address_of(peer), ifname, address, sockets) for peer in peers]
        receive = [self._accept(each, sockets) for each in listeners]
        for each in listeners:
            each.close()
        return send, receive

    def _connect(self, peer: tuple, ifname: str, address: str, count: int) -> list:
        """One connection to the peer's channel: data sockets, then the control socket."""
        opened = []
        for index in range(count):
            sock = connect(peer, ifname, f"the peer's NCCL channel at {peer[0]}:{peer[1]}",
                           source=address)
            sock.sendall(bytes([index]))
            opened.append(sock)
        return [opened[-1], *opened[:-1]]

    def _accept(self, listening: socket.socket, count: int) -> list:
        """The peer's connection to this channel, each socket placed by the index it sends."""
        placed: list = [None] * count
        for _ in range(count):
            sock = accept(listening, "the peer's NCCL connection")[0]
            index = sock.recv(1)
            if not index:
                raise PeerLost("the peer closed an NCCL connection while opening it")
            placed[(index[0] + 1) % count] = sock
        return placed

    def data_link(self) -> NcclLink:
        """Every channel's connections: sent on those this rank opened, received on the peer's."""
        return NcclLink(self._rank, self._transport, self._send, self._receive)


class Proxy:
    """NCCL's proxy thread, and the rank's own connection to it."""

    def __init__(self, address: str) -> None:
        listening = listener(address)
        self._held: list[socket.socket] = []
        threading.Thread(target=self._serve, args=(listening,), name="nccl-proxy",
                         daemon=True).start()
        self._client = connect(listening.getsockname(), None, "NCCL's proxy", source=address)

    def _serve(self, listening: socket.socket) -> None:
        while True:
            sock, _ = listening.accept()
            self._held.append(sock)


def gloo_address() -> str:
    """Gloo's address: ``GLOO_SOCKET_IFNAME``'s interface's, else the host name's."""
    name = os.environ.get("GLOO_SOCKET_IFNAME")
    return interface_address(name) if name else socket.gethostbyname(socket.gethostname())


def gloo_pair(rank: int, store: StoreClient) -> socket.socket:
    """The two ranks' Gloo connection: rank 0 listens and publishes its address in the store."""
    address = gloo_address()
    if rank == 0:
        with listener(address) as listening:
            store.set(GLOO_KEY, name_of(listening))
            return accept(listening, "rank 1's Gloo pair")[0]
    return connect(address_of(store.get(GLOO_KEY)), None, "rank 0's Gloo pair", source=address)


def die_with_parent() -> None:
    """SGLang's ``kill_itself_when_parent_died``: a scheduler never outlives its server."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def scheduler_main(rank: int, host: str, port: int, ifname: str | None,
                   log_format: str, log_level: str, pipe: Connection) -> None:
    """
    The scheduler process: join the store and NCCL, say so, then run the
    server process's requests on the data link (rank 0) or answer rank 0's
    all-reduces until the link breaks (rank 1).
    """
    die_with_parent()
    logging.basicConfig(level=log_level.upper(), format=log_format, datefmt="%Y-%m-%d %H:%M:%S")
    try:
        # This frame holds them for the process's life: their sockets close when they go.
        server = StoreServer(port) if rank == 0 else None  # noqa: F841
        store = StoreClient(host, port)
        gloo = gloo_pair(rank, store)  # noqa: F841
        group = NcclGroup(rank, store, ifname)
        link = group.data_link()
    except (OSError, ValueError) as error:
        pipe.send(("failed", f"{type(error).__name__}: {error}"))
        raise SystemExit(1) from None
    pipe.send(("formed", None))
    serve_requests(link, pipe)  # returns only by raising SystemExit, with them still held


def serve_requests(link: NcclLink, pipe: Connection) -> None:
    """The server process's requests on the data link, until it or the link goes."""
    try:
        while True:
            request, *arguments = pipe.recv()
            if request == "echo":
                pipe.send(("ok", None))
                link.echo_forever()
            result = getattr(link, request)(*arguments)
            if request == "forward":
                # The pass's timers ran here: the server's /metrics reports them.
                result = (result, LATENESS.totals())
            pipe.send(("ok", result))
    except PeerLost as error:
        pipe.send(("lost", str(error)))
        raise SystemExit(1) from None
    except EOFError:
        raise SystemExit(0) from None


class SchedulerProcess:
    """
    The server process's handle on its scheduler process, with the data
    link's interface (:class:`NcclLink`'s ``send``, ``expect``, ``forward``,
    ``heartbeat``, ``set_timeout`` and the profiler's start and stop), each a
    request over the pipe.
    """

    def __init__(self, rank: int, host: str, port: int, ifname: str | None,
                 log_format: str, log_level: str) -> None:
        context = multiprocessing.get_context("spawn")
        self._pipe, child = context.Pipe()
        self._process = context.Process(
            target=scheduler_main, name=f"sglang::scheduler_TP{rank}", daemon=True,
            args=(rank, host, port, ifname, log_format, log_level, child))
        self._process.start()
        child.close()
        self.pid = self._process.pid

    def _ask(self, *request: object) -> object:
        try:
            if request:
                self._pipe.send(request)
            outcome, value = self._pipe.recv()
        except (EOFError, OSError):
            raise PeerLost(f"the scheduler process (pid {self.pid}) exited") from None
        if outcome == "failed":
            raise RuntimeError(f"the scheduler process could not join the TP group: {value}")
        if outcome == "lost":
            raise PeerLost(value)
        return value

    def formed(self) -> None:
        """Wait until the group has formed (the store, NCCL's bootstrap and channels)."""
        self._ask()

    def send(self, kind: int, nbytes: int = 0) -> None:
        self._ask("send", kind, nbytes)

    def expect(self, kind: int) -> int:
        return self._ask("expect", kind)

    def forward(self, seconds: float, nbytes: int, count: int = 1,
                element_bytes: int = 2) -> int:
        moved, timers = self._ask("forward", seconds, nbytes, count, element_bytes)
        LATENESS.mirror(timers)
        return moved

    def start_profile(self, output_dir: str | None, profile_id: str,
                      activities: list[str] | None = None) -> str | None:
        return self._ask("start_profile", output_dir, profile_id, activities)

    def stop_profile(self) -> list[str] | None:
        return self._ask("stop_profile")

    def heartbeat(self) -> None:
        self._ask("heartbeat")

    def set_timeout(self, seconds: float | None) -> None:
        self._ask("set_timeout", seconds)

    def echo_forever(self) -> None:
        """Rank 1: answer rank 0's all-reduces in the scheduler process until the link breaks."""
        self._ask("echo")
        self._ask()


__all__ = ["READY", "SchedulerProcess"]
