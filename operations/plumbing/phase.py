"""
Whether pyinfra is executing operations or only detecting what they would change.

Without ``-y`` (and with ``--dry``) pyinfra runs every operation body once to
predict changes, before anything is executed. A verification that depends on an
earlier operation's effect cannot judge then: it predicts, and judges for real
when the body runs again at execute time.
"""

from typing import Any

from pyinfra import host, state
from pyinfra.api import Host, StringCommand
from pyinfra.api.arguments import CONNECTOR_ARGUMENT_KEYS, pop_global_arguments
from pyinfra.api.state import StateStage


def executing() -> bool:
    """True while operations execute; false while pyinfra only predicts changes."""
    return state.current_stage == StateStage.Execute


def run_now(command: StringCommand) -> tuple[bool, Any]:
    """
    Run ``command`` at once, while operations execute, as the operation's own
    commands run: pyinfra applies the connector arguments (``_sudo`` from a
    site's host data above all) to the commands an operation yields and to its
    facts, but not to a direct ``host.run_shell_command``.

    Only where pyinfra leaves no other way, each caller saying why:

    - bookkeeping about the run, not the hosts' declared state (the host lock,
      the guard's events moved aside): pyinfra reports every command an
      operation yields, a ``FunctionCommand`` too, as a change (its "Success"),
      and a converged run must report none;
    - a command whose outcome decides a refusal (the lock taken by another run
      first): a refusal is an ``OperationError`` raised by the operation's body,
      which ends the run; raised in a ``FunctionCommand``, pyinfra would log it
      as an unexpected error of a callback and fail the host instead;
    - a command inside a wait that already runs as the step's own
      ``FunctionCommand`` (the link's address, applied as the interface
      appears): a callback cannot yield a command.
    """
    return host.run_shell_command(command, **connector_arguments())


def connector_arguments() -> dict[str, Any]:
    """
    The current operation's connector arguments on this host (``_sudo``, ``_timeout``,
    ...): how :func:`run_now` runs a command, and how a later one on this host must.
    """
    arguments = host.current_op_global_arguments or {}
    return {key: value for key, value in arguments.items() if key in CONNECTOR_ARGUMENT_KEYS}


def planning_arguments(target: Host) -> dict[str, Any]:
    """
    How a command on ``target`` runs while the run is still planned, outside any
    operation: the connector arguments its host data sets (``_sudo`` above all),
    as pyinfra would give its operations.
    """
    arguments, _ = pop_global_arguments(state, target, {})
    return {key: value for key, value in arguments.items() if key in CONNECTOR_ARGUMENT_KEYS}


def elsewhere(settings: object | None, role: str) -> bool:
    """
    Whether this host has no part in an operation (its settings are ``None``).

    deploy.py calls the serving and gateway operations on every host, each host
    passing the settings it has and ``None`` for the rest: pyinfra orders
    operations across hosts only through the operations they share, so a
    gateway-only step could otherwise run before the workstations' steps above it.
    """
    if settings is None:
        host.noop(f"this host is not a {role}")
        return True
    return False
