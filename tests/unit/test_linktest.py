"""The linktest's commands, run for real on loopback, and its report beside the field's."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from harness.hosts.topology import Workstation
from harness.reporting import compare, linktest_report
from harness.reporting.compare import NOT_REPORTED
from harness.runs import linktest


def workstation(name: str, address: str, peer: str, interface: str = "thunderbolt0"
                ) -> Workstation:
    return Workstation(name, ("workstations",), {
        "thunderbolt_address": address, "peer_thunderbolt_address": peer,
        "link_interface": interface})


LOOPBACK = linktest.Direction(workstation("wsa", "127.0.0.1", "127.0.0.1", "lo").settings,
                              workstation("wsb", "127.0.0.1", "127.0.0.1", "lo").settings)


def shell(command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs Debian's iperf3 (make setup)")
def test_the_rendered_iperf3_commands_run_and_their_json_is_read() -> None:
    server = subprocess.Popen(["sh", "-c", linktest.iperf3_server(LOOPBACK, 1)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(40):
            client = shell(linktest.iperf3_client(LOOPBACK, 2, 1))
            if "Connection refused" not in client.stdout:
                break
            time.sleep(0.1)
        run = linktest.FlowRun.from_iperf3(2, json.loads(client.stdout))
    finally:
        server.wait(timeout=30)
    assert run.flows == 2 and run.gbit_s > 0 and run.bytes > 0
    assert 0.5 < run.seconds < 2 and run.retransmits >= 0
    assert server.returncode == 0, server.stderr  # --one-off: gone after the one test


def test_the_rendered_ping_runs_and_its_replies_are_read() -> None:
    probes = linktest.Probes.from_ping(shell(linktest.ping(LOOPBACK, count=5,
                                                           interval=0.01)).stdout)
    assert (probes.sent, probes.received, len(probes.rtts_ms)) == (5, 5, 5)
    assert probes.loss == 0 and 0 < probes.mean_ms <= probes.p99_ms < 10


def test_exactly_the_probes_asked_for_are_sent_whatever_is_lost() -> None:
    """ping's -w would send until it had every reply: a lossy link would get more probes."""
    command = linktest.ping(LOOPBACK)
    assert " -w " not in command and command.startswith("timeout ")
    assert " -c 100 -i 0.02 " in command


def test_lost_probes_count_as_loss() -> None:
    output = ("64 bytes from 169.254.77.2: icmp_seq=1 ttl=64 time=0.30 ms\n"
              "64 bytes from 169.254.77.2: icmp_seq=3 ttl=64 time=0.50 ms\n"
              "4 packets transmitted, 2 received, 50% packet loss, time 60ms\n")
    probes = linktest.Probes.from_ping(output)
    assert probes.loss == 0.5 and probes.mean_ms == pytest.approx(0.4)
    assert probes.p99_ms == pytest.approx(0.498)
    with pytest.raises(ValueError, match="no summary"):
        linktest.Probes.from_ping("ping: connect: Network is unreachable\n")


def test_each_workstation_sends_to_the_peer_across_the_cable(tmp_path: Path) -> None:
    wsa = workstation("wsa", "169.254.77.1", "169.254.77.2")
    wsb = workstation("wsb", "169.254.77.2", "169.254.77.1")
    topology = type("Topology", (), {"workstations": (wsa, wsb)})()
    assert [d.name for d in linktest.directions(topology)] == ["wsa->wsb", "wsb->wsa"]
    client = linktest.iperf3_client(linktest.directions(topology)[1], 4, 3)
    assert "--client 169.254.77.1 " in client and "--bind 169.254.77.2 " in client
    assert "--parallel 4 --time 3 $(" in client and client.endswith(") --json")
    # CUBIC, as an Ubuntu host's TCP runs, where the kernel has it; nothing asked where not.
    asked = client[client.index("$(") + 2:client.rindex(")")]
    for available, flag in (("reno bbr cubic", "--congestion cubic"), ("reno bbr", "")):
        proc = tmp_path / "tcp_available_congestion_control"
        proc.write_text(available + "\n")
        ran = subprocess.run(["sh", "-c", asked.replace(
            linktest.AVAILABLE_CONGESTION_CONTROL, str(proc))], capture_output=True, text=True)
        assert ran.stdout.strip() == flag


def test_the_report_says_which_congestion_control_the_flows_ran() -> None:
    cubic = report("stock", 14.0, 7)
    for run in cubic["runs"]:
        run["congestion"] = "cubic"
    assert linktest_report.congestion_words(cubic) == (
        "TCP: cubic, asked per flow, as an Ubuntu host runs it.")
    bbr = report("stock", 14.0, 7)
    for run in bbr["runs"]:
        run["congestion"] = "bbr"
    assert linktest_report.congestion_words(bbr).startswith("TCP: bbr ran, not cubic")
    assert "TCP: cubic, asked per flow" in linktest_report.markdown(cubic)


def test_a_link_far_below_its_trained_rate_is_capped() -> None:
    assert linktest.capped(9.9, 20.0) and not linktest.capped(10.0, 20.0)
    assert not linktest.capped(0.1, None)


def link(errors: int, retransmissions: int) -> dict:
    return {"hosts": {"wsb": {"counters": {"rx_crc_errors": errors, "rx_errors": errors},
                              "sockets": {"retrans": 0}}},
            "totals": {"receiver_errors": errors, "retransmissions": retransmissions}}


def report(driver: str, gbit_s: float, errors: int) -> dict:
    runs = []
    for direction in ("wsa->wsb", "wsb->wsa"):
        for flows in linktest.FLOW_COUNTS:
            runs.append({"direction": direction, "kind": "flows", "flows": flows,
                         "gbit_s": gbit_s, "retransmits": 3, "bytes": 1, "seconds": 3.0,
                         "trained_gbps": 20.0, "capped": linktest.capped(gbit_s, 20.0),
                         "link": link(errors, 10 * errors)})
        runs.append({"direction": direction, "kind": "probes", "sent": 100, "received": 100,
                     "loss": 0.0, "mean_ms": 0.05, "p99_ms": 0.1, "link": link(0, 0)})
        runs.append({"direction": direction, "kind": "load_and_ping", "sent": 100,
                     "received": 99, "loss": 0.01, "mean_ms": 0.2, "p99_ms": 0.9, "flows": 4,
                     "gbit_s": gbit_s, "retransmits": 5, "link": link(errors, 0)})
    return {"format": linktest.FORMAT, "state": f"production_{driver}", "seconds": 3.0,
            "measured_at": "2026-12-02T15:00:00+00:00", "trained_gbps": {"wsa": 20.0},
            "observed": {"layers": {"driver": driver}, "verdict": "matches"}, "runs": runs}


def test_the_headline_totals_the_four_flow_runs_and_both_directions() -> None:
    row = linktest_report.headline(report("stock", 14.0, 7))
    assert row["gbit_s_4_flows"] == 14.0
    assert (row["receiver_errors"], row["retransmissions"]) == (14, 140)
    assert (row["probe_loss"], row["loaded_probe_loss"], row["probe_p99_ms"]) == (0, 0.01, 0.1)
    assert row["capped"] == []
    assert linktest_report.headline(report("stock", 5.0, 7))["capped"][0] == "wsa->wsb x1"


def test_the_field_column_is_the_drivers_and_says_not_reported_only_where_it_gives_none(
        ) -> None:
    texts = {driver: "\n".join(linktest_report.beside_the_field(report(driver, 14.0, 7)))
             for driver in linktest_report.FIELD_NETWORK}
    assert "field, stock-direction control" in texts["stock"]
    assert "| 15.249 | 0.92× |" in texts["stock"] and "| 4,346 |" in texts["stock"]
    assert "| 25,717 |" in texts["stock"]
    assert "about 0.28 to 0.29" in texts["candidate"] and "0 (100 each way)" in texts["candidate"]
    assert "field, stock, receive-side E2E off (e2e=0)" in texts["stock_e2e_off"]
    assert "| not removed (no count given) | — |" in texts["stock_e2e_off"]
    for key, title, _ in linktest_report.FIGURES:
        for driver, text in texts.items():
            row = next(line for line in text.splitlines() if line.startswith(f"| {title} |"))
            given = key in linktest_report.FIELD_NETWORK[driver].figures
            assert (NOT_REPORTED in row) == (not given), (key, driver)
    every = {key for column in linktest_report.FIELD_NETWORK.values() for key in column.figures}
    assert every <= {key for key, _, _ in linktest_report.FIGURES}


def test_the_markdown_and_the_comparison_show_every_run(tmp_path) -> None:
    built = report("stock", 5.0, 7)
    text = linktest_report.markdown(built)
    assert text.count("**link up but capped**") == 6
    assert "rx_crc_errors 7, rx_errors 7" in text
    path = linktest_report.write(built, tmp_path)
    assert path.with_suffix(".png").stat().st_size > 0
    assert json.loads(path.read_text()) == built
    table = linktest_report.comparison([built, report("candidate", 16.0, 0)])
    assert "| production_stock | stock | 5.000 |" in table
    assert "| production_candidate | candidate | 16.000 |" in table


def test_a_workstation_without_iperf3_is_refused_with_the_fix(monkeypatch) -> None:
    async def run(host: str, command: str, *args: object, **kwargs: object) -> object:
        found = "/usr/bin/ping\n" + ("/usr/bin/iperf3\n" if host == "wsa" else "")
        return linktest.remote.Ran(host, 0 if host == "wsa" else 1, found, "", 0.0)
    monkeypatch.setattr(linktest.remote, "run", run)
    wsa = workstation("wsa", "169.254.77.1", "169.254.77.2")
    wsb = workstation("wsb", "169.254.77.2", "169.254.77.1")
    topology = type("Topology", (), {"workstations": (wsa, wsb), "ssh_config": "x"})()
    with pytest.raises(linktest.NotTestable) as refusal:
        asyncio.run(linktest.preflight(topology))
    assert str(refusal.value) == f"wsb: no iperf3: {linktest.INSTALL_FIX}"


def test_the_transport_chart_sets_the_states_side_by_side_counts_from_zero(tmp_path) -> None:
    # All zero: an axis from 0 to 1, not zeros centred on a +-0.04 axis.
    assert compare.axis_top([0, 0, 0]) == 1.0
    assert compare.axis_top([0, 14, 0]) is None
    assert [key for key, _ in linktest_report.TRANSPORT_PANELS] == [
        "gbit_s_4_flows", "receiver_errors", "retransmissions"]
    path = linktest_report.transport_chart(
        [report("stock", 14.0, 7), report("candidate", 16.0, 0), report("stock_e2e_off", 15.0, 9)],
        tmp_path / "transport.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
