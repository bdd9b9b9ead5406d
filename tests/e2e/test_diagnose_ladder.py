"""
``experiment.py diagnose`` on the lab: every fault switched on in a running
state, and the rung it breaks named as the cause, with nothing changed.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
from e2e_helpers import PYTHON, REPO, deploy, fault, restarted, ssh, verify

from lab.topology import LARGE_BACKEND_SERVICE


def diagnosed() -> tuple[int, dict]:
    """diagnose's exit code and its JSON, with the time it took printed for the record."""
    started = time.monotonic()
    run = subprocess.run([str(PYTHON), "experiment.py", "diagnose", "--json"], cwd=REPO,
                         capture_output=True, text=True, timeout=180)
    assert run.stdout, run.stderr[-3000:]
    found = json.loads(run.stdout)
    cause = found["cause"]["name"] if found["cause"] else None
    print(f"diagnose: cause {cause} in {time.monotonic() - started:.1f}s")
    return run.returncode, found


def cause_of(name: str) -> str | None:
    with fault(name):
        code, found = diagnosed()
    assert code != 0 or found["cause"] is None
    return found["cause"] and found["cause"]["name"]


def restart_large_backend() -> None:
    """rank_hang hangs every simulated server asked to generate, the gateway's backend too."""
    restarted("gw", LARGE_BACKEND_SERVICE)


@pytest.fixture
def production_after() -> Iterator[None]:
    yield
    run = deploy("production")
    assert run.returncode == 0, run.output[-3000:]
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-3000:]


def test_each_fault_in_a_running_tp_state_is_named_at_its_rung_and_a_group_off_the_link_at_sockets(
        production_after) -> None:
    """
    One chain, so that it shares its states: each fault switched on in a running
    tp2_e2e, then, from there, a tp2_stock whose group misses the link, left as
    its failed acceptance found it; production restored once, after both.
    """
    run = deploy("tp2_e2e")
    assert run.returncode == 0, run.output[-3000:]
    code, found = diagnosed()
    assert (code, found["cause"], found["state"]) == (0, None, "tp2_e2e"), found
    assert [rung["verdict"] for rung in found["rungs"]] == ["pass"] * 8, found
    try:
        assert cause_of("fallback_down") == "route"
        assert cause_of("peer_no_e2e") == "driver"
        assert cause_of("rank_hang") == "serving"
        assert cause_of("tx_credit_stall") == "thunderbolt0"
    finally:
        restart_large_backend()

    with fault("wrong_interface"):
        # Left as the failed acceptance found it, for the diagnosis.
        run = deploy("tp2_stock", "--data", "on_failure=stop")
    assert run.returncode != 0
    code, found = diagnosed()
    assert code != 0 and found["cause"]["name"] == "sockets", found
    assert any("its connections 10.66.0.11:" in line
               for line in found["rungs"][3]["evidence"]), found["rungs"][3]


def test_a_link_retrained_at_10g_in_production_warns_at_the_xdomain_rung() -> None:
    with fault("link_10g"):
        # A retrain, as a replug or a reload brings: the driver reloaded by hand.
        ssh("wsa", "rmmod thunderbolt_net && modprobe thunderbolt_net")
        time.sleep(2)
        code, found = diagnosed()
    # The replicas do not use the link: production holds, and the link is a warning.
    assert code == 0 and found["cause"] is None, found
    assert found["state"] == "production"
    xdomain = found["rungs"][6]
    assert xdomain["verdict"] == "warn", xdomain
    assert any("WARN: wsa: 10 Gb/s over 1 lane(s)" in line for line in xdomain["evidence"])
    # Switched off, the cable is re-seated: the link retrains at 20 Gb/s.
    time.sleep(2)
    checks = verify("production")
    assert checks.returncode == 0, checks.stdout[-3000:]
