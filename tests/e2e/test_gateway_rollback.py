"""The gateway layer's rollback rule, end to end: when the route breaks during
the outage, the run restores production and exits non-zero naming the gateway.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable, Iterator

import pytest
from e2e_helpers import PYINFRA, REPO, lab, ssh, verify

CONFIG = "/var/lib/twinbolt/litellm.yaml"


@pytest.fixture
def fallback_back_up() -> Iterator[None]:
    yield
    lab("fault", "fallback_down", "off")


def deploy_acting(state: str, actions: dict[str, Callable[[], None]],
                  timeout: float = 900) -> tuple[int, str]:
    """Deploy ``state``, running each action once, when the run first prints its marker."""
    process = subprocess.Popen(
        [str(PYINFRA), "-y", "inventory.py", "deploy.py", "--data", f"state={state}"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    watchdog = threading.Timer(timeout, process.kill)
    watchdog.start()
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            for marker in [marker for marker in actions if marker in line]:
                actions.pop(marker)()
        return process.wait(), "".join(lines)
    finally:
        watchdog.cancel()


def test_a_fallback_that_breaks_during_the_outage_restores_production_naming_the_gateway(
        fallback_back_up: None) -> None:
    # The large backend stops after the forced fallback was proven, just as the
    # replicas stop: the proof during the outage is the one that catches it.
    returncode, output = deploy_acting("tp2_e2e", {
        "Starting operation: Serving: the router stops with the replicas":
            lambda: lab("fault", "fallback_down", "on"),
        # The rollback proves large too: the backend is back before it gets there.
        "gw: gateway layer: role small": lambda: lab("fault", "fallback_down", "off"),
    })
    assert returncode != 0
    assert "gw: gateway layer: role small: no completion" in output, output[-4000:]
    assert "production was restored and verified" in output, output[-4000:]
    # The GPUs were never borrowed: the attempt swapped no driver and started no TP rank.
    attempt = output.split("rollback: converging production")[0]
    for operation in ("Driver: thunderbolt_net is the candidate build",
                      "Serving: the TP ranks run"):
        _, _, section = attempt.partition(f"Starting operation: {operation}")
        assert "Success" not in section.split("--> ")[0], f"{operation}: {section[:500]}"
    assert ssh("gw", f"grep -c '^  fallbacks:' {CONFIG}").strip() == "0"
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-4000:]


