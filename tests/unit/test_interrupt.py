"""Signals: before the first change a run just ends; after it, it ends in a verified production."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from operation_harness import a_run, run_operation
from pyinfra.api import Config, FunctionCommand, Inventory, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.api.state import StateStage

from operations import run as runs
from operations import step as steps
from operations.safety import interrupt, ledger
from operations.safety import rollback as rollbacks
from operations.step import Ending, Interruption, Layer, operation

DRIVER_STEP = "Driver: thunderbolt_net is the candidate build"


def changing() -> interrupt.Interrupts:
    """A run past its first change, in the driver step."""
    return interrupt.Interrupts(changing=True, step=DRIVER_STEP, step_hash="driver")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143),
                                              (signal.SIGHUP, 129)])
def test_before_the_first_change_a_signal_ends_the_run_as_shells_expect(signum, code) -> None:
    run = a_run()
    preflight = interrupt.Interrupts(step="Preflight: the GPU is present")
    reaction = interrupt.react(preflight, run.attempt, signum, now=0)
    assert reaction.exit_code == code and not reaction.forced
    assert "'Preflight: the GPU is present', before any change" in reaction.message
    assert "nothing was changed" in reaction.message
    assert run.attempt.healthy()
    # Before deploy.py has begun a run (connecting), the same.
    assert interrupt.react(interrupt.Interrupts(), None, signum, now=0).exit_code == code


def test_after_the_first_change_a_signal_fails_the_attempt_in_its_step() -> None:
    run = a_run()
    run.attempt.layer_of["driver"] = Layer.DRIVER
    reaction = interrupt.react(changing(), run.attempt, signal.SIGTERM, now=0)
    assert reaction.exit_code is None
    assert run.attempt.interrupted == Interruption("SIGTERM", DRIVER_STEP)
    assert run.attempt.interrupted.exit_code == 143
    assert run.attempt.messages() == [
        f"interrupted by SIGTERM during {DRIVER_STEP!r}: the attempt's remaining steps were "
        "skipped"]
    assert run.attempt.layers == [Layer.DRIVER]


def test_later_signals_do_not_stop_the_rollback_but_two_in_a_row_force_the_exit() -> None:
    run, interrupts = a_run(), changing()
    interrupt.react(interrupts, run.attempt, signal.SIGINT, now=0)
    run.attempt.closing = True
    second = interrupt.react(interrupts, run.attempt, signal.SIGINT, now=10)
    assert second.exit_code is None
    assert "send SIGINT again within 5s" in second.message
    assert interrupt.RESTORE in second.message
    # Too late for the force: it only says so again.
    assert interrupt.react(interrupts, run.attempt, signal.SIGINT, now=16).exit_code is None
    third = interrupt.react(interrupts, run.attempt, signal.SIGINT, now=19)
    assert (third.exit_code, third.forced) == (130, True)
    assert "the hosts are left as after a killed run" in third.message
    assert len(run.attempt.messages()) == 1


def test_a_signal_after_the_rollback_step_no_longer_fails_a_healthy_attempt() -> None:
    run = a_run()
    run.attempt.closing = True
    reaction = interrupt.react(changing(), run.attempt, signal.SIGINT, now=0)
    assert reaction.exit_code is None and run.attempt.healthy()


@operation(Layer.DRIVER)
def signalled(signum: int) -> Iterator[FunctionCommand]:
    """A step the operator interrupts while it runs."""
    yield FunctionCommand(lambda: os.kill(os.getpid(), signum) or True, (), {})


@operation(Layer.SERVING)
def later_step(ran: list[str]) -> Iterator[FunctionCommand]:
    yield FunctionCommand(lambda: ran.append("later") or True, (), {})


@pytest.fixture
def handlers() -> Iterator[None]:
    """The process's own signal handlers, back after the test installs twinbolt's."""
    saved = {signum: signal.getsignal(signum) for signum in interrupt.SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def interrupted_run(signum: int, changes_begun: bool, ended: list[int] | None = None
                    ) -> tuple[runs.Run, list[str]]:
    """
    A real pyinfra run on @local whose first attempt step receives ``signum``;
    the exit codes the handler ends the process with are appended to ``ended``
    instead.
    """
    state = State(Inventory((["@local"], {})), Config())
    connect_all(state)
    interrupt.install(state, end=(ended if ended is not None else []).append)
    run = runs.begin(state, "tp2_e2e", None)
    if changes_begun:
        add_op(state, interrupt.changes_begin, name="Interrupt: from here",
               interrupts=run.interrupts)
    ran: list[str] = []
    add_op(state, signalled, name=DRIVER_STEP, signum=signum, _ignore_errors=True,
           _if=[run.attempt.healthy])
    add_op(state, later_step, name="Serving: the TP ranks run", ran=ran, _ignore_errors=True,
           _if=[run.attempt.healthy])
    state.set_stage(StateStage.Execute)
    run_ops(state)
    return run, ran


def test_a_signal_in_a_running_step_skips_the_steps_after_it(handlers) -> None:
    ended: list[int] = []
    run, ran = interrupted_run(signal.SIGINT, changes_begun=True, ended=ended)
    assert ended == []
    assert run.attempt.interrupted == Interruption("SIGINT", DRIVER_STEP)
    assert run.attempt.layers == [Layer.DRIVER]
    assert ran == []


def test_a_signal_in_preflight_ends_a_real_run_at_once(handlers) -> None:
    ended: list[int] = []
    run, _ = interrupted_run(signal.SIGTERM, changes_begun=False, ended=ended)
    assert ended == [143] and run.attempt.healthy()


def no_facts(cls, kwargs):
    raise AssertionError("the conclusion reads no facts")


def test_an_interrupted_run_concludes_interrupted_and_exits_as_shells_expect(tmp_path) -> None:
    run = a_run()
    path = tmp_path / "ledger.jsonl"
    run.observed.hosts["wsa"] = {"host": "wsa"}
    ledger.keep(run, str(path), "tp2_e2e", "candidate", ["wsa", "wsb"])
    run.attempt.layer_of["driver"] = Layer.DRIVER
    interrupt.react(changing(), run.attempt, signal.SIGINT, now=0)
    run.attempt.rollback_exit, run.attempt.rollback_ending = 0, "accepted"
    with pytest.raises(SystemExit) as ended:
        run_operation(rollbacks.concluded, no_facts, run=run, on_failure="rollback",
                      speakers=("wsa",))
    assert ended.value.code == 130
    [entry] = ledger.read(path)
    assert (entry["outcome"], entry["layer"], entry["interrupted"], entry["stall"]) == (
        "interrupted", "driver", {"signal": "SIGINT", "step": DRIVER_STEP}, False)
    assert f"interrupted by SIGINT during {DRIVER_STEP!r}" in entry["evidence"]


def test_an_interrupted_run_whose_rollback_failed_says_so_and_still_exits_130() -> None:
    run = a_run()
    interrupt.react(changing(), run.attempt, signal.SIGINT, now=0)
    run.attempt.rollback_exit = 1
    with pytest.raises(SystemExit) as ended:
        run_operation(rollbacks.concluded, no_facts, run=run, on_failure="rollback",
                      speakers=("wsa",))
    assert ended.value.code == 130
    assert run.attempt.ending.outcome == "rollback_failed"
    assert run.attempt.ending.interrupted == Interruption("SIGINT", DRIVER_STEP)


# A rollback that reports the ending it reached, and whether it ran in a session of its own.
REPORTING = ("import json, os, sys; open(os.environ[sys.argv[1]], 'w').write(json.dumps("
             "{'outcome': sys.argv[2] if os.getsid(0) == os.getpid() else 'shared_session'}))")


def rollback(command: list[str]) -> tuple[bool, steps.Attempt]:
    run = a_run()
    run.attempt.record("wsb", "op1", "wsb: driver layer: insmod failed")
    logged: list[str] = []
    wsa = SimpleNamespace(name="wsa", executing_op_hash="op2", connector=None,
                          log_styled=lambda message, **_: logged.append(message))
    pyinfra_state = SimpleNamespace(**{steps.RUN_ATTRIBUTE: run},
                                    get_op_meta=lambda _: SimpleNamespace(names={"Rollback"}))
    return rollbacks.run_rollback(pyinfra_state, wsa, command, [], timeout=60), run.attempt


def test_a_rollback_that_exits_0_without_verifying_production_has_failed() -> None:
    restored, quiet = rollback([sys.executable, "-c", "pass"])
    assert not restored and (quiet.rollback_exit, quiet.rollback_ending) == (0, None)
    with pytest.raises(Exception, match=r"failed too \(exit 0, but it reported no verified "
                                        r"production\)"):
        run_operation(rollbacks.concluded, no_facts, attempt=quiet, on_failure="rollback",
                      speakers=("wsa",))
    assert quiet.ending.outcome == "rollback_failed"
    restored, stopped = rollback([sys.executable, "-c", REPORTING, rollbacks.ENDING_ENV,
                                  "stopped"])
    assert not restored and stopped.rollback_ending == "stopped"


def test_a_rollback_runs_in_its_own_session_and_is_trusted_once_it_reports_accepted() -> None:
    restored, accepted = rollback([sys.executable, "-c", REPORTING, rollbacks.ENDING_ENV,
                                   "accepted"])
    assert restored and accepted.rollback_ending == "accepted"
    assert accepted.rollback_pid is None


def test_a_rollback_reports_its_ending_where_its_environment_says(tmp_path, monkeypatch
                                                                  ) -> None:
    report = tmp_path / "ending.json"
    monkeypatch.setenv(rollbacks.ENDING_ENV, str(report))
    state = State(Inventory((["@local"], {})), Config())
    run = runs.begin(state, "production", "machine=x user=y pid=1")
    run.attempt.end(Ending("accepted"))
    assert json.loads(report.read_text()) == {"outcome": "accepted"}
