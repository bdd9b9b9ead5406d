"""Fixtures for the lab's own tests: a running lab, and both workstations left on stock."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest
from lab_helpers import linked, ssh, wait_until

from lab import faults
from lab.control import loaded_driver
from lab.topology import PYTHON, REPO, host_named

WORKSTATIONS = ("wsa", "wsb")


@pytest.fixture(scope="session", autouse=True)
def lab_up() -> None:
    subprocess.run([str(PYTHON), "-m", "lab", "up"], cwd=REPO, check=True)


def reload_stock() -> None:
    """Both workstations on a freshly loaded stock driver, linked again."""
    for host in WORKSTATIONS:
        ssh(host, "rmmod thunderbolt_net; rm -rf /run/twinbolt; modprobe thunderbolt_net",
            check=False)
    for host in WORKSTATIONS:
        wait_until(lambda host=host: linked(host), timeout=10)


@pytest.fixture(scope="session")
def fresh_stock() -> dict[str, str]:
    """What each workstation shows with a freshly loaded stock driver (build and parameters)."""
    reload_stock()
    return {host: loaded_driver(host_named(host)) for host in WORKSTATIONS}


@pytest.fixture
def restore_stock(fresh_stock: dict[str, str]) -> Iterator[None]:
    """
    Leave both workstations on the stock driver with no faults, whatever the test
    did. A test that left them as a fresh load would is not reloaded again: the
    reload and the retrain cost four seconds a test.
    """
    yield
    faulted = faults.active()
    faults.clear()
    if faulted or any(loaded_driver(host_named(host)) != fresh_stock[host] or not linked(host)
                      for host in WORKSTATIONS):
        reload_stock()
    else:
        for host in WORKSTATIONS:
            ssh(host, "rm -rf /run/twinbolt", check=False)
