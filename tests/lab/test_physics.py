"""
The lab's link physics: a receive ring that overruns, and credits that stop it.

Nothing here is a drop rule. Each receiver's ring (``lab.topology``: 256
frames of 4 KiB, drained at what one NAPI poll per throttled interrupt takes)
sits on the cable between the hosts; a sender on the wire's 20 Gb/s outruns it
only when its arrivals no longer fit, and the candidate with ``tx_e2e=1`` paces
itself to the receiver's credits. So these tests set a workload and read what
the real TCP stacks and the receivers' counters did with it: an idle link, a
burst that fits and one that does not, four flows under stock, under ``e2e=0``
and under the candidate.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from lab_helpers import counters, linked, load, wait_until

from lab import network
from lab.topology import LINK_INTERFACE, LINK_SPEED_GBPS, PYTHON, RING_BYTES, host_named

pytestmark = pytest.mark.usefixtures("restore_stock")
IPERF_PORT = 5202
BURST_PORT = 5203
DATAGRAM_BYTES = 60_000
# Sixteen rings back to back at 20 Gb/s into a ring drained at 16.4 Gbit/s: the
# backlog outgrows one ring before the burst ends.
OUTRUNS_RING = 16 * RING_BYTES // DATAGRAM_BYTES

BURST_SCRIPT = """
import socket, sys, time
mode, address, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if mode == "receive":
    # SO_RCVBUFFORCE (33, asm-generic/socket.h; Python does not name it): past rmem_max.
    sock.setsockopt(socket.SOL_SOCKET, 33, 64 << 20)
    sock.bind((address, port)); sock.settimeout(10)
    print("ready", flush=True)
    got = 0
    try:
        while sock.recv(1 << 16):
            got += 1; sock.settimeout(1)
    except TimeoutError:
        pass
    print(got)
else:
    # SO_SNDBUFFORCE (32): the whole burst may wait in the sender's queue.
    sock.setsockopt(socket.SOL_SOCKET, 32, 64 << 20)
    count, size = int(sys.argv[4]), int(sys.argv[5])
    block = b"x" * size
    for _ in range(count):
        sock.sendto(block, (address, port))
"""


def address(host: str) -> str:
    return host_named(host).link_address or ""


def settled(hosts: tuple[str, ...] = ("wsa", "wsb")) -> None:
    for host in hosts:
        # A reload by an earlier test leaves the link without its address until
        # the network manager applies it.
        wait_until(lambda host=host: linked(host), what=f"{host}'s link with its address")


def in_netns(host: str, *command: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", "netns", "exec", host, *command], capture_output=True,
                          text=True, timeout=timeout, check=True)


def deltas_while(run, sender: str, receiver: str) -> tuple[object, dict[str, int]]:
    """What ``run()`` returned; the receiver's errors and the sender's retransmissions meanwhile."""
    before = {sender: counters(sender), receiver: counters(receiver)}
    result, received_bytes = run()
    # The statistics files follow the real counters within a lab kernel tick.
    wait_until(lambda: counters(receiver)["rx_bytes"] - before[receiver]["rx_bytes"]
               >= received_bytes, what=f"{receiver}'s statistics catching up")
    after = {sender: counters(sender), receiver: counters(receiver)}
    return result, {"rx_errors": after[receiver]["rx_errors"] - before[receiver]["rx_errors"],
                    "retrans": after[sender]["retrans"] - before[sender]["retrans"]}


@pytest.fixture
def iperf_server() -> Iterator[None]:
    """One iperf3 server on each workstation's link address, stopped by pid after the test."""
    servers = [subprocess.Popen(["ip", "netns", "exec", host, "iperf3", "-s", "-B", address(host),
                                 "-p", str(IPERF_PORT)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL) for host in ("wsa", "wsb")]
    try:
        for host in ("wsa", "wsb"):
            wait_until(lambda host=host: f"{address(host)}:{IPERF_PORT}" in in_netns(
                host, "ss", "-Hltn").stdout, what=f"iperf3 listening on {host}")
        yield
    finally:
        for server in servers:
            server.terminate()
            server.wait(timeout=10)


def flows(sender: str, receiver: str, parallel: int = 4,
          seconds: int = 2) -> tuple[float, dict[str, int]]:
    """``parallel`` TCP flows for ``seconds``: Gbit/s delivered, and the counters' deltas."""
    def run() -> tuple[float, int]:
        out = in_netns(sender, "iperf3", "-J", "-c", address(receiver), "-p", str(IPERF_PORT),
                       "-P", str(parallel), "-t", str(seconds), timeout=seconds + 30).stdout
        received = json.loads(out)["end"]["sum_received"]
        return received["bits_per_second"] / 1e9, int(received["bytes"])
    gbps, deltas = deltas_while(run, sender, receiver)
    print(f"{parallel} flows {sender}->{receiver}: {gbps:.2f} Gbit/s, {deltas}")
    return gbps, deltas


def held_at_the_sender(host: str) -> None:
    """
    Hold what ``host`` sends in its own queue (a tbf at a trickle, long enough
    for a burst), so that a burst leaves at the wire's rate once let go: a loop
    in Python writes a 60 KB datagram no faster than the lab drains it.
    """
    in_netns(host, "tc", "qdisc", "replace", "dev", LINK_INTERFACE, "root", "tbf", "rate",
             "1mbit", "burst", f"{RING_BYTES}b", "limit", f"{64 * RING_BYTES}b")


def burst(datagrams: int) -> tuple[int, dict[str, int]]:
    """
    ``datagrams`` UDP datagrams wsa queues for wsb and then sends back to back
    at the wire's rate: how many arrived, and the deltas.
    """
    def run() -> tuple[int, int]:
        receiver = subprocess.Popen(
            ["ip", "netns", "exec", "wsb", str(PYTHON), "-c", BURST_SCRIPT, "receive",
             address("wsb"), str(BURST_PORT)], stdout=subprocess.PIPE, text=True)
        try:
            assert receiver.stdout and receiver.stdout.readline().strip() == "ready"
            held_at_the_sender("wsa")
            try:
                in_netns("wsa", str(PYTHON), "-c", BURST_SCRIPT, "send", address("wsb"),
                         str(BURST_PORT), str(datagrams), str(DATAGRAM_BYTES))
            finally:
                # Let go at the wire's rate (the tbf changed in place keeps its queue).
                network.shape_sender(host_named("wsa"), LINK_SPEED_GBPS)
            arrived = int(receiver.communicate(timeout=30)[0])
        finally:
            receiver.kill()
            # Back to the lab kernel's own stock sender on a 20 Gb/s wire: not shaped.
            network.shape_sender(host_named("wsa"), None)
        return arrived, arrived * DATAGRAM_BYTES
    arrived, deltas = deltas_while(run, "wsa", "wsb")
    print(f"burst of {datagrams} x {DATAGRAM_BYTES} B: {arrived} arrived, {deltas}")
    return arrived, deltas


def test_an_idle_stock_link_loses_nothing() -> None:
    """A probe every 10 ms never fills a ring: no loss, no receiver error, under stock."""
    settled()
    before = counters("wsb")["rx_errors"]
    out = in_netns("wsa", "ping", "-q", "-c", "100", "-i", "0.01", address("wsb")).stdout
    assert " 0% packet loss" in out, out
    assert counters("wsb")["rx_errors"] == before


def test_a_burst_that_fits_the_ring_arrives_and_one_that_outruns_it_loses_frames() -> None:
    """
    Under stock the sender is on the wire's rate, faster than the receiver
    drains: a burst the ring absorbs arrives whole, a burst several rings long
    overruns it, and the receiver counts what it lost.
    """
    settled()
    fits = RING_BYTES // DATAGRAM_BYTES
    arrived, deltas = burst(fits)
    assert (arrived, deltas["rx_errors"]) == (fits, 0)
    outruns = OUTRUNS_RING
    arrived, deltas = burst(outruns)
    assert arrived < outruns
    assert deltas["rx_errors"] == outruns - arrived


@pytest.mark.usefixtures("iperf_server")
def test_four_stock_flows_overrun_the_receiver_and_tcp_retransmits() -> None:
    """Sustained flows outrun the ring in each direction: errors there, retransmissions here."""
    settled()
    for sender, receiver in (("wsa", "wsb"), ("wsb", "wsa")):
        _, deltas = flows(sender, receiver)
        assert deltas["rx_errors"] > 0 and deltas["retrans"] > 0, (sender, deltas)


@pytest.mark.usefixtures("iperf_server")
def test_receive_side_e2e_off_is_no_better_than_stock() -> None:
    for host in ("wsa", "wsb"):
        load(host, "stock", "e2e=0")
    settled()
    _, deltas = flows("wsa", "wsb")
    assert deltas["rx_errors"] > 0 and deltas["retrans"] > 0


@pytest.mark.usefixtures("iperf_server")
def test_the_candidate_waits_for_credits_and_no_receiver_loses_a_frame() -> None:
    """
    With ``tx_e2e=1`` at both ends (each peer advertising E2E) each sender holds
    its frames until the receiver's ring has room: four flows each way and the
    burst that overran stock lose nothing.
    """
    for host in ("wsa", "wsb"):
        load(host, "candidate", "tx_e2e=1")
    settled()
    for sender, receiver in (("wsa", "wsb"), ("wsb", "wsa")):
        _, deltas = flows(sender, receiver)
        assert deltas["rx_errors"] == 0, (sender, deltas)
    outruns = OUTRUNS_RING
    arrived, deltas = burst(outruns)
    assert (arrived, deltas["rx_errors"]) == (outruns, 0)
