"""
Running an operation's generator without a host, in the manner of pyinfra's own
operation tests: facts come from a table, and the commands the operation would
run are collected as text.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any

from operation_harness import a_run, run_arguments
from pyinfra.api.command import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.state import StateStage
from pyinfra.context import ctx_host, ctx_state

from operations.run import Run
from operations.step import RUN_ATTRIBUTE


class FakeHost:
    """
    A host whose facts are a table: ``{FactClass: value}`` or
    ``{FactClass: callable(**fact_kwargs)}``; a fact not in the table is an error,
    so a test lists exactly what the operation reads.
    """

    def __init__(self, facts: dict[type, Any], name: str = "wsa",
                 data: dict[str, Any] | None = None) -> None:
        self.name = name
        self.facts = facts
        self.noops: list[str] = []
        self.data = SimpleNamespace(**(data or {}))
        self.current_op_global_arguments: dict[str, Any] = {}
        self.current_op_hash: str | None = None
        # Never connected: never lost (operations.plumbing.connect.lost).
        self.connector = None

    def get_fact(self, fact: type, *args: Any, **kwargs: Any) -> Any:
        if fact not in self.facts:
            raise AssertionError(f"unexpected fact {fact.__name__}({kwargs})")
        value = self.facts[fact]
        return value(**kwargs) if callable(value) else value

    def noop(self, description: str) -> None:
        self.noops.append(description)

    def get_temp_filename(self, *args: Any, **kwargs: Any) -> str:
        return "/tmp/pyinfra-upload"

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass


def describe(command: object) -> str:
    if isinstance(command, FileUploadCommand):
        return f"upload {command.dest}"
    if isinstance(command, FunctionCommand):
        return f"call {command.function.__name__}"
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    return str(command).strip()


@contextmanager
def on(host: FakeHost, run: Run | None = None) -> Iterator[FakeHost]:
    """Operations called inside run on ``host``, in ``run`` (a new one unless given)."""
    state = SimpleNamespace(cwd=None, inventory=None, config=SimpleNamespace(DIFF=False),
                            is_executing=True, current_stage=StateStage.Execute,
                            **{RUN_ATTRIBUTE: run or a_run()})
    with ctx_state.use(state), ctx_host.use(host):
        yield host


def commands(operation: Callable[..., Iterator[object]], host: FakeHost,
             run: Run | None = None, **arguments: Any) -> list[str]:
    """The commands ``operation`` yields on ``host``, in ``run``, as text."""
    run = run or a_run()
    with on(host, run):
        return [describe(command)
                for command in operation._inner(**run_arguments(operation, run, arguments))]
