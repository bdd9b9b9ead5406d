"""
The experiment harness on the lab: the observed state, and one short window
measured in tp2_e2e and in production, exactly as an operator runs it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from e2e_helpers import (
    PYTHON,
    REPO,
    deploy,
    files_under,
    inventory,
    places_holding,
    secrets,
    ssh,
)

from harness.hosts.topology import Topology
from harness.measuring import profile
from harness.reporting import linktest_report
from harness.reporting.report import headline as report_headline
from harness.runs import matrix
from operations.safety import ledger

# One short window keeps the whole file within a few minutes.
SHORT = ("--window", "single", "--single-tokens", "64")
# The same, and a short sweep: production and tp2_e2e are set side by side level by level.
# And one request under SGLang's profiler: where each rank's time goes.
SWEEP = (*SHORT, "--window", "sweep", "--concurrency", "1,2,4", "--sweep-tokens", "32",
         "--window", "profile", "--profile-tokens", "32")
LEVELS = ("sweep@1", "sweep@2", "sweep@4")
# pyinfra at its most verbose prints every command and every fact's output: the
# experiment and the way back run so, and nothing of them may hold the master key.
VERBOSE = "-vvv"


def experiment(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(PYTHON), "experiment.py", *arguments], cwd=REPO,
                          capture_output=True, text=True, timeout=180)


def measured(directory: Path, state: str) -> dict:
    (path,) = directory.glob(f"{state}-*.json")
    assert path.with_suffix(".md").exists()
    return json.loads(path.read_text())


def linktested(directory: Path, state: str) -> tuple[Path, dict]:
    """
    ``experiment.py linktest`` of one-second flows in the current state: it ran
    every run it must, and wrote its report, its Markdown and its chart.
    """
    result = experiment("linktest", "--seconds", "1", "--out", str(directory))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (path,) = directory.glob(f"linktest-{state}-*.json")
    assert path.with_suffix(".png").stat().st_size > 0
    built = json.loads(path.read_text())
    kinds = [(run["kind"], run["direction"], run.get("flows")) for run in built["runs"]]
    for direction in ("wsa->wsb", "wsb->wsa"):
        assert [kind for kind in kinds if kind[1] == direction] == [
            ("flows", direction, 1), ("flows", direction, 2), ("flows", direction, 4),
            ("probes", direction, None), ("load_and_ping", direction, 4)]
    assert all(run["gbit_s"] > 0 and run["trained_gbps"] == 20.0
               for run in built["runs"] if run["kind"] == "flows")
    assert all(run["sent"] == 100 for run in built["runs"] if "sent" in run)
    assert "### The field report's network-only figures beside these" in result.stdout
    return path, built


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where each state's measurement with the sweep is kept, for the comparison of both."""
    return tmp_path_factory.mktemp("swept")


def windows_of(report: dict) -> dict[str, dict]:
    """A report's windows by name, in the order measured."""
    return {window["name"]: window for window in report["windows"]}


def check_sweep(report: dict, kept: Path) -> None:
    """Each level of the sweep measured as its own window, every request answered; kept."""
    levels = {name: window for name, window in windows_of(report).items() if "@" in name}
    assert list(levels) == list(LEVELS)
    for name, window in levels.items():
        level = int(name.partition("@")[2])
        summary = window["summary"]
        assert (summary["completed"], summary["completion_tokens"]) == (level, 32 * level)
        assert summary["aggregate_output_tok_s"] > 0 and summary["tpot_seconds"]["p50"] > 0
    (kept / f"{report['state']}.json").write_text(json.dumps(report))


def check_profile(report: dict) -> dict[str, dict]:
    """
    The profile window's traces, one per server, each span of a server that ran
    the request split whole into all-reduce, compute and idle; the traces by
    workstation and rank.
    """
    window = windows_of(report)["profile"]
    assert window["errors"] == [] and not window["invalid"]
    assert set(window["summary"]["profiler"]["start"].values()) == {"started"}
    assert set(window["summary"]["profiler"]["stop"].values()) == {"stopped"}
    # Both workstations' TP sockets were sampled while the profiler recorded.
    assert all(taken >= 2 for taken in window["summary"]["samples_taken"])
    ranks = {f"{rank['host']} {rank['trace'].rpartition('-TP-')[2]}": rank
             for rank in window["summary"]["ranks"].values()}
    for rank in ranks.values():
        assert rank["kernels"] == 0 or sum(rank["shares"].values()) == pytest.approx(1.0), rank
    return ranks


def section(text: str, title: str) -> list[str]:
    """The lines of one ``###`` section of a comparison, up to the next."""
    return text.split(title, 1)[1].split("\n### ", 1)[0].splitlines()


def path_text(directory: Path, pattern: str) -> str:
    (path,) = directory.glob(pattern)
    return path.read_text()


def test_tp2_e2e_is_observed_and_measured_with_the_link_counters_in_its_window(
        tmp_path: Path, swept: Path) -> None:
    """
    ``experiment.py status`` names tp2_e2e and one window is measured through rank 0,
    with the link's counters read in the same window: under the candidate each
    sender waits for its receiver's credits (tests/lab/test_physics.py), so the
    window counts no receiver error.
    """
    run = deploy("tp2_e2e", VERBOSE)
    assert run.returncode == 0, run.output[-3000:]
    status = experiment("status")
    assert status.returncode == 0, status.stdout + status.stderr
    assert "matches: tp2_e2e" in status.stdout

    result = experiment("measure", "--state", "tp2_e2e", *SWEEP, "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "window single: done" in result.stderr
    report = measured(tmp_path, "tp2_e2e")
    single = windows_of(report)["single"]
    check_sweep(report, swept)
    # Both ranks profiled, each on its own host, from one /start_profile to rank 0:
    # every step's all-reduces in NCCL's kernels, and NCCL's own word that they
    # went over thunderbolt0, from both ranks' logs.
    ranks = check_profile(report)
    assert sorted(ranks) == ["wsa 0.trace.json.gz", "wsb 1.trace.json.gz"]
    for rank in ranks.values():
        assert rank["kernels"] > 0
        assert rank["shares"]["allreduce"] > 0 and rank["shares"]["compute"] > 0
        assert rank["allreduce"]["count"] >= 2 * 64
        assert 0 < rank["allreduce"]["p50_ms"] <= rank["allreduce"]["p99_ms"]
    nccl = windows_of(report)["profile"]["summary"]["nccl"]
    addresses = {"wsa": "169.254.77.1", "wsb": "169.254.77.2"}
    assert {host: profile.transport(lines).words() for host, lines in nccl.items()} == {
        host: f"NET/Socket on thunderbolt0 ({address}), 2 channels"
        for host, address in addresses.items()}
    assert "## Where a token's time goes" in path_text(tmp_path, "tp2_e2e-*.md")
    # Nothing else ran: no window was disturbed, and the report says so first.
    assert {window["name"]: window["disturbed"] for window in report["windows"]} == dict.fromkeys(
        ["single", *LEVELS, "profile"])
    assert "- quiet: none of the 5 windows was disturbed" in path_text(tmp_path, "tp2_e2e-*.md")
    # The traces were fetched, and their directories removed from both hosts.
    for host in addresses:
        assert ssh(host, f"ls -d {profile.TRACE_ROOT}* 2>/dev/null || true").strip() == ""
    # The TP group's all-reduces crossed the link at every level.
    assert all(windows_of(report)[name]["link"]["totals"]["bytes_moved"] > 2**20
               for name in LEVELS)
    assert single["summary"]["completion_tokens"] == 64
    assert report["endpoint"]["route"] == "TP rank 0 on wsa"
    # The TP all-reduces (one per verify step, each way) crossed the link, and no
    # receiver lost a frame of them.
    assert single["link"]["totals"]["bytes_moved"] > 8 * 2**20
    assert single["link"]["totals"]["receiver_errors"] == 0
    assert 1 < single["server"]["accept_length"] <= 4
    for host in report["hosts"].values():
        assert host["driver_parameters"]["tx_e2e"] == "Y" and host["rx_rate_gbps"] == 20.0
    # Each workstation reads the TP group's own socket to the peer's Thunderbolt
    # address, alive through the whole window.
    peers = {entry.name: entry.data["peer_thunderbolt_address"] for entry in inventory()
             if "workstations" in entry.groups}
    for name, delta in single["link"]["delta"].items():
        assert delta["sockets"]["count"] >= 1 and delta["sockets"]["closed"] == [], name
        for key in single["link"]["after"][name]["sockets"]:
            assert key.partition(">")[2].startswith(f"{peers[name]}:"), key
    assert single["link"]["totals"]["socket_retransmissions"] is not None
    # The roofline is read from the model's files on rank 0 (the lab's: 27e9 NVFP4
    # weights), the server's settings and the link's rate; the simulator spends the
    # roofline's compute and then the link's real round trips, so it stays below.
    bound = report["roofline"]["bound"]
    assert bound["inputs"] | {"context_positions": 0} == {
        "weight_bytes": 15_187_500_000, "tp_size": 2, "gpu_bandwidth_gb_s": 1792.0,
        "link_gbps": 20.0, "context_positions": 0, "draft_passes": 3, "verified_positions": 4}
    assert 0 < report["roofline"]["fraction"] < 1
    # The measurement's tok/s is in the compatibility ledger, with the hosts it ran on.
    entry = ledger.read(matrix.ledger_path(Topology.load(tmp_path)))[-1]
    assert (entry["outcome"], entry["state"], entry["driver"]) == ("measured", "tp2_e2e",
                                                                   "candidate")
    assert entry["tok_s"] == single["summary"]["output_tok_s"]
    assert [part["nhi"] for part in entry["hosts"]] == ["8086:1137", "8086:1137"]
    assert [part["nvm_version"] for part in entry["hosts"]] == ["36.0", "36.0"]
    assert {part["parameters"].get("tx_e2e") for part in entry["hosts"]} == {"Y"}
    # The network-only window, in the same state: under the candidate no receiver
    # loses a frame, with or without load.
    _, built = linktested(tmp_path, "tp2_e2e")
    row = linktest_report.headline(built)
    assert (row["driver"], row["receiver_errors"], row["probe_loss"]) == ("candidate", 0, 0)
    assert "field, candidate (tx_e2e=1)" in path_text(tmp_path, "linktest-tp2_e2e-*.md")
    # TCP as an Ubuntu host runs it: CUBIC on the linktest's flows and the TP group's sockets.
    assert {run["congestion"] for run in built["runs"] if run["kind"] == "flows"} == {"cubic"}
    assert "TCP: cubic, asked per flow" in path_text(tmp_path, "linktest-tp2_e2e-*.md")
    tp_sockets = tp_socket_congestion("wsa", "169.254.77.1", "169.254.77.2")
    assert tp_sockets and set(tp_sockets) == {"cubic"}, tp_sockets
    texts = {"the run at -vvv": run.output, "status": status.stdout + status.stderr,
             "measure": result.stdout + result.stderr, **files_under(tmp_path)}
    assert {name: places_holding(secret, texts) for name, secret in secrets().items()} == {
        name: [] for name in secrets()}


def test_a_window_beside_a_busy_core_outside_the_lab_is_disturbed_and_measured_again(
        tmp_path: Path) -> None:
    """
    In tp2_e2e, as the test above leaves it: a process spinning on this machine,
    outside every lab host, through the measurement. Its one window is named
    disturbed by this machine's reading, gives no figure, and is measured once more.
    """
    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        result = experiment("measure", "--state", "tp2_e2e", "--window", "single",
                            "--single-tokens", "256", "--out", str(tmp_path))
    finally:
        spinning.kill()
        spinning.wait(timeout=10)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = measured(tmp_path, "tp2_e2e")
    first, again = report["windows"]
    assert (first["name"], again["name"], again["again"]) == ("single", "single", True)
    assert "this machine: processes outside the measurement used" in first["disturbed"]
    assert "measuring it again, once, as it was disturbed" in result.stderr
    text = path_text(tmp_path, "tp2_e2e-*.md")
    assert "- **not quiet**: " in text and "| single (disturbed) |" in text
    assert report_headline(report)["single_tok_s"] == (
        None if again["disturbed"] else again["summary"]["output_tok_s"])


def tp_socket_congestion(host: str, address: str, peer: str) -> list[str]:
    """The congestion control of each connection between the two link addresses, by ``ss -ti``."""
    lines = ssh(host, f"ss -tinH state established src {address} dst {peer}").splitlines()
    return [match[1] for line in lines
            if (match := re.search(r"\b(cubic|bbr|reno)\b", line))]


def test_production_is_measured_through_the_router_and_a_wrong_state_is_refused(
        tmp_path: Path, swept: Path) -> None:
    run = deploy("production", VERBOSE)
    assert run.returncode == 0, run.output[-3000:]
    refused = experiment("measure", "--state", "tp2_stock", *SHORT, "--out", str(tmp_path))
    assert refused.returncode == 1
    assert "the hosts are not in tp2_stock" in refused.stderr
    assert not list(tmp_path.glob("*.json"))

    result = experiment("measure", *SWEEP, "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    report = measured(tmp_path, "production")
    single = windows_of(report)["single"]
    check_sweep(report, swept)
    # Each replica is a rank 0 of its own, on its own GPU: the one the router sent
    # the request to computed, and all-reduced nothing; the other ran nothing.
    ranks = check_profile(report)
    assert sorted(ranks) == ["wsa 0.trace.json.gz", "wsb 0.trace.json.gz"]
    (ran,) = [rank for rank in ranks.values() if rank["kernels"]]
    assert ran["shares"]["allreduce"] == 0 and ran["allreduce"]["count"] == 0
    assert ran["shares"]["compute"] > 0.5
    assert report["endpoint"]["route"] == "sglang-router on gw"
    assert single["summary"]["completion_tokens"] == 64
    assert single["server"]["accept_length"] is None
    assert "matches: production" in report["observed"]["verdict"]
    # The replicas talk to nobody across the link: no TP socket, so no per-socket figure.
    assert single["link"]["totals"]["socket_retransmissions"] == 0
    assert single["link"]["totals"]["max_socket_retransmissions"] is None
    # A replica holds the whole model on one GPU and all-reduces nothing.
    bound = report["roofline"]["bound"]
    assert (bound["inputs"]["tp_size"], bound["link_ms"], bound["draft_ms"]) == (1, 0.0, 0.0)
    # The link needs no model: production's stock driver is tested on it, the
    # replicas untouched, and set beside the field's stock-direction control.
    path, built = linktested(tmp_path, "production")
    row = linktest_report.headline(built)
    assert row["driver"] == "stock" and row["receiver_errors"] > 0 and row["retransmissions"] > 0
    compared = experiment("compare", str(path), *map(str, tmp_path.glob("production-*.json")))
    assert compared.returncode == 0, compared.stderr
    assert "### Linktests" in compared.stdout and "| production | stock |" in compared.stdout
    assert "single tok/s" in compared.stdout
    # Both architectures through the route users take, level by level: one trial
    # each, so every level's ratio comes without a verdict, and says so.
    both = experiment("compare", str(swept / "tp2_e2e.json"), str(swept / "production.json"),
                      "--chart", str(tmp_path / "swept.png"))
    assert both.returncode == 0, both.stderr
    assert "### Concurrency sweep" in both.stdout
    rows = [line for line in section(both.stdout, "### TP2 against two replicas (production)")
            if line.startswith("| tp2_e2e |")]
    assert [row.split(" | ")[1:3] for row in rows] == [
        ["driver, serving, speculative", level] for level in ("1", "2", "4")]
    assert all(row.count("no verdict: one trial") == 2 for row in rows)
    assert ("- tp2_e2e against production, aggregate tok/s: no crossover: no level of 1–4 "
            "decided") in both.stdout
    # The memory side, from each server's own /server_info: a TP rank holds half the
    # weights and half of each position's KV heads, so more than twice a replica's cache.
    (memory,) = [line.strip("| ").split(" | ") for line in section(both.stdout,
                                                                   "### The memory side")
                 if line.startswith("| tp2_e2e |")]
    assert float(memory[2].rstrip("×")) > 2 and float(memory[4].rstrip("×")) > 2
    # Where a token's time goes, per server: the TP ranks share their time with
    # NCCL's all-reduces over thunderbolt0; each replica with none.
    profiled = {tuple(line.strip("| ").split(" | ")[:2]): line
                for line in section(both.stdout, "### Where a token's time goes")
                if line.startswith(("| tp2_e2e |", "| production |"))}
    assert sorted(key for key in profiled if key[0] == "tp2_e2e") == [
        ("tp2_e2e", "wsa, TP-0"), ("tp2_e2e", "wsb, TP-1")]
    assert "wsb: NET/Socket on thunderbolt0 (169.254.77.2)" in profiled[("tp2_e2e",
                                                                          "wsb, TP-1")]
    (replica,) = [line for key, line in profiled.items() if key[0] == "production"]
    assert "| 0.0% (0.0%–0.0%) |" in replica
    texts = {"the way back at -vvv": run.output, "measure": result.stdout + result.stderr,
             **files_under(tmp_path)}
    assert {name: places_holding(secret, texts) for name, secret in secrets().items()} == {
        name: [] for name in secrets()}
    assert 0 < report["roofline"]["fraction"] < 1


def demo_windows() -> list[str]:
    """The Makefile's DEMO_WINDOWS: the demo's own short windows."""
    match = re.search(r"^DEMO_WINDOWS := (.*?[^\\])$", (REPO / "Makefile").read_text(),
                      re.MULTILINE | re.DOTALL)
    return match.group(1).replace("\\\n", " ").split()


def test_the_demos_campaign_in_three_trials_gives_intervals_and_verdicts(tmp_path: Path) -> None:
    """
    The demo's campaign with ``--trials 3``, from the production the test above
    left (the transport stage, tested above state by state, skipped): tp2_stock
    and tp2_e2e in the order ABBA, five moves for six measurements, each trial's
    reports kept, the comparison in medians, intervals and verdicts, and
    production restored.
    """
    result = subprocess.run(
        [str(PYTHON), "experiment.py", "campaign", "--no-baseline", "--states",
         "tp2_stock,tp2_e2e", "--no-transport", "--trials", "3", *demo_windows(),
         "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (directory,) = tmp_path.glob("campaign-*")
    built = json.loads((directory / "campaign.json").read_text())
    assert built["visits"] == [[1, "tp2_stock"], [1, "tp2_e2e"], [2, "tp2_e2e"],
                               [2, "tp2_stock"], [3, "tp2_stock"], [3, "tp2_e2e"]]
    assert [(entry["trial"], entry["state"]) for entry in built["measured"]] == [
        tuple(visit) for visit in built["visits"]]
    assert all((directory / entry["report"]).exists() for entry in built["measured"])
    steps = [step["name"] for step in built["steps"]]
    assert sum(name.startswith("deploy tp2_") for name in steps) == 4
    assert steps[-2:] == ["restore production", "verify production"]
    # One row per state over its three trials; the driver's ratio with its interval
    # and a verdict in words, whichever the lab's run gives.
    # The first table's row (the cold and warm prefills' table has one of its own).
    main_table = built["comparison"].split("### Cold and warm")[0]
    (e2e,) = [line for line in main_table.splitlines()
              if line.startswith("| tp2_e2e | driver | 3 | ")]
    assert re.search(r"\| \d+\.\d+× \[\d+\.\d+–\d+\.\d+\] (faster|slower|no difference "
                     r"detected at n=3) \|", e2e), e2e
    # Under the candidate each sender waits for its receiver's credits: no receiver
    # error in any trial.
    assert "| tp2_e2e | receiver errors | 0, 0, 0 | 0 | zero in every trial (n=3) |" in \
        built["comparison"]
    # Under stock the long window's prefill bursts, both ranks sending at once,
    # overrun the receivers: the model states meet the field's mechanism.
    (stock,) = re.findall(r"^\| tp2_stock \| receiver errors \| [\d, ]+ \| ([\d,]+) \|",
                          built["comparison"], re.MULTILINE)
    assert int(stock.replace(",", "")) > 0, built["comparison"]
    assert "field tp2_stock (one observation)" in built["comparison"]
    # Where a token's time goes: both ranks of both states, profiled in every trial,
    # NCCL on thunderbolt0 by its own word.
    profiled = [line.strip("| ").split(" | ") for line in
                section(built["comparison"], "### Where a token's time goes")
                if line.startswith(("| tp2_stock |", "| tp2_e2e |"))]
    assert [row[:3] for row in profiled] == [
        [state, server, "3"] for state in ("tp2_stock", "tp2_e2e")
        for server in ("wsa, TP-0", "wsb, TP-1")]
    assert all("NET/Socket on thunderbolt0" in row[-1] for row in profiled)
    assert re.search(r"trial 2 of 3, tp2_e2e, window single \(about \d+ min \d+ s left\): "
                     "reading counters", result.stderr)
    spent = built["time"]
    assert spent["measuring_seconds"] > 0 and spent["converging_and_proving_seconds"] > 0
