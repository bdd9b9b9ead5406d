"""What the verify checks share: the layers' own facts, read over testinfra's SSH as
pyinfra reads them. (A host's settings come from ``operations/site/settings.py``, built
from its inventory data as the deploy builds them.)"""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase

from harness.hosts import remote


def fact(inventory_host, cls: type[FactBase], **arguments: Any) -> Any:
    """A layer's fact, its command run over testinfra's SSH and read as pyinfra reads it."""
    result = inventory_host.host.run(remote.Query(cls.__name__, cls(), arguments).command())
    assert result.rc == 0, f"{inventory_host.name}: {cls.__name__}: {result.stderr}"
    lines = result.stdout.splitlines()
    return cls().process(lines) if lines else cls().default()
