"""
Conditions are steps (issue 44): an ``_if`` condition of ``deploy.py`` that
raises, or that reads a fact that cannot be read, fails its step, and the run
ends in the rollback (before the first change, in a refusal), naming the host,
the step and the error; never in pyinfra's abort ("No hosts remaining!").

``deploy.py`` is loaded here as the CLI loads it, under pyinfra's own API, for
the minimal site; no host is contacted: each case executes the one step whose
condition fails, then the rollback and the conclusion.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from unittest.mock import patch

import pyinfra
import pytest
from operation_harness import RollbackProcess
from pyinfra.api import Config, OperationError, State
from pyinfra.api.host import Host
from pyinfra.api.operations import run_host_op
from pyinfra.api.state import StateStage
from pyinfra.connectors.util import CommandOutput
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

from operations import run as runs
from operations import step as steps
from operations.safety import rollback as rollbacks
from operations.site.model import SITE_ENV
from operations.site.options import RunOptions

# pyinfra's CLI package patches the standard library for gevent when it is first
# imported (pyinfra_cli/__init__.py): not in the process every other test shares.
with patch("gevent.monkey.patch_all"):
    from pyinfra_cli.inventory import make_inventory
    from pyinfra_cli.util import load_deploy_file

REPO = Path(__file__).resolve().parents[2]
MINIMAL_SITE = (Path(__file__).parent / "minimal_site.toml").read_text()


def loaded(target: str) -> State:
    """``pyinfra -y inventory.py deploy.py --data state=target``, up to its execution."""
    state = State(check_for_changes=False)
    state.cwd = str(REPO)
    config = Config()
    config.FAIL_PERCENT = 0  # as config.py sets it
    with ctx_state.use(state):
        inventory = make_inventory("inventory.py", cwd=str(REPO),
                                   override_data={"state": target})
        state.init(inventory, config)
        runs.remember_command_line(state, {"inventory": "inventory.py",
                                           "operations": ["deploy.py"],
                                           "data": [f"state={target}"]})
        RunOptions.read({"state": target}).remember(state)  # as config.py does
        for host in inventory:
            state.activate_host(host)
        state.set_stage(StateStage.Prepare)
        with ctx_inventory.use(inventory):
            load_deploy_file(state, "deploy.py")
    state.set_stage(StateStage.Execute)
    state.is_executing = True
    return state


@pytest.fixture
def deploy(write_site, tmp_path: Path, monkeypatch) -> Callable[[str], State]:
    """deploy.py loaded for a target, on the minimal site, its ledger in the test's directory."""
    site = write_site(MINIMAL_SITE + f'\n[ledger]\npath = "{tmp_path / "ledger.jsonl"}"\n')
    monkeypatch.setenv(SITE_ENV, str(site))
    monkeypatch.chdir(REPO)
    monkeypatch.setattr(pyinfra, "is_cli", True)
    return loaded


def conditions_of(state: State, host: Host, op_hash: str) -> tuple[Callable[[], bool], ...]:
    """A step's ``_if`` conditions on ``host``, however the step holds them."""
    data = state.ops[host].get(op_hash)
    return tuple(getattr(data.global_arguments["_if"], "conditions",
                         data.global_arguments["_if"])) if data else ()


def name_of(condition: Callable[[], bool]) -> str:
    """A condition as the failure names it: its module (in operations/) and name."""
    asked = getattr(condition, "func", condition)
    return f"{asked.__module__.removeprefix('operations.')}.{asked.__qualname__}"


@dataclass(frozen=True)
class Case:
    """One condition (by its place) of one step of ``deploy.py``."""

    op_hash: str
    step: str
    index: int
    condition: str
    preflight: bool


def cases(state: State) -> list[Case]:
    """Every condition of every step, once: each host asks the same ones."""
    found: dict[tuple[str, int], Case] = {}
    for op_hash in state.get_op_order():
        for host in state.inventory:
            for index, condition in enumerate(conditions_of(state, host, op_hash)):
                found.setdefault((op_hash, index), Case(
                    op_hash, steps.step_name(state, op_hash), index, name_of(condition),
                    not state.ops[host][op_hash].global_arguments["_ignore_errors"]))
    return list(found.values())


def broken(condition: Callable[[], bool]) -> Callable[[], bool]:
    """``condition``, under its own name, raising as a parse of what a fact read might."""
    @functools.wraps(getattr(condition, "func", condition))
    def raising() -> bool:
        raise ValueError("what it read cannot be parsed")
    return raising


def break_condition(state: State, case: Case, how: str) -> list[Host]:
    """
    Make ``case``'s condition fail on every host that asks it, the ones before
    it holding: ``raises`` (an exception in it), or ``fact fails`` (the real
    condition, whose facts' commands fail, as over a connection that times out).
    Returns the hosts.
    """
    hosts = []
    for host in state.inventory:
        conditions = conditions_of(state, host, case.op_hash)
        if len(conditions) <= case.index:
            continue
        failing = conditions[case.index] if how == "fact fails" else broken(
            conditions[case.index])
        arguments = state.ops[host][case.op_hash].global_arguments
        arguments["_if"] = type(arguments["_if"])(
            (*(lambda: True,) * case.index, failing, *conditions[case.index + 1:]))
        host.connected = True
        hosts.append(host)
    return hosts


def execute(state: State, host: Host, step: str) -> bool:
    """Run the step named ``step`` on ``host`` as pyinfra runs each operation."""
    [op_hash] = [op_hash for op_hash in state.get_op_order()
                 if steps.step_name(state, op_hash) == step]
    with ctx_state.use(state), ctx_host.use(host):
        return run_host_op(state, host, op_hash)


ROLLBACK = "Rollback: production is converged and proven if the attempt failed"
CONCLUSION = "Conclusion: did the attempt succeed, and what was restored"


def ends_in_the_rollback(state: State, case: Case, hosts: list[Host], error: str,
                         monkeypatch) -> None:
    run = steps.of(state)
    for host in hosts:
        # Not pyinfra's abort: the step is done, its error ignored, the failure recorded.
        assert execute(state, host, case.step) is True
    assert run.messages() == [
        f"{host.name}: {run.layer_of[case.op_hash]} layer: the condition {case.condition} of "
        f"{case.step!r} could not be answered: {error}; the step was skipped"
        for host in hosts]
    rollback = RollbackProcess.ending("accepted")
    monkeypatch.setattr(rollbacks.subprocess, "Popen", rollback)
    speaker = next(iter(state.inventory))
    execute(state, speaker, ROLLBACK)
    assert [command[-4:] for command, _ in rollback.ran] == [
        ["--data", "state=production", "--data", "on_failure=stop"]]
    with pytest.raises(OperationError, match="production was restored and verified"):
        execute(state, speaker, CONCLUSION)
    assert run.ending.outcome == "rolled_back"


def is_refused(state: State, case: Case, hosts: list[Host], error: str) -> None:
    run = steps.of(state)
    for host in hosts:
        with pytest.raises(OperationError) as refused:
            execute(state, host, case.step)
        assert str(refused.value) == (
            f"{host.name}: {run.layer_of[case.op_hash]} layer: the condition {case.condition} "
            f"of {case.step!r} could not be answered: {error}; the step was skipped")
    assert run.ending.outcome == "refused" and run.failed() is False


@pytest.mark.parametrize("target", ["tp2_e2e", "production"])
def test_each_condition_that_raises_fails_its_step_and_the_run_ends_in_the_rollback(
        deploy, target, monkeypatch) -> None:
    every = cases(deploy(target))
    assert {case.condition for case in every} >= (
        {"step.Attempt.healthy", "serving.sglang.replica_runs", "thunderbolt.driver.swap_planned",
         "safety.guard.disarm_first"}
        if target == "tp2_e2e" else {"step.Attempt.healthy"})
    for case in every:
        # Each case a run of its own: pyinfra runs a step once per host and run.
        state = deploy(target)
        hosts = break_condition(state, case, "raises")
        error = "ValueError: what it read cannot be parsed"
        if case.preflight:
            is_refused(state, case, hosts, error)
        else:
            ends_in_the_rollback(state, case, hosts, error, monkeypatch)


def test_each_condition_whose_fact_fails_fails_its_step_and_the_host_stays(
        deploy, monkeypatch) -> None:
    """pyinfra would fail the host for the fact, and abort the run ("Over 0% of hosts failed")."""
    monkeypatch.setattr(Host, "run_shell_command", lambda self, *_, **__: (
        False, CommandOutput([])))
    reading = [case for case in cases(deploy("tp2_e2e"))
               if case.condition != "step.Attempt.healthy"]
    assert {(case.condition, case.preflight) for case in reading} == {
        ("serving.sglang.replica_runs", True), ("serving.sglang.replica_runs", False),
        ("thunderbolt.driver.swap_planned", False), ("safety.guard.disarm_first", False)}
    for case in reading:
        state = deploy("tp2_e2e")
        hosts = break_condition(state, case, "fact fails")
        error = "a fact it read could not be read (pyinfra says which above)"
        if case.preflight:
            is_refused(state, case, hosts, error)
        else:
            ends_in_the_rollback(state, case, hosts, error, monkeypatch)
        assert set(hosts) <= state.active_hosts and not state.failed_hosts
