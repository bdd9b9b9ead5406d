"""
A site given as its hosts' inventory data: what ``python -m lab up`` writes
(``<lab state>/inventory.json``), so that ``inventory.py`` reads the embedded lab
as it reads a site file, without importing the lab.

A listing holds what the inventory defines: the ``workstations`` (pair by pair,
rank 0 first in each) and the ``gateway``, each host with its data, each pair's
group, and the ``extra`` group (the lab's ``lab``) that the inventory defines
last, so that its ``group_data/`` wins over the defaults. Only the connection's
bounds are not in it, being objects (a socket, a transport factory): the
inventory adds them to every listed host, as a site file's hosts get them
(:meth:`Listing.hosts`). It is a file like any other the inventory reads:
validated here, every problem reported at once, before any host is touched.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from operations.plumbing.connect import connection_data
from operations.site.model import PAIR_GROUP_PREFIX, Port, SiteError, problem_message
from operations.site.syntax import HostName

# Where the embedded lab keeps its state (lab/topology.py reads the same variable),
# and the listing it writes there.
LAB_STATE_ENV = "TWINBOLT_LAB_STATE"
LISTING_NAME = "inventory.json"

# A key of pyinfra host data: twinbolt's flat names and pyinfra's own (``_sudo``).
DataKey = Annotated[str, StringConstraints(pattern=r"^_?[a-z][a-z0-9_]*$")]
# What a host's data may hold: JSON's scalars, and lists of strings (pip options).
DataValue = StrictStr | StrictBool | StrictInt | StrictFloat | list[StrictStr] | None
HostData = dict[DataKey, DataValue]


class Listing(BaseModel):
    """The hosts and groups ``inventory.py`` defines, as the listing file gives them."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workstations: Annotated[list[tuple[HostName, HostData]], Field(min_length=2)]
    gateway: Annotated[list[tuple[HostName, HostData]], Field(min_length=1, max_length=1)]
    pairs: Annotated[dict[str, list[HostName]], Field(min_length=1)]
    extra: tuple[DataKey, list[HostName]]

    @model_validator(mode="after")
    def _one_inventory(self) -> Listing:
        workstations = [name for name, _ in self.workstations]
        (gateway, _), = self.gateway
        every = [*workstations, gateway]
        if len(set(every)) != len(every):
            raise ValueError(f"host names must be distinct, got {', '.join(every)}")
        # Each pair's group: its two workstations, in the inventory's order, then the gateway.
        grouped = []
        for group, members in self.pairs.items():
            if not group.startswith(PAIR_GROUP_PREFIX) or len(members) != 3 \
                    or members[-1] != gateway:
                raise ValueError(f"pair group {group!r} must be {PAIR_GROUP_PREFIX}<name>: its "
                                 f"two workstations, then the gateway {gateway}")
            grouped += members[:-1]
        if grouped != workstations:
            raise ValueError(f"the pairs' groups hold {', '.join(grouped)}, but the "
                             f"workstations are {', '.join(workstations)}: each once, in order")
        for host, data in [*self.workstations, *self.gateway]:
            try:
                _HOST_NAME.validate_python(data.get("ssh_hostname"))
                _PORT.validate_python(data.get("ssh_port"))
            except ValidationError:
                raise ValueError(f"{host}: its data must give ssh_hostname (a host name or "
                                 "address) and ssh_port (a port)") from None
        name, members = self.extra
        if name in ("workstations", "gateway", *self.pairs) or members != every:
            raise ValueError(f"the extra group {name!r} must be a new group of every host, "
                             f"in order ({', '.join(every)})")
        return self

    def hosts(self, group: str) -> list[tuple[str, dict[str, Any]]]:
        """``workstations`` or ``gateway``: each host with its data and its connection's bounds."""
        return [(name, {**data, **connection_data(str(data["ssh_hostname"]),
                                                  int(data["ssh_port"]))})
                for name, data in getattr(self, group)]


_HOST_NAME: TypeAdapter[str] = TypeAdapter(HostName)
_PORT: TypeAdapter[int] = TypeAdapter(Port)


def listing_path(checkout: Path) -> Path:
    """The lab's listing: in its state directory, ``.lab`` in ``checkout`` unless overridden."""
    return Path(os.environ.get(LAB_STATE_ENV, checkout / ".lab")) / LISTING_NAME


def load_listing(path: Path) -> Listing:
    """Read and validate a listing; a :class:`SiteError` names every problem, one per line."""
    try:
        document: Any = json.loads(path.read_text())
    except FileNotFoundError:
        raise SiteError(
            f"no site: neither a site file (TWINBOLT_SITE) nor the embedded lab's {path}; "
            "bring the lab up (`python -m lab up`, which writes it) or name a site file"
        ) from None
    except OSError as error:
        raise SiteError(f"{path} cannot be read: {error.strerror}") from None
    except ValueError as error:
        raise SiteError(f"{path}: not valid JSON: {error}") from None
    try:
        return Listing.model_validate(document)
    except ValidationError as error:
        raise SiteError("\n".join(
            f"{path}: {'.'.join(map(str, problem['loc'])) or 'the listing'}: "
            f"{problem_message(problem)}" for problem in error.errors())) from None


def write_listing(path: Path, listing: Listing) -> None:
    """Write ``listing`` where ``inventory.py`` reads it, whole: a reader never sees half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.tmp")
    partial.write_text(listing.model_dump_json(indent=1) + "\n")
    partial.rename(path)
