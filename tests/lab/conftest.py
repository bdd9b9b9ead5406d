"""Fixtures for the lab's own tests: a running lab, and both workstations left on stock."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from lab_helpers import linked, ssh, wait_until

from lab import faults
from lab.topology import PYTHON, REPO


@pytest.fixture(scope="session", autouse=True)
def lab_up() -> None:
    subprocess.run([str(PYTHON), "-m", "lab", "up"], cwd=REPO, check=True)


@pytest.fixture
def restore_stock() -> Iterator[None]:
    """Leave both workstations on the stock driver with no faults, whatever the test did."""
    yield
    faults.clear()
    for host in ("wsa", "wsb"):
        ssh(host, "rmmod thunderbolt_net; rm -rf /run/twinbolt; modprobe thunderbolt_net",
            check=False)
    for host in ("wsa", "wsb"):
        wait_until(lambda host=host: linked(host), timeout=10)
