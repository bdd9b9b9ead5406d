"""What the verify checks share: the layers' own facts and readings, read over
testinfra's SSH as pyinfra reads them. (A host's settings come from
``operations/site/settings.py``, built once per host by the session's fixtures.)"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase

from harness.hosts import remote
from operations.plumbing.reading import Query


def read(inventory_host, queries: list[Query]) -> dict[str, Any]:
    """
    A layer's reading (:mod:`operations.plumbing.reading`), its facts run in one
    command over testinfra's SSH and each read as pyinfra reads it.
    """
    result = inventory_host.host.run(remote.script(queries))
    assert result.rc == 0, f"{inventory_host.name}: {[q.key for q in queries]}: {result.stderr}"
    return remote.parse(result.stdout, queries)


def fact(inventory_host, cls: type[FactBase], **arguments: Any) -> Any:
    """A layer's fact, its command run over testinfra's SSH and read as pyinfra reads it."""
    result = inventory_host.host.run(Query(cls.__name__, cls(), arguments).command())
    assert result.rc == 0, f"{inventory_host.name}: {cls.__name__}: {result.stderr}"
    lines = result.stdout.splitlines()
    return cls().process(lines) if lines else cls().default()
