"""
Every remote command and every wait is bounded (issue 30): a host whose
connection drops silently fails its step, instead of holding the run until TCP
gives up; the rollback's own run is bounded too.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from operation_harness import a_run, run_operation
from pyinfra.api import Config, Inventory, OperationError, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.server import Command

from operations import attempt
from operations import run as runs
from operations.attempt import Layer, operation
from operations.hosts import InventoryEntry
from operations.settings import HostSettings, WorkstationSettings
from operations.site import COMMAND_TIMEOUT, command_timeout_data, load_site

MINIMAL_SITE = (Path(__file__).parent / "minimal_site.toml").read_text()


@operation(Layer.SERVING)
def a_serving_step_that_hangs() -> Iterator[str]:
    """A remote command that never answers in time, as over a connection that dropped."""
    yield "sleep 5"


def local_state(data: dict) -> State:
    state = State(Inventory(([("@local", data)], {})), Config())
    connect_all(state)
    return state


def test_a_command_past_its_bound_fails_its_step_under_its_layer() -> None:
    # The bound as a site gives it: pyinfra's _timeout in host data, no argument at the call.
    state = local_state(command_timeout_data(1))
    run = runs.begin(state, "tp2_e2e", None)
    add_op(state, a_serving_step_that_hangs, name="Serving: a step that hangs",
           _ignore_errors=True)
    run_ops(state)
    assert run.attempt.layers == [Layer.SERVING]
    assert run.attempt.messages() == ["@local: Serving: a step that hangs: a command failed"]


def test_a_fact_read_past_its_bound_gives_its_default() -> None:
    # pyinfra bounds a fact's command by the same _timeout; what it then returns is
    # the fact's default (None), and the failure is pyinfra's to report.
    state = local_state(command_timeout_data(1))
    host = state.inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(host):
        assert host.get_fact(Command, command="sleep 5", _ignore_errors=True) is None


def test_the_site_bounds_every_host_and_the_settings_read_the_same_value(write_site) -> None:
    site = load_site(write_site())
    hosts = [*site.workstation_hosts(), *site.gateway_hosts()]
    assert {data[COMMAND_TIMEOUT] for _, data in hosts} == {300}
    # One key, pyinfra's own: not also a flat ssh_ key that could disagree with it.
    assert not any("ssh_command_timeout_seconds" in data for _, data in hosts)
    (name, data), _ = site.workstation_hosts()
    assert WorkstationSettings.of(InventoryEntry(name, ("workstations",), data)
                                  ).command_timeout == 300


def test_a_sites_own_bound_reaches_pyinfra(write_site) -> None:
    site = load_site(write_site(MINIMAL_SITE + "\n[ssh]\ncommand_timeout_seconds = 45\n"))
    assert {data[COMMAND_TIMEOUT] for _, data in site.gateway_hosts()} == {45}


def test_a_wait_is_bounded_by_itself_and_one_command_more() -> None:
    # --data _timeout=60 overrides pyinfra's bound and twinbolt's derived ones alike.
    settings = HostSettings.of(InventoryEntry("ws", (), {COMMAND_TIMEOUT: 60}))
    assert settings.bound(900) == 960
    assert settings.bound(29.5) == 90
    # Data with no bound (an old inventory's) takes the site model's default.
    assert HostSettings.of(InventoryEntry("ws", (), {})).command_timeout == 300


def test_the_rollbacks_bound_holds_every_wait_of_production_in_full() -> None:
    waits = (900, 900, 30, 120.0)
    assert attempt.rollback_timeout(300, waits) == (
        sum(waits) + attempt.ROLLBACK_SLACK_COMMANDS * 300)


@pytest.fixture
def failed_attempt() -> attempt.Attempt:
    run = a_run()
    run.attempt.record("wsb", "op1", "wsb: link layer: no carrier")
    return run.attempt


def test_a_rollback_past_its_bound_is_stopped_and_named(failed_attempt, monkeypatch) -> None:
    logged: list[str] = []
    fake_host = SimpleNamespace(name="wsa", executing_op_hash="rollback", connector=None,
                                log_styled=lambda message, **_: logged.append(message))
    pyinfra_state = SimpleNamespace(**{attempt.RUN_ATTRIBUTE: SimpleNamespace(
        attempt=failed_attempt)})
    # A fake rollback: a process that outlives its bound.
    never_ends = [sys.executable, "-c", "import time; time.sleep(30)"]
    assert attempt.run_rollback(pyinfra_state, fake_host, never_ends, [], timeout=0.5) is False
    assert failed_attempt.rollback_expired == 0.5
    assert failed_attempt.messages()[-1].startswith(
        "wsa: rollback layer: the rollback to production did not end within its bound of 0.5s "
        "and was stopped: ")
    # The run still ends non-zero, saying the rollback failed and why.
    with pytest.raises(OperationError,
                       match=r"the rollback to production failed too \(stopped after 0.5s\): "
                             "the hosts need an operator"):
        run_operation(attempt.concluded, lambda cls, kwargs: None, attempt=failed_attempt,
                      on_failure="rollback", speakers=("wsa",))


def test_the_rollback_step_gives_its_run_the_bound(failed_attempt, monkeypatch) -> None:
    failed_attempt.rollback_command = ["pyinfra", "-y", "inventory.py", "deploy.py"]
    run = a_run()
    run.attempt = failed_attempt
    given: list[tuple] = []
    real = attempt.FunctionCommand
    monkeypatch.setattr(attempt, "FunctionCommand",
                        lambda function, args, kwargs: given.append(args) or real(function, args,
                                                                                  kwargs))
    assert run_operation(attempt.rolled_back, lambda cls, kwargs: None, run=run,
                         on_failure="rollback", speakers=("wsa",), timeout=2400) == [
        "call run_rollback"]
    [(_, _, timeout)] = given
    assert timeout == 2400


def test_the_lab_is_bounded_by_default_and_a_runs_data_overrides_it(run_pyinfra) -> None:
    def bounds(*arguments: str) -> dict[str, int]:
        result = run_pyinfra("inventory.py", "debug-inventory", "--json", *arguments)
        assert result.returncode == 0, result.stderr
        return {host["name"]: HostSettings.of(InventoryEntry(host["name"], (), host["data"])
                                              ).command_timeout
                for host in json.loads(result.stdout)}

    assert bounds() == {"wsa": 300, "wsb": 300, "gw": 300}
    assert set(bounds("--data", "_timeout=60").values()) == {60}
