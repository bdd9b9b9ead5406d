"""The field report's figures: one module, one page that agrees with it, no citation outside."""

from __future__ import annotations

import os
import re
from pathlib import Path

from harness.judging import field_report
from harness.measuring.windows import WindowSettings
from harness.reporting import compare, linktest_report

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / field_report.PAGE
# Built, so that this file does not name it itself.
OUTSIDE = "REFERENCE" + ".md"
# What a clone holds: the tree, without the venvs, the lab's hosts, caches and outputs.
SKIPPED_DIRECTORIES = {"__pycache__", "reports", "wheelhouse", "node_modules"}
TEXT = {".py", ".md", ".j2", ".toml", ".txt", ".sh", ".yaml", ".yml", ".cfg", ".ini", ".json",
        ".svg", ".jsonl"}


def page_figures() -> str:
    match = re.search(r"<!-- field-report-figures -->\n(.*?)<!-- /field-report-figures -->",
                      PAGE.read_text(), re.DOTALL)
    assert match, f"{field_report.PAGE} lost its field-report-figures markers"
    return match.group(1)


def test_the_page_lists_exactly_the_modules_figures() -> None:
    assert page_figures() == field_report.tables(), (
        f"{field_report.PAGE} and harness/judging/field_report.py disagree: put the output of "
        "`python -m harness.judging.field_report` between the page's markers")


def test_every_figure_says_what_it_is_and_the_reports_use_only_the_modules() -> None:
    figures = field_report.figures()
    assert all(figure.text and figure.meaning for figure in figures.values())
    used = [figure for pair in compare.FIELD_REPORT.values() for figure in pair if figure]
    used += [figure for column in linktest_report.FIELD_NETWORK.values()
             for figure in column.figures.values()]
    assert all(any(figure is known for known in figures.values()) for figure in used)
    # Every figure of the module is set beside something.
    assert all(any(known is figure for figure in used) for known in figures.values())


def test_the_windows_default_to_the_reports_request_shapes() -> None:
    defaults = WindowSettings()
    assert (defaults.single_tokens, defaults.concurrent_requests, defaults.concurrent_tokens,
            defaults.prefix_tokens, defaults.long_output_tokens) == (512, 6, 256, 120_000, 64)


def test_the_reports_cite_the_page_in_the_repository() -> None:
    assert f"({field_report.PAGE})" in compare.SIDE_BY_SIDE_NOTE
    assert f"({field_report.PAGE})" in linktest_report.FIELD_NOTE
    assert PAGE.is_file()


def repository_files() -> list[Path]:
    found = []
    for directory, subdirectories, files in os.walk(REPO):
        subdirectories[:] = [name for name in subdirectories
                             if not name.startswith(".") and name not in SKIPPED_DIRECTORIES]
        found += [Path(directory, name) for name in files
                  if Path(name).suffix in TEXT or name == "Makefile"]
    return found


def test_no_file_of_the_repository_cites_a_reference_outside_it() -> None:
    files = repository_files()
    assert REPO / "harness" / "judging" / "field_report.py" in files and PAGE in files
    citing = [str(path.relative_to(REPO)) for path in files
              if OUTSIDE in path.read_text(errors="replace")]
    assert citing == [], f"these name {OUTSIDE}, which a clone does not have: {citing}"
