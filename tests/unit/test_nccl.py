"""The simulator's all-reduce as NCCL moves it: the plan as tables, then over real sockets."""

import socket
import threading
import time

import pytest

from lab.sglang_sim import nccl_log
from lab.sglang_sim.args import default_chunked_prefill_size
from lab.sglang_sim.engine import prefill_chunks
from lab.sglang_sim.link import NcclLink, PeerLost, nic_speed_mbps, nic_vendor
from lab.sglang_sim.model import ModelShape
from lab.sglang_sim.nccl import (
    LL,
    SIMPLE,
    SOCKET_CTRL_BYTES,
    Transport,
    channel_bytes,
    ll_lines,
    plan_allreduce,
    protocol,
    ring_sends,
    ring_speed,
    wire_bytes,
    wire_segments,
)

MIB = 1 << 20
# The lab's model (lab/hostfs.py): Qwen3-32B's shape, bf16 activations.
LAB_MODEL = ModelShape(layers=64, hidden_size=5120, activation_bytes=2, draft_layers=1,
                       kv_bytes_per_position=2 * 64 * 8 * 128 * 2, weight_bytes=15_187_500_000)


@pytest.mark.parametrize(("environ", "vendor", "channels", "data_sockets"), [
    # Any NIC but a cloud's: no helper thread, so the control socket carries the data.
    ({}, None, 2, 0),
    ({}, "0x8086", 2, 0),
    ({}, "0x1d0f", 2, 16),
    ({}, "0x1ae0", 2, 4),
    # Sockets per thread alone change nothing: the threads stay at 0.
    ({"NCCL_NSOCKS_PERTHREAD": "4"}, None, 2, 0),
    ({"NCCL_SOCKET_NTHREADS": "2"}, None, 2, 2),
    ({"NCCL_SOCKET_NTHREADS": "2", "NCCL_NSOCKS_PERTHREAD": "4"}, None, 2, 8),
    # At most 16 threads and 64 sockets.
    ({"NCCL_SOCKET_NTHREADS": "32", "NCCL_NSOCKS_PERTHREAD": "8"}, None, 2, 64),
    ({"NCCL_MIN_NCHANNELS": "4"}, None, 4, 0),
    ({"NCCL_MIN_NCHANNELS": "1"}, None, 2, 0),
    ({"NCCL_MAX_NCHANNELS": "1"}, None, 1, 0),
    ({"NCCL_MIN_NCHANNELS": "100"}, None, 64, 0),
])
def test_the_transport_is_what_nccl_2_27_5_chooses(environ, vendor, channels, data_sockets):
    assert Transport.from_env(environ, vendor) == Transport(channels, data_sockets)


@pytest.mark.parametrize(("files", "vendor", "speed"), [
    # A PCI NIC: its vendor and its speed.
    ({"device/vendor": "0x1d0f\n", "speed": "100000\n"}, "0x1d0f", 100_000),
    # thunderbolt0 before Linux 7.0: an XDomain service, no vendor, and no speed.
    ({"device/key": "network\n", "speed": "-1\n"}, None, None),
    # Loopback: no device, and reading its speed fails.
    ({}, None, None),
])
def test_nccl_reads_the_nics_vendor_and_speed_from_sysfs(tmp_path, files, vendor, speed):
    for name, text in files.items():
        (tmp_path / "nic" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "nic" / name).write_text(text)
    assert nic_vendor("nic", tmp_path) == vendor
    assert nic_speed_mbps("nic", tmp_path) == speed


def test_a_bad_nccl_integer_names_its_variable():
    with pytest.raises(ValueError, match="NCCL_MIN_NCHANNELS='many'"):
        Transport.from_env({"NCCL_MIN_NCHANNELS": "many"}, None)


@pytest.mark.parametrize(("gpu_mib", "tokens"), [
    (16_000, 2048), (32_607, 2048), (40_960, 4096), (81_920, 8192), (143_000, 8192),
    (190_000, 16384),
])
def test_sglang_0_5_9_chunks_prefill_by_gpu_memory(gpu_mib, tokens):
    assert default_chunked_prefill_size(gpu_mib) == tokens


@pytest.mark.parametrize(("tokens", "size", "chunks"), [
    (8000, 2048, [2048, 2048, 2048, 1856]),
    (2048, 2048, [2048]),
    (1, 2048, [1]),
    (0, 2048, []),
    (5000, -1, [5000]),
])
def test_prefill_runs_one_pass_per_chunk(tokens, size, chunks):
    assert prefill_chunks(tokens, size) == chunks


@pytest.mark.parametrize(("what", "positions", "nbytes"), [
    ("a decode step, one request", 1, 10_240),
    ("a NEXTN verify, 4 draft tokens", 4, 40_960),
    ("six requests verified together", 24, 245_760),
    ("a 2048-token prefill chunk", 2048, 20 * MIB),
])
def test_one_layers_all_reduce_carries_its_positions_activations(what, positions, nbytes):
    assert LAB_MODEL.allreduce_bytes(positions) == nbytes, what


@pytest.mark.parametrize(("speed_mbps", "gb_s"), [
    # thunderbolt0 reports no speed: NCCL assumes 10 Gb/s.
    (None, 1.2), (10_000, 1.2), (20_000, 2.4), (40_000, 3.0), (100_000, 12.0), (400_000, 48.0),
])
def test_the_ring_runs_at_the_searchs_speed_for_the_nic(speed_mbps, gb_s):
    assert ring_speed(speed_mbps) == gb_s


@pytest.mark.parametrize(("nbytes", "speed_mbps", "proto"), [
    # 16.6 us + size / 0.6 GB/s against 51 us + size / 1.2 GB/s: LL up to about 41 KB.
    (512, None, LL),
    (10_240, None, LL),
    (40_960, None, LL),
    (41_984, None, SIMPLE),
    (245_760, None, SIMPLE),
    (20 * MIB, None, SIMPLE),
    # A faster NIC moves the crossing: up to about 412 KB at 12 GB/s.
    (245_760, 100_000, LL),
    (MIB, 100_000, SIMPLE),
])
def test_the_tuner_picks_the_cheaper_protocol(nbytes, speed_mbps, proto):
    assert protocol(nbytes, Transport.from_env({}, None, speed_mbps)) == proto


@pytest.mark.parametrize(("nbytes", "channels", "proto", "split"), [
    # Under 2 channels x 256 threads x 64 bytes the tuner runs one channel.
    (512, 2, SIMPLE, [512, 0]),
    (32_767, 2, SIMPLE, [32_767, 0]),
    # Then an even share of the traffic each, in cells of 8 KiB, the last one short.
    (40_960, 2, SIMPLE, [24_576, 16_384]),
    (245_760, 2, SIMPLE, [122_880, 122_880]),
    (20 * MIB, 2, SIMPLE, [10 * MIB, 10 * MIB]),
    (20 * MIB, 4, SIMPLE, [5 * MIB] * 4),
    (20 * MIB + 2, 2, SIMPLE, [10 * MIB + 8192, 10 * MIB - 8190]),
    (0, 2, SIMPLE, [0, 0]),
    # LL counts its traffic four times over: cells of 2 KiB, and the first channel's
    # share of the tuned channels' traffic leaves the rest to the last.
    (512, 2, LL, [512, 0]),
    (10_240, 2, LL, [4_096, 6_144]),
    (40_960, 2, LL, [6_144, 34_816]),
    (40_960, 4, LL, [4_096, 12_288, 12_288, 12_288]),
])
def test_an_all_reduce_is_split_over_the_channels(nbytes, channels, proto, split):
    assert channel_bytes(nbytes, channels, proto) == split


def test_a_channel_sends_chunks_in_slices_the_all_gather_after_the_peers_scatter():
    """10 MiB on a channel: two loops of 2 MiB chunks, then a last loop of 1 MiB chunks."""
    sends = ring_sends(10 * MIB, 0, 2)
    assert [send.nbytes for send in sends] == [MIB] * 8 + [MIB // 2] * 4
    # Each loop: the scatter's two slices at once, then each gather slice after the
    # peer's matching scatter slice; a loop waits for all four of the last one's.
    assert [send.after for send in sends] == [0, 0, 1, 2, 4, 4, 5, 6, 8, 8, 9, 10]


@pytest.mark.parametrize(("nbytes", "rank", "proto", "sizes"), [
    # A chunk smaller than a 32 KiB slice goes whole, its second slice empty; with
    # an odd number of 16-byte units, rank 0 scatters the smaller half.
    (10_240, 0, SIMPLE, [5_120, 0, 5_120, 0]),
    (10_256, 0, SIMPLE, [5_120, 0, 5_136, 0]),
    (10_256, 1, SIMPLE, [5_136, 0, 5_120, 0]),
    (16, 0, SIMPLE, [0, 0, 16, 0]),
    (16, 1, SIMPLE, [16, 0, 0, 0]),
    # LL: one message a chunk, a 16-byte line for every 8 bytes; chunks of 32 KiB.
    (10_240, 0, LL, [10_240, 10_240]),
    (6_152, 0, LL, [6_128, 6_176]),
    (96 * 1024, 0, LL, [65_536, 65_536, 32_768, 32_768]),
])
def test_each_chunk_travels_in_the_protocols_messages(nbytes, rank, proto, sizes):
    assert [send.nbytes for send in ring_sends(nbytes, rank, 2, proto)] == sizes


def test_ll_lines_carry_8_bytes_of_data_in_16():
    assert [ll_lines(size) for size in (0, 1, 8, 9, 5_120)] == [0, 16, 16, 32, 10_240]


@pytest.mark.parametrize("transport", [Transport(), Transport(4, 0), Transport(2, 3)])
@pytest.mark.parametrize("nbytes", [512, 10_240, 40_960, 245_760, 20 * MIB, 20 * MIB + 2])
def test_each_rank_sends_and_receives_what_nccls_formula_says(transport, nbytes):
    """A ring of n ranks: each sends 2 (n-1)/n x size of data, which for two is the size."""
    ranks = [plan_allreduce(nbytes, rank, transport, 2) for rank in (0, 1)]
    lines = protocol(nbytes, transport) == LL
    for rank, plan in enumerate(ranks):
        sends = [send for channel in plan for send in channel.sends]
        assert sum(send.data for send in sends) == 2 * (2 - 1) * nbytes // 2
        peer = ranks[1 - rank]
        assert [channel.receives for channel in plan] == [
            tuple(send.nbytes for send in channel.sends) for channel in peer]
        # On the wire: each message's size first, and LL's flags beside its data.
        on_wire = sum(ll_lines(send.data) if lines else send.data for send in sends)
        assert wire_bytes(plan) == on_wire + SOCKET_CTRL_BYTES * len(sends)


@pytest.mark.parametrize(("nbytes", "data_sockets", "rotation", "segments", "after"), [
    # No data socket: the control socket carries the size and the data.
    (10_240, 0, 0, [(0, 4 + 10_240)], 0),
    (0, 0, 0, [(0, 4)], 0),
    # Up to 128 bytes travel inline with the size, whatever the sockets.
    (128, 4, 1, [(0, 4 + 128)], 1),
    # Tasks of at least 64 KiB, round-robin from where the connection left off.
    (100_000, 4, 3, [(0, 4), (4, 65_536), (1, 34_464)], 1),
    (MIB, 4, 0, [(0, 4), (1, MIB // 4), (2, MIB // 4), (3, MIB // 4), (4, MIB // 4)], 0),
])
def test_a_message_spreads_over_its_connections_sockets(nbytes, data_sockets, rotation,
                                                         segments, after):
    assert wire_segments(nbytes, data_sockets, rotation) == (segments, after)


class Recorded:
    """A socket that notes when it sent how much; everything else is the socket's."""

    def __init__(self, sock: socket.socket, log: list) -> None:
        self._sock, self._log = sock, log

    def sendmsg(self, buffers) -> int:
        count = self._sock.sendmsg(buffers)
        self._log.append((time.monotonic(), self, count))
        return count

    def __getattr__(self, name: str):
        return getattr(self._sock, name)


def connected(count: int, log: list) -> tuple[list, list]:
    """``count`` loopback connections: the connecting ends (recorded), the accepted ends."""
    opened, accepted = [], []
    with socket.create_server(("127.0.0.1", 0)) as listening:
        for _ in range(count):
            client = socket.create_connection(listening.getsockname())
            client.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 32 << 10)
            server, _ = listening.accept()
            server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 10)
            opened.append(Recorded(client, log))
            accepted.append(server)
    return opened, accepted


@pytest.fixture
def pair():
    """Two ranks' NcclLinks over loopback, rank 1 following in a thread; their send logs."""
    transport = Transport(channels=2, data_sockets=2)
    logs: tuple[list, list] = ([], [])
    sockets = 1 + transport.data_sockets
    zero_to_one = [connected(sockets, logs[0]) for _ in range(transport.channels)]
    one_to_zero = [connected(sockets, logs[1]) for _ in range(transport.channels)]
    rank0 = NcclLink(0, transport, [opened for opened, _ in zero_to_one],
                     [accepted for _, accepted in one_to_zero])
    rank1 = NcclLink(1, transport, [opened for opened, _ in one_to_zero],
                     [accepted for _, accepted in zero_to_one])
    rank0.set_timeout(10.0)
    outcome = []

    def follow() -> None:
        try:
            rank1.echo_forever()
        except PeerLost as error:
            outcome.append(error)

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    yield rank0, transport, logs, (zero_to_one, one_to_zero)
    # Rank 0 goes: rank 1 notices, as NCCL's error aborts the group.
    for opened, _ in zero_to_one:
        for each in opened:
            each.close()
    for _, accepted in one_to_zero:
        for each in accepted:
            each.close()
    follower.join(5)
    assert outcome, "rank 1 did not notice its peer had gone"
    for connection in (*zero_to_one, *one_to_zero):
        for each in (*connection[0], *connection[1]):
            each.close()


def sent_per_socket(log: list) -> dict:
    totals: dict = {}
    for _, sock, count in log:
        totals[sock] = totals.get(sock, 0) + count
    return totals


@pytest.mark.parametrize("nbytes", [4 * MIB, 40_960])
def test_every_channels_connections_carry_their_share_both_ways(pair, nbytes):
    rank0, transport, logs, (zero_to_one, one_to_zero) = pair
    for _ in range(2):
        logs[0].clear()
        logs[1].clear()
        assert rank0.forward(0.0, nbytes, 1, 2) == 2 * nbytes
        # Rank 1 answers a frame only once its side is done: its log is complete.
        rank0.heartbeat()
        for rank, connections, log in ((0, zero_to_one, logs[0]), (1, one_to_zero, logs[1])):
            sent = sent_per_socket(log)
            plan = plan_allreduce(nbytes, rank, transport, 2)
            for channel, (opened, _) in zip(plan, connections, strict=True):
                expected = [0] * len(opened)
                rotation = 0
                for send in channel.sends:
                    segments, rotation = wire_segments(send.nbytes, 2, rotation)
                    for index, size in segments:
                        expected[index] += size
                assert [sent.get(each, 0) for each in opened] == expected
                assert all(expected)
            # Nothing beyond NCCL's messages (the announce goes by sendall, unrecorded).
            assert sum(sent.values()) == wire_bytes(plan)


def test_both_ranks_send_at_once(pair):
    """Rank 1 starts sending long before rank 0 is half done: no echo of the whole message."""
    rank0, _, logs, _ = pair
    nbytes = 4 * MIB
    rank0.forward(0.0, nbytes, 1, 2)
    rank0.heartbeat()
    first_of_rank1 = logs[1][0][0]
    half_of_rank0 = next(moment for moment, total in running_totals(logs[0])
                         if total >= nbytes // 2)
    assert first_of_rank1 < half_of_rank0
    last_of_rank1 = logs[1][-1][0]
    assert logs[0][0][0] < last_of_rank1


def running_totals(log: list):
    total = 0
    for moment, _, count in log:
        total += count
        yield moment, total


@pytest.mark.parametrize(("environ", "subsystems", "written"), [
    ({}, ("INIT",), False),
    ({"NCCL_DEBUG": "WARN"}, ("INIT",), False),
    ({"NCCL_DEBUG": "info"}, ("INIT",), True),
    ({"NCCL_DEBUG": "INFO"}, ("NET",), False),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}, ("NET",), True),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "COLL"}, ("INIT", "NET"), False),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "ALL"}, ("NET",), True),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^INIT"}, ("INIT",), False),
    ({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "^COLL"}, ("INIT",), True),
])
def test_ncclss_info_lines_are_written_only_as_nccl_debug_asks(environ, subsystems, written):
    assert nccl_log.enabled(subsystems, environ) is written
