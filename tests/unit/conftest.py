"""Shared fixtures: a minimal valid site file, and pyinfra's CLI run from the repository."""

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

MINIMAL_SITE = (Path(__file__).parent / "minimal_site.toml").read_text()


@pytest.fixture
def write_site(tmp_path: Path) -> Callable[[str], Path]:
    """
    Write a site file into the test's directory and return its path, beside the
    candidate module the minimal site names (whose sha256 it declares).
    """

    def write(text: str = MINIMAL_SITE) -> Path:
        (tmp_path / "modules").mkdir(exist_ok=True)
        (tmp_path / "modules" / "thunderbolt_net.ko").write_text("test")
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
