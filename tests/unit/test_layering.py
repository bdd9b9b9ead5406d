"""
The layering contracts (pyproject.toml's ``[tool.importlinter]``) hold on the tree,
and each one fails on a deliberate wrong import: lint-imports runs on a copy of
the packages with one import added that breaks that contract and no other.

The top-level modules a run loads are no packages, which import-linter cannot
check: their imports are read here, with ``ast``.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = ("operations", "harness", "lab")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def contracts() -> dict[str, str]:
    """Each contract's id and name, as pyproject.toml declares them."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    return {contract["id"]: contract["name"] for contract in config["contracts"]}


@dataclass(frozen=True)
class WrongImport:
    """One import that breaks exactly one contract, added to one module of the copy."""

    contract: str
    module: str
    line: str

    def __str__(self) -> str:
        return f"{self.contract}: {self.module} += {self.line!r}"


# The imported modules import nothing of twinbolt's (lab.topology, harness.judging.intervals),
# and the importing ones are imported by no other contract's sources, so that each
# wrong import breaks its own contract and no other.
WRONG_IMPORTS = [
    # A floor imports one above it: the plumbing, the declared states.
    WrongImport("operations-layers", "operations/plumbing/phase.py",
                "from operations import states"),
    # Two independent packages on one floor: serving imports the gateway.
    WrongImport("operations-layers", "operations/serving/gpu.py",
                "from operations.gateway import route"),
    # A new package of operations/ that takes no floor (the contract is exhaustive).
    WrongImport("operations-layers", "operations/unplaced.py", "import json"),
    # The driver's and the link's floor is serving's and the gateway's: given values.
    WrongImport("operations-layers", "operations/gateway/route.py",
                "from operations.thunderbolt import link"),
    WrongImport("operations-layers", "operations/serving/sglang.py",
                "from operations.thunderbolt.driver import CandidateModule"),
    WrongImport("operations-not-lab", "operations/part.py", "from lab import topology"),
    # Reading the hosts imports what judges them: a floor above.
    WrongImport("harness-layers", "harness/hosts/remote.py",
                "from harness.judging import field_report"),
    # A module of harness/ outside every package (the contract is exhaustive).
    WrongImport("harness-layers", "harness/unplaced.py", "import json"),
    WrongImport("harness-not-lab", "harness/reporting/report.py",
                "from lab.topology import STATE"),
    WrongImport("operations-not-harness", "operations/part.py",
                "from harness.judging import intervals"),
]


def copy_tree(destination: Path) -> Path:
    """The packages, the top-level modules and pyproject.toml, as lint-imports reads them."""
    for package in PACKAGES:
        shutil.copytree(REPO / package, destination / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for path in [*REPO.glob("*.py"), REPO / "pyproject.toml"]:
        shutil.copy(path, destination / path.name)
    return destination


def lint_imports(root: Path) -> tuple[int, dict[str, str]]:
    """lint-imports' exit code in ``root``, and what it said of each contract, by name."""
    environment = {**os.environ, "PYTHONPATH": str(root)}
    result = subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=environment,
                            stdin=subprocess.DEVNULL, capture_output=True, text=True,
                            timeout=60)
    output = ANSI.sub("", result.stdout + result.stderr)
    verdicts = {}
    for line in output.splitlines():
        name, _, verdict = line.strip().rpartition(" ")
        if verdict in ("KEPT", "BROKEN"):
            verdicts[name] = verdict
    assert verdicts, output
    return result.returncode, verdicts


def test_every_contract_has_a_wrong_import_that_breaks_it() -> None:
    assert {wrong.contract for wrong in WRONG_IMPORTS} == set(contracts())


def test_the_tree_keeps_every_contract(tmp_path: Path) -> None:
    code, verdicts = lint_imports(copy_tree(tmp_path))
    assert verdicts == dict.fromkeys(contracts().values(), "KEPT")
    assert code == 0


@pytest.mark.parametrize("wrong", WRONG_IMPORTS, ids=str)
def test_a_wrong_import_breaks_its_contract_and_no_other(tmp_path: Path,
                                                         wrong: WrongImport) -> None:
    root = copy_tree(tmp_path)
    module = root / wrong.module
    text = module.read_text() if module.exists() else ""
    module.write_text(f"{text}\n{wrong.line}\n")
    code, verdicts = lint_imports(root)
    names = contracts()
    assert verdicts == {name: "BROKEN" if id_ == wrong.contract else "KEPT"
                        for id_, name in names.items()}
    assert code != 0


# What pyinfra loads for a run, on a real site as on the lab: none of it imports the
# lab (the inventory reads the listing the lab writes: operations/site/listing.py).
RUN_MODULES = ("inventory.py", "deploy.py", "config.py")


def imported(source: str) -> set[str]:
    """Every module ``source`` imports, anywhere in it, each by its full dotted name."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return found


def from_the_lab(modules: set[str]) -> set[str]:
    return {module for module in modules if module == "lab" or module.startswith("lab.")}


@pytest.mark.parametrize("module", RUN_MODULES)
def test_a_run_imports_nothing_of_the_lab(module: str) -> None:
    assert from_the_lab(imported((REPO / module).read_text())) == set()


@pytest.mark.parametrize("line", ["from lab import topology", "import lab.topology as _lab",
                                  "from lab.topology import STATE",
                                  "if True:\n    from lab import topology"])
def test_an_import_of_the_lab_is_seen_wherever_it_is(line: str) -> None:
    assert from_the_lab(imported(f"import os\n{line}\n")) != set()
