"""
A step of the runbook: the layer it belongs to, and how it refuses or fails.

The tool borrows production GPUs and may load a driver that stalls the link on
some controllers, so it must never leave the hosts worse off than it found them:

- before any change, a refusal stops the run at once (:func:`refuse`: an
  ``OperationError`` raised by a preflight operation body: nothing has
  changed, nothing to undo);
- after the first change, a failure is a command that fails with the evidence
  (:func:`failing`), recorded in the run's :class:`Attempt` for the whole run;
  the attempt's remaining steps are skipped on every host, and the rollback
  (:mod:`operations.safety.rollback`) converges and proves production.

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
own ending is how the run that started it knows production was verified. A
signal after the first change is a failure too
(:mod:`operations.safety.interrupt`).
"""

from __future__ import annotations

import functools
import signal
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, OperationError
from pyinfra.api import operation as pyinfra_operation
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.api.exceptions import PyinfraError
from pyinfra.api.state import BaseStateCallback
from pyinfra.context import ctx_host

from operations.plumbing import connect
from operations.plumbing.phase import executing


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
    # The signal that failed the attempt (:mod:`operations.safety.interrupt`).
    interrupted: Interruption | None = None
    # Set when the run reaches its rollback step: a signal can no longer fail the attempt.
    closing: bool = False

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


# The attribute of pyinfra's state that holds the run it executes (:mod:`operations.run`).
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
    when no operation of ours words them; and a host whose command failed and
    whose connection has died, or no longer answers, is lost."""

    @staticmethod
    def operation_host_error(state: Any, host: Any, op_hash: str, *_: Any) -> None:
        run = of(state)
        if connect.lost(host) or not connect.still_answers(host):
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
    """A condition as a failure names it: ``serving.sglang.replica_runs``,
    ``step.Attempt.healthy``."""
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
