"""Counters, server statistics, reports and comparisons, from given values."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
from pathlib import Path

import pytest

import experiment
from harness.hosts import counters, remote
from harness.hosts.counters import LinkSnapshot
from harness.hosts.topology import Endpoint, Topology
from harness.judging import intervals
from harness.measuring import server_stats
from harness.measuring.client import Sample
from harness.measuring.server_stats import ServerSnapshot
from harness.measuring.windows import WindowSettings
from harness.reporting import caveats, compare, report
from harness.runs import campaign
from operations.plumbing.facts import MARKER
from operations.serving.transport import SOCKET_COUNTERS, LinkCounters, PeerSockets
from operations.site.hosts import InventoryEntry
from operations.thunderbolt.link import XDomainLink

SNMP = [
    "Tcp: RtoAlgorithm RtoMin RtoMax MaxConn ActiveOpens PassiveOpens AttemptFails "
    "EstabResets CurrEstab InSegs OutSegs RetransSegs InErrs OutRsts InCsumErrors",
    "Tcp: 1 200 120000 -1 10 5 0 0 3 9000 8000 417 0 2 0",
]


def test_link_counters_reads_interface_statistics_and_tcp_retransmissions():
    values = LinkCounters().process(["rx_bytes 1000", "rx_errors 3", *SNMP])
    assert values == {"rx_bytes": 1000, "rx_errors": 3, "retrans_segs": 417}
    # Without the interface (a driver reload) the retransmissions are still read.
    assert LinkCounters().process(SNMP) == {"retrans_segs": 417}


def test_facts_are_read_in_one_script_and_parsed_by_their_own_process():
    queries = [remote.Query("xdomain", XDomainLink()),
               remote.Query("counters", LinkCounters(), {"interface": "thunderbolt0"})]
    script = remote.script(queries)
    assert script.count(MARKER + " ") == 2 and "thunderbolt0" in script
    output = "\n".join([
        f"{MARKER} xdomain", "0-1|wsb|20.0 Gb/s|20.0 Gb/s|1|1", f"{MARKER}-status 0",
        f"{MARKER} counters", "rx_bytes 5", f"{MARKER}-status 1",
    ])
    values = remote.parse(output, queries)
    assert values["xdomain"]["peer"] == "wsb" and values["xdomain"]["rx_speed_gbps"] == 20.0
    # A failed command yields the fact's default, as in pyinfra.
    assert values["counters"] == {}


def snap(at: float, build: str = "b1", **values: int) -> LinkSnapshot:
    base = {name: 0 for name in (*counters.INTERFACE_COUNTERS, counters.RETRANSMISSIONS)}
    return LinkSnapshot("wsa", at, {**base, **values}, 20.0, build, {"e2e": "Y"})


def test_a_window_delta_is_after_minus_before():
    delta = counters.delta(snap(1.0, tx_bytes=100, rx_errors=2, retrans_segs=10),
                           snap(3.5, tx_bytes=900, rx_errors=5, retrans_segs=14))
    assert delta["seconds"] == 2.5 and not delta["reset"]
    assert delta["counters"]["tx_bytes"] == 800
    assert delta["counters"]["rx_errors"] == 3 and delta["counters"]["retrans_segs"] == 4


def test_a_reload_inside_a_window_is_flagged_instead_of_reported_wrong():
    backwards = counters.delta(snap(1.0, tx_bytes=900), snap(2.0, tx_bytes=100))
    assert backwards["reset"] and backwards["counters"] == {}
    swapped = counters.delta(snap(1.0, "stock"), snap(2.0, "candidate"))
    assert swapped["reset"] and "driver changed" in swapped["problems"][0]
    assert counters.window_totals({"wsa": backwards})["receiver_errors"] is None


def test_window_totals_count_each_byte_once_and_sum_both_workstations():
    deltas = {
        "wsa": counters.delta(snap(0, tx_bytes=0, rx_bytes=0), snap(1, tx_bytes=10, rx_bytes=7,
                                                                     rx_errors=1, retrans_segs=2)),
        "wsb": counters.delta(snap(0), snap(1, tx_bytes=7, rx_bytes=10, rx_errors=4,
                                            retrans_segs=5)),
    }
    # No TP socket in these snapshots: none retransmitted, and no socket to name a maximum of.
    assert counters.window_totals(deltas) == {"receiver_errors": 5, "retransmissions": 7,
                                              "bytes_moved": 17, "socket_retransmissions": 0,
                                              "max_socket_retransmissions": None}


SS_OUTPUT = [
    "0      0      169.254.77.1%thunderbolt0:5757 169.254.77.2:42304",
    "\t bbr wscale:10,10 rto:204 rtt:0.433/0.155 mss:65468 bytes_sent:39748539 "
    "bytes_retrans:426129 bytes_acked:39322410 segs_out:957 retrans:0/9 dsack_dups:1 lost:2",
    "0      0      169.254.77.1%thunderbolt0:5758 169.254.77.2:42310",
    "\t bbr wscale:10,10 rto:204 rtt:0.4/0.1 mss:65468 bytes_sent:100 bytes_acked:100",
    # torch's store listens dual-stack: its connections show IPv4-mapped addresses.
    "0      0      [::ffff:169.254.77.1]:5757 [::ffff:169.254.77.2]:47018",
    "\t cubic wscale:10,10 rto:204 rtt:0.4/0.1 mss:65468 retrans:0/1",
]


def test_peer_sockets_are_read_one_by_one_from_ss():
    sockets = PeerSockets().process(SS_OUTPUT)
    assert sockets == {
        "169.254.77.1@thunderbolt0:5757>169.254.77.2:42304":
            {"retrans": 9, "bytes_retrans": 426129, "lost": 2, "bytes_sent": 39748539,
             "bytes_received": 0, "segs_out": 957, "segs_in": 0},
        # ss leaves zero counters out.
        "169.254.77.1@thunderbolt0:5758>169.254.77.2:42310":
            {**dict.fromkeys(SOCKET_COUNTERS, 0), "bytes_sent": 100},
        "169.254.77.1:5757>169.254.77.2:47018":
            {**dict.fromkeys(SOCKET_COUNTERS, 0), "retrans": 1},
    }


def test_the_real_ss_is_parsed_for_a_real_connection():
    with socket.create_server(("127.0.0.1", 0)) as server, \
            socket.create_connection(server.getsockname()) as client:
        accepted, _ = server.accept()
        port = client.getsockname()[1]
        client.sendall(b"x" * 100_000)
        accepted.recv(10)
        command = PeerSockets().command("127.0.0.1").get_raw_value()
        output = subprocess.run(command, shell=True, capture_output=True, text=True).stdout
        accepted.close()
    sockets = PeerSockets().process(output.splitlines())
    # Both ends of the loopback connection, each with its counters.
    mine = [key for key in sockets if key.endswith(f":{port}") or f":{port}>" in key]
    assert len(mine) == 2
    assert all(sockets[key]["retrans"] == 0 for key in mine)


def test_a_socket_window_counts_new_sockets_from_zero_and_names_closed_ones():
    before = {"a": {"retrans": 5, "bytes_retrans": 500, "lost": 0},
              "gone": {"retrans": 1, "bytes_retrans": 10, "lost": 0}}
    after = {"a": {"retrans": 8, "bytes_retrans": 800, "lost": 0},
             "new": {"retrans": 4, "bytes_retrans": 40, "lost": 0}}
    assert counters.socket_deltas(before, after) == {
        "count": 2, "retrans": 7, "max_retrans": 4, "bytes_retrans": 340, "wire_bytes": 0,
        "closed": ["gone"]}
    wsa = {"counters": {}, "sockets": counters.socket_deltas(before, after)}
    wsb = {"counters": {}, "sockets": counters.socket_deltas({}, {"b": before["a"]})}
    totals = counters.window_totals({"wsa": wsa, "wsb": wsb})
    assert totals["socket_retransmissions"] == 12
    assert totals["max_socket_retransmissions"] == 5


def test_window_accept_length_from_two_cumulative_snapshots():
    # Before: 1000 tokens at 2.0 per step (500 steps). The window adds 380 tokens in
    # 100 steps (3.8 each), so the cumulative average is only 1380 / 600 = 2.3.
    before = [ServerSnapshot("s", 1000.0, 2.0)]
    after = [ServerSnapshot("s", 1380.0, 1380 / 600)]
    assert server_stats.window_accept_length(before, after) == pytest.approx(3.8)
    assert server_stats.window_generated(before, after) == 380
    assert server_stats.window_accept_length([ServerSnapshot("s", 10.0)],
                                             [ServerSnapshot("s", 20.0)]) is None


def finished(tokens: int | None, verify_steps: int | None, error: str | None = None) -> Sample:
    """A window's request as the client leaves it."""
    sample = Sample("s", tokens or 1)
    sample.completion_tokens, sample.verify_steps, sample.error = tokens, verify_steps, error
    return sample


def test_a_windows_accept_length_is_its_requests_tokens_over_their_verify_steps():
    # 64 tokens in 17 steps and 32 in 8: (64 + 32) / (17 + 8), every step counted
    # once, not the mean of 64 / 17 and 32 / 8; a failed request counts nothing.
    samples = [finished(64, 17), finished(32, 8), finished(None, None, "HTTP 500: no")]
    assert server_stats.requests_accept_length(samples) == pytest.approx(96 / 25)
    # One finished request that reports no verify steps: no figure from the requests.
    assert server_stats.requests_accept_length([finished(64, 17), finished(64, None)]) is None
    assert server_stats.requests_accept_length([finished(None, None, "refused")]) is None
    assert server_stats.requests_accept_length([]) is None


def test_the_requests_figure_is_preferred_and_the_lagging_snapshots_are_the_fallback():
    # Nothing folded into avg_spec_accept_length during the window: the snapshots
    # see the old 2.0 while the window's requests ran at 380 / 100 = 3.8.
    before = [ServerSnapshot("s", 1000.0, 2.0)]
    after = [ServerSnapshot("s", 1380.0, 2.0)]
    accept = server_stats.window_accept([finished(380, 100)], before, after)
    assert accept == {"accept_length": pytest.approx(3.8), "accept_length_source": "requests",
                      "requests_accept_length": pytest.approx(3.8),
                      "cumulative_accept_length": pytest.approx(2.0)}
    fallback = server_stats.window_accept([finished(380, None)], before, after)
    assert (fallback["accept_length"], fallback["accept_length_source"]) == (
        pytest.approx(2.0), "cumulative")
    plain = server_stats.window_accept([finished(380, None)], [ServerSnapshot("s", 1000.0)],
                                       [ServerSnapshot("s", 1380.0)])
    assert (plain["accept_length"], plain["accept_length_source"]) == (None, None)


def test_a_cumulative_accept_length_is_marked_and_said_to_lag_by_the_servers_interval():
    built = measurement("tp2_e2e", 77.1, 300.0, 0, 1, 3.8)
    built["windows"][0]["server"]["accept_length_source"] = "cumulative"
    built["config"]["server_info"]["decode_log_interval"] = 25
    text = report.markdown(built)
    assert "| 3.80 * |" in text
    assert "cumulative" in text and "may lag by up to 25 decode batches" in text
    # A report from before the requests' figure had only the snapshots': the same caveat,
    # with SGLang's default interval when /server_info does not give one.
    del built["windows"][0]["server"]["accept_length_source"]
    del built["config"]["server_info"]["decode_log_interval"]
    assert "may lag by up to 40 decode batches" in report.markdown(built)
    table = compare.comparison([built])
    assert "| 3.80 (n=1) * |" in table and "may lag by up to 40 decode batches" in table


def test_an_accept_length_from_the_requests_needs_no_caveat():
    built = measurement("tp2_e2e", 77.1, 300.0, 0, 1, 3.8)
    built["windows"][0]["server"]["accept_length_source"] = "requests"
    text = report.markdown(built) + compare.comparison([built])
    assert "| 3.80 |" in text and "3.80 *" not in text and "may lag" not in text


def test_metrics_are_summed_over_label_sets_and_secrets_are_redacted():
    text = ('# TYPE sglang:generation_tokens_total counter\n'
            'sglang:generation_tokens_total{model_name="qwen"} 120.0\n'
            'sglang:generation_tokens_total{model_name="other"} 30.0\n')
    assert server_stats.metric(text, server_stats.GENERATION_TOKENS) == 150.0
    assert server_stats.metric(text, "sglang:cached_tokens_total") is None
    info = server_stats.redact({"api_key": "sk-1", "admin_api_key": None, "hf_token": "t",
                                "speculative_num_draft_tokens": 4, "tp_size": 2})
    assert info == {"api_key": "(redacted)", "admin_api_key": None, "hf_token": "(redacted)",
                    "speculative_num_draft_tokens": 4, "tp_size": 2}
    # SGLang 0.5.23's launch_command: its argv after --config's YAML was merged in.
    launched = server_stats.redact({"launch_command": "sglang serve --api-key sk-1234 "
                                    "--admin-api-key=sk-5678 --model-path /m"})
    assert launched == {"launch_command": "sglang serve --api-key (redacted) "
                        "--admin-api-key=(redacted) --model-path /m"}


def window(name: str, summary: dict, tokens: int, moved: int, errors: int, retrans: int,
           accept: float | None = None, max_socket: int | None = None) -> dict:
    return {
        "name": name, "started_at": "t", "seconds": 2.0, "summary": summary, "errors": [],
        "samples": [{"label": name, "sent_at": 0.0, "ttft_seconds": 0.05, "seconds": 2.0,
                     "prompt_tokens": 16, "completion_tokens": tokens, "error": None}],
        "link": {"before": {}, "after": {}, "delta": {},
                 "totals": {"bytes_moved": moved, "receiver_errors": errors,
                            "retransmissions": retrans,
                            "max_socket_retransmissions": max_socket}},
        "server": {"accept_length": accept, "generated_tokens": tokens},
    }


def measurement(state: str, single: float, aggregate: float, errors: int, retrans: int,
                accept: float | None, max_socket: int | None = None,
                topology: Topology | None = None) -> dict:
    endpoint = Endpoint("http://wsa:30000", "qwen", ("http://wsa:30000",), "TP rank 0 on wsa")
    windows = [
        window("single", {"output_tok_s": single, "ttft_seconds": 0.05, "seconds": 5.0,
                          "completion_tokens": 512, "tokens_per_chunk": accept}, 512,
               512 << 20, errors, retrans, accept, max_socket),
        window("concurrent", {"aggregate_output_tok_s": aggregate, "seconds": 4.0,
                              "completion_tokens": 1536, "requests": 6,
                              "per_request_output_tok_s": {"mean": aggregate / 6, "min": 1,
                                                           "max": 2},
                              "ttft_seconds": {"mean": 0.1, "min": 0.1, "max": 0.1}}, 1536,
               1536 << 20, 0, 0, max_socket=None if max_socket is None else 0),
    ]
    return report.build(state, {"verdict": f"matches: {state}"}, topology, endpoint,
                        WindowSettings(), {"tp_size": 2}, windows)


def test_headline_totals_the_link_over_every_window():
    figures = report.headline(measurement("tp2_stock", 50.0, 200.0, 12, 30, 3.8))
    assert figures["single_tok_s"] == 50.0 and figures["aggregate_tok_s"] == 200.0
    assert figures["receiver_errors"] == 12 and figures["retransmissions"] == 30
    # 2048 MiB moved for 2048 output tokens: 1 MiB per token, 1000/1024 GiB per 1k.
    assert figures["gib_per_1k_tokens"] == pytest.approx(1000 / 1024)
    assert figures["accept_length"] == 3.8


def test_bytes_per_output_token_are_the_decode_windows_and_counts_every_window():
    """A long prefill moves its prompt for 8 output tokens: not a decode figure."""
    built = with_prefills(measurement("tp2_stock", 50.0, 200.0, 12, 30, 3.8), 2.0, 0.02)
    for window in built["windows"]:
        if window["name"] in ("long", "long_warm"):
            window["link"]["totals"].update(bytes_moved=20 << 30, receiver_errors=5)
    figures = report.headline(built)
    assert figures["gib_per_1k_tokens"] == pytest.approx(1000 / 1024)
    assert figures["receiver_errors"] == 12 + 2 * 5



def test_a_report_is_written_as_json_and_markdown_and_read_back(tmp_path):
    built = measurement("tp2_e2e", 77.1, 300.0, 0, 1, 3.8)
    path = report.write(built, tmp_path)
    assert path.name.startswith("tp2_e2e-") and path.suffix == ".json"
    assert report.load(path) == built
    text = path.with_suffix(".md").read_text()
    assert "# twinbolt measurement: tp2_e2e" in text and "matches: tp2_e2e" in text
    assert "| single | 1 | 77.1 |" in text
    # The two retransmission figures are told apart, in the table and in words.
    assert "| TP-socket retrans (max per socket) | host-wide retrans |" in text
    assert report.RETRANSMISSIONS_NOTE in text
    other = tmp_path / "other.json"
    other.write_text("{}")
    with pytest.raises(ValueError, match="not a twinbolt measurement"):
        report.load(other)


def campaign_reports() -> list[dict]:
    """Three trials of three states, in the order ABBA, the driver's effect well apart."""
    stock = [(48.4, 200.0, 120), (50.1, 205.0, 90), (47.2, 198.0, 0)]
    e2e = [(77.1, 310.0, 0), (79.0, 305.0, 0), (75.6, 312.0, 0)]
    nospec = [(60.0, 250.0, 0), (40.0, 240.0, 0), (78.0, 255.0, 0)]
    trials = [[stock[0], e2e[0], nospec[0]], [nospec[1], e2e[1], stock[1]],
              [stock[2], e2e[2], nospec[2]]]
    names = [["tp2_stock", "tp2_e2e", "tp2_e2e_nospec"],
             ["tp2_e2e_nospec", "tp2_e2e", "tp2_stock"],
             ["tp2_stock", "tp2_e2e", "tp2_e2e_nospec"]]
    return [measurement(name, single, aggregate, errors, 20, 3.8 if "nospec" not in name else None)
            for trial, order in zip(trials, names, strict=True)
            for (single, aggregate, errors), name in zip(trial, order, strict=True)]


def rows_of(table: str) -> dict[str, list[str]]:
    """The comparison's rows by state, cell by cell."""
    return {cells[0]: cells for cells in (line.strip("| ").split(" | ")
                                          for line in table.splitlines()
                                          if line.startswith("| tp2_"))
            if len(cells) == len(compare.comparison_header())}


def test_a_state_over_its_trials_is_one_row_of_medians_intervals_and_verdicts():
    rows = rows_of(compare.comparison(campaign_reports()))
    assert list(rows) == ["tp2_stock", "tp2_e2e", "tp2_e2e_nospec"]
    column = {title: index for index, title in enumerate(compare.comparison_header())
              if title != "×"}
    stock, e2e, nospec = rows.values()
    assert stock[:5] == ["tp2_stock", "—", "3", "48.4 [45.1–52.3]", "—"]
    # The driver's effect: every trial of tp2_e2e above every trial of tp2_stock.
    assert e2e[:5] == ["tp2_e2e", "driver", "3", "77.1 [73.1–81.6]", "1.59× [1.50–1.69] faster"]
    # Speculative decoding off, its three trials spread from 40 to 78: a ratio's
    # interval that holds 1, said as such rather than as the 0.78× of its first trial.
    assert nospec[:5] == ["tp2_e2e_nospec", "speculative", "3", "60.0 [24.8–132.0]",
                          "0.74× [0.43–1.27] no difference detected at n=3"]
    # Counts are totals, each trial's beside it: never a ratio, never a mean.
    assert stock[column["receiver errors"]] == "210 (120, 90, 0)"
    assert e2e[column["receiver errors"]] == "0 (0, 0, 0)"
    assert e2e[column["host-wide retransmissions"]] == "60 (20, 20, 20)"


def test_each_state_and_figure_has_its_median_range_interval_and_trials():
    lines = section(compare.comparison(campaign_reports()), "### Each state over its trials")
    assert lines[1] == ("| state | figure | n | median | min–max | 95% interval | trials |")
    assert "| tp2_stock | single tok/s | 3 | 48.4 | 47.2–50.1 | 45.1–52.3 | 48.4, 50.1, 47.2 |" \
        in lines
    integrity = section(compare.comparison(campaign_reports()), "### Counts: zero in every trial?")
    assert "| tp2_stock | receiver errors | 120, 90, 0 | 210 | not zero in every trial: 2 of 3 " \
           "counted some |" in integrity
    assert "| tp2_e2e | receiver errors | 0, 0, 0 | 0 | zero in every trial (n=3) |" in integrity


def test_one_trial_a_state_gives_its_figures_but_no_ratio_and_says_why():
    reports = campaign_reports()[:3]
    text = compare.comparison(reports)
    _, e2e, _ = rows_of(text).values()
    assert e2e[:5] == ["tp2_e2e", "driver", "1", "77.1 (n=1)", "no verdict: one trial"]
    assert "1.59×" not in text.split("### The field report side by side")[0]


def test_comparison_against_a_baseline_and_its_chart(tmp_path):
    rows = rows_of(compare.comparison(campaign_reports(), baseline="tp2_stock"))
    assert rows["tp2_e2e_nospec"][4] == "1.18× [0.69–2.02] no difference detected at n=3"
    assert rows["tp2_stock"][4] == "—"
    with pytest.raises(ValueError, match="baseline state 'production'"):
        compare.comparison(campaign_reports(), baseline="production")
    chart = compare.chart(campaign_reports(), tmp_path / "chart.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_chart_draws_each_interval_at_its_own_bounds_even_off_its_median(tmp_path,
                                                                             monkeypatch):
    from matplotlib.axes import Axes

    # Three equal trials: an interval of exp(log(5.0)), a rounding below the median
    # of 5.0, which an error bar drawn from the bar's top refused ("'yerr' must not
    # contain negative values") and ended a campaign that had measured everything.
    equal = [measurement("tp2_stock", 5.0, 200.0 + trial, 0, 20, 3.8) for trial in range(3)]
    drawn = []
    original = Axes.vlines
    monkeypatch.setattr(Axes, "vlines", lambda axis, x, low, high, *a, **k:
                        drawn.append((x, low, high)) or original(axis, x, low, high, *a, **k))
    chart = compare.chart([*equal, *campaign_reports()[1:2]], tmp_path / "equal.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    single = intervals.spread([5.0, 5.0, 5.0]).interval
    assert single[1] < 5.0
    assert (0, *single) in drawn
    assert (0, *intervals.spread([200.0, 201.0, 202.0]).interval) in drawn


def with_prefills(built: dict, cold_ttft: float, warm_ttft: float) -> dict:
    """``built`` with a cold and a warm long window (each one request of 8 tokens)."""
    built = copy.deepcopy(built)
    cold = {"prompt_tokens": 5000, "cached_tokens": 0, "prefill": "cold",
            "ttft_seconds": cold_ttft, "temperature": "cold"}
    warm = {**cold, "cached_tokens": 4990, "prefill": "warm", "ttft_seconds": warm_ttft,
            "temperature": "warm", "hit_rate": 0.998}
    built["windows"] += [window("long", cold, 8, 0, 0, 0), window("long_warm", warm, 8, 0, 0, 0)]
    return built


def test_a_warm_figure_never_lands_in_a_cold_column():
    def of(state: str) -> list[dict]:
        return [built for built in campaign_reports() if built["state"] == state]

    stock = [with_prefills(built, cold, 0.02)
             for built, cold in zip(of("tp2_stock"), (2.0, 2.2, 1.9), strict=True)]
    e2e = [with_prefills(built, 1.0, warm)
           for built, warm in zip(of("tp2_e2e"), (0.010, 0.011, 0.009), strict=True)]
    # A fourth trial of the candidate with its warm window only: its cold column keeps three.
    warm_only = copy.deepcopy(e2e[0])
    warm_only["windows"] = [w for w in warm_only["windows"] if w["name"] != "long"]
    text = compare.comparison([*stock, *e2e, warm_only])
    lines = section(text, "### Cold and warm prefills, kept apart")
    header = ("| state | changed | trials | prefix TTFT s, cold | × | prefix TTFT s, warm | × | "
              "prefix hit rate, warm | long TTFT s, cold | × | long TTFT s, warm | × | "
              "long hit rate, warm |")
    assert lines[1] == header
    rows = {cells[0]: cells for cells in (line.strip("| ").split(" | ") for line in lines
                                          if line.startswith("| tp2_"))}
    # The candidate's cold column holds its three cold trials, never the warm-only fourth.
    assert rows["tp2_e2e"][8] == "1.000 [1.000–1.000]"
    assert rows["tp2_e2e"][10] == "0.010 [0.009–0.011]"
    # The cold verdict rests on the three trials that measured it, and says so.
    assert rows["tp2_e2e"][9].endswith("faster (rests on 3 of 4 trials here)")
    assert rows["tp2_e2e"][11].endswith("faster")
    assert rows["tp2_e2e"][12] == "0.998 [0.998–0.998]"
    assert "| tp2_e2e | long TTFT s, cold | 3 | 1.000 |" in text
    assert "| tp2_e2e | long TTFT s, warm | 4 | 0.010 |" in text
    # The headline keys each window by its own name.
    figures = report.headline(warm_only)
    assert figures["long_ttft_s"] is None and figures["long_warm_ttft_s"] == 0.010
    assert figures["long_warm_hit_rate"] == 0.998


def test_the_chart_draws_cold_and_warm_prefills_in_panels_of_their_own(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    titles = []
    original = Axes.set_title
    monkeypatch.setattr(Axes, "set_title",
                        lambda axis, title, *a, **k: titles.append(title) or original(axis, title))
    compare.chart(campaign_reports(), tmp_path / "plain.png")
    assert not [title for title in titles if "TTFT" in title]
    titles.clear()
    with_both = [with_prefills(built, 2.0, 0.02) for built in campaign_reports()]
    chart = compare.chart(with_both, tmp_path / "prefills.png")
    assert [title for title in titles if "TTFT" in title] == ["long TTFT s, cold",
                                                              "long TTFT s, warm"]
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_comparison_without_prefill_windows_has_no_cold_and_warm_table():
    assert "Cold and warm" not in compare.comparison(campaign_reports())


def test_compare_takes_several_reports_per_state(tmp_path, capsys):
    paths = [report.write(built, tmp_path / f"trial-{index}")
             for index, built in enumerate(campaign_reports())]
    assert experiment.main(["compare", *map(str, paths), "--chart",
                            str(tmp_path / "chart.png")]) == 0
    printed = capsys.readouterr().out
    assert rows_of(printed)["tp2_e2e"][4] == "1.59× [1.50–1.69] faster"
    assert "| single-stream tok/s | 48.4 [45.1–52.3] | 77.1 [73.1–81.6] | 1.59× [1.50–1.69] " \
           "faster | 48.4 | 77.1 | 1.59× |" in printed


def test_a_reset_window_shows_its_problem_in_the_summary():
    built = measurement("tp2_stock", 48.4, 200.0, 1, 1, 3.8)
    reset = copy.deepcopy(built)
    reset["windows"][0]["link"]["delta"] = {"wsa": counters.delta(snap(0, tx_bytes=5),
                                                                  snap(1, tx_bytes=1))}
    assert "a counter went backwards" in report.markdown(reset)


def inventory(*groups: str) -> Topology:
    """Two workstations in ``groups``, as the inventory would give them."""
    return Topology(tuple(InventoryEntry(name, ("workstations", *groups),
                                         {"rank": rank, "ssh_hostname": f"10.66.0.1{rank}"})
                          for rank, name in enumerate(("wsa", "wsb"))), None, Path("ssh_config"))


def stock_and_candidate(topology: Topology | None = None) -> list[dict]:
    """A campaign's control and candidate, with figures unlike the field report's."""
    return [measurement("production", 60.0, 250.0, 0, 2, None, 0, topology),
            measurement("tp2_stock", 40.0, 200.0, 120, 300, 3.8, 9, topology),
            measurement("tp2_e2e", 70.0, 310.0, 0, 20, 3.8, 0, topology)]


def section(text: str, title: str) -> list[str]:
    """The lines of a Markdown section, up to the next heading."""
    lines = text.splitlines()
    start = lines.index(title) + 1
    end = next((index for index in range(start, len(lines)) if lines[index].startswith("#")),
               len(lines))
    return lines[start:end]


def test_the_field_report_is_set_beside_this_campaigns_stock_and_candidate():
    lines = section(compare.comparison(stock_and_candidate()), "### The field report side by side")
    rows = [line for line in lines if line.startswith("| ")]
    assert rows[0] == ("| measure | tp2_stock (n=1) | tp2_e2e (n=1) | × "
                       "| field tp2_stock (one observation) | field tp2_e2e (one observation) "
                       "| field × (one observation each) |")
    # Measured 40 -> 70 here, once: no verdict; the field report's 48.4 -> 77.1 stays
    # its own, one observation each. Every figure the report gives is beside its lab
    # figure; "not reported" only where it gives none (a TP socket's own count; GiB
    # per 1k tokens under the candidate).
    assert rows[1:] == [
        "| single-stream tok/s | 40.0 (n=1) | 70.0 (n=1) | no verdict: one trial | 48.4 | 77.1 "
        "| 1.59× |",
        "| aggregate tok/s | 200.0 (n=1) | 310.0 (n=1) | no verdict: one trial | 172.9 | 199.6 "
        "| 1.15× |",
        "| accept length | 3.80 (n=1) | 3.80 (n=1) | no verdict: one trial | about 2 to 3 "
        "| 3.83 to 4.00 | — |",
        "| receiver errors | 120 (120) | 0 (0) | — | 109 (one receiver) | 0 (both) | 0.00× |",
        "| host-wide retransmissions | 300 (300) | 20 (20) | — | 2,026 (239 + 1,787) "
        "| 847 (529 + 318) | 0.42× |",
        "| max retransmissions of one TP socket | 9 | 0 | — | not reported | not reported | — |",
        rows[7],
    ]
    assert rows[7].startswith("| GiB / 1k output tokens | ") and rows[7].endswith(
        " | about 3.6 | not reported | — |")
    assert compare.SIDE_BY_SIDE_NOTE in lines


def test_the_field_table_takes_every_trial_of_a_state():
    reports = [*stock_and_candidate(), measurement("tp2_stock", 50.0, 100.0, 0, 0, 3.8, 0),
               measurement("tp2_e2e", 72.0, 300.0, 0, 0, 3.8, 0)]
    rows = section(compare.comparison(reports), "### The field report side by side")
    # Two trials each, the stock ones 40 and 50: too few and too spread for a verdict.
    assert ("| single-stream tok/s | 45.0 [10.8–184.6] | 71.0 [59.4–84.9] "
            "| 1.59× [0.98–2.58] no difference detected at n=2 | 48.4 | 77.1 | 1.59× |") in rows
    assert "| receiver errors | 120 (120, 0) | 0 (0, 0) | — | 109 (one receiver) | 0 (both) " \
           "| 0.00× |" in rows


def test_without_a_stock_and_a_candidate_report_the_section_names_the_missing_state():
    production, stock, _ = stock_and_candidate()
    nospec = measurement("tp2_e2e_nospec", 30.0, 150.0, 0, 10, None)
    lines = section(compare.comparison([stock, nospec]), "### The field report side by side")
    assert lines == ["", "No report of tp2_e2e (have tp2_stock, tp2_e2e_nospec): the field "
                         "report compares tp2_stock with tp2_e2e."]
    text = compare.comparison([production])
    assert "No report of tp2_stock or tp2_e2e (have production)" in text
    assert "| single-stream tok/s |" not in text


def test_a_report_records_whether_its_workstations_are_the_labs():
    lab = stock_and_candidate(inventory("lab"))
    assert lab[1]["hosts"]["wsb"]["groups"] == ["workstations", "lab"]
    assert caveats.ran_on(lab) == "lab"
    assert caveats.ran_on(stock_and_candidate(inventory())) == "site"
    # Built without an inventory, or from a report that predates the record: unknown.
    assert caveats.ran_on(stock_and_candidate()) is None
    older = copy.deepcopy(lab)
    del older[0]["hosts"]["wsa"]["groups"]
    assert caveats.ran_on(older) is None
    assert caveats.ran_on([lab[1], stock_and_candidate(inventory())[2]]) is None


def test_what_this_does_not_prove_says_whose_figures_they_are():
    lab = caveats.does_not_prove(stock_and_candidate(inventory("lab")))
    assert any("ran on the embedded lab" in bullet and "simulator's, not a GPU's" in bullet
               for bullet in lab)
    assert any("not that the candidate driver helps real hardware" in bullet for bullet in lab)
    assert any("its losses are a simulated receive ring overrunning" in bullet for bullet in lab)
    site = caveats.does_not_prove(stock_and_candidate(inventory()))
    assert any("ran on a site's workstations" in bullet for bullet in site)
    assert not any("simulat" in bullet for bullet in site)
    unknown = caveats.does_not_prove(stock_and_candidate())
    assert unknown[0].startswith("These reports do not record where they ran. If on the "
                                 "embedded lab")
    assert not any("ran on" in bullet for bullet in unknown)
    # The lab's link answers sooner than a real one: said, with the field's figure.
    assert any("The lab's link answers an idle probe in a few hundredths of a ms (no linktest "
               "ran here), a real Thunderbolt link in about 0.28 to 0.29 ms" in bullet
               and "decode figures" in bullet for bullet in lab)
    assert not any("idle probe" in bullet for bullet in site + unknown)
    # The candidate's two windows of 2 s each: the bound is said for 4 s.
    assert "tp2_e2e's windows lasted 4 s in all" in lab[-2]
    assert "below about 3 per 4 s (95%)" in lab[-2]
    assert lab[-1] == caveats.ONCE
    # Three trials of each state: what the intervals do not cover.
    trials = caveats.does_not_prove(campaign_reports())
    assert trials[-1].startswith("Each state was measured in 3 trials or more, in one campaign")
    assert "no difference detected at n=3' is not 'no difference'" in trials[-1]


def test_the_labs_latency_caveat_names_what_its_linktests_measured():
    links = [linktest_report_of("production", 0.061), linktest_report_of("tp2_e2e", 0.058)]
    bullet = caveats.link_latency(links)
    assert bullet.startswith("The lab's link answers an idle probe in about 0.058 to 0.061 ms "
                             "in this campaign's linktests, a real Thunderbolt link in about "
                             "0.28 to 0.29 ms")


def linktest_report_of(state: str, probe_mean_ms: float) -> dict:
    """A linktest's report as far as its headline reads it: idle probes at ``probe_mean_ms``."""
    probes = {"kind": "probes", "sent": 100, "received": 100, "mean_ms": probe_mean_ms,
              "p99_ms": probe_mean_ms}
    return {"state": state, "observed": {"layers": {"driver": "stock"}},
            "runs": [{**probes, "direction": "wsa->wsb"}, {**probes, "direction": "wsb->wsa"}]}


def test_the_campaign_report_sets_the_field_report_beside_it_and_says_what_it_does_not_prove(
        tmp_path):
    run = campaign.Campaign(None, campaign.check_plan(["tp2_stock_nospec", "tp2_stock",
                                                       "tp2_e2e"]),
                            ["single", "concurrent"], WindowSettings(), tmp_path)
    run.reports = [report.write(built, tmp_path)
                   for built in stock_and_candidate(inventory("lab"))]
    result = run.finish("t", restored=True)
    text = (tmp_path / "campaign.md").read_text()
    assert "| single-stream tok/s | 40.0 (n=1) | 70.0 (n=1) | no verdict: one trial | 48.4 " \
           "| 77.1 | 1.59× |" in text
    bullets = section(text, "## What this does not prove")
    assert bullets == ["", *(f"- {bullet}" for bullet in result["does_not_prove"])]
    assert result["does_not_prove"] == caveats.does_not_prove(
        [report.load(path) for path in run.reports])
    assert json.loads((tmp_path / "campaign.json").read_text())["does_not_prove"] == \
        result["does_not_prove"]
    # Nothing measured: nothing to caution about.
    empty = campaign.Campaign(None, run.plan, ["single"], WindowSettings(), tmp_path / "empty")
    empty.finish("t", restored=None)
    assert "What this does not prove" not in (tmp_path / "empty" / "campaign.md").read_text()


def test_a_report_is_written_whole_or_not_at_all(tmp_path) -> None:
    path = tmp_path / "reports" / "tp2_e2e.json"
    report.write_text(path, "old\n")
    with pytest.raises(RuntimeError), report.replaced(path) as temporary:
        temporary.write_text("half of the ne")
        raise RuntimeError("the writer dies mid-way")
    assert path.read_text() == "old\n"
    assert sorted(item.name for item in path.parent.iterdir()) == ["tp2_e2e.json"]
    report.write_text(path, "new\n")
    assert path.read_text() == "new\n" and oct(path.stat().st_mode & 0o777) == "0o644"
    assert sorted(item.name for item in path.parent.iterdir()) == ["tp2_e2e.json"]


def test_a_campaigns_trials_are_compared_with_intervals_and_verdicts(tmp_path):
    run = campaign.Campaign(None, campaign.check_plan(["tp2_stock", "tp2_e2e", "tp2_e2e_nospec"],
                                                      baseline=False),
                            ["single", "concurrent"], WindowSettings(), tmp_path, baseline=False,
                            trials=3)
    run.reports = [report.write(built, tmp_path / f"trial-{index // 3 + 1}")
                   for index, built in enumerate(campaign_reports())]
    result = run.finish("t", restored=True)
    text = (tmp_path / "campaign.md").read_text()
    assert rows_of(result["comparison"])["tp2_e2e"][4] == "1.59× [1.50–1.69] faster"
    assert "| tp2_e2e | receiver errors | 0, 0, 0 | 0 | zero in every trial (n=3) |" in text
    assert result["does_not_prove"][-1].startswith("Each state was measured in 3 trials")
