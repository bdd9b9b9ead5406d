"""
One run's attempt at a state, and what happens when it fails after a change.

The tool borrows production GPUs and may load a driver that stalls the link on
some controllers, so it must never leave the hosts worse off than it found them:

- before any change, a refusal stops the run at once (an ``OperationError``
  raised by a preflight operation body: nothing has changed, nothing to undo);
- after the first change, a failure is a command that fails with the evidence
  (:func:`failing`), recorded here for the whole run; the attempt's remaining
  steps are skipped on every host, production is converged and proven by a new
  run (:func:`rolled_back`), and :func:`concluded` ends the run non-zero with one
  message naming the host, the layer, the evidence and what was restored.

The rollback is a new run, ``deploy.py --data state=production``, rather than
operations declared here: it is exactly the run an operator would type, it is
the path the interruption sweep proves converges from any point, and a
``--dry`` of the attempt predicts only the attempt.

pyinfra runs each operation on every host before the next, and runs
``deploy.py`` once per host in one process, so the attempt, part of the run
(:mod:`operations.run`) that pyinfra's state holds, is shared by both
workstations and the gateway: a failure on one host stops the others at the
same step.

A failure is recorded under its layer, as data: each operation declares the
layer it belongs to (:func:`operation`), and a plain command of it that fails
is recorded under that layer, whatever the step's title says.

How the run ended (:class:`Ending`: accepted, refused, rolled back, ...) is
told once to whoever listens: the compatibility ledger does, and a rollback's
own ending is how the run that started it knows production was verified
(:func:`run_rollback`). A signal after the first change is a failure too
(:mod:`operations.interrupt`).
"""

from __future__ import annotations

import functools
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, OperationError
from pyinfra.api import operation as pyinfra_operation
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host

from operations import connect
from operations.phase import executing


class Layer(StrEnum):
    """The layer a step, and so a refusal or a failure, belongs to; the ledger records it."""

    LOCK = "lock"
    LEDGER = "ledger"
    GPU = "gpu"
    DRIVER = "driver"
    LINK = "link"
    SERVING = "serving"
    GATEWAY = "gateway"
    ROLLBACK = "rollback"


@dataclass(frozen=True)
class Interruption:
    """A signal that failed the attempt: its name and the step it arrived in."""

    signal: str
    step: str

    @property
    def exit_code(self) -> int:
        """128 and the signal's number, as a shell reports a process the signal ended."""
        return 128 + signal.Signals[self.signal]


@dataclass(frozen=True)
class Ending:
    """
    How a run ended: ``accepted``, ``refused`` (before any change), or after a
    failure ``rolled_back``, ``interrupted`` (rolled back after a signal),
    ``rollback_failed`` or ``stopped`` (``on_failure=stop``); the layer that failed
    or refused, its evidence, the hosts it lost, and the signal that interrupted it.
    """

    outcome: str
    layer: Layer | None = None
    evidence: str = ""
    # The hosts whose connection died during the run (:func:`lose`).
    lost: tuple[str, ...] = ()
    interrupted: Interruption | None = None


@dataclass
class Attempt:
    """The failures of this run, in order, each once per host and operation, and its end."""

    failures: dict[tuple[str, str | None], str] = field(default_factory=dict)
    layers: list[Layer | None] = field(default_factory=list)
    # The hosts whose connection died, each with the step that met it, in order.
    lost: dict[str, str] = field(default_factory=dict)
    # The layer each operation of this run declared, by its hash (:func:`operation`).
    layer_of: dict[str | None, Layer] = field(default_factory=dict)
    rollback_command: list[str] = field(default_factory=list)
    # The run's other --data items, which the rollback gets in its environment.
    rollback_data: list[str] = field(default_factory=list)
    rollback_exit: int | None = None
    # The outcome the rollback reported of itself (:data:`ENDING_ENV`): ``accepted``
    # only once it verified production.
    rollback_ending: str | None = None
    # The rollback's pid while it runs, which leads its own session.
    rollback_pid: int | None = None
    # The rollback's bound, once it expired: the rollback was stopped, not finished.
    rollback_expired: float | None = None
    dry: bool = False
    # Said again when the run concludes, however it ends (a forced refusal, say).
    caveats: list[str] = field(default_factory=list)
    listeners: list[Callable[[Ending], None]] = field(default_factory=list)
    ending: Ending | None = None
    # The signal that failed the attempt (:mod:`operations.interrupt`).
    interrupted: Interruption | None = None
    # Set when the run reaches its rollback step: a signal can no longer fail the attempt.
    closing: bool = False

    @classmethod
    def for_command_line(cls, params: dict[str, Any], target: str = "production") -> Attempt:
        """
        An attempt that keeps its very command line (``params``, pyinfra's parsed
        one), aimed at ``target`` and unable to roll back in turn, for the
        rollback: the same inventory, data and way of reaching the hosts
        (``--sudo``, ``--ssh-user``, ...). The ``--data`` items (a secret may be
        among them) go into the rollback's environment (:data:`CARRIED_DATA_ENV`).
        """
        return cls(
            rollback_data=[item for item in params["data"]
                           if not item.startswith(("state=", "on_failure="))],
            dry=bool(params.get("dry")),
            rollback_command=[
                sys.argv[0], "-y", *carried_options(params), params["inventory"],
                *params["operations"], "--data", f"state={target}", "--data", "on_failure=stop",
            ],
        )

    def healthy(self) -> bool:
        return not self.failures

    def failed(self) -> bool:
        return bool(self.failures)

    def record(self, host_name: str, op_hash: str | None, message: str,
               layer: Layer | None = None) -> None:
        if (host_name, op_hash) not in self.failures:
            self.failures[host_name, op_hash] = message
            self.layers.append(layer)

    def lose(self, host_name: str, step: str, layer: Layer | None) -> None:
        """Record, once, that ``host_name``'s connection died in ``step``: a failure."""
        if host_name not in self.lost:
            self.lost[host_name] = step
            self.record(host_name, LOST, f"{host_name}: {layer or 'a'} layer: the connection to "
                        f"{host_name} was lost during {step!r}; nothing more was done there",
                        layer)

    def interrupt(self, interruption: Interruption, layer: Layer | None) -> None:
        """Record, once, that a signal failed the attempt in ``interruption.step``."""
        if self.interrupted is None:
            self.interrupted = interruption
            self.record(INTERRUPTED, None, f"interrupted by {interruption.signal} during "
                        f"{interruption.step!r}: the attempt's remaining steps were skipped",
                        layer)

    def restored(self) -> bool:
        """Whether the rollback restored production: it exited 0 *and* said it verified it."""
        return self.rollback_exit == 0 and self.rollback_ending == "accepted"

    def speaker(self, hosts: Iterable[str]) -> str | None:
        """The first of ``hosts`` still reachable: it speaks for the run (``None``: none is)."""
        return next((name for name in hosts if name not in self.lost), None)

    def messages(self) -> list[str]:
        return list(self.failures.values())

    def end(self, ending: Ending) -> None:
        """Tell the listeners how the run ended, once; a dry run ends unheard."""
        if self.ending is None and not self.dry:
            self.ending = ending
            for listener in self.listeners:
                listener(ending)

    def rollback_environment(self, extra: list[str]) -> dict[str, str]:
        """The rollback's environment: this one, with the carried ``--data`` and ``extra`` items."""
        return {**os.environ, CARRIED_DATA_ENV: json.dumps([*self.rollback_data, *extra])}


# The attribute of pyinfra's state that holds the run it executes (operations.run).
RUN_ATTRIBUTE = "twinbolt_run"


def of(pyinfra_state: Any) -> Attempt:
    """The attempt of the run that ``pyinfra_state`` executes."""
    return getattr(pyinfra_state, RUN_ATTRIBUTE).attempt


# The failure key of a host's loss, which counts once whatever step met it.
LOST = "lost"
# The failure key of a signal, which is the run's, not a host's.
INTERRUPTED = "interrupted"


def step_name(state: Any, op_hash: str | None) -> str:
    """An operation's title, as pyinfra prints it."""
    return ", ".join(sorted(state.get_op_meta(op_hash).names)) or "an operation"


class RecordFailedOperations(BaseStateCallback):
    """Remote commands that fail (an ``insmod`` refused, a service that will not
    start) count as failures too, under the layer their operation declared, even
    when no operation of ours words them."""

    @staticmethod
    def operation_host_error(state: Any, host: Any, op_hash: str, *_: Any) -> None:
        run = of(state)
        if connect.lost(host):
            run.lose(host.name, step_name(state, op_hash), run.layer_of.get(op_hash))
        else:
            run.record(host.name, op_hash,
                       f"{host.name}: {step_name(state, op_hash)}: a command failed",
                       run.layer_of.get(op_hash))


def operation(layer: Layer, **options: Any) -> Callable[[Callable[..., Iterator[Any]]], Any]:
    """
    pyinfra's ``@operation(**options)`` for a step of ``layer``: when it runs, it
    declares its layer to the run, so that a plain command of it that fails is
    recorded under that layer. An operation another one calls (``_inner``)
    belongs to the caller's layer.

    A step asks its own ``_if`` conditions (:func:`conditions_hold`), when
    pyinfra predicts as when it executes: pyinfra itself would ask them only
    when it executes, before the body and outside any ``try``, where an error
    ends the whole run with no rollback (:class:`AskedByTheStep`). While
    operations execute, a step never crashes the run, whatever it meets:

    - on a host whose connection has died, it runs nothing and records the loss
      (:meth:`Attempt.lose`);
    - a condition that cannot be answered (:func:`answer`) skips the step: it
      refuses the run before any change, and fails the step after (:func:`unanswered`);
    - any exception its body raises but pyinfra's own (a refusal, an
      ``OperationError``: the run stops before any change) fails the step with
      the exception as its evidence, so that after the first change it ends in
      the rollback like any other failure.
    """

    def decorate(body: Callable[..., Iterator[Any]]) -> Any:
        @functools.wraps(body)
        def declared(*args: Any, **kwargs: Any) -> Iterator[Any]:
            of(state).layer_of.setdefault(host.current_op_hash, layer)
            if not executing():
                if conditions_hold():
                    yield from body(*args, **kwargs)
            elif connect.lost(host):
                yield FunctionCommand(lose, (layer,), {})
            else:
                try:
                    holds = conditions_hold()
                except UnansweredCondition as error:
                    yield unanswered(layer, str(error))
                    return
                try:
                    if holds:
                        yield from body(*args, **kwargs)
                except PyinfraError:
                    raise
                except Exception as error:  # noqa: BLE001 - any error is a failure to roll back
                    yield failing(layer, [f"{type(error).__name__}: {error}"])

        added = pyinfra_operation(**options)(declared)

        @functools.wraps(added)
        def called(*args: Any, **kwargs: Any) -> Any:
            return added(*args, **{**kwargs, "_if": AskedByTheStep.of(kwargs)})

        return called

    return decorate


@dataclass(frozen=True)
class AskedByTheStep:
    """
    What pyinfra's ``_if`` holds for a twinbolt step: its conditions, which the
    step asks itself (:func:`conditions_hold`); to pyinfra it always holds.

    pyinfra asks ``_if`` before the operation's body, outside any ``try``: a
    condition that raises, or a fact one reads that fails, ends the whole run
    there ("No hosts remaining!"), with no rollback, though replicas may already
    be stopped. Asked by the step, it is a failure of that step like any other.
    """

    conditions: tuple[Callable[[], bool], ...]

    def __call__(self) -> bool:
        return True

    @classmethod
    def of(cls, arguments: dict[str, Any]) -> AskedByTheStep:
        """The conditions a call with ``arguments`` has, by pyinfra's own precedence
        (the call's ``_if``, else that of an enclosing ``host.arguments``)."""
        conditions = pop_global_arguments(state, host, dict(arguments))[0]["_if"] or []
        if isinstance(conditions, cls):
            return conditions
        return cls(tuple([conditions] if callable(conditions) else conditions))


def conditions_hold() -> bool:
    """
    Whether the operation's ``_if`` conditions hold, asked by the step itself
    (:class:`AskedByTheStep`). While pyinfra only predicts (``--dry``, a run
    without ``-y``) they are asked too: pyinfra would ask them only when it
    executes, for conditions on earlier operations' outcomes; twinbolt's are
    facts read when asked (a replica runs, a swap is planned), and a prediction
    that ignored them would refuse, or change, where the run would not. An
    error in one while predicting is raised as it was, as a body's is: nothing
    has changed yet.
    """
    conditions = (host.current_op_global_arguments or {}).get("_if") or []
    if isinstance(conditions, AskedByTheStep):
        conditions = conditions.conditions
    elif callable(conditions):
        conditions = [conditions]
    if not executing():
        return all(condition() for condition in conditions)
    return all(answer(condition) for condition in conditions)


class UnansweredCondition(Exception):
    """A step's condition that raised, or that read a fact pyinfra could not read."""


def answer(condition: Callable[[], bool]) -> bool:
    """
    ``condition()``, asked while its step executes, with the step's own
    arguments (its bound, its sudo) but one: the facts it reads fail loudly.
    Where the step ignores errors, pyinfra would answer a fact it cannot read
    with the fact's default, and the step would act, or not, on a guess. So
    pyinfra fails the host for it (and prints which fact); the host is kept in
    the run, and the condition, like one that raises, is unanswered
    (:class:`UnansweredCondition`).
    """
    arguments = host.current_op_global_arguments or {}
    host.current_op_global_arguments = {**arguments, "_ignore_errors": False}
    error = None
    try:
        holds = condition()
    except Exception as raised:  # noqa: BLE001 - any error leaves the condition unanswered
        error = f"{type(raised).__name__}: {raised}"
    finally:
        host.current_op_global_arguments = arguments
    if host in state.failed_hosts:
        # pyinfra's own host object: `host` is the context's stand-in for it.
        state.failed_hosts.discard(host)
        state.active_hosts.add(ctx_host.get())
        error = "a fact it read could not be read (pyinfra says which above)"
    if error:
        raise UnansweredCondition(f"the condition {condition_name(condition)} of "
                                  f"{step_name(state, host.executing_op_hash)!r} could not be "
                                  f"answered: {error}; the step was skipped")
    return holds


def condition_name(condition: Callable[[], bool]) -> str:
    """A condition as a failure names it: ``serving.replica_runs``, ``attempt.Attempt.healthy``."""
    asked = getattr(condition, "func", condition)  # functools.partial
    module = getattr(asked, "__module__", "") or ""
    return ".".join(part for part in (module.removeprefix("operations."),
                                      getattr(asked, "__qualname__", repr(asked))) if part)


def unanswered(layer: Layer, found: str) -> FunctionCommand:
    """
    An unanswered condition's end: before any change (a step whose failure is
    not ignored: preflight), a refusal, as any preflight's; after, a failure of
    its step, so that the attempt ends in the rollback.
    """
    if not (host.current_op_global_arguments or {}).get("_ignore_errors"):
        refuse(layer, [found])
    return failing(layer, [found])


def failure(host_name: str, layer: str, found: list[str]) -> str:
    """How a refusal or a failure reads: the host, the layer, then every piece of evidence."""
    return f"{host_name}: {layer} layer: " + "; ".join(found)


def fail(state: Any, host: Any, layer: Layer, found: list[str]) -> bool:
    """
    Record and print the evidence of a failure on ``host``; False, which fails
    the operation (called by pyinfra as a ``FunctionCommand``: see :func:`failing`).
    On a host whose connection has died, the evidence (facts read as their
    defaults) is not the host's: the loss is recorded instead.

    pyinfra passes the state and the host to a ``FunctionCommand`` only when its
    function names them exactly ``state`` and ``host``.
    """
    if connect.lost(host):
        return lose(state, host, layer)
    message = failure(host.name, layer, found)
    of(state).record(host.name, host.executing_op_hash, message, layer)
    host.log_styled(message, fg="red", log_func=logger.error)
    return False


def lose(state: Any, host: Any, layer: Layer) -> bool:
    """Record and print that ``host``'s connection died in this step; False, as :func:`fail`."""
    run = of(state)
    first = host.name not in run.lost
    run.lose(host.name, step_name(state, host.executing_op_hash), layer)
    if first:
        host.log_styled(run.failures[host.name, LOST], fg="red", log_func=logger.error)
    return False


def failing(layer: Layer, found: list[str]) -> FunctionCommand:
    """A command that, executed, records the evidence and fails its operation."""
    return FunctionCommand(fail, (layer, found), {})


def refuse(layer: Layer, found: list[str]) -> None:
    """Stop the whole run before any change, with every piece of evidence."""
    message = failure(host.name, layer, found)
    of(state).end(Ending("refused", layer, message))
    raise OperationError(message)


# pyinfra's own options that decide which hosts are reached, and how: the rollback
# reaches the same hosts the same way. Passwords are not carried: they would show
# in the process list, and the rollback has no terminal to prompt on.
CARRIED_OPTIONS = {
    "limit": "--limit", "exclude": "--exclude", "group_data": "--group-data",
    "config_filename": "--config", "sudo": "--sudo", "sudo_user": "--sudo-user",
    "use_sudo_login": "--use-sudo-login", "su_user": "--su-user", "dzdo": "--dzdo",
    "dzdo_user": "--dzdo-user", "shell_executable": "--shell-executable",
    "ssh_user": "--ssh-user", "ssh_port": "--ssh-port", "ssh_key": "--ssh-key",
}


def carried_options(params: dict[str, Any]) -> list[str]:
    """The command line's :data:`CARRIED_OPTIONS`, as given (a flag once, a value each time)."""
    options = []
    for key, option in CARRIED_OPTIONS.items():
        value = params.get(key)
        if value is True:
            options.append(option)
        elif isinstance(value, tuple | list):
            options += [part for item in value for part in (option, str(item))]
        elif value not in (None, False):
            options += [option, str(value)]
    return options


# The --data items a rollback carries, as a JSON list of "key=value" strings:
# in its environment, which only its user can read, not on its command line,
# which every user's `ps` shows and the rollback's log line repeats.
CARRIED_DATA_ENV = "TWINBOLT_CARRIED_DATA"


def carried_data() -> dict[str, Any]:
    """
    The host data a rollback was given by the run that started it, each value
    read as pyinfra reads a ``--data`` value; ``inventory.py`` sets it on every
    host, where it wins over group data, as ``--data`` does.
    """
    from pyinfra_cli.util import parse_cli_arg

    items = json.loads(os.environ.get(CARRIED_DATA_ENV) or "[]")
    return {key: parse_cli_arg(value)
            for key, _, value in (item.partition("=") for item in items)}


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


# The data item that tells a rollback which hosts its failed run lost: it
# leaves them out (``--exclude``) and restores production on the rest.
LOST_HOSTS_KEY = "lost_hosts"


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


def stopped_at_bound(what: str, seconds: float, check: str) -> str:
    """
    How a process stopped at its bound reads, wherever one is run (the rollback,
    the campaign's deploys, the inventory's listing): what was stopped, after
    how long, and what to check.
    """
    return f"{what} did not end within its bound of {seconds:g}s and was stopped; check {check}"


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
                                 env={**attempt.rollback_environment(carried),
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

        attempt.rolled_back(name="Rollback: production is restored if the attempt failed",
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

        attempt.concluded(name="The attempt succeeded", attempt=run.attempt,
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
