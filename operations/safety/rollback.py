"""
What happens when an attempt fails after a change: production is converged and
proven by a new run, and the run ends saying what was restored.

After the first change, a failure (:func:`operations.step.failing`) skips the
attempt's remaining steps on every host; then production is converged and
proven by a new run (:func:`rolled_back`), and :func:`concluded` ends the run
non-zero with one message naming the host, the layer, the evidence and what
was restored.

The rollback is a new run, ``deploy.py --data state=production``, rather than
operations declared here: it is exactly the run an operator would type, it is
the path the interruption sweep proves converges from any point, and a
``--dry`` of the attempt predicts only the attempt.

A rollback's own ending is how the run that started it knows production was
verified (:func:`run_rollback`).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError
from pyinfra.api.command import PyinfraCommand

from operations.plumbing.phase import executing
from operations.plumbing.probes import stopped_at_bound
from operations.site.options import CARRIED_DATA_ENV, LOST_HOSTS_KEY, RunOptions, carried_options
from operations.step import Attempt, Ending, Layer, fail, of, operation


def for_command_line(params: dict[str, Any], target: str = "production") -> Attempt:
    """
    An attempt that keeps its very command line (``params``, pyinfra's parsed
    one), aimed at ``target`` and unable to roll back in turn, for the
    rollback: the same inventory, data and way of reaching the hosts
    (``--sudo``, ``--ssh-user``, ...). The ``--data`` items (a secret may be
    among them) go into the rollback's environment (:func:`environment`), but
    for the run options the rollback is given anew (``state``, ``on_failure``).
    """
    anew = RunOptions(state=target, on_failure="stop")
    return Attempt(
        rollback_data=[item for item in params["data"]
                       if item.partition("=")[0] not in anew.model_fields_set],
        dry=bool(params.get("dry")),
        rollback_command=[
            sys.argv[0], "-y", *carried_options(params), params["inventory"], *params["operations"],
            *(part for item in anew.data_items() for part in ("--data", item)),
        ],
    )


def environment(attempt: Attempt, extra: list[str]) -> dict[str, str]:
    """The rollback's environment: this one, with the carried ``--data`` and ``extra`` items."""
    return {**os.environ, CARRIED_DATA_ENV: json.dumps([*attempt.rollback_data, *extra])}


# Beyond its waits, a production converge runs a few dozen short commands, each
# bounded by the command bound and done in seconds: this many bounds are slack.
ROLLBACK_SLACK_COMMANDS = 4


def rollback_timeout(command_timeout: int, waits: Iterable[float]) -> int:
    """
    The bound of the rollback's run: ``waits``, every wait of a production
    converge, in full, and :data:`ROLLBACK_SLACK_COMMANDS` commands' bounds more.

    Each of its steps is bounded already (it reads the same site); this bounds
    the process as a whole, so that a rollback that never ends (a connect that
    never completes, a pyinfra that never exits) still ends this run, non-zero,
    rather than holding the operator's terminal and the hosts' lock.
    """
    return math.ceil(sum(waits)) + ROLLBACK_SLACK_COMMANDS * command_timeout


def rollback_reach(attempt: Attempt) -> tuple[list[str], list[str]]:
    """
    The command-line options and the data items that have a rollback leave out
    the hosts the attempt lost, which it could not reach.
    """
    lost = list(attempt.lost)
    if not lost:
        return [], []
    return ([part for name in lost for part in ("--exclude", name)],
            [f"{LOST_HOSTS_KEY}={json.dumps(lost)}"])


# The file a rollback reports its own ending in, named in its environment: the run
# that started it trusts production only once the rollback itself verified it.
ENDING_ENV = "TWINBOLT_ROLLBACK_ENDING"


def report_ending(path: Path, ending: Ending) -> None:
    """Tell the run that started this rollback how it ended (a listener of its attempt)."""
    path.write_text(json.dumps({"outcome": ending.outcome}))


@contextmanager
def ending_report() -> Iterator[Path]:
    """A new file for a rollback to report its ending in (only this user reads it), then gone."""
    descriptor, name = tempfile.mkstemp(prefix="twinbolt-rollback-", suffix=".json")
    os.close(descriptor)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def reported_ending(path: Path) -> str | None:
    """The outcome a rollback reported in ``path``; ``None`` if it reported none."""
    try:
        return json.loads(path.read_text() or "{}").get("outcome")
    except (OSError, ValueError, AttributeError):
        return None


def kill_rollback(pid: int) -> None:
    """Kill the rollback ``pid`` and whatever it started: it leads its own session."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_rollback(state: Any, host: Any, command: list[str], carried: list[str],
                 timeout: float | None = None) -> bool:
    """
    Converge production with ``command``, a new run, and judge it by what it
    verified: it must exit 0 and report an ``accepted`` ending (:data:`ENDING_ENV`),
    which it reaches only once its own step 8 has verified production. It runs in
    a session of its own, so that the operator's terminal does not signal it (a
    Ctrl-C would end it, and a pyinfra that ends on one exits 0).
    """
    attempt = of(state)
    if not command:
        return fail(state, host, Layer.ROLLBACK, ["no pyinfra command line to run again"])
    excluded, lost = rollback_reach(attempt)
    command, carried = [*command, *excluded], [*carried, *lost]
    keys = [item.partition("=")[0] for item in [*attempt.rollback_data, *carried]]
    host.log_styled(f"rollback: converging production: {' '.join(command)}"
                    + (f" (carrying --data {', '.join(keys)})" if keys else ""), fg="yellow",
                    log_func=logger.warning)
    with ending_report() as ending:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, start_new_session=True,
                                 env={**environment(attempt, carried),
                                      ENDING_ENV: str(ending)})
        attempt.rollback_pid = child.pid
        try:
            attempt.rollback_exit = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_rollback(child.pid)
            child.wait()
            # The hosts are as after an interrupted run.
            attempt.rollback_expired = timeout
            return fail(state, host, Layer.ROLLBACK, [stopped_at_bound(
                f"the rollback to production ({' '.join(command)})", timeout,
                "that every host answers over SSH; the hosts are as after an interrupted run")])
        finally:
            attempt.rollback_pid = None
        attempt.rollback_ending = reported_ending(ending)
    return attempt.restored()


@operation(Layer.ROLLBACK)
def rolled_back(attempt: Attempt, on_failure: str, speakers: tuple[str, ...],
                carried: tuple[str, ...] = (),
                timeout: float | None = None) -> Iterator[PyinfraCommand]:
    """
    If the attempt failed, converge production with a new run, once for all
    hosts but those the attempt lost, which it leaves out.

    + attempt: the run's :class:`Attempt`
    + on_failure: ``rollback`` or ``stop`` (leave the hosts as they are)
    + speakers: the run's hosts, in order; the first not lost starts the new run
      in its step (the others only wait for it)
    + carried: more ``key=value`` data for the new run (the host lock it inherits)
    + timeout: seconds the new run may take before it is stopped and counts as
      failed (:func:`rollback_timeout`); the step's own ``_timeout`` must be longer

    **Example:**

    .. code:: python

        rollback.rolled_back(name="Rollback: production is restored if the attempt failed",
                            attempt=run.attempt, on_failure="rollback",
                            speakers=("wsa", "wsb", "gw"))
    """
    speaker = attempt.speaker(speakers)
    if executing():
        attempt.closing = True
    if not executing() or attempt.healthy() or on_failure == "stop":
        host.noop("nothing to roll back")
    elif host.name != speaker:
        host.noop(f"the rollback runs in {speaker}'s step")
    else:
        yield FunctionCommand(run_rollback,
                              (attempt.rollback_command, list(carried), timeout), {})


@operation(Layer.ROLLBACK, is_idempotent=True)
def concluded(attempt: Attempt, on_failure: str,
              speakers: tuple[str, ...]) -> Iterator[PyinfraCommand]:
    """
    End the run non-zero if the attempt failed, saying what happened after: with
    128 and the signal's number if a signal interrupted it, as shells expect.

    + attempt: the run's :class:`Attempt`
    + on_failure: ``rollback`` (production was converged and proven) or ``stop``
      (the hosts were left as they were, for debugging)
    + speakers: the run's hosts, in order; the first not lost says it, once for
      the whole run

    **Example:**

    .. code:: python

        rollback.concluded(name="The attempt succeeded", attempt=run.attempt,
                          on_failure="rollback", speakers=("wsa", "wsb", "gw"))
    """
    speaker = attempt.speaker(speakers)
    if not executing() or host.name != speaker:
        host.noop("the attempt succeeded" if attempt.healthy() else f"{speaker} concludes")
    elif attempt.failed():
        messages = attempt.messages()
        if on_failure == "stop":
            outcome, after = "stopped", (
                "on_failure=stop: THE HOSTS WERE LEFT AS THEY ARE for debugging; "
                f"restore with: {RESTORE}")
        elif attempt.restored():
            outcome = "interrupted" if attempt.interrupted else "rolled_back"
            after = restored(attempt, speakers)
        else:
            outcome, after = "rollback_failed", (
                f"the rollback to production failed too ({rollback_failure(attempt)}): "
                "the hosts need an operator")
        layer = next((layer for layer in attempt.layers if layer), None)
        attempt.end(Ending(outcome, layer, " | ".join(messages), tuple(attempt.lost),
                           attempt.interrupted))
        conclusion = " | ".join([*messages, after, *attempt.caveats])
        if attempt.interrupted:
            # pyinfra's CLI ends an OperationError with exit 1: say it here, end as shells expect.
            host.log_styled(conclusion, fg="red", log_func=logger.error)
            raise SystemExit(attempt.interrupted.exit_code)
        raise OperationError(conclusion)
    else:
        attempt.end(Ending("accepted"))
        for caveat in attempt.caveats:
            host.log_styled(caveat, fg="red", log_func=logger.warning)
        host.noop("the attempt succeeded")
    yield from ()


RESTORE = "pyinfra inventory.py deploy.py --data state=production"


def rollback_failure(attempt: Attempt) -> str:
    """How the rollback failed: stopped at its bound, its exit, or no verified production."""
    if attempt.rollback_expired is not None:
        return f"stopped after {attempt.rollback_expired:g}s"
    if attempt.rollback_exit == 0:
        return "exit 0, but it reported no verified production"
    return f"exit {attempt.rollback_exit}"


def restored(attempt: Attempt, speakers: Iterable[str]) -> str:
    """What a rollback that passed restored: everything, or all but the hosts lost."""
    if not attempt.lost:
        return "production was restored and verified"
    reached = [name for name in speakers if name not in attempt.lost]
    lost = ", ".join(attempt.lost)
    return (f"production was restored and verified on {', '.join(reached)}, without {lost}, "
            f"which the rollback could not reach and which may still run what the attempt "
            f"left there; once {lost} answers again, converge the whole pair: {RESTORE}")
