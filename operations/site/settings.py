"""
A host's settings as one typed object, built from its final host data.

A site reaches its hosts as flat pyinfra host data (``operations/site/model.py``:
``[serving] port`` is ``serving_port``), and ``--data key=value`` overrides it
after the inventory and ``group_data/`` have run; a rollback's carried data is
host data too. So the settings are built here, from the data pyinfra merged,
and this is the only code that reads the flat keys: the runbook, the layers,
the harness and the verify checks all ask :meth:`WorkstationSettings.of` or
:meth:`GatewaySettings.of`, given a pyinfra ``Host`` or an
``operations.site.hosts.InventoryEntry`` alike.

The key names are the site model's own fields (:func:`section`), so a setting
added to a model reaches every consumer with no other edit; a layer's own
settings object is derived from these by its fields' names (:func:`derived`). Values are not
validated again: the site file was when it loaded, ``--data`` overrides of its
keys are when a run starts (``operations/site/overrides.py``), the lab's are its own,
and the lab's service accounts are root, which a site's may never be.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol, TypeVar

from pydantic import BaseModel

from operations.site.model import (
    COMMAND_TIMEOUT,
    WORKSTATION_SECTIONS,
    Candidate,
    GatewayRoles,
    Ledger,
    Link,
    Serving,
    Ssh,
    flat_key,
    nested_section,
    site_default,
)
from operations.thunderbolt.driver import CandidateModule
from operations.thunderbolt.link import ExpectedLink
from operations.thunderbolt.module_file import NotAModule

Section = TypeVar("Section", bound=BaseModel)
LayerSettings = TypeVar("LayerSettings")


class Data(Protocol):
    """pyinfra's ``HostData`` and the plain dict of an inventory entry both answer this."""

    def get(self, key: str, default: Any = None) -> Any: ...


class Inventoried(Protocol):
    """A host with its merged data: a pyinfra ``Host``, an ``InventoryEntry``."""

    name: str

    @property
    def data(self) -> Data | Mapping[str, Any]: ...


_ABSENT = object()


def section(model: type[Section], data: Data | Mapping[str, Any], prefix: str) -> Section:
    """
    One site section from its flat keys, ``prefix_field`` (nested models
    ``prefix_field_subfield``, as the site flattens them); a key no data holds
    takes the model's default.
    """
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = flat_key(prefix, name)
        if nested := nested_section(field):
            values[name] = section(nested, data, key)
        elif (value := data.get(key, _ABSENT)) is not _ABSENT:
            values[name] = value
    return model.model_construct(**values)


def derived(layer: type[LayerSettings], *sources: object, prefix: str = "",
            **computed: Any) -> LayerSettings:
    """
    A layer's own settings (the dataclass ``layer``), derived from the host's:
    each field is the one setting among ``sources`` (a host's settings, their
    sections) that bears its name, or its name after ``prefix``, where a section
    holds the settings of several roles (``gateway_roles.router_port`` is the
    router's ``port``). Only the ``computed`` fields (a router's workers, a
    proxy's deployments) are given, because no setting holds them.

    A field that no setting names, or that two do, is an error, not a guess: a
    setting reaches a layer under its own name, never copied by hand, so a field
    added to a layer is a setting's name or a computed value. A list becomes a
    tuple, as a frozen dataclass holds it.
    """
    values = dict(computed)
    for field in fields(layer):
        if field.name in computed:
            continue
        found = [(source, key) for source in sources
                 for key in dict.fromkeys((prefix + field.name, field.name))
                 if key in _setting_names(source)]
        if len(found) != 1:
            held = ", ".join(f"{type(source).__name__}.{key}" for source, key in found)
            raise TypeError(f"{layer.__name__}.{field.name}: " + (
                f"more than one setting holds it ({held})" if found
                else "no setting is named so; a field no setting holds is computed"))
        ((source, key),) = found
        value = getattr(source, key)
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return layer(**values)


def _setting_names(source: object) -> Collection[str]:
    """The settings ``source`` holds: a site section's fields, or a settings dataclass's."""
    if isinstance(source, BaseModel):
        return type(source).model_fields
    return {field.name for field in fields(source)}


def http_url(address: str, port: int) -> str:
    """Where a client reaches a service of twinbolt's: every base URL is built here."""
    return f"http://{address}:{port}"


@dataclass(frozen=True)
class HostSettings:
    """
    What every host has: its name, the ``address`` clients and probes reach it
    at, the run directory, and ``command_timeout``, the bound on one remote
    command (``[ssh] command_timeout_seconds``, pyinfra's ``_timeout``).

    ``address`` is the host's ``ssh_hostname``, else its name: pyinfra's own
    rule for where it connects, so a service is reached where pyinfra deploys it.
    """

    name: str
    address: str
    run_dir: str
    command_timeout: int

    @classmethod
    def of(cls, host: Inventoried) -> HostSettings:
        return cls(**HostSettings.common(host))

    @staticmethod
    def common(host: Inventoried) -> dict[str, Any]:
        """The fields of every host, for the kinds of host to build on."""
        data = host.data
        return {"name": host.name, "address": data.get("ssh_hostname") or host.name,
                "run_dir": data.get("run_dir"),
                "command_timeout": data.get(COMMAND_TIMEOUT)
                or site_default(Ssh, "command_timeout_seconds")}

    def bound(self, wait: float) -> int:
        """
        pyinfra's ``_timeout`` for a step that waits up to ``wait`` seconds (a
        start, a retraining, a request): the wait, and one command's bound more
        for the check under way when it ends. pyinfra bounds a step's commands
        and its Python callbacks, a wait among them, by one ``_timeout`` each:
        the run's own would cut a legitimate wait that is longer.
        """
        return math.ceil(wait) + self.command_timeout


@dataclass(frozen=True)
class WorkstationSettings(HostSettings):
    """
    A workstation's settings: its pair and place in the pair's TP group
    (``tp_group_data``) and the site's sections. ``link_address``,
    ``peer_link_address`` and ``rank0_link_address`` are this host's, its peer's
    and rank 0's addresses on the Thunderbolt link.
    """

    pair: str
    rank: int
    tp_size: int
    link_address: str
    peer_link_address: str
    rank0_link_address: str
    # Where SGLang listens (site key workstations.listen_address).
    listen_address: str
    link: Link
    candidate: Candidate
    serving: Serving
    ledger: Ledger

    @classmethod
    def of(cls, host: Inventoried) -> WorkstationSettings:
        data = host.data
        return cls(
            **HostSettings.common(host),
            pair=data.get("pair"),
            rank=data.get("rank"),
            tp_size=data.get("tp_size"),
            link_address=data.get("thunderbolt_address"),
            peer_link_address=data.get("peer_thunderbolt_address"),
            rank0_link_address=data.get("rank0_thunderbolt_address"),
            listen_address=data.get("serving_listen_address"),
            **{prefix: section(model, data, prefix)
               for prefix, model in WORKSTATION_SECTIONS.items()},
        )

    @property
    def server_url(self) -> str:
        """This workstation's SGLang server, as the router, the probes and clients reach it."""
        return http_url(self.address, self.serving.port)

    @property
    def candidate_module(self) -> CandidateModule:
        return CandidateModule(self.candidate.path, self.candidate.sha256,
                               self.candidate.module_name)

    @property
    def expected_link(self) -> ExpectedLink:
        """The link as the link layer expects it of this workstation, from its settings."""
        return derived(ExpectedLink, self, self.link)

    @property
    def candidate_build_id(self) -> str | None:
        """
        The candidate's GNU build ID, or None when its file is missing or no ELF
        module: a report still reads the host, and the driver layer says why.
        """
        try:
            return self.candidate_module.build_id
        except (OSError, NotAModule):
            return None


@dataclass(frozen=True)
class GatewaySettings(HostSettings):
    """The gateway's settings: the site's ``[gateway_roles]``."""

    roles: GatewayRoles

    @classmethod
    def of(cls, host: Inventoried) -> GatewaySettings:
        return cls(**HostSettings.common(host),
                   roles=section(GatewayRoles, host.data, "gateway_roles"))

    @property
    def router_url(self) -> str:
        """sglang-router, which fronts the replicas in production."""
        return http_url(self.address, self.roles.router_port)

    @property
    def proxy_url(self) -> str:
        """The LiteLLM proxy: the public roles small and large."""
        return http_url(self.address, self.roles.litellm_port)
