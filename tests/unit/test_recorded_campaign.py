"""
A recorded campaign (CI's `make demo` of 2026-12-07: three trials of tp2_stock and
tp2_e2e, three linktests) goes through the report and comparison path and gives
what it gave when it was recorded: every report's Markdown, its bench_serving
lines, the comparison, the campaign's own Markdown, and the data each chart draws.

The expected outputs (``recorded_campaign/expected/``) were written by this code
before harness/ was reorganised; a refactor that changes one character of them
fails here. ``TWINBOLT_RECORD=1`` writes them again, for a change meant to alter
a report (and its diff is then the review).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import matplotlib
import pytest

from harness.reporting import bench_serving, compare, linktest_report, report, report_schema
from harness.runs import campaign

matplotlib.use("Agg")

HERE = Path(__file__).resolve().parent / "recorded_campaign"
REPORTS = HERE / "recorded"
EXPECTED = HERE / "expected"


def loaded(pattern: str) -> list[dict[str, Any]]:
    return [report_schema.load(path) for path in sorted(REPORTS.glob(pattern))]


def drawn(figure: Any) -> dict[str, Any]:
    """What a figure shows, axis by axis: titles, bars, their labels, ticks, lines, limits."""
    axes = []
    for axis in figure.axes:
        if not axis.axison:
            continue
        axes.append({
            "title": axis.get_title(),
            "bars": [[round(float(bar.get_x()), 6), round(float(bar.get_height()), 6)]
                     for bar in axis.patches],
            "texts": [text.get_text() for text in axis.texts],
            "xticks": [tick.get_text() for tick in axis.get_xticklabels()],
            "lines": [[[round(float(x), 6) for x in line.get_xdata()],
                       [round(float(y), 6) for y in line.get_ydata()]]
                      for line in axis.get_lines()],
            "segments": [[[round(float(v), 6) for v in point] for point in segment]
                         for collection in axis.collections
                         for segment in collection.get_segments()],
            "ylim_bottom": float(axis.get_ylim()[0]),
        })
    return {"title": figure._suptitle.get_text() if figure._suptitle else None, "axes": axes}


def charts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, Any]:
    """Each chart's data, read from its figure as it is saved."""
    from matplotlib.figure import Figure

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(Figure, "savefig", lambda figure, *_, **__: seen.append(drawn(figure)))
    measurements = loaded("trial-*.json")
    links = loaded("linktest-*.json")
    compare.chart(measurements, tmp_path / "comparison.png")
    for built in links:
        linktest_report.chart(built, tmp_path / "linktest.png")
    linktest_report.transport_chart(links, tmp_path / "transport.png")
    return {"charts": seen}


def rendered(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Every text the report path writes from the recorded JSON, by the file it is kept in."""
    measurements = loaded("trial-*.json")
    links = loaded("linktest-*.json")
    texts = {}
    for path, built in zip(sorted(REPORTS.glob("trial-*.json")), measurements, strict=True):
        texts[f"{path.stem}.md"] = report.markdown(built)
        texts[f"{path.stem}.bench_serving.jsonl"] = bench_serving.lines(built)
    for path, built in zip(sorted(REPORTS.glob("linktest-*.json")), links, strict=True):
        texts[f"{path.stem}.md"] = linktest_report.markdown(built)
    texts["comparison.md"] = compare.comparison(measurements)
    texts["comparison-baseline-tp2_stock.md"] = compare.comparison(measurements, "tp2_stock")
    texts["linktests.md"] = linktest_report.comparison(links)
    texts["transport.md"] = campaign.transport_tables(links)
    texts["campaign.md"] = campaign.markdown(json.loads((REPORTS / "campaign.json").read_text()))
    texts["charts.json"] = json.dumps(charts(monkeypatch, tmp_path), indent=1) + "\n"
    return texts


def test_the_recorded_campaign_reads_as_it_did(monkeypatch, tmp_path):
    texts = rendered(monkeypatch, tmp_path)
    if os.environ.get("TWINBOLT_RECORD") == "1":
        EXPECTED.mkdir(exist_ok=True)
        for name, text in texts.items():
            (EXPECTED / name).write_text(text)
    expected = {path.name: path.read_text() for path in EXPECTED.iterdir()}
    assert sorted(texts) == sorted(expected)
    for name, text in texts.items():
        assert text == expected[name], f"{name} differs from the recorded output"
