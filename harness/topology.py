"""
The inventory as the harness uses it: the workstations (rank 0 first), the
gateway, an SSH config to reach them, and where each state is served.

Everything comes from ``operations.site.hosts`` (pyinfra's own merge of the
inventory, group data and site data), so the harness reaches the hosts pyinfra
deploys to, with the same keys and host-key checking.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from operations import bounds
from operations.site.hosts import InventoryEntry, in_group, inventory_entries, ssh_config
from operations.site.settings import GatewaySettings, WorkstationSettings
from operations.states import State


@dataclass(frozen=True)
class Endpoint:
    """
    Where a state is served.

    + url: where clients send requests: rank 0 in TP states, the router in production
    + model: the served model name
    + servers: the SGLang servers whose ``/server_info`` and ``/metrics`` count
      (rank 0 only: rank 1 serves nothing but a dummy ``/health``)
    + route: a human name for ``url``
    """

    url: str
    model: str
    servers: tuple[str, ...]
    route: str


@dataclass(frozen=True)
class Topology:
    """The hosts of the inventory: workstations rank 0 first, the gateway, their SSH config."""

    workstations: tuple[InventoryEntry, ...]
    gateway: InventoryEntry | None
    ssh_config: Path

    @classmethod
    def load(cls, directory: Path) -> Topology:
        """Read the inventory and write its SSH config into ``directory``."""
        entries = inventory_entries()
        path = directory / "ssh_config"
        path.write_text(ssh_config(entries))
        gateways = in_group(entries, "gateway")
        return cls(tuple(in_group(entries, "workstations")),
                   gateways[0] if gateways else None, path)

    @property
    def rank0(self) -> InventoryEntry:
        """The TP group's rank 0: the one rank clients reach, and the rendezvous."""
        return self.workstations[0]

    @property
    def tp_size(self) -> int:
        """The TP group's size, as the site gives it to every workstation."""
        return WorkstationSettings.of(self.rank0).tp_size

    @property
    def deploy_timeout(self) -> int:
        """The bound of one ``deploy.py`` run, from the site's settings (``operations.bounds``)."""
        return bounds.deploy_timeout(WorkstationSettings.of(self.rank0))

    @property
    def verify_timeout(self) -> int:
        """The bound of one ``pytest tests/verify`` run (``operations.bounds``)."""
        return bounds.verify_timeout(WorkstationSettings.of(self.rank0))

    @property
    def served_model_name(self) -> str:
        """The model every server serves: a site-wide setting, read from any workstation."""
        return WorkstationSettings.of(self.rank0).serving.served_model_name

    def endpoint(self, state: State) -> Endpoint:
        """The serving endpoint of ``state``, from the inventory's addresses and ports."""
        model = self.served_model_name
        if state.tensor_parallel:
            rank0 = server_url(self.rank0)
            return Endpoint(rank0, model, (rank0,), f"TP rank 0 on {self.rank0.name}")
        servers = tuple(server_url(entry) for entry in self.workstations)
        if self.gateway is None:
            raise ValueError("the inventory has no gateway: production is served by its router")
        router = GatewaySettings.of(self.gateway).router_url
        return Endpoint(router, model, servers, f"sglang-router on {self.gateway.name}")


def server_url(workstation: InventoryEntry) -> str:
    """The SGLang server of a workstation, as the router and the probes reach it."""
    return WorkstationSettings.of(workstation).server_url
