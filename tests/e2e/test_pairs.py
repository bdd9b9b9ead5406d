"""
Two pairs behind one gateway (issue 49), in one chain on ``python -m lab up --pairs 2``:

- production on both pairs;
- ``tp2_e2e`` on pair b alone (``--limit pair_b``) while a client asks ``small``
  four times a second: pair a's replicas answer every request, and the proxy never gets
  the fallback;
- a fault on pair b (``draft_init_crash``) is rolled back on pair b alone, and
  pair a's replicas never restart;
- two runs on different pairs, started together, both end in the state each asked
  for, one after the other;
- ``matrix`` shows both pairs' controllers.

It leaves the one-pair lab, in production, as the rest of the suite expects: the
lab is rebuilt with one pair, and production converged on it.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
from e2e_helpers import (
    PYTHON,
    REPO,
    SHORT_LINK_WAIT,
    client_figures,
    deploy,
    inventory,
    lab,
    refusals,
    service_process,
    small_client,
    snapshot,
    ssh,
    verify,
)

from operations.gateway.proxy import DEPLOYMENTS
from operations.site.hosts import in_group
from operations.site.settings import GatewaySettings

CONFIG = "/var/lib/twinbolt/litellm.yaml"
PAIR_A = ("wsa", "wsb")
# The lab's pair a serves at these, as the router lists them.
PAIR_A_REPLICAS = ("http://10.66.0.11:30000", "http://10.66.0.12:30000")


@pytest.fixture(scope="module", autouse=True)
def two_pairs() -> Iterator[None]:
    lab("up", "--pairs", "2")
    inventory.cache_clear()
    try:
        yield
    finally:
        lab("up")
        inventory.cache_clear()
        run = deploy("production")
        assert run.returncode == 0, run.output[-3000:]


def converged(state: str, *extra: str, pair: str | None = None) -> str:
    """Move the lab (or one pair) to ``state`` and verify it; what the deploy printed."""
    run = deploy(state, *(("--limit", f"pair_{pair}") if pair else ()), *extra)
    assert run.returncode == 0, run.output[-4000:]
    checks = verify(state, *(("--pair", pair) if pair else ()))
    assert checks.returncode == 0, checks.stdout[-4000:]
    return run.output


def verified(state: str, pair: str) -> None:
    checks = verify(state, "--pair", pair)
    assert checks.returncode == 0, checks.stdout[-4000:]


def general_fallback_line() -> str:
    return ssh("gw", f"grep -n '^  fallbacks:' {CONFIG} || true").strip()


def pair_a() -> dict[str, str]:
    """What a run could change on pair a's hosts: a restart shows as a new pid or start."""
    return {what: value for what, value in snapshot().items()
            if what.split(":")[0] in PAIR_A}


def test_production_on_both_pairs() -> None:
    # Proven here by the run's own verification; pytest tests/verify checks each pair below.
    run = deploy("production")
    assert run.returncode == 0, run.output[-4000:]
    baseline = small_client()
    for _ in range(10):
        baseline.ask()
    assert all(answer.status == 200 and answer.served_by == DEPLOYMENTS["small"]
               for answer in baseline.answers), baseline.answers
    print(f"small in production: {client_figures(baseline.answers)}")


def test_an_experiment_on_pair_b_while_pair_a_serves_small() -> None:
    before = pair_a()
    router_before = service_process("gw", "sglang-router")["pid"]
    # Four requests a second, as the one-pair round trip's client asks.
    with small_client().asking() as client:
        time.sleep(2)
        output = converged("tp2_e2e", pair="b")
        time.sleep(2)
    verified("production", "a")
    # Every request answered within 5 s, by small's own deployment: pair a's replicas, not large.
    assert client.answers and not refusals(client.answers), refusals(client.answers)
    assert {answer.served_by for answer in client.answers} == {DEPLOYMENTS["small"]}
    assert general_fallback_line() == "", "the proxy got the fallback though pair a serves"
    assert "ready with the fallback present" not in output
    router_url = GatewaySettings.of(in_group(list(inventory()), "gateway")[0]).router_url
    assert pair_a() == before, "the experiment on pair b touched pair a"
    # Pair b's replicas left the router through its API: the router never restarted.
    assert service_process("gw", "sglang-router")["pid"] == router_before
    assert f"the router at {router_url} fronts {', '.join(PAIR_A_REPLICAS)}: yes" in output
    print(f"small during pair b's tp2_e2e: {client_figures(client.answers)}")


def test_a_failure_on_pair_b_is_rolled_back_on_pair_b_alone() -> None:
    before = pair_a()
    lab("fault", "draft_init_crash", "on", "--pair", "b")
    try:
        run = deploy("tp2_stock", "--limit", "pair_b", *SHORT_LINK_WAIT)
    finally:
        lab("fault", "draft_init_crash", "off", "--pair", "b")
    assert run.returncode != 0
    assert "production was restored and verified" in run.output, run.output[-4000:]
    assert "--limit pair_b" in run.output.split("rollback: converging production")[1][:300]
    assert pair_a() == before, "pair b's rollback restarted or changed pair a"


def test_two_runs_on_different_pairs_started_together_both_end_as_asked() -> None:
    runs = {pair: subprocess.Popen(
        [str(PYTHON.with_name("pyinfra")), "-y", "--limit", f"pair_{pair}", "inventory.py",
         "deploy.py", "--data", f"state={state}"], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        for pair, state in (("a", "tp2_stock_nospec"), ("b", "tp2_e2e"))}
    printed = {pair: run.communicate(timeout=600)[0] for pair, run in runs.items()}
    assert {pair: run.returncode for pair, run in runs.items()} == {"a": 0, "b": 0}, (
        printed["a"][-3000:] + printed["b"][-3000:])
    # One planned only once the other had ended.
    assert any("waiting for the gateway: another run holds" in text
               for text in printed.values()), printed
    # Whichever ran second planned from what the first left: no pair serves small, so
    # the router stopped and the fallback is back. (The module's end restores production.)
    verified("tp2_stock_nospec", "a")
    verified("tp2_e2e", "b")
    assert general_fallback_line() != ""


def test_the_matrix_shows_both_pairs_controllers() -> None:
    shown = subprocess.run([str(PYTHON), "experiment.py", "matrix"], cwd=REPO,
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    rows = [line for line in shown.stdout.splitlines() if line.startswith("| 8086")]
    # Pair a's controllers run NVM 36.0, pair b's 40.0: a row each, never one of four.
    assert any(row.count("NVM 36.0") == 2 and "NVM 40.0" not in row for row in rows), rows
    assert any(row.count("NVM 40.0") == 2 and "NVM 36.0" not in row for row in rows), rows
