"""
The README's commands, run exactly as it writes them: the operator's venv on
``PATH`` (``. .venv/bin/activate``), from the repository root, on the lab in
production. The commands that change state are run by the other end-to-end
tests and by ``make demo`` in CI; these are the ones a newcomer types first.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
from e2e_helpers import REPO

README = (REPO / "README.md").read_text()
# What `. .venv/bin/activate` does for the commands below.
ACTIVATED = {**os.environ, "PATH": f"{REPO / '.venv' / 'bin'}:{os.environ['PATH']}",
             "VIRTUAL_ENV": str(REPO / ".venv")}
READ_ONLY = [
    "pyinfra inventory.py deploy.py --data state=production --dry",
    "pytest tests/verify --state production",
    "python experiment.py status",
    "python experiment.py diagnose",
    "python experiment.py matrix",
]


def documented(command: str) -> bool:
    """The README writes ``command`` verbatim, in a code span or a code block."""
    return re.search(rf"(`|^){re.escape(command)}(`|\s|$)", README, re.MULTILINE) is not None


@pytest.mark.parametrize("command", READ_ONLY)
def test_a_read_only_readme_command_works_as_written(command: str) -> None:
    assert documented(command), f"the README no longer writes {command!r}"
    result = subprocess.run(shlex.split(command), cwd=REPO, env=ACTIVATED, capture_output=True,
                            text=True, timeout=300, stdin=subprocess.DEVNULL)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
