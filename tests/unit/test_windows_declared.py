"""
A window is one declaration (``harness/measuring/windows.py``'s ``DECLARED``):
one declared there and nowhere else is an option of experiment.py, a row and
headline figures of its report, and columns and a chart panel of a comparison.
"""

from __future__ import annotations

import pytest
from pydantic import PositiveInt
from test_measure_reports import measurement, window

import experiment
from harness.measuring import windows
from harness.measuring.windows import WindowSettings
from harness.reporting import compare, report

# A window no module names: one request of its own size, and one figure compared.
BURST = windows.Window(
    "burst", windows.once(windows.single), windows.one_request,
    (windows.Setting("burst_tokens", PositiveInt, 48, "output tokens of the burst"),),
    (windows.Figure("burst_tok_s", windows.summarised("output_tok_s"), "burst tok/s", 1,
                    windows.RATE, charted=True),))


@pytest.fixture
def burst(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(windows.DECLARED, BURST.name, BURST)


def with_burst(state: str, tok_s: float) -> dict:
    built = measurement(state, 50.0, 200.0, 0, 0, 3.8)
    built["windows"].append(window("burst", {"output_tok_s": tok_s, "ttft_seconds": 0.25}, 48,
                                   48 << 20, 0, 0))
    return built


def test_a_declared_window_is_an_option_of_experiment(burst, capsys):
    parsed = experiment.parser().parse_args(["measure", "--window", "burst",
                                             "--burst-tokens", "12"])
    assert (parsed.windows, parsed.burst_tokens) == (["burst"], 12)
    with pytest.raises(SystemExit):
        experiment.parser().parse_args(["campaign", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "--burst-tokens N default 48" in shown
    assert "in this order: single, concurrent, sweep, profile, prefix, prefix_warm, long, " \
           "long_warm, burst;" in shown
    # Measured by default, after the windows declared before it.
    assert windows.names()[-1] == "burst"


def test_a_declared_window_has_its_row_and_headline_figures(burst):
    built = with_burst("tp2_stock", 42.0)
    assert report.headline(built)["burst_tok_s"] == 42.0
    assert report.window_row(built["windows"][-1])[:7] == [
        "burst", "1", "42.0", "—", "0.250", "—", "—"]
    assert "| burst | 1 | 42.0 | — | 0.250 |" in report.markdown(built)
    # Its output tokens are a decode window's: they count in the link's bytes per token.
    assert report.headline(built)["output_tokens"] == 512 + 1536 + 48


def test_a_declared_window_has_its_columns_and_chart_panel_in_a_comparison(burst):
    header = compare.comparison_header()
    assert header[header.index("per-request tok/s") + 1:][:3] == [
        "burst tok/s", "×", "accept length"]
    text = compare.comparison([with_burst("tp2_stock", 42.0), with_burst("tp2_e2e", 84.0)])
    rows = [line for line in text.splitlines() if line.startswith("| tp2_e2e | driver |")]
    # After the concurrent window's per-request figure, before the state's accept length.
    assert len(rows) == 1 and "| 33.3 (n=1) | 84.0 (n=1) | no verdict: one trial | 3.80 " in rows[0]
    assert "| tp2_e2e | burst tok/s | 1 | 84.0 |" in text
    assert compare.charted_figures()[:3] == ["single_tok_s", "aggregate_tok_s", "burst_tok_s"]


def test_window_settings_are_the_declared_windows_settings_and_the_timeout():
    assert list(WindowSettings.model_fields) == [
        setting.name for window in windows.DECLARED.values() for setting in window.settings
    ] + ["request_timeout_seconds"]
    assert all(WindowSettings.model_fields[setting.name].default == setting.default
               for setting in windows.settings())
