"""
twinbolt's windows as SGLang's ``bench_serving --output-file`` lines
(``harness/reporting/bench_serving.py``), against the source of every release the locks
pin: the fields are upstream's, read from the dict ``benchmark()`` appends to
the output file, and so are the units and the TPOT. None is listed here.

The source is read, not imported: ``bench_serving`` imports the tokenizer's and
NumPy's stack, which the conformance venvs leave out.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from packaging.version import Version

from harness.reporting import bench_serving
from operations.plumbing.venvs import lock_pins

REPO = Path(__file__).resolve().parents[2]
RELEASES = sorted((lock_pins(lock)["sglang"] for lock in REPO.glob("requirements-sglang-*.lock")),
                  key=Version)
# Where benchmark() lives: 0.5.9's module, and 0.5.23's (the old path re-exports it).
MODULES = ("sglang/benchmark/serving.py", "sglang/bench_serving.py")


def source(release: str) -> tuple[Path, ast.Module]:
    """The module of ``release`` whose benchmark() writes the output file."""
    venv = REPO / f".venv-sglang-{release}"
    for module in MODULES:
        for path in venv.glob(f"lib/python*/site-packages/{module}"):
            tree = ast.parse(path.read_text())
            if result_fields(tree):
                return path, tree
    raise AssertionError(f"no bench_serving result in {venv}: `make setup` builds the "
                         "conformance venvs")


def result_fields(tree: ast.Module) -> list[str]:
    """The keys of the result dict benchmark() appends to ``--output-file``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [key.value for key in node.keys if isinstance(key, ast.Constant)]
            if {"duration", "median_ttft_ms", "output_throughput"} <= set(keys):
                return keys
    return []


@pytest.mark.parametrize("release", RELEASES)
def test_a_line_has_every_field_the_release_writes(release: str) -> None:
    _, tree = source(release)
    upstream = result_fields(tree)
    assert [field for field in upstream if field not in bench_serving.FIELDS] == []


def test_a_line_has_no_field_no_release_writes() -> None:
    written = {field for release in RELEASES for field in result_fields(source(release)[1])}
    assert [field for field in bench_serving.FIELDS if field not in written] == []


@pytest.mark.parametrize("release", RELEASES)
def test_latencies_are_milliseconds_and_tpot_is_upstreams(release: str) -> None:
    path, tree = source(release)
    (metrics,) = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
                  and node.name == "calculate_metrics"]
    scaled = {keyword.arg: ast.unparse(keyword.value) for call in ast.walk(metrics)
              if isinstance(call, ast.Call) for keyword in call.keywords
              if keyword.arg and keyword.arg.endswith("_ms")}
    assert scaled and all(value.endswith("* 1000") for value in scaled.values()), scaled
    text = re.sub(r"\s+", "", path.read_text())
    assert "tpots.append((outputs[i].latency-outputs[i].ttft)/(output_len-1))" in text
    assert "ifoutput_len>1:" in text
