"""
Whether a window was measured clean (harness/judging/disturbance.py): the judge, its
readings, and the figures it leaves out.
"""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys

import httpx
import pytest
from simulator import simulator
from test_measure_reports import campaign_reports

from harness.hosts import counters
from harness.hosts.counters import LinkSnapshot
from harness.judging import disturbance
from harness.judging.disturbance import Process
from harness.measuring import server_stats
from harness.measuring.server_stats import ServerSnapshot
from harness.reporting import compare
from harness.reporting.report import headline, markdown
from operations.serving.neighbours import ProcessCpu
from operations.serving.transport import SOCKET_COUNTERS

MIB = 1024 * 1024
CLEAN = {"cpu_seconds": 0.05, "link_bytes": 4096, "gpu": []}
SITE_JOB = {"pid": 9001, "used_mib": 4000, "lineage": [9001, 1],
            "command": "python train.py"}


@pytest.mark.parametrize(("wsa", "machine", "seconds", "disturbed"), [
    (CLEAN, 0.1, 10.0, []),
    # A job beside the servers: 0.8 of a core through a 10 s window.
    ({**CLEAN, "cpu_seconds": 8.0}, 0.1, 10.0,
     ["wsa: processes other than the state's servers used 0.80 cores"]),
    # Someone's transfer over the cable.
    ({**CLEAN, "link_bytes": 50 * MIB}, 0.1, 10.0,
     ["wsa: the link carried 50.0 MiB beyond the TP group's sockets"]),
    ({**CLEAN, "gpu": ["pid 9001 (python train.py) holds 4000 MiB of GPU memory"]}, 0.1, 10.0,
     ["wsa: pid 9001 (python train.py) holds 4000 MiB"]),
    # This machine, where the client takes its timestamps.
    (CLEAN, 9.5, 10.0, ["this machine: processes outside the measurement used 0.95 cores"]),
    # A short window is not judged by the noise of reading the hosts.
    ({**CLEAN, "cpu_seconds": 0.1}, 0.1, 0.2, []),
    # Unknown readings judge nothing.
    ({"cpu_seconds": None, "link_bytes": None, "gpu": []}, None, 10.0, []),
], ids=["clean", "cpu-busy", "foreign-link-bytes", "foreign-gpu-process", "machine-busy",
        "short-window", "unknown"])
def test_the_judge_names_each_reading_past_its_threshold(
        wsa: dict, machine: float | None, seconds: float, disturbed: list[str]) -> None:
    found = disturbance.reasons({"wsa": wsa, "wsb": CLEAN}, machine, seconds)
    assert len(found) == len(disturbed)
    for reason, expected in zip(found, disturbed, strict=True):
        assert reason.startswith(expected)


def snapshot(at: float, others: float, tx: int, rx: int, sockets: dict,
             gpu: list | None = None) -> LinkSnapshot:
    return LinkSnapshot("wsa", at, counters={"tx_bytes": tx, "rx_bytes": rx},
                        cpu={"servers": 100.0, "others": others,
                             "pids": {"sglang-tp2-rank0": 4242}},
                        sockets=sockets, gpu=gpu or [])


def socket(sent: int, received: int, segments: int) -> dict:
    return {**dict.fromkeys(SOCKET_COUNTERS, 0), "bytes_sent": sent,
            "bytes_received": received, "segs_out": segments, "segs_in": segments}


def test_a_hosts_reading_is_what_others_did_between_two_snapshots() -> None:
    tp = "169.254.77.1:5757>169.254.77.2:42304"
    before = snapshot(0.0, 20.0, 1_000, 1_000, {tp: socket(0, 0, 0)})
    # 100 MB each way over 10,000 segments each way, and 5 MiB of someone else's.
    wire = 2 * (100_000_000 + 10_000 * counters.SEGMENT_HEADER_BYTES)
    own = [{"pid": 4250, "used_mib": 28000, "lineage": [4250, 4242, 1], "command": "sglang"}]
    after = snapshot(10.0, 21.5, 1_000 + wire // 2 + 5 * MIB, 1_000 + wire // 2,
                     {tp: socket(100_000_000, 100_000_000, 10_000)}, [*own, SITE_JOB])
    reading = disturbance.host_reading(before, after, counters.delta(before, after))
    assert reading["cpu_seconds"] == pytest.approx(1.5)
    # The sockets' own bytes and headers, and the slack for options, are not foreign.
    slack = round(wire * disturbance.LINK_SLACK)
    assert reading["link_bytes"] == max(0, 5 * MIB - slack)
    # The server's child is the state's; the site's job is not.
    assert reading["gpu"] == ["pid 9001 (python train.py) holds 4000 MiB of GPU memory and "
                              "was not started by twinbolt"]


def test_a_socket_closed_inside_the_window_leaves_the_links_reading_unknown() -> None:
    tp = "169.254.77.1:5757>169.254.77.2:42304"
    before = snapshot(0.0, 20.0, 0, 0, {tp: socket(10, 10, 1)})
    after = snapshot(10.0, 20.0, 90 * MIB, 90 * MIB, {})
    assert disturbance.host_reading(before, after, counters.delta(before, after))[
        "link_bytes"] is None


def test_this_machines_others_are_its_network_namespaces_processes_outside_mine() -> None:
    found = {
        1: Process(0, 100, "net:[1]"),
        500: Process(1, 7, "net:[1]"),        # a shell beside the measurement
        600: Process(1, 3, "net:[1]"),        # the measurement
        601: Process(600, 9, "net:[1]"),      # its ssh to a host
        602: Process(601, 2, "net:[1]"),
        700: Process(1, 50, "net:[2]"),       # a lab host, in a network of its own
        800: Process(1, 4, None),             # another user's: its namespace unread
    }
    assert disturbance.others(found, 600, "net:[1]") == {1, 500, 800}


def test_the_measurements_children_are_its_own_and_everything_else_is_counted() -> None:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        found = disturbance.processes()
        net = os.readlink("/proc/self/ns/net")
        # Spawned by this process: the measurement's own, not counted.
        assert sleeper.pid not in disturbance.others(found, os.getpid(), net)
        # Were the sleeper the measurement, this process would be someone else's load.
        assert os.getpid() in disturbance.others(found, sleeper.pid, net)
        assert disturbance.machine_cpu_seconds() > 0
    finally:
        sleeper.kill()
        sleeper.wait(timeout=10)


# A server's child that uses a third of a CPU second, then waits.
BURN = ("import time\nwhile time.process_time() < 0.3: pass\n"
        "print('burnt', flush=True)\ntime.sleep(30)\n")


def test_the_workstations_reading_gives_a_servers_descendants_cpu_to_the_servers(
        tmp_path) -> None:
    """The fact's own script, run here: a 'server' whose grandchild burns CPU."""
    (tmp_path / "burn.py").write_text(BURN)
    server = subprocess.Popen(["sh", "-c", f"{sys.executable} {tmp_path / 'burn.py'} & wait"],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    sv = tmp_path / "sv"
    sv.write_text(f"#!/bin/sh\necho 'run: /etc/service/x: (pid {server.pid}) 1s'\n")
    sv.chmod(0o755)
    environment = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}

    def read(*services: str) -> dict | None:
        command = ProcessCpu().command(services, "runit").get_raw_value()
        output = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                env=environment, check=True)
        return ProcessCpu().process(output.stdout.splitlines())
    try:
        assert server.stdout.readline().strip() == "burnt"
        served = read("x")
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=10)
    assert served is not None and served["servers"] >= 0.29
    assert served["pids"] == {"x": server.pid}
    assert served["others"] > 0


def with_disturbed(report: dict, name: str) -> dict:
    report = copy.deepcopy(report)
    for window in report["windows"]:
        if window["name"] == name:
            window["disturbed"] = "wsa: processes other than the state's servers used 0.80 cores"
    return report


def test_a_disturbed_window_gives_no_figure_and_the_verdict_says_on_how_many_trials() -> None:
    reports = campaign_reports()
    stock = [report for report in reports if report["state"] == "tp2_stock"]
    e2e = [report for report in reports if report["state"] == "tp2_e2e"]
    assert headline(with_disturbed(e2e[0], "single"))["single_tok_s"] is None
    text = compare.comparison([*stock, with_disturbed(e2e[0], "single"), *e2e[1:]])
    row = next(line for line in text.splitlines() if line.startswith("| tp2_e2e |"))
    assert "(rests on 2 of 3 trials here)" in row


def test_a_report_says_first_whether_the_machine_was_quiet_and_names_each_disturbed_window(
        ) -> None:
    report = campaign_reports()[0]
    quiet = markdown(report)
    assert "- quiet: none of the" in quiet
    loud = markdown(with_disturbed(report, "single"))
    assert "- **not quiet**: 1 of" in loud
    assert "| single (disturbed) |" in loud
    assert "- single: wsa: processes other than the state's servers used 0.80 cores" in loud
    assert "What makes a window disturbed:" in loud


def test_the_simulators_timer_lateness_is_read_per_window_and_judged() -> None:
    before = [ServerSnapshot("rank0", timers=1000.0, timer_late_seconds=0.1)]
    quiet = [ServerSnapshot("rank0", timers=2000.0, timer_late_seconds=0.2)]
    late = [ServerSnapshot("rank0", timers=2000.0, timer_late_seconds=5.1)]
    assert server_stats.window_timer_lateness(before, quiet) == pytest.approx(0.0001)
    assert server_stats.window_timer_lateness(before, late) == pytest.approx(0.005)
    # A real server says nothing of its timers: nothing is judged.
    assert server_stats.window_timer_lateness([ServerSnapshot("s")], [ServerSnapshot("s")]) \
        is None
    assert disturbance.reasons({}, None, 10.0, 0.0001) == []
    assert disturbance.reasons({}, None, 10.0, 0.005) == [
        "the lab's simulated GPU woke 5.0 ms late per pass on average (over 1 ms)"]


def test_the_simulator_says_how_late_its_timers_woke_in_its_metrics(tmp_path) -> None:
    with simulator(tmp_path) as url:
        httpx.post(f"{url}/generate", json={"text": "hello", "sampling_params": {
            "max_new_tokens": 8}}, timeout=30).raise_for_status()
        text = httpx.get(f"{url}/metrics", timeout=10).text
    assert server_stats.metric(text, server_stats.TIMERS) >= 8
    assert 0 <= server_stats.metric(text, server_stats.TIMER_LATE_SECONDS) < 1
