"""A newcomer's first try: the README's excerpt is current, and no root stops at once."""

from __future__ import annotations

import re
import subprocess
import tempfile
from pathlib import Path

from harness.reporting.compare import comparison_header
from harness.reporting.report import table

REPO = Path(__file__).resolve().parents[2]
NOBODY = "65534"


def demo_excerpt() -> str:
    match = re.search(r"<!-- demo-excerpt -->\n(.*?)<!-- /demo-excerpt -->",
                      (REPO / "README.md").read_text(), re.DOTALL)
    assert match, "the README lost its demo excerpt markers"
    return match.group(1)


def test_the_readmes_demo_excerpt_has_the_comparisons_current_header() -> None:
    header_line = table(comparison_header(), [])[0]
    assert header_line in demo_excerpt().splitlines(), (
        f"refresh the README's excerpt from a real `make demo`: its table header is now\n"
        f"{header_line}")


def test_make_demo_and_test_without_root_stop_before_installing_anything() -> None:
    """Run as nobody in an empty directory of its own: nothing may appear in it."""
    with tempfile.TemporaryDirectory(prefix="twinbolt-no-root-") as directory:
        refused_before_any_change(Path(directory))


def refused_before_any_change(tmp_path: Path) -> None:
    tmp_path.chmod(0o777)
    for target in ("demo", "test", "setup", "lab"):
        result = subprocess.run(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "make", "-s", "-C", str(tmp_path), "-f", str(REPO / "Makefile"), target],
            capture_output=True, text=True, timeout=30)
        assert result.returncode != 0
        assert "the lab needs root: it makes network namespaces and mounts, and installs " \
               "Debian packages" in result.stderr
        assert f"sudo make {target}" in result.stderr
        assert "make venv" in result.stderr
        assert list(tmp_path.iterdir()) == [], f"make {target} changed something before refusing"
