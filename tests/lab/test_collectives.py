"""
The TP group's all-reduces on the lab's cable, as NCCL moves them.

Two ranks of the simulator (:mod:`lab.sglang_sim.group`), one in each
workstation's namespace, form their group over ``thunderbolt0`` as the served
TP ranks do; rank 0 then runs all-reduces, rank 1 joins each. Nothing is read
from the simulator's own accounting: the bytes are what ``ss`` shows each real
TCP socket carried, the losses what the receivers' counters and the senders'
TCP stacks show.

What the sockets should carry is the plan of :mod:`lab.sglang_sim.nccl`,
replayed here from its pure functions; that the plan is NCCL's (two ranks,
each sending ``2 (n-1)/n`` of the message each way) is asserted on the bytes.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest
from lab_helpers import counters, linked, load, wait_until

from lab.hostfs import MODEL_CONFIG
from lab.sglang_sim.args import default_chunked_prefill_size
from lab.sglang_sim.gpu import GPU_MEMORY_MIB
from lab.sglang_sim.link import ANNOUNCE, HEADER
from lab.sglang_sim.nccl import (
    RANKS,
    SOCKET_CTRL_BYTES,
    Transport,
    plan_allreduce,
    wire_segments,
)
from lab.topology import PYTHON, REPO, host_named

pytestmark = pytest.mark.usefixtures("restore_stock")
STORE_PORT = 29511
ELEMENT_BYTES = 2
# A message large enough for NCCL's Simple protocol on every channel.
LARGE = 64 << 20

RANK_SCRIPT = """
import sys
from lab.sglang_sim.group import NcclGroup, StoreClient, StoreServer
from lab.sglang_sim.link import PeerLost
rank, store, port = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if rank == 0:
    StoreServer(port)
group = NcclGroup(rank, StoreClient(store, port), "thunderbolt0")
link = group.data_link()
# The group's connections, control socket first, for the test to find in ss.
for direction, connections in (("send", group._send), ("receive", group._receive)):
    for channel, connection in enumerate(connections):
        for index, sock in enumerate(connection):
            local, peer = sock.getsockname()[:2], sock.getpeername()[:2]
            print(direction, channel, index, "%s:%d" % local, "%s:%d" % peer, flush=True)
print("formed", flush=True)
if rank == 0:
    for line in sys.stdin:
        nbytes, count = map(int, line.split())
        link.forward(0.0, nbytes, count)
        print("done", flush=True)
else:
    try:
        link.echo_forever()
    except PeerLost:
        pass
"""


def address(host: str) -> str:
    return host_named(host).link_address or ""


@dataclass
class Rank:
    """
    One rank's process, its output's lines as they come (read by a thread of
    their own, so that a wait for one is bounded), and its connections:
    ``(direction, channel, index)`` -> its local and peer addresses (a
    channel's accepted sockets share their local one).
    """

    process: subprocess.Popen[str]
    lines: queue.SimpleQueue[str] = field(default_factory=queue.SimpleQueue)
    sockets: dict[tuple[str, int, int], tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())
        self.lines.put("")

    def next_line(self, timeout: float) -> str:
        """The rank's next line; a failure with its stderr if it ended or said nothing in time."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"a rank said nothing for {timeout:g} s") from None
        if not line:
            self.process.wait(timeout=10)
            assert self.process.stderr is not None
            raise AssertionError(f"a rank exited {self.process.returncode}: "
                                 f"{self.process.stderr.read()}")
        return line


@dataclass
class Pair:
    """The two ranks, the transport they chose, and the all-reduces rank 0 has run."""

    ranks: tuple[Rank, Rank]
    transport: Transport
    runs: list[tuple[int, int]] = field(default_factory=list)

    def start(self, nbytes: int, count: int = 1) -> None:
        """Rank 0 begins ``count`` all-reduces of ``nbytes``, one after the other."""
        stdin = self.ranks[0].process.stdin
        assert stdin is not None
        stdin.write(f"{nbytes} {count}\n")
        stdin.flush()
        self.runs.append((nbytes, count))

    def finish(self, timeout: float = 120) -> None:
        """Wait for rank 0 to end what it began."""
        line = self.ranks[0].next_line(timeout)
        assert line == "done", f"rank 0 ended its all-reduces with {line!r}"

    def allreduce(self, nbytes: int, count: int = 1) -> None:
        self.start(nbytes, count)
        self.finish()


def start_rank(rank: int, host: str, environ: Mapping[str, str]) -> Rank:
    process = subprocess.Popen(
        ["ip", "netns", "exec", host, str(PYTHON), "-c", RANK_SCRIPT, str(rank),
         address("wsa"), str(STORE_PORT)],
        cwd=REPO, env={**os.environ, **environ}, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return Rank(process)


@contextmanager
def nccl_pair(environ: Mapping[str, str] | None = None) -> Iterator[Pair]:
    """Rank 0 on wsa, rank 1 on wsb, their group formed over the link; both stopped after."""
    environ = dict(environ or {})
    for host in ("wsa", "wsb"):
        wait_until(lambda host=host: linked(host), what=f"{host}'s link with its address")
    ranks = (start_rank(0, "wsa", environ), start_rank(1, "wsb", environ))
    try:
        for rank in ranks:
            while (line := rank.next_line(60)) != "formed":
                direction, channel, index, local, peer = line.split()
                rank.sockets[(direction, int(channel), int(index))] = (local, peer)
        # Both ranks read the same environment and the same kind of NIC.
        transport = Transport.from_env(environ, None, None)
        channels = {key[1] for key in ranks[0].sockets}
        assert len(channels) == transport.channels
        yield Pair(ranks, transport)
    finally:
        for rank in ranks:
            if rank.process.stdin:
                rank.process.stdin.close()
        for rank in ranks:
            try:
                rank.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                rank.process.kill()
                rank.process.wait()


# ss -tinH: a socket's line (state, queues, local and peer address), then its details.
SOCKET_LINE = re.compile(r"^(\S+)\s+\d+\s+\d+\s+(\S+)\s+(\S+)")


def socket_bytes(host: str) -> dict[tuple[str, str], dict[str, int]]:
    """What ``ss`` shows each established TCP socket of ``host`` carried, by its addresses."""
    out = subprocess.run(["ip", "netns", "exec", host, "ss", "-tinH"],
                         capture_output=True, text=True, timeout=10, check=True).stdout
    shown: dict[tuple[str, str], dict[str, int]] = {}
    addresses = None
    for line in out.splitlines():
        if matched := SOCKET_LINE.match(line):
            # A socket bound to its interface shows as address%interface:port.
            addresses = (tuple(re.sub(r"%[^:]+", "", each) for each in matched.group(2, 3))
                         if matched.group(1) == "ESTAB" else None)
            if addresses is not None:
                shown[addresses] = {}
        elif addresses is not None:
            shown[addresses].update({key: int(value) for key, value in
                                 re.findall(r"\b(bytes_acked|bytes_received):(\d+)", line)})
    return shown


def planned(pair: Pair, rank: int) -> Counter[tuple[int, int]]:
    """
    What ``rank`` should have put on each ``(channel, socket)`` of its sending
    connections: the byte that places each socket, rank 0's frame naming each
    all-reduce, and the plan's messages, each after its size on the control socket.
    """
    transport = pair.transport
    sockets = 1 + transport.data_sockets
    expected: Counter[tuple[int, int]] = Counter(
        {(channel, index): 1 for channel in range(transport.channels)
         for index in range(sockets)})
    rotation = [0] * transport.channels
    for nbytes, count in pair.runs:
        if rank == 0:
            expected[(0, 0)] += HEADER.size + ANNOUNCE.size
        plan = plan_allreduce(nbytes, rank, transport, ELEMENT_BYTES)
        for _ in range(count):
            for channel, share in enumerate(plan):
                for send in share.sends:
                    segments, rotation[channel] = wire_segments(
                        send.nbytes, transport.data_sockets, rotation[channel])
                    for index, size in segments:
                        expected[(channel, index)] += size
    return expected


def carried(pair: Pair, rank: int) -> Counter[tuple[int, int]]:
    """What the peer's receiving sockets got of ``rank``'s connections, socket by socket."""
    peer = pair.ranks[1 - rank]
    host = ("wsa", "wsb")[1 - rank]
    shown = socket_bytes(host)
    return Counter({(channel, index): shown[addresses].get("bytes_received", 0)
                    for (direction, channel, index), addresses in peer.sockets.items()
                    if direction == "receive"})


def messages(pair: Pair, rank: int) -> int:
    """How many NCCL messages ``rank`` sent for the all-reduces run so far."""
    total = 0
    for nbytes, count in pair.runs:
        plan = plan_allreduce(nbytes, rank, pair.transport, ELEMENT_BYTES)
        total += count * sum(len(share.sends) for share in plan)
    return total


def arrived(pair: Pair, rank: int) -> Counter[tuple[int, int]]:
    """What ``rank``'s sockets carried once all of what it should have sent has arrived."""
    expected = planned(pair, rank)
    wait_until(lambda: carried(pair, rank) == expected, timeout=30,
               what=f"rank {rank}'s bytes reaching its peer as planned")
    return carried(pair, rank)


@pytest.mark.parametrize("environ", [
    {},
    {"NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "2", "NCCL_MIN_NCHANNELS": "3"},
], ids=["defaults", "4-sockets-3-channels"])
def test_an_allreduce_moves_nccls_bytes_each_way_on_every_channel_and_socket(
        environ: dict[str, str]) -> None:
    """
    A large all-reduce: each rank puts on the wire ``2 (n-1)/n`` of the
    message (all of it, for two ranks) and a size before each message; every
    channel's connection carries an even share, and every socket of it its
    tasks. Then decode-sized ones, in NCCL's LL protocol (16-byte lines of 8
    bytes of data and their flags): every socket still carries what the plan
    says, to the byte.
    """
    with nccl_pair(environ) as pair:
        transport = pair.transport
        pair.allreduce(LARGE)
        sockets = transport.channels * (1 + transport.data_sockets)
        for rank in range(RANKS):
            got = arrived(pair, rank)
            framing = (HEADER.size + ANNOUNCE.size) if rank == 0 else 0
            sizes = SOCKET_CTRL_BYTES * messages(pair, rank)
            print(f"rank {rank}: {sum(got.values())} B on {len(got)} sockets, {dict(got)}")
            assert sum(got.values()) == sockets + framing + sizes + LARGE * 2 * (RANKS - 1) // RANKS
            assert all(got[(channel, index)] > 1 for channel in range(transport.channels)
                       for index in range(1 + transport.data_sockets)), got
            shares = [sum(size for (c, _), size in got.items() if c == channel)
                      for channel in range(transport.channels)]
            assert max(shares) - min(shares) <= LARGE // 100, shares
        decode_step = json.loads(MODEL_CONFIG)["hidden_size"] * ELEMENT_BYTES * 4
        pair.allreduce(decode_step, 16)
        for rank in range(RANKS):
            arrived(pair, rank)


def test_both_ranks_send_at_once() -> None:
    """
    Halfway through one large all-reduce, rank 0 has received about as much as
    it has sent: the ring's reduce-scatter and all-gather keep both directions
    busy at once, where a send-then-echo would have received nothing yet.
    """
    nbytes = 1 << 30
    with nccl_pair() as pair:
        sending = [addresses for (direction, _, _), addresses in pair.ranks[0].sockets.items()
                   if direction == "send"]
        receiving = [addresses for (direction, _, _), addresses in pair.ranks[0].sockets.items()
                     if direction == "receive"]
        samples = []
        pair.start(nbytes)
        while len(samples) < 400:
            shown = socket_bytes("wsa")
            sent = sum(shown[each].get("bytes_acked", 0) for each in sending)
            received = sum(shown[each].get("bytes_received", 0) for each in receiving)
            samples.append((sent / nbytes, received / nbytes))
            if sent >= nbytes and received >= nbytes:
                break
        pair.finish()
    midway = [(sent, received) for sent, received in samples if 0.25 <= sent <= 0.75]
    print(f"{len(samples)} samples, midway: {midway}")
    assert midway, samples
    assert all(received >= sent / 2 for sent, received in midway), midway


def prefill_chunk() -> tuple[int, int]:
    """One of SGLang's prefill chunks of the lab's model: its all-reduce's bytes, and how many."""
    config = json.loads(MODEL_CONFIG)
    tokens = default_chunked_prefill_size(GPU_MEMORY_MIB)
    return tokens * config["hidden_size"] * ELEMENT_BYTES, 2 * config["num_hidden_layers"]


def losses_during(run) -> dict[str, dict[str, int]]:
    """Each workstation's receiver errors and TCP retransmissions while ``run()`` ran."""
    before = {host: counters(host) for host in ("wsa", "wsb")}
    run()
    after = {host: counters(host) for host in ("wsa", "wsb")}
    return {host: {key: after[host][key] - before[host][key] for key in ("rx_errors", "retrans")}
            for host in ("wsa", "wsb")}


def test_a_long_prefill_overruns_the_stock_receivers_and_not_the_candidates() -> None:
    """
    One prefill chunk's all-reduces (two per layer, each the chunk's
    activations) under the stock driver: both receivers overrun, as both ranks
    send at once, and TCP retransmits. Under the candidate with ``tx_e2e=1`` at
    both ends the senders wait for credits: no receiver loses a frame.
    """
    nbytes, count = prefill_chunk()
    with nccl_pair() as pair:
        stock = losses_during(lambda: pair.allreduce(nbytes, count))
    print(f"stock, {count} all-reduces of {nbytes} B: {stock}")
    assert all(stock[host]["rx_errors"] > 0 for host in stock), stock
    assert sum(stock[host]["retrans"] for host in stock) > 0, stock
    for host in ("wsa", "wsb"):
        load(host, "candidate", "tx_e2e=1")
    with nccl_pair() as pair:
        candidate = losses_during(lambda: pair.allreduce(nbytes, count))
    print(f"candidate: {candidate}")
    assert all(candidate[host]["rx_errors"] == 0 for host in candidate), candidate
