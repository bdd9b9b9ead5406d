"""experiment.py's command line: bad input is one line, exits non-zero, and starts nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_linktest import report as linktest_report
from test_measure_reports import measurement

import experiment

REPO = Path(__file__).resolve().parents[2]


def compare(*paths: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(REPO / "experiment.py"), "compare", *map(str, paths),
                           "--chart", str(paths[0].with_name("chart.png"))],
                          cwd=REPO, capture_output=True, text=True, timeout=120)


def written(tmp_path: Path, name: str, content: object) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(content))
    return path


def without(document: dict, *where: str | int) -> dict:
    """``document`` with the key at ``where`` (a path of keys and indexes) taken out."""
    *parents, last = where
    inner = document
    for part in parents:
        inner = inner[part]
    del inner[last]
    return document


@pytest.mark.parametrize(("content", "expected"), [
    ([], "not a twinbolt report: a JSON object whose format is twinbolt-measurement/1 or "
         "twinbolt-linktest/1 was expected"),
    ("text", "not a twinbolt report"),
    ({"format": "twinbolt-measurement/1"}, "a twinbolt-measurement/1 report that compare cannot "
                                           "read: state: Field required"),
    (without(measurement("tp2_e2e", 77.1, 300.0, 0, 1, 3.8), "windows", 0, "summary"),
     "report that compare cannot read: windows.0.summary: Field required"),
    (without(measurement("tp2_e2e", 77.1, 300.0, 0, 1, 3.8), "windows", 1, "link", "totals",
             "receiver_errors"),
     "windows.1.link.totals.receiver_errors: Field required"),
    (without(linktest_report("candidate", 19.0, 0), "runs", 0, "gbit_s"),
     "a twinbolt-linktest/1 report that compare cannot read: runs.0.flows.gbit_s: Field "
     "required"),
], ids=["list", "string", "no state", "no summary", "no receiver errors", "linktest no rate"])
def test_compare_names_a_file_it_cannot_read_in_one_line(tmp_path, content, expected) -> None:
    good = written(tmp_path, "good.json", measurement("tp2_stock", 48.4, 200.0, 1, 2, 3.8))
    bad = written(tmp_path, "bad.json", content)
    result = compare(good, bad)
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"experiment: {bad}: ") and expected in line, line
    # Every file is checked before any is compared: no table, no chart.
    assert result.stdout == "" and not (tmp_path / "chart.png").exists()


def test_compare_reads_measurements_and_linktests_it_can_read(tmp_path) -> None:
    result = compare(
        written(tmp_path, "stock.json", measurement("tp2_stock", 48.4, 200.0, 120, 300, 3.8)),
        written(tmp_path, "e2e.json", measurement("tp2_e2e", 77.1, 310.0, 0, 20, 3.8)),
        written(tmp_path, "link.json", linktest_report("candidate", 19.0, 0)))
    assert result.returncode == 0, result.stderr
    # One report of each: their figures, and no verdict.
    assert "| tp2_e2e | driver | 1 | 77.1 (n=1) | no verdict: one trial |" in result.stdout
    assert "### Linktests" in result.stdout


@pytest.mark.parametrize("interval", ["inf", "nan", "-5", "0", "61"])
def test_a_soak_interval_that_is_no_interval_is_refused_before_anything_starts(
        monkeypatch, capsys, interval: str) -> None:
    started: list[object] = []

    async def soak_would_start(arguments: object) -> int:
        started.append(arguments)
        return 0

    monkeypatch.setattr(experiment, "with_topology", soak_would_start)
    assert experiment.main(["soak", "--minutes", "1", "--interval", interval]) == 1
    assert started == []
    assert capsys.readouterr().err == (
        "experiment: soak: --minutes must be in (0, 1440] and --interval in (0, the soak's "
        "length in seconds]\n")
    # The control: a soak's interval within it starts the soak.
    assert experiment.main(["soak", "--minutes", "1", "--interval", "60"]) == 0
    assert len(started) == 1
