"""What the verify checks share: the inventory's data read the way pyinfra reads it,
so the layers' own settings (``Sglang.from_host``, ``Proxy.from_host``) build from it."""

from __future__ import annotations

from typing import Any


class HostData(dict):
    """Inventory data read like pyinfra's: ``data.key`` and ``data.get(key)``."""

    def __getattr__(self, key: str) -> Any:
        return self[key]


class InventoryView:
    """What the layers' settings are built from: a name and its data."""

    def __init__(self, inventory_host) -> None:
        self.name = inventory_host.name
        self.data = HostData(inventory_host.data)
