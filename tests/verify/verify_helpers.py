"""What the verify checks share: the inventory's data read the way pyinfra reads it,
so the layers' own settings (``Sglang.from_host``, ``Proxy.from_host``) build from it;
and the layers' own facts, read over testinfra's SSH as pyinfra reads them."""

from __future__ import annotations

from typing import Any

from pyinfra.api import FactBase

from harness import remote


class HostData(dict):
    """Inventory data read like pyinfra's: ``data.key`` and ``data.get(key)``."""

    def __getattr__(self, key: str) -> Any:
        return self[key]


class InventoryView:
    """What the layers' settings are built from: a name and its data."""

    def __init__(self, inventory_host) -> None:
        self.name = inventory_host.name
        self.data = HostData(inventory_host.data)


def fact(inventory_host, cls: type[FactBase], **arguments: Any) -> Any:
    """A layer's fact, its command run over testinfra's SSH and read as pyinfra reads it."""
    result = inventory_host.host.run(remote.Query(cls.__name__, cls(), arguments).command())
    assert result.rc == 0, f"{inventory_host.name}: {cls.__name__}: {result.stderr}"
    lines = result.stdout.splitlines()
    return cls().process(lines) if lines else cls().default()
