"""Shared fixtures: a minimal valid site file, and pyinfra's CLI run from the repository."""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from lab import modules

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


@pytest.fixture
def run_pyinfra() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real pyinfra CLI from the repository, with extra environment."""

    def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
        unset = {"TWINBOLT_SITE", "TWINBOLT_LAB_STATE"}
        environment = {k: v for k, v in os.environ.items() if k not in unset}
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
