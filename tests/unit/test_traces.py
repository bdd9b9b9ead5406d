"""Where a token's time goes: the trace reader, the stalls, the profile window's parsers."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_measure_reports import measurement, window
from test_remote import fake_hosts  # noqa: F401 (the fixture)

from harness.measuring import profile, traces
from harness.reporting import compare, report
from lab.sglang_sim.profiler import ALLREDUCE_KERNEL, FORWARD_KERNEL, Profiler
from operations.serving import reading as serving_reading

BASE_NS = 1_765_000_000_000_000_000
AR = ALLREDUCE_KERNEL


def trace(*kernels: tuple[str, float, float], base: int | None = BASE_NS) -> dict:
    """A Kineto trace of ``(name, ts_us, dur_us)`` kernels, with CPU events beside them."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
               "ts": 0.0, "dur": 10_000.0}]
    events += [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts,
                "dur": dur, "args": {"device": 0, "stream": 7}} for name, ts, dur in kernels]
    events.append({"ph": "i", "cat": "kernel", "name": "marker", "ts": 5.0, "s": "t"})
    found = {"schemaVersion": 1, "traceEvents": events}
    if base is not None:
        found["baseTimeNanoseconds"] = base
    return found


def test_kernels_are_gpu_complete_events_counted_from_the_base_time():
    found = traces.kernels(trace(("b", 20.0, 5.0), (AR, 10.0, 2.5), base=BASE_NS))
    assert [(k.name, k.start_ns - BASE_NS, k.end_ns - BASE_NS) for k in found] == [
        (AR, 10_000, 12_500), ("b", 20_000, 25_000)]
    assert [k.allreduce for k in found] == [True, False]
    # A trace without a base time counts from zero.
    assert traces.kernels(trace(("b", 1.0, 1.0), base=None))[0].start_ns == 1_000


@pytest.mark.parametrize(("name", "allreduce"), [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", True),
    ("ncclKernel_AllReduce_RING_LL_Sum_bfloat16(ncclWorkElem)", True),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", False),
    ("sm90_xmma_gemm_bf16bf16_bf16f32", False),
    (FORWARD_KERNEL, False),
])
def test_an_allreduce_is_ncclss_all_reduce_kernel_in_either_naming(name, allreduce):
    assert traces.Kernel(name, 0, 1).allreduce is allreduce


# Three events of a real torch profiler trace of a two-rank NCCL all-reduce, as
# Kineto wrote them (facebookresearch/HolisticTraceAnalysis,
# tests/data/nccl_parser_config/nccl_data.json.gz; NCCL 2.17's kernel name):
# the kernel, its flow arrow and its launch on the CPU.
REAL_EXCERPT = """{"schemaVersion": 1, "traceName": "/tmp/tmpu3g3sevh.json",
 "displayTimeUnit": "ms", "baseTimeNanoseconds": 1696377600000000000, "traceEvents": [
  {
    "ph": "X", "cat": "kernel", "name": "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, \
unsigned long, ncclWork*)", "pid": 0, "tid": 40,
    "ts": 4458677009853.422, "dur": 2636.669,
    "args": {
      "External id": 12945,      "queued": 0, "device": 0, "context": 1,      "stream": 40, \
"correlation": 60047,      "registers per thread": 96,      "shared memory": 87568,      \
"blocks per SM": 0.074074,      "warps per SM": 1.259259,      "grid": [8, 1, 1],      \
"block": [544, 1, 1],      "est. achieved occupancy %": 0, "Collective name": "allreduce", \
"In msg nelems": 6637568, "Out msg nelems": 6637568, "Group size": 2, "dtype": "Float", \
"In split size": "[]", "Out split size": "[]", "Process Group Name": "0", \
"Process Group Description": "default_pg", "Process Group Ranks": "[0, 1]"
    }
  },
  {
    "ph": "f", "id": 60047, "pid": 0, "tid": 40, "ts": 4458677009853.422,
    "cat": "ac2g", "name": "ac2g", "bp": "e"
  },
  {
    "ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "pid": 2910249, \
"tid": 2919752,
    "ts": 4458677009840.015, "dur": 12.422,
    "args": {
      "External id": 12945,      "cbid": 430, "correlation": 60047
    }
  }
]}"""


def test_a_real_torch_trace_gives_its_one_nccl_kernel_and_no_cpu_event():
    (kernel,) = traces.kernels(traces.load(REAL_EXCERPT.encode()))
    assert kernel.allreduce
    assert kernel.seconds == pytest.approx(2636.669e-6)
    assert kernel.start_ns == 1696377600000000000 + 4458677009853422
    result = traces.breakdown([kernel], [])
    assert result["shares"] == {"allreduce": 1.0, "compute": 0.0, "idle": 0.0}
    assert result["allreduce"]["p50_ms"] == pytest.approx(2.636669)


def test_a_trace_is_read_gzipped_or_not_and_anything_else_is_refused():
    data = json.dumps(trace(("b", 1.0, 1.0))).encode()
    assert traces.load(gzip.compress(data)) == traces.load(data)
    for bad in (b"[]", b'{"events": []}'):
        with pytest.raises(ValueError, match="traceEvents"):
            traces.load(bad)


@pytest.mark.parametrize(("spans", "seconds"), [
    ([], 0.0),
    ([(0, 10), (20, 30)], 20e-9),
    ([(0, 10), (5, 15)], 15e-9),
    ([(0, 30), (5, 15), (20, 25)], 30e-9),
    ([(20, 30), (0, 10), (10, 20)], 30e-9),
])
def test_union_counts_overlaps_once(spans, seconds):
    assert traces.union_seconds(spans) == pytest.approx(seconds)


def test_a_ranks_span_splits_into_allreduce_compute_and_idle():
    # 0-40 us compute, 40-50 all-reduce, 50-60 idle, 60-90 compute, 90-100 all-reduce.
    found = traces.kernels(trace(("gemm", 0.0, 40.0), (AR, 40.0, 10.0), ("gemm", 60.0, 30.0),
                                 (AR, 90.0, 10.0)))
    result = traces.breakdown(found, [])
    assert result["span_seconds"] == pytest.approx(100e-6)
    assert result["shares"] == {"allreduce": pytest.approx(0.2), "compute": pytest.approx(0.7),
                                "idle": pytest.approx(0.1)}
    assert result["allreduce"]["count"] == 2
    assert result["allreduce"]["p50_ms"] == pytest.approx(0.010)
    assert result["stalls"]["count"] == 0
    assert traces.breakdown([], [])["error"].startswith("no GPU kernel: the server ran nothing")


def test_retransmissions_are_the_intervals_whose_total_grew():
    samples = [(0, 5), (100, 5), (200, 7), (300, 7), (400, 8)]
    assert traces.retransmission_intervals(samples) == [(100, 200), (300, 400)]
    assert traces.retransmission_intervals(samples[:1]) == []


def test_a_stall_is_five_medians_and_coincides_when_it_overlaps_a_retransmission():
    us = 1000
    # Nine all-reduces of 100 us; one of 50 ms (a stall), one of 400 us (not: under 5x).
    allreduces = [traces.Kernel(AR, i * 1000 * us, i * 1000 * us + 100 * us) for i in range(9)]
    stalled = traces.Kernel(AR, 20_000 * us, 70_000 * us)
    slow = traces.Kernel(AR, 80_000 * us, 80_400 * us)
    every = [*allreduces, stalled, slow]
    alone = traces.stalls(every, [])
    assert alone == {"count": 1, "seconds_lost": pytest.approx(0.0499),
                     "with_retransmissions": 0, "seconds_lost_with_retransmissions": 0}
    overlapping = traces.stalls(every, [(60_000 * us, 65_000 * us)])
    assert overlapping["with_retransmissions"] == 1
    assert overlapping["seconds_lost_with_retransmissions"] == pytest.approx(0.0499)
    # A retransmission elsewhere in the window does not make the stall its.
    assert traces.stalls(every, [(75_000 * us, 76_000 * us)])["with_retransmissions"] == 0


def test_the_simulators_trace_is_what_the_reader_reads(tmp_path):
    recorder = Profiler(rank=1)
    assert recorder.start(str(tmp_path / "out"), "1765.5")
    assert not recorder.start(str(tmp_path / "out"), "again")
    recorder.kernel(FORWARD_KERNEL, 1000.0, 1000.004)
    recorder.kernel(AR, 1000.004, 1000.005, bytes=40_960)
    path = recorder.stop()
    assert path == tmp_path / "out" / "1765.5-TP-1.trace.json.gz"
    assert recorder.stop() is None
    found = traces.kernels(traces.load(path.read_bytes()))
    assert [(k.name, k.allreduce) for k in found] == [(FORWARD_KERNEL, False), (AR, True)]
    assert found[0].start_ns == pytest.approx(1000.0 * 1e9, abs=1000)
    assert found[1].seconds == pytest.approx(0.001, abs=1e-6)
    shares = traces.breakdown(found, [])["shares"]
    assert shares["allreduce"] == pytest.approx(0.2, abs=0.001)
    # CPU activity alone records no GPU kernel.
    assert recorder.start(str(tmp_path / "cpu"), "2", activities=["CPU"])
    recorder.kernel(FORWARD_KERNEL, 1000.0, 1000.004)
    assert traces.kernels(traces.load(recorder.stop().read_bytes())) == []


NCCL_LINES = [
    "wsa:4100:4180 [0] NCCL INFO NET/Socket : Using [0]eno1:10.66.0.11<0>",
    "wsa:4100:4180 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    # The service's last start: the one that counts.
    "wsa:5200:5280 [0] NCCL INFO NET/Socket : Using [0]thunderbolt0:169.254.77.1<0>",
    "wsa:5200:5280 [0] NCCL INFO Using network Socket",
    "wsa:5200:5280 [0] NCCL INFO Channel 00/02 : 0 1",
    "wsa:5200:5280 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    "wsa:5200:5280 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0",
    "wsa:5200:5280 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    "wsa:5200:5280 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/Socket/0",
]


def test_ncclss_transport_is_read_from_its_last_start():
    said = profile.transport(NCCL_LINES)
    assert (said.interface, said.address, said.transports, said.channels) == (
        "thunderbolt0", "169.254.77.1", ("NET/Socket",), 2)
    assert said.words() == "NET/Socket on thunderbolt0 (169.254.77.1), 2 channels"
    assert said.lines[0].endswith("Using [0]thunderbolt0:169.254.77.1<0>")
    assert len(said.lines) == 5
    real = ("H20-GPU-06:4015540:4015653 [1] NCCL INFO 8 coll channels, 0 collnet channels, "
            "0 nvls channels, 8 p2p channels, 2 p2p channels per peer")
    assert profile.transport([*NCCL_LINES, real]).channels == 8
    assert "NCCL_DEBUG=INFO" in profile.transport([]).words()


SS_BLOCK = ("ESTAB 0 0 169.254.77.1:43210 169.254.77.2:5757\n"
            "\t cubic wscale:7,7 rto:204 retrans:0/{total} bytes_retrans:100 lost:0\n"
            "ESTAB 0 0 169.254.77.1:43211 169.254.77.2:5758\n"
            "\t cubic wscale:7,7 rto:204\n")


def test_samples_read_the_time_and_the_tp_sockets_retransmissions():
    output = "".join(f"{profile.SAMPLE_MARK}{at}\n" + SS_BLOCK.format(total=total) + ".\n"
                     for at, total in ((100, 3), (200, 3), (300, 9)))
    assert profile.parse_samples(output) == [(100, 3), (200, 3), (300, 9)]
    assert profile.parse_samples("") == []
    # A sample cut short by the stop (its second socket not read) is left out.
    cut = f"{profile.SAMPLE_MARK}400\n" + SS_BLOCK.format(total=9).splitlines(True)[0]
    assert profile.parse_samples(output + cut) == [(100, 3), (200, 3), (300, 9)]


def test_the_sampler_bounds_its_rounds_and_reads_the_peers_sockets():
    peer = SimpleNamespace(peer_link_address="169.254.77.2")
    script = profile.sampler_script(serving_reading.sockets(peer), 1.0)
    assert "-lt 21 " in script
    assert f"echo {profile.SAMPLE_END};" in script
    assert "dst 169.254.77.2" in script
    assert profile.SAMPLE_MARK in script


def test_fetched_traces_come_back_by_name_and_the_directory_is_removed():
    script = profile.fetch_script("/tmp/twinbolt-profile-ab; rm -rf /")
    assert "'/tmp/twinbolt-profile-ab; rm -rf /'/*.trace.json.gz" in script
    assert script.endswith("rm -rf '/tmp/twinbolt-profile-ab; rm -rf /'")
    data = gzip.compress(b'{"traceEvents": []}')
    output = (f"{profile.TRACE_MARK}1.5-TP-0.trace.json.gz\n"
              f"{base64.b64encode(data).decode()}\n")
    assert profile.parse_fetched(output) == {"1.5-TP-0.trace.json.gz": data}


def test_the_analysis_names_each_hosts_traces_and_what_could_not_be_read():
    good = gzip.compress(json.dumps(trace(("gemm", 0.0, 40.0), (AR, 40.0, 10.0))).encode())
    analysed = profile.analyse(
        {"wsa": {"1-TP-0.trace.json.gz": good}, "wsb": "ssh wsb: no answer", "wsc": {},
         "wsd": {"1-TP-1.trace.json.gz": b"not json"}},
        [[(0, 1), (100, 4)], [], [(0, 2), (50, 1), (100, 1)]])
    ranks = analysed["ranks"]
    assert ranks["wsa/1-TP-0.trace.json.gz"]["shares"]["allreduce"] == pytest.approx(0.2)
    assert ranks["wsb"] == {"error": "ssh wsb: no answer"}
    assert ranks["wsc"] == {"error": "no trace in the profile's directory"}
    assert "1-TP-1.trace.json.gz" in ranks["wsd/1-TP-1.trace.json.gz"]["error"]
    assert analysed["retransmissions_sampled"] == 3
    # Growth only: a count that seems to fall (a socket closed between samples) adds none.
    assert analysed["samples_taken"] == [2, 0, 3]


def profiled_report(state: str, allreduce_share: float, hosts: tuple[str, ...]) -> dict:
    """A measurement whose profile window read one trace per host, rank by rank."""
    ranks = {}
    for rank, host in enumerate(hosts):
        name = f"1.5-TP-{rank if state != 'production' else 0}.trace.json.gz"
        ranks[f"{host}/{name}"] = {
            "host": host, "trace": name, "kernels": 10, "span_seconds": 1.0,
            "shares": {"allreduce": allreduce_share, "compute": 0.9 - allreduce_share,
                       "idle": 0.1},
            "allreduce": {"count": 4, "p50_ms": 0.2, "p99_ms": 1.5, "kernels": [AR]},
            "stalls": {"count": 1, "seconds_lost": 0.01, "with_retransmissions": 1,
                       "seconds_lost_with_retransmissions": 0.01}}
    summary = {"ttft_seconds": 0.05, "completion_tokens": 32, "output_tok_s": 90.0,
               "ranks": ranks, "samples_taken": [9, 9], "retransmissions_sampled": 2,
               "nccl": {host: NCCL_LINES[2:] if state != "production" else [] for host in hosts}}
    built = measurement(state, 50.0, 200.0, 0, 0, None)
    built["windows"].append(window("profile", summary, 32, 1 << 20, 0, 0))
    return built


def test_a_reports_profile_gives_each_traces_shares_stalls_and_nccls_lines():
    text = report.markdown(profiled_report("tp2_e2e", 0.5, ("wsa", "wsb")))
    lines = text.split("## Where a token's time goes", 1)[1].splitlines()
    row = next(line for line in lines if line.startswith("| wsb/1.5-TP-1"))
    assert row.strip(" |").split(" | ")[1:9] == ["50.0%", "40.0%", "10.0%", "4", "0.200", "1.500",
                                     "1: 0.010 s", "1: 0.010 s"]
    assert "- wsa: NET/Socket on thunderbolt0 (169.254.77.1), 2 channels" in lines
    assert "(2 in this window)" in text


def test_a_comparison_splits_each_servers_time_over_its_trials():
    reports = [profiled_report("production", 0.0, ("wsa", "wsb")),
               profiled_report("tp2_e2e", 0.4, ("wsa", "wsb")),
               profiled_report("tp2_e2e", 0.6, ("wsa", "wsb"))]
    text = compare.comparison(reports)
    rows = {tuple(line.strip("| ").split(" | ")[:2]): line.strip("| ").split(" | ")
            for line in text.split("### Where a token's time goes", 1)[1].split("\n### ")[0]
            .splitlines() if line.startswith(("| production", "| tp2_e2e"))}
    assert sorted(rows) == [("production", "wsa, TP-0"), ("production", "wsb, TP-0"),
                            ("tp2_e2e", "wsa, TP-0"), ("tp2_e2e", "wsb, TP-1")]
    # The median over two trials, and their range.
    assert rows[("tp2_e2e", "wsb, TP-1")][2:4] == ["2", "50.0% (40.0%–60.0%)"]
    assert rows[("tp2_e2e", "wsb, TP-1")][-1] == (
        "wsb: NET/Socket on thunderbolt0 (169.254.77.1), 2 channels")
    assert rows[("production", "wsa, TP-0")][3] == "0.0% (0.0%–0.0%)"
    assert "NCCL logged nothing" in rows[("production", "wsa, TP-0")][-1]


def test_no_profile_window_no_section():
    assert "Where a token's time goes" not in compare.comparison(
        [measurement("tp2_e2e", 50.0, 200.0, 0, 0, None)])


def test_a_sampler_reads_the_sockets_until_stopped_and_its_loop_ends(fake_hosts):  # noqa: F811
    """Over ``ssh`` (here this machine's shell): samples as they come, none after the stop."""

    async def sample() -> list[tuple[int, int]]:
        sockets = serving_reading.sockets(SimpleNamespace(peer_link_address="192.0.2.7"))
        sampler = profile.Sampler("wsa", True, sockets, fake_hosts, seconds=3)
        await sampler.start()
        await asyncio.sleep(0.3)
        samples = await sampler.stop()
        assert sampler._process.returncode is not None
        return samples

    samples = asyncio.run(sample())
    # At least the first sample and those of 0.3 s at 50 ms apart, each time later
    # than the one before; no socket to a documentation address, so no retransmission.
    assert len(samples) >= 4
    assert [at for at, _ in samples] == sorted(at for at, _ in samples)
    assert {total for _, total in samples} == {0}


def test_a_sampler_that_never_started_stops_with_nothing():
    sampler = profile.Sampler("wsa", False, "192.0.2.7", Path("/nonexistent"), seconds=1)
    assert asyncio.run(sampler.stop()) == []
