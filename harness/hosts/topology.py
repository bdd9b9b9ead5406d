"""
The inventory as the harness uses it: the workstations (rank 0 first), the
gateway, an SSH config to reach them, and where each state is served.

Everything comes from ``operations.site.hosts`` (pyinfra's own merge of the
inventory, group data and site data), so the harness reaches the hosts pyinfra
deploys to, with the same keys and host-key checking. Each host's settings are
built once, when the topology is, as ``deploy.py`` builds them once per host:
the harness reads ``host.settings``, never the raw data again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Self

from operations import bounds
from operations.plumbing import keys
from operations.site.hosts import InventoryEntry, in_group, inventory_entries, ssh_config
from operations.site.model import PAIR_GROUP_PREFIX, pair_group
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
    + headers: what every request shows the servers and the router: their key
    + admin_headers: what SGLang's admin endpoints (``/flush_cache``,
      ``/start_profile``) ask instead
    """

    url: str
    model: str
    servers: tuple[str, ...]
    route: str
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    admin_headers: dict[str, str] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class TypedHost(InventoryEntry):
    """
    A host of the inventory with its typed settings (``SETTINGS``' kind),
    built once, when the entry is.
    """

    SETTINGS: ClassVar[type[WorkstationSettings] | type[GatewaySettings]]
    settings: Any = field(init=False, hash=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", self.SETTINGS.of(self))

    @classmethod
    def of(cls, entry: InventoryEntry) -> Self:
        return entry if isinstance(entry, cls) else cls(entry.name, entry.groups, entry.data)


@dataclass(frozen=True)
class Workstation(TypedHost):
    """A workstation of the inventory with its settings."""

    SETTINGS = WorkstationSettings
    settings: WorkstationSettings = field(init=False, hash=False, compare=False, repr=False)


@dataclass(frozen=True)
class Gateway(TypedHost):
    """The gateway of the inventory with its settings."""

    SETTINGS = GatewaySettings
    settings: GatewaySettings = field(init=False, hash=False, compare=False, repr=False)


@dataclass(frozen=True)
class Topology:
    """
    One pair of the inventory, as the harness looks at it: its workstations
    rank 0 first, the gateway, their SSH config, and the pair's name when the
    inventory has other pairs (``None``: the pair is the site's only one).
    Entries it is given become typed hosts (``Workstation``, ``Gateway``).
    """

    workstations: tuple[Workstation, ...]
    gateway: Gateway | None
    ssh_config: Path
    pair: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "workstations",
                           tuple(Workstation.of(entry) for entry in self.workstations))
        if self.gateway is not None:
            object.__setattr__(self, "gateway", Gateway.of(self.gateway))

    @classmethod
    def load(cls, directory: Path, pair: str | None = None) -> Topology:
        """
        Read the inventory and write its SSH config into ``directory``: the pair
        ``pair``, which a site of several pairs must name.
        """
        (topology,) = cls.load_pairs(directory, [pair] if pair else None, one=pair is None)
        return topology

    @classmethod
    def load_pairs(cls, directory: Path, pairs: Sequence[str] | None = None,
                   one: bool = False) -> list[Topology]:
        """
        Each of ``pairs`` (every pair of the inventory by default; ``one``: the
        inventory must hold only one), reading the inventory once; refused with
        the pairs there are when one is unknown.
        """
        entries = inventory_entries()
        path = directory / "ssh_config"
        path.write_text(ssh_config(entries))
        gateways = in_group(entries, "gateway")
        found = list(dict.fromkeys(group.removeprefix(PAIR_GROUP_PREFIX)
                                   for entry in in_group(entries, "workstations")
                                   for group in entry.groups
                                   if group.startswith(PAIR_GROUP_PREFIX)))
        unknown = [pair for pair in pairs or () if pair not in found]
        if unknown or (one and len(found) > 1):
            raise ValueError(
                (f"no pair {', '.join(unknown)} in the inventory" if unknown else
                 "the inventory has several pairs: name one with --pair (a campaign: --pairs)")
                + f"; its pairs are {', '.join(found)}")
        return [cls(tuple(entry for entry in in_group(entries, "workstations")
                          if pair_group(pair) in entry.groups),
                    gateways[0] if gateways else None, path,
                    pair if len(found) > 1 else None)
                for pair in pairs or found]

    @property
    def deploy_options(self) -> list[str]:
        """What ``pyinfra`` is given to move this pair alone (nothing on a one-pair site)."""
        return ["--limit", pair_group(self.pair)] if self.pair else []

    @property
    def verify_options(self) -> list[str]:
        """What ``pytest tests/verify`` is given to check this pair alone (likewise)."""
        return ["--pair", self.pair] if self.pair else []

    @property
    def named(self) -> str:
        """How a report names this pair: ``pair b``, or nothing on a one-pair site."""
        return f"pair {self.pair}" if self.pair else ""

    @property
    def rank0(self) -> Workstation:
        """The TP group's rank 0: the one rank clients reach, and the rendezvous."""
        return self.workstations[0]

    @property
    def tp_size(self) -> int:
        """The TP group's size, as the site gives it to every workstation."""
        return self.rank0.settings.tp_size

    @property
    def deploy_timeout(self) -> int:
        """The bound of one ``deploy.py`` run, from the site's settings (``operations.bounds``)."""
        return bounds.deploy_timeout(self.rank0.settings)

    @property
    def verify_timeout(self) -> int:
        """The bound of one ``pytest tests/verify`` run (``operations.bounds``)."""
        return bounds.verify_timeout(self.rank0.settings)

    @property
    def served_model_name(self) -> str:
        """The model every server serves: a site-wide setting, read from any workstation."""
        return self.rank0.settings.serving.served_model_name

    @property
    def headers(self) -> dict[str, str]:
        """What the SGLang servers and the router ask of a caller: the servers' key."""
        return keys.bearer(self.rank0.settings.serving.api_key_file)

    @property
    def admin_headers(self) -> dict[str, str]:
        """What the SGLang servers' admin endpoints ask instead: their admin key."""
        return keys.bearer(self.rank0.settings.serving.admin_api_key_file)

    def endpoint(self, state: State) -> Endpoint:
        """The serving endpoint of ``state``, from the inventory's addresses and ports."""
        model = self.served_model_name
        credentials = {"headers": self.headers, "admin_headers": self.admin_headers}
        if state.tensor_parallel:
            rank0 = self.rank0.settings.server_url
            return Endpoint(rank0, model, (rank0,), f"TP rank 0 on {self.rank0.name}",
                            **credentials)
        servers = tuple(entry.settings.server_url for entry in self.workstations)
        if self.gateway is None:
            raise ValueError("the inventory has no gateway: production is served by its router")
        router = self.gateway.settings.router_url
        return Endpoint(router, model, servers, f"sglang-router on {self.gateway.name}",
                        **credentials)

