"""
Shared fixtures: a minimal valid site file, the embedded lab's state as `python -m
lab up` leaves it for the inventory, and pyinfra's CLI run from the repository.
"""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import listing, modules
from lab.topology import init_system, lab_pairs

REPO = Path(__file__).resolve().parents[2]

MINIMAL_SITE = (Path(__file__).parent / "minimal_site.toml").read_text()


@pytest.fixture(scope="session")
def candidate_module(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A real candidate ``thunderbolt_net`` module, as the lab builds it: what a site may name."""
    return modules.build("candidate",
                         tmp_path_factory.mktemp("candidate") / "thunderbolt_net.ko").read_bytes()


@pytest.fixture
def write_site(tmp_path: Path, candidate_module: bytes) -> Callable[[str], Path]:
    """
    Write a site file into the test's directory and return its path, beside the
    candidate module the minimal site names (a real module, which the site checks
    when it loads; its sha256 is checked only before a candidate is loaded).
    """

    def write(text: str = MINIMAL_SITE) -> Path:
        (tmp_path / "modules").mkdir(exist_ok=True)
        (tmp_path / "modules" / "thunderbolt_net.ko").write_bytes(candidate_module)
        path = tmp_path / "site.toml"
        path.write_text(text)
        return path

    return write


@pytest.fixture(scope="session")
def lab_state(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """
    A lab's state directory as `python -m lab up` leaves it for the inventory: its
    listing of one pair (lab/listing.py), and the init system this checkout's lab
    boots, which group_data/lab.py reads there.
    """
    state = tmp_path_factory.mktemp("lab")
    (state / "init").write_text(f"{init_system()}\n")
    listing.write(lab_pairs(1), state)
    return state


@pytest.fixture
def run_pyinfra(lab_state: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """
    Run the real pyinfra CLI from the repository, with extra environment; the lab
    is :func:`lab_state`'s unless ``TWINBOLT_LAB_STATE`` is given.
    """

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        unset = {"TWINBOLT_SITE", "TWINBOLT_LAB_STATE"}
        environment = {k: v for k, v in os.environ.items() if k not in unset}
        environment["TWINBOLT_LAB_STATE"] = str(lab_state)
        return subprocess.run(
            [str(Path(sys.executable).with_name("pyinfra")), *args],
            cwd=REPO,
            env={**environment, **env},
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )

    return run
