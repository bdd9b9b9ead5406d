"""
One run's attempt at a state, and what happens when it fails after a change.

The tool borrows production GPUs and may load a driver that stalls the link on
some controllers, so it must never leave the hosts worse off than it found them:

- before any change, a refusal stops the run at once (an ``OperationError``
  raised by a preflight operation body: nothing has changed, nothing to undo);
- after the first change, a failure is a command that fails with the evidence
  (:func:`failing`), recorded here for the whole run; the attempt's remaining
  steps are skipped on every host, production is converged and proven, and
  :func:`concluded` ends the run non-zero with one message naming the host, the
  layer, the evidence and what was restored.

pyinfra runs each operation on every host before the next, and runs
``deploy.py`` once per host in one process, so this module-level record is
shared by both workstations and the gateway: a failure on one host stops the
others at the same step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, OperationError, operation
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.state import BaseStateCallback

from operations.phase import executing


@dataclass
class Attempt:
    """The failures of this run, in order, each once per host and operation."""

    failures: dict[tuple[str, str | None], str] = field(default_factory=dict)
    restoring_from: int | None = None
    registered: bool = False

    def healthy(self) -> bool:
        return not self.failures

    def failed(self) -> bool:
        return bool(self.failures)

    def record(self, host_name: str, op_hash: str | None, message: str) -> None:
        self.failures.setdefault((host_name, op_hash), message)

    def messages(self) -> list[str]:
        return list(self.failures.values())


ATTEMPT = Attempt()


class RecordFailedOperations(BaseStateCallback):
    """Remote commands that fail (an ``insmod`` refused, a service that will not
    start) count as failures too, even when no operation of ours words them."""

    @staticmethod
    def operation_host_error(state: Any, host: Any, op_hash: str, *_: Any) -> None:
        names = ", ".join(sorted(state.get_op_meta(op_hash).names)) or "an operation"
        ATTEMPT.record(host.name, op_hash, f"{host.name}: {names}: a command failed")


def begin() -> Attempt:
    """The run's attempt, listening for failed operations (once per run)."""
    if not ATTEMPT.registered:
        state.add_callback_handler(RecordFailedOperations())
        ATTEMPT.registered = True
    return ATTEMPT


def failure_message(host_name: str, layer: str, found: list[str]) -> str:
    return f"{host_name}: {layer} layer: " + "; ".join(found)


def record_failure(on_host: Any, layer: str, found: list[str]) -> bool:
    """Record and print the evidence of a failure on ``on_host``; False, for pyinfra."""
    message = failure_message(on_host.name, layer, found)
    ATTEMPT.record(on_host.name, on_host.executing_op_hash, message)
    on_host.log_styled(message, fg="red", log_func=logger.error)
    return False


def fail(state: Any, host: Any, layer: str, found: list[str]) -> bool:
    return record_failure(host, layer, found)


def failing(layer: str, found: list[str]) -> FunctionCommand:
    """A command that, executed, records the evidence and fails its operation."""
    return FunctionCommand(fail, (layer, found), {})


def refuse(layer: str, found: list[str]) -> None:
    """Stop the whole run before any change, with every piece of evidence."""
    raise OperationError(failure_message(host.name, layer, found))


@operation(is_idempotent=True)
def restoring() -> Iterator[PyinfraCommand]:
    """
    Mark where the rollback to production starts, so that the conclusion can
    tell a failure of the attempt from a failure of its rollback.

    **Example:**

    .. code:: python

        attempt.restoring(name="Rollback: production is restored")
    """
    if executing() and ATTEMPT.restoring_from is None:
        ATTEMPT.restoring_from = len(ATTEMPT.failures)
    host.noop("restoring production after a failed attempt")
    yield from ()


@operation(is_idempotent=True)
def concluded(on_failure: str = "rollback") -> Iterator[PyinfraCommand]:
    """
    End the run non-zero if the attempt failed, saying what happened after.

    + on_failure: ``rollback`` (production was converged and proven) or ``stop``
      (the hosts were left as they were, for debugging)

    **Example:**

    .. code:: python

        attempt.concluded(name="The attempt succeeded", on_failure="rollback")
    """
    if executing() and ATTEMPT.failed():
        messages = ATTEMPT.messages()
        if on_failure == "stop":
            after = ("on_failure=stop: THE HOSTS WERE LEFT AS THEY ARE for debugging; "
                     "restore with: pyinfra inventory.py deploy.py --data state=production")
        elif ATTEMPT.restoring_from is not None and len(messages) > ATTEMPT.restoring_from:
            after = "the rollback to production failed too: the hosts need an operator"
        else:
            after = "production was restored and verified"
        raise OperationError(" | ".join([*messages, after]))
    host.noop("the attempt succeeded")
    yield from ()
