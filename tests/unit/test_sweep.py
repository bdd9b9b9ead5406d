"""The concurrency sweep's arithmetic, its table, TP against the replicas and the crossover."""

from __future__ import annotations

import pytest
from test_measure_reports import measurement, window

import experiment
from harness.measuring import sweep
from harness.measuring.client import Sample, time_per_output_token
from harness.measuring.windows import WindowSettings
from harness.reporting import compare, report


def test_a_levels_window_names_its_level_and_no_other_name_does():
    assert sweep.level_name(16) == "sweep@16"
    assert sweep.level_of("sweep@16") == 16
    for name in ("single", "concurrent", "sweep", "sweep@", "sweep@x", "sweep@-1", "long_warm"):
        assert sweep.level_of(name) is None, name


@pytest.mark.parametrize(("values", "share", "expected"), [
    # numpy.percentile's default, linear between the nearest two.
    ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
    ([4.0, 1.0, 3.0, 2.0], 99, 3.97),
    ([1.0, 2.0, 3.0, 4.0], 0, 1.0),
    ([1.0, 2.0, 3.0, 4.0], 100, 4.0),
    ([7.0], 99, 7.0),
    ([], 50, None),
])
def test_percentiles_interpolate_linearly_as_bench_serving_does(values, share, expected):
    found = sweep.percentile(values, share)
    assert found == (None if expected is None else pytest.approx(expected))


def finished(label: str, sent: float, first: float, last: float, tokens: int,
             error: str | None = None) -> Sample:
    sample = Sample(label, tokens)
    sample.sent_at, sample.first_token_at, sample.last_token_at = sent, first, last
    sample.completion_tokens, sample.error = (None, error) if error else (tokens, None)
    return sample


def test_time_per_output_token_counts_the_tokens_after_the_first():
    # 31 tokens after the first in 1.5 s.
    a, b = finished("a", 0.0, 0.5, 2.0, 32), finished("b", 0.0, 0.5, 0.5, 1)
    assert time_per_output_token(a.seconds, a.ttft, a.completion_tokens) == pytest.approx(
        1.5 / 31)
    assert time_per_output_token(b.seconds, b.ttft, b.completion_tokens) is None


def test_a_levels_aggregate_is_its_tokens_over_its_span_and_each_request_keeps_its_own():
    samples = [finished("sweep@4-0", 0.0, 0.1, 2.0, 32), finished("sweep@4-1", 0.0, 0.2, 4.0, 32),
               finished("sweep@4-2", 0.5, 0.6, 2.5, 32), finished("sweep@4-3", 0.5, 1.5, 4.5, 32)]
    summary = sweep.level_summary(4, samples)
    assert (summary["requests"], summary["completed"], summary["completion_tokens"]) == (4, 4, 128)
    # From the first request sent (0.0) to the last token received (4.5).
    assert summary["seconds"] == 4.5
    assert summary["aggregate_output_tok_s"] == pytest.approx(128 / 4.5)
    # Each request's own tok/s: 16, 8, 16, 8; never the aggregate divided by four.
    rates = summary["per_request_output_tok_s"]
    assert (rates["p50"], rates["mean"]) == (pytest.approx(12.0), pytest.approx(12.0))
    assert rates["p99"] == pytest.approx(16.0)
    ttft = summary["ttft_seconds"]
    assert (ttft["p50"], ttft["p99"]) == (pytest.approx(0.15), pytest.approx(0.2 + 0.8 * 0.97))


def test_a_level_with_a_failed_request_has_no_aggregate():
    samples = [finished("sweep@2-0", 0.0, 0.1, 2.0, 32),
               finished("sweep@2-1", 0.0, 0.1, 2.0, 32, error="HTTP 503")]
    summary = sweep.level_summary(2, samples)
    assert (summary["completed"], summary["aggregate_output_tok_s"]) == (1, None)
    assert summary["per_request_output_tok_s"]["p50"] == pytest.approx(16.0)


@pytest.mark.parametrize(("verdicts", "expected"), [
    # Faster at 1 and 2, no difference at 4, slower from 8: the crossover lies
    # between 2 and 8, the levels that decided.
    ([(1, "faster"), (2, "faster"), (4, "no difference detected at n=3"), (8, "slower"),
      (16, "slower")], (2, 8, "faster", "slower")),
    ([(1, "slower"), (2, "faster")], (1, 2, "slower", "faster")),
    ([(1, "faster"), (2, "faster"), (4, "faster")], None),
    ([(1, "no verdict: one trial"), (2, "no verdict: one trial")], None),
    ([(1, "faster"), (2, "no difference detected at n=3")], None),
])
def test_the_crossover_is_where_a_decided_verdict_turns(verdicts, expected):
    found = sweep.crossover(verdicts, ("faster", "slower"))
    assert (found and (found.low, found.high, found.before, found.after)) == expected


def test_a_sweep_without_a_crossover_says_which_verdict_it_kept_or_that_none_was_decided():
    assert sweep.no_crossover([(1, "faster"), (4, "faster")], ("faster", "slower")) == (
        "no crossover in 1–4: faster wherever a level decided")
    assert sweep.no_crossover([(1, "no verdict: one trial"), (2, "no verdict: one trial")],
                              ("faster", "slower")) == "no crossover: no level of 1–2 decided"
    assert sweep.crossover([(2, "faster"), (8, "slower")], ("faster", "slower")).words() == (
        "crossover between 2 and 8 requests: faster up to 2, slower from 8")


def level_window(level: int, aggregate: float, per_request: float, errors: int = 0) -> dict:
    summary = {"level": level, "requests": level, "completed": level,
               "completion_tokens": 32 * level, "seconds": 32 * level / aggregate,
               "aggregate_output_tok_s": aggregate,
               "per_request_output_tok_s": {"p50": per_request, "p99": per_request * 1.1,
                                            "mean": per_request},
               "ttft_seconds": {"p50": 0.1, "p99": 0.2, "mean": 0.12},
               "tpot_seconds": {"p50": 1 / per_request, "p99": 1.2 / per_request,
                                "mean": 1 / per_request}}
    return window(sweep.level_name(level), summary, 32 * level, 1 << 20, errors, 0, 3.0)


# (level, aggregate, per-request) of each architecture: TP serves one request
# faster, the replicas serve more once there are enough requests for both GPUs.
TP = ((1, 80.0, 80.0), (2, 150.0, 75.0), (4, 200.0, 50.0), (8, 250.0, 31.0))
REPLICAS = ((1, 50.0, 50.0), (2, 100.0, 50.0), (4, 200.0, 50.0), (8, 400.0, 50.0))


def swept(state: str, levels: tuple, jitter: float, errors: int = 0) -> dict:
    built = measurement(state, 50.0, 200.0, 0, 0, 3.8)
    built["windows"] += [level_window(level, aggregate * jitter, per_request * jitter, errors)
                         for level, aggregate, per_request in levels]
    return built


def sweep_reports() -> list[dict]:
    return [swept(state, levels, jitter, errors=5 if state == "tp2_stock" else 0)
            for jitter in (1.0, 1.02, 0.98)
            for state, levels in (("production", REPLICAS), ("tp2_e2e", TP))]


def section(text: str, title: str) -> list[str]:
    start = text.index(title)
    return text[start:].split("\n\n### ")[0].splitlines()


def test_each_level_is_a_row_with_its_interval_and_its_ratio_at_the_same_level():
    figures = report.headline(sweep_reports()[1])["sweep"]
    assert sorted(figures) == [1, 2, 4, 8]
    assert figures[8]["aggregate_tok_s"] == 250.0 and figures[8]["tpot_p50_ms"] == pytest.approx(
        1000 / 31)
    text = compare.comparison(sweep_reports())
    rows = {tuple(cells[:2]): cells for cells in (
        line.strip("| ").split(" | ") for line in section(text, "### Concurrency sweep")
        if line.startswith("| tp2_e2e") or line.startswith("| production"))}
    assert set(rows) == {(state, str(level)) for state in ("production", "tp2_e2e")
                         for level in (1, 2, 4, 8)}
    # Against the row above (production) at the same level: 80 / 50 at one request.
    aggregate_ratio = rows[("tp2_e2e", "1")][4]
    assert aggregate_ratio.startswith("1.60× [") and aggregate_ratio.endswith("faster")
    assert rows[("tp2_e2e", "8")][4].endswith("slower")
    assert rows[("tp2_e2e", "4")][4].endswith("no difference detected at n=3")
    assert rows[("production", "1")][4] == "—"


def test_tp_against_the_replicas_gives_a_verdict_per_level_and_the_crossover():
    text = compare.comparison(sweep_reports())
    lines = section(text, "### TP2 against two replicas (production), level by level")
    verdicts = {(cells[0], cells[2]): cells[3:] for cells in (
        line.strip("| ").split(" | ") for line in lines if line.startswith("| tp2_e2e"))}
    # tp2_e2e differs from production in three layers, and the table says so.
    assert {cells[1] for cells in (line.strip("| ").split(" | ") for line in lines
                                   if line.startswith("| tp2_e2e"))} == {
        "driver, serving, speculative"}
    assert verdicts[("tp2_e2e", "1")][0].endswith("serves more")
    assert verdicts[("tp2_e2e", "8")][0].endswith("serves less")
    assert verdicts[("tp2_e2e", "8")][1].endswith("slower per request")
    assert ("- tp2_e2e against production, aggregate tok/s: crossover between 2 and 8 "
            "requests: serves more up to 2, serves less from 8") in lines
    assert ("- tp2_e2e against production, per-request tok/s p50: crossover between 2 and 8 "
            "requests: faster per request up to 2, slower per request from 8") in lines


def test_the_memory_side_is_each_architectures_own_answer_beside_the_replicas():
    reports = sweep_reports()
    for built in reports:
        built["config"]["server_info"] |= (
            {"max_total_num_tokens": 52_928, "max_req_input_len": 52_922}
            if built["state"] == "production"
            else {"max_total_num_tokens": 150_749, "max_req_input_len": 150_743})
    lines = section(compare.comparison(reports), "### The memory side")
    rows = {cells[0]: cells[1:] for cells in (line.strip("| ").split(" | ") for line in lines
                                             if line.startswith(("| production", "| tp2_")))}
    assert rows == {"production": ["52,928", "—", "52,922", "—"],
                    "tp2_e2e": ["150,749", "2.85×", "150,743", "2.85×"]}


def test_a_level_whose_summary_lacks_a_figure_leaves_it_unknown():
    built = swept("tp2_e2e", TP, 1.0)
    for measured in built["windows"]:
        if sweep.level_of(measured["name"]) == 4:
            measured["summary"] = {}
    figures = report.headline(built)["sweep"]
    assert figures[4]["aggregate_tok_s"] is None and figures[4]["tpot_p50_ms"] is None
    assert figures[8]["aggregate_tok_s"] == 250.0
    assert "### Concurrency sweep" in compare.comparison([built])


def test_without_a_sweep_or_without_the_replicas_there_is_no_such_section():
    from test_measure_reports import campaign_reports

    assert "Concurrency sweep" not in compare.comparison(campaign_reports())
    alone = [built for built in sweep_reports() if built["state"] == "tp2_e2e"]
    text = compare.comparison(alone)
    assert "### Concurrency sweep" in text and "TP2 against two replicas" not in text
    assert "The memory side" not in text


def test_the_chart_draws_the_sweep_as_a_curve_per_state(tmp_path, monkeypatch):
    from matplotlib.axes import Axes

    curves = []
    original = Axes.plot
    monkeypatch.setattr(Axes, "plot", lambda axis, x, y, *a, **k:
                        curves.append((list(x), list(y), k.get("label")))
                        or original(axis, x, y, *a, **k))
    chart = compare.chart(sweep_reports(), tmp_path / "sweep.png")
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert ([1, 2, 4, 8], [50.0, 100.0, 200.0, 400.0], "production (n=3)") in curves
    assert ([1, 2, 4, 8], [80.0, 75.0, 50.0, 31.0], "tp2_e2e (n=3)") in curves


@pytest.mark.parametrize("levels", [(4, 2), (1, 1), (1, 512), ()])
def test_the_sweeps_levels_must_be_ascending_distinct_and_bounded(levels):
    with pytest.raises(ValueError, match="the sweep's levels must be ascending"):
        WindowSettings(concurrency=levels)


def test_the_command_line_takes_the_levels_and_refuses_a_bad_list(capsys):
    parsed = experiment.parser().parse_args(["measure", "--window", "sweep",
                                             "--concurrency", "1,2,4"])
    assert experiment.window_settings(parsed).concurrency == (1, 2, 4)
    assert experiment.main(["measure", "--concurrency", "4,2"]) == 2
    assert "--concurrency" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        experiment.parser().parse_args(["measure", "--concurrency", "1,x"])
    assert "is not whole numbers separated by commas" in capsys.readouterr().err
