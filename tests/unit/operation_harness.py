"""
Run a twinbolt operation body against given facts, the way pyinfra's own
operation tests do: no host is contacted; the test states what the facts say
and asserts the commands the operation yields, or that it yields none.
"""

from __future__ import annotations

import atexit
import inspect
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

from pyinfra.api import Config, Inventory, State
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.host import Host
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from operations.run import Run
from operations.safety.lock import this_run
from operations.safety.rollback import ENDING_ENV
from operations.step import RUN_ATTRIBUTE

_KEYS = Path(tempfile.mkdtemp(prefix="twinbolt-unit-keys-"))
atexit.register(shutil.rmtree, _KEYS, True)


def local_key_file(name: str, key: str = "sk-0123456789abcdef0123456789abcdef") -> Path:
    """A key file of the machine running twinbolt, as a site keeps one (mode 0600)."""
    path = _KEYS / name
    path.write_text(key + "\n")
    path.chmod(0o600)
    return path


def describe(command: Any) -> str:
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        return f"upload {command.src} {command.dest}"
    if isinstance(command, FunctionCommand) and command.function.__name__ == "fail":
        layer, found = command.args
        return f"fail: {layer} layer: " + "; ".join(found)
    if isinstance(command, FunctionCommand):
        return f"call {command.function.__name__}"
    return repr(command)


def a_run() -> Run:
    """A run of its own, as ``deploy.py`` begins one: nothing proven, nothing failed."""
    return Run(owner=this_run("tests"))


def run_arguments(operation: Callable, run: Run, arguments: dict[str, Any]) -> dict[str, Any]:
    """
    ``arguments``, with the run or the part of it ``operation`` takes (``run``,
    ``proofs``, ``attempt``), as ``deploy.py`` passes them, unless given.
    """
    parts = {"run": run, "proofs": run.proofs, "attempt": run.attempt}
    taken = inspect.signature(operation._inner).parameters
    return {**{name: part for name, part in parts.items() if name in taken}, **arguments}


def run_operation(operation: Callable, facts: Callable[[type, dict], Any],
                  executing: bool = True, shell: list[str] | None = None,
                  run: Run | None = None, conditions: list[Callable[[], bool]] | None = None,
                  host_name: str = "wsa", **arguments: Any) -> list[str]:
    """
    The commands ``operation`` yields on a host whose facts ``facts(cls, kwargs)``
    gives, in ``run`` (a new one unless given); commands it runs directly
    (``host.run_shell_command``) succeed and are appended to ``shell``.
    ``conditions``: the operation's ``_if``, which the step asks itself, before
    its body (``operations.step.conditions_hold``). ``host_name``: the host it runs on.

    The run's parts are passed as ``deploy.py`` passes them (:func:`run_arguments`).
    """
    run = run or a_run()
    arguments = run_arguments(operation, run, arguments)
    inventory = Inventory(([host_name], {}))
    state = State(inventory, Config())
    setattr(state, RUN_ATTRIBUTE, run)
    state.current_stage = StateStage.Execute if executing else StateStage.Prepare
    host = inventory.get_host(host_name)
    host.current_op_global_arguments = {"_if": conditions or []}

    def get_fact(self: Host, cls: type, *args: Any, **kwargs: Any) -> Any:
        return facts(cls, kwargs)

    def run_shell_command(self: Host, command: Any, **kwargs: Any) -> tuple[bool, Any]:
        (shell if shell is not None else []).append(describe(command))
        return True, None

    with patch.object(Host, "get_fact", get_fact), \
            patch.object(Host, "run_shell_command", run_shell_command), \
            ctx_state.use(state), ctx_host.use(host):
        return [describe(command) for command in operation._inner(**arguments)]


class RollbackProcess:
    """
    A rollback's process, in place of ``subprocess.Popen``: it records the
    command and environment it was given, exits ``exit_code`` and reports the
    ``ending`` it reached, as ``deploy.py`` does, to the file its environment names.
    """

    ran: list[tuple[list[str], dict[str, str]]]

    @classmethod
    def ending(cls, outcome: str | None = "accepted", exit_code: int = 0) -> type:
        return type(cls.__name__, (cls,), {"outcome": outcome, "exit_code": exit_code,
                                           "ran": []})

    def __init__(self, command: list[str], env: dict[str, str], **_: Any) -> None:
        self.ran.append((command, env))
        self.pid = 0
        if self.outcome is not None:
            Path(env[ENDING_ENV]).write_text(json.dumps({"outcome": self.outcome}))

    def wait(self, timeout: float | None = None) -> int:
        return self.exit_code
