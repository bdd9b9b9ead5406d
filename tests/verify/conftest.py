"""
testinfra checks of the live hosts of the inventory, for one declared state:

    pytest tests/verify --state tp2_e2e
    pytest tests/verify --state tp2_e2e --pair b

Every pair is checked in that state, or the one ``--pair`` names, which a run
limited to it moved (``--limit pair_b``); the gateway then routes as the state
of that pair and the replicas the router fronts outside it imply.

The hosts come from ``inventory.py`` (the embedded lab, or the site named by
``TWINBOLT_SITE``), never from a list typed by hand. testinfra reaches them
with the system ``ssh`` and a config written from the inventory's own SSH data,
so host keys are checked exactly as strictly as pyinfra checks them; on a host
reached as a user with sudo, every check runs under sudo, as root, as pyinfra
ran what it checks.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import testinfra
from verify_helpers import read

from operations.serving import reading as serving_reading
from operations.serving.sglang import ROUTER
from operations.site.hosts import InventoryEntry, in_group, inventory_entries, ssh_config
from operations.site.model import PAIR_GROUP_PREFIX, pair_group
from operations.site.settings import GatewaySettings, WorkstationSettings
from operations.states import STATES, resolve_state
from operations.states import State as DeclaredState

# How long an idle control master outlives the last check (the session also
# closes it explicitly when it ends).
MASTER_SECONDS = 60


@dataclass(frozen=True)
class InventoryHost:
    """
    One host of the inventory: its name, its pyinfra data, its settings (built
    once, as ``deploy.py`` builds them once per host) and a testinfra handle.
    """

    name: str
    data: dict[str, Any]
    settings: WorkstationSettings | GatewaySettings
    host: testinfra.host.Host


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--state", choices=list(STATES),
                     help="the declared state the live hosts must be in")
    parser.addoption("--pair", help="the one pair in that state (its group is pair_NAME); "
                                    "every pair by default")


@functools.cache
def the_inventory() -> tuple[InventoryEntry, ...]:
    """The inventory, asked of pyinfra once per session (it costs a second to ask)."""
    return tuple(inventory_entries())


def checked_pairs(config: pytest.Config) -> list[str]:
    """The pair groups in the declared state: the one ``--pair`` names, else every pair."""
    entries = list(the_inventory())
    groups = list(dict.fromkeys(group for entry in in_group(entries, "workstations")
                                for group in entry.groups if group.startswith(PAIR_GROUP_PREFIX)))
    if (name := config.getoption("--pair")) is None:
        return groups
    if pair_group(name) not in groups:
        names = ", ".join(group.removeprefix(PAIR_GROUP_PREFIX) for group in groups)
        raise pytest.UsageError(f"--pair {name}: no such pair; the inventory's pairs are {names}")
    return [pair_group(name)]


def pytest_configure(config: pytest.Config) -> None:
    # A pair that does not exist is a usage error, said once, before any check.
    if config.getoption("--pair") is not None:
        checked_pairs(config)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    pairs = checked_pairs(metafunc.config)
    if "workstation" in metafunc.fixturenames:
        names = [entry.name for entry in in_group(list(the_inventory()), "workstations")
                 if set(entry.groups) & set(pairs)]
        metafunc.parametrize("workstation", names, indirect=True, scope="module")
    elif "workstations" in metafunc.fixturenames and len(pairs) > 1:
        metafunc.parametrize("pair", pairs, indirect=True, scope="module")


@pytest.fixture(scope="session")
def state(request: pytest.FixtureRequest) -> DeclaredState:
    name = request.config.getoption("--state")
    if name is None:
        raise pytest.UsageError(f"--state is required; the states are: {', '.join(STATES)}")
    return resolve_state(name)


@pytest.fixture(scope="session")
def inventory() -> list[InventoryEntry]:
    return list(the_inventory())


@pytest.fixture(scope="session")
def ssh_config_file(inventory: list[InventoryEntry],
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("ssh") / "config"
    path.write_text(ssh_config(inventory))
    yield path
    # The control masters are this session's own processes: stop each by its socket.
    for entry in inventory:
        master = path.with_name(f"{entry.name}.sock")
        if master.exists():
            subprocess.run(["ssh", "-F", str(path), "-o", f"ControlPath={master}", "-O", "exit",
                            "--", entry.name], capture_output=True, timeout=30)


def inventory_host(entry: InventoryEntry, ssh_config_file: Path) -> InventoryHost:
    """
    A handle whose commands share one SSH connection per host (a control master
    beside the SSH config), rather than a new connection for every check; the
    session closes the masters when it ends (:func:`ssh_config_file`). Under
    sudo where the inventory says so: a module, a unit or a root-only file reads
    the same to every check as it did to pyinfra.
    """
    master = ssh_config_file.with_name(f"{entry.name}.sock")
    handle = testinfra.get_host(f"ssh://{entry.name}?controlpersist={MASTER_SECONDS}",
                                ssh_config=str(ssh_config_file), controlpath=str(master),
                                sudo=entry.sudo)
    settings = (WorkstationSettings.of(entry) if "workstations" in entry.groups
                else GatewaySettings.of(entry))
    return InventoryHost(entry.name, entry.data, settings, handle)


@pytest.fixture(scope="module")
def workstation(request: pytest.FixtureRequest, inventory: list[InventoryEntry],
                ssh_config_file: Path) -> InventoryHost:
    entry = next(entry for entry in inventory if entry.name == request.param)
    return inventory_host(entry, ssh_config_file)


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest) -> str:
    """The pair group a check of both workstations looks at (one per pair checked)."""
    return getattr(request, "param", None) or checked_pairs(request.config)[0]


@pytest.fixture(scope="module")
def workstations(pair: str, inventory: list[InventoryEntry],
                 ssh_config_file: Path) -> list[InventoryHost]:
    """The pair's two workstations, rank 0 first."""
    return [inventory_host(entry, ssh_config_file)
            for entry in in_group(inventory, "workstations") if pair in entry.groups]


@pytest.fixture(scope="session")
def outside(request: pytest.FixtureRequest, inventory: list[InventoryEntry]) -> list[str]:
    """The replicas of the pairs not checked, by URL: the router may front them in any state."""
    pairs = set(checked_pairs(request.config))
    return [WorkstationSettings.of(entry).server_url
            for entry in in_group(inventory, "workstations") if not set(entry.groups) & pairs]


@pytest.fixture(scope="session")
def gateway(inventory: list[InventoryEntry], ssh_config_file: Path) -> InventoryHost:
    return inventory_host(in_group(inventory, "gateway")[0], ssh_config_file)


@pytest.fixture(scope="session")
def fronted(gateway: InventoryHost) -> list[str]:
    """The replicas the router fronts now, as its ``/workers`` lists them; none while stopped."""
    settings = gateway.settings
    router = read(gateway, serving_reading.router(settings))
    if ROUTER not in router["router"]:
        return []
    listed = router["workers"]
    assert listed is not None, (f"{gateway.name}: the router at {settings.router_url} does not "
                                f"list its workers with the key in "
                                f"{settings.roles.router_key_file}")
    return [worker["url"] for worker in listed]


@pytest.fixture(scope="session")
def fallback(state: DeclaredState, fronted: list[str], outside: list[str]) -> bool:
    """
    Whether small is on the temporary fallback to large: in a TP state, while
    the router fronts no replica of a pair outside the ones checked.
    """
    return state.gateway_fallback and not set(fronted) & set(outside)
