"""
Runs on a site of two pairs: which replicas the router fronts, and when the
user's small needs the fallback, for every state of each pair (issue 49).
"""

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

import experiment
from harness.hosts import topology
from operations.part import Part
from operations.run import Run
from operations.safety import lock
from operations.serving import router
from operations.serving.sglang import Sglang
from operations.site.hosts import InventoryEntry
from operations.site.model import load_site
from operations.site.settings import GatewaySettings
from operations.states import resolve_state
from operations.step import Attempt

TWO_PAIRS_SITE = (Path(__file__).parent / "two_pairs_site.toml").read_text()


@dataclass(frozen=True)
class Gateway(InventoryEntry):
    """
    The gateway, whose router fronts ``workers`` (none: it is stopped), and
    whose lock is held by each of ``holders`` in turn, one per reading, then by none.
    """

    workers: tuple[str, ...] = field(default=(), hash=False)
    holders: list[Any] = field(default_factory=list, hash=False)
    commands: list[str] = field(default_factory=list, hash=False)
    # The router lists its workers when asked with its key; False: it does not answer.
    answers: bool = field(default=True, hash=False)
    print_prefix = "gw0: "

    def get_fact(self, fact: type, **arguments: Any) -> Any:
        if fact is lock.HostLock:
            return self.holders.pop(0) if self.holders else None
        if fact is router.RouterWorkers:
            settings = GatewaySettings.of(self)
            assert arguments == {"url": settings.router_url,
                                 "key_file": settings.roles.router_key_file}
            return [{"id": "bfb7778b", "url": url, "is_healthy": True, "load": 0}
                    for url in self.workers] if self.answers else None
        assert fact is router.ServiceProcess and arguments["service"] == router.ROUTER
        # sglang-router renames its process: its command line names no worker.
        return {"running": bool(self.workers), "pid": 4242, "argv": ["sglang::router"]}

    def run_shell_command(self, command: Any, **arguments: Any) -> tuple[bool, None]:
        self.commands.append(str(command))
        return True, None


class Inventory:
    def __init__(self, *hosts: InventoryEntry) -> None:
        self.hosts = hosts

    def get_group(self, group: str) -> list[InventoryEntry]:
        return [host for host in self.hosts if group in host.groups]


def a_run(dry: bool = False) -> Run:
    return Run(owner=lock.this_run("tp2_e2e"), attempt=Attempt(dry=dry))


@pytest.fixture
def site(write_site):
    return load_site(write_site(TWO_PAIRS_SITE))


@pytest.fixture
def workstations(site) -> dict[str, InventoryEntry]:
    return {name: InventoryEntry(name, ("workstations", f"pair_{data['pair']}"), data)
            for name, data in site.workstation_hosts()}


def url(workstation: InventoryEntry) -> str:
    return Sglang.from_host(workstation).url


def gateway(site, *workers: str) -> Gateway:
    ((name, data),) = site.gateway_hosts()
    return Gateway(name, ("gateway", "pair_a", "pair_b"), data, workers)


# (the run's pairs, its state's replicas serve, what the router fronts now) -> its workers.
PAIR_A, PAIR_B = ("wsa", "wsb"), ("wsc", "wsd")


@pytest.mark.parametrize(("in_run", "serves", "fronted", "expected"), [
    # Every pair moves: the run's state alone decides, as on a site of one pair.
    pytest.param(PAIR_A + PAIR_B, True, (), PAIR_A + PAIR_B, id="all to production"),
    pytest.param(PAIR_A + PAIR_B, False, PAIR_A + PAIR_B, (), id="all to a TP state"),
    # Pair b leaves production while pair a serves: the router keeps pair a alone.
    pytest.param(PAIR_B, False, PAIR_A + PAIR_B, PAIR_A, id="b to a TP state, a serving"),
    # Pair b comes back beside pair a, in inventory order.
    pytest.param(PAIR_B, True, PAIR_A, PAIR_A + PAIR_B, id="b to production, a serving"),
    # Pair a is in a TP state itself (the router does not front it): nobody stays.
    pytest.param(PAIR_B, False, PAIR_B, (), id="b to a TP state, a in one too"),
    pytest.param(PAIR_B, True, (), PAIR_B, id="b to production, a in a TP state"),
    # A replica the router fronts that the run moves follows the run's state.
    pytest.param(PAIR_A, True, PAIR_A, PAIR_A, id="a to production again, b in a TP state"),
])
def test_the_router_fronts_the_runs_replicas_in_production_and_the_pairs_that_serve_outside_it(
        workstations, in_run, serves, fronted, expected) -> None:
    hosts = list(workstations.values())
    assert router.router_workers(
        hosts, [workstations[name] for name in in_run], serves,
        [url(workstations[name]) for name in fronted],
    ) == tuple(url(workstations[name]) for name in expected)


def test_the_workers_fronted_now_are_what_the_running_router_lists(site) -> None:
    workers = ("http://10.0.0.11:30000", "http://10.0.0.12:30000")
    serving = gateway(site, *workers)
    settings = GatewaySettings.of(serving)
    assert router.fronted_workers(serving, settings) == list(workers)
    assert router.fronted_workers(gateway(site), settings) == []
    # Running, yet not saying: the run cannot know which pairs serve, and changes nothing.
    silent = replace(serving, answers=False)
    with pytest.raises(router.FrontedUnknown, match=r"gw0: the router runs \(pid 4242\) but "
                                                    r"its worker list cannot be read at "
                                                    r"http://.*/workers with the key in /"):
        router.fronted_workers(silent, settings)


@pytest.mark.parametrize(("state", "in_run", "fronted", "workers", "fallback"), [
    # The one pair's case, on a site of two: every pair leaves, small falls back.
    ("tp2_e2e", PAIR_A + PAIR_B, PAIR_A + PAIR_B, (), True),
    # Pair a keeps serving small: no fallback, the router stays with pair a.
    ("tp2_e2e", PAIR_B, PAIR_A + PAIR_B, PAIR_A, False),
    # No pair is left serving: the fallback, and the router stops.
    ("tp2_e2e", PAIR_B, PAIR_B, (), True),
    ("production", PAIR_B, PAIR_A, PAIR_A + PAIR_B, False),
])
def test_the_gateways_part_falls_back_only_when_no_pair_is_left_serving_small(
        site, workstations, state, in_run, fronted, workers, fallback) -> None:
    the_gateway = gateway(site, *(url(workstations[name]) for name in fronted))
    inventory = Inventory(*workstations.values(), the_gateway)
    run = [*(workstations[name] for name in in_run), the_gateway]
    part = Part.of(the_gateway, inventory, run, resolve_state(state), a_run(dry=True))
    assert part.router.workers == tuple(url(workstations[name]) for name in workers)
    assert (part.router_runs, part.fallback) == (bool(workers), fallback)


def test_the_harness_looks_at_one_pair_at_a_time(site, workstations, monkeypatch,
                                                 tmp_path) -> None:
    the_gateway = gateway(site)
    entries = [*workstations.values(), InventoryEntry(the_gateway.name, the_gateway.groups,
                                                      the_gateway.data)]
    monkeypatch.setattr(topology, "inventory_entries", lambda: entries)
    pair_a, pair_b = topology.Topology.load_pairs(tmp_path)
    assert [entry.name for entry in pair_a.workstations] == ["wsa", "wsb"]
    assert [entry.name for entry in pair_b.workstations] == ["wsc", "wsd"]
    assert pair_b.gateway.name == "gw0" and pair_b.named == "pair b"
    # Each pair is moved and checked alone, the gateway with it.
    assert (pair_b.deploy_options, pair_b.verify_options) == (["--limit", "pair_b"],
                                                              ["--pair", "b"])
    assert topology.Topology.load(tmp_path, "b") == pair_b
    with pytest.raises(ValueError, match="several pairs: name one with --pair"):
        topology.Topology.load(tmp_path)
    with pytest.raises(ValueError, match="no pair c in the inventory; its pairs are a, b"):
        topology.Topology.load_pairs(tmp_path, ["a", "c"])


def test_a_site_of_one_pair_is_looked_at_as_before(write_site, monkeypatch, tmp_path) -> None:
    one = load_site(write_site())
    entries = [InventoryEntry(name, ("workstations", "pair_a"), data)
               for name, data in one.workstation_hosts()]
    monkeypatch.setattr(topology, "inventory_entries", lambda: entries)
    only = topology.Topology.load(tmp_path)
    assert [entry.name for entry in only.workstations] == ["ws0", "ws1"]
    assert (only.pair, only.deploy_options, only.verify_options, only.named) == (None, [], [], "")


def test_a_run_leaving_pairs_out_waits_for_the_gateway_then_holds_it_from_its_plan(
        site, monkeypatch) -> None:
    """Two runs on different pairs: the second plans once the first has ended, never beside it."""
    said: list[str] = []
    monkeypatch.setattr(lock.logger, "info", said.append)
    monkeypatch.setattr(lock, "planning_arguments", lambda host: {"_sudo": True})
    monkeypatch.setattr(lock, "GATEWAY_POLL_SECONDS", 0)
    other = lock.this_run("tp2_e2e")
    the_gateway = replace(gateway(site), holders=[other, other])
    run = a_run()
    lock.gateway_taken(the_gateway, "/run/twinbolt", run, dry=False, timeout=60)
    # Asked three times: held, held, free; then taken once, by a compare-and-swap.
    assert the_gateway.holders == []
    (command,) = the_gateway.commands
    assert run.owner.line() in command
    assert run.locks.taken == [(the_gateway, "/run/twinbolt", {"_sudo": True})]
    # Said once, not at every reading.
    assert [line.split(";")[0] for line in said] == [
        f"gw0: waiting for the gateway: another run holds /run/twinbolt/lock: {other.describe()}, "
        f"for {other.age()}"]


def test_a_rollback_holds_the_gateway_already_and_a_dry_run_takes_nothing(site) -> None:
    run = a_run()
    held = replace(gateway(site), holders=[run.owner])
    lock.gateway_taken(held, "/run/twinbolt", run, dry=False, timeout=60)
    free = gateway(site)
    lock.gateway_taken(free, "/run/twinbolt", a_run(dry=True), dry=True, timeout=60)
    assert held.commands == free.commands == []


def test_a_gateway_held_past_the_bound_refuses_the_run_having_taken_nothing(
        site, monkeypatch) -> None:
    monkeypatch.setattr(lock, "GATEWAY_POLL_SECONDS", 0)
    other = lock.this_run("tp2_stock")
    busy = replace(gateway(site), holders=[other] * 1000)
    run = a_run()
    with pytest.raises(lock.GatewayBusy, match=r"^refused: another run holds "
                                               r"/run/twinbolt/lock: .*Nothing was taken"):
        lock.gateway_taken(busy, "/run/twinbolt", run, dry=False, timeout=0)
    assert busy.commands == [] and run.locks.taken == []


def test_a_run_that_cannot_read_the_routers_workers_releases_the_gateway_it_took(
        site, workstations, monkeypatch) -> None:
    monkeypatch.setattr(lock, "planning_arguments", lambda host: {})
    the_gateway = replace(gateway(site, url(workstations["wsa"])), answers=False)
    inventory = Inventory(*workstations.values(), the_gateway)
    run = a_run()
    with pytest.raises(router.FrontedUnknown):
        Part.of(the_gateway, inventory, [workstations["wsc"], workstations["wsd"], the_gateway],
                resolve_state("tp2_e2e"), run)
    taken, released = the_gateway.commands
    assert run.owner.line() in taken and "remove" in released
    assert run.locks.taken == []


def test_a_campaign_on_two_pairs_runs_each_in_turn_into_one_report(
        site, workstations, monkeypatch, tmp_path, capsys) -> None:
    ran: list[tuple[str | None, Path]] = []

    class Campaign:
        def __init__(self, topology, plan, windows, settings, directory, **options) -> None:
            self.topology, self.directory = topology, directory

        async def run(self) -> dict[str, Any]:
            ran.append((self.topology.pair, self.directory))
            self.directory.mkdir(parents=True)
            (self.directory / "campaign.md").write_text(f"the plan on {self.topology.pair}\n")
            return {"chart": None, "failed_step": None, "restored": True}

    monkeypatch.setattr(experiment.campaign, "Campaign", Campaign)
    pairs = [topology.Topology((workstations["wsa"], workstations["wsb"]), None, tmp_path, "a"),
             topology.Topology((workstations["wsc"], workstations["wsd"]), None, tmp_path, "b")]
    arguments = experiment.parser().parse_args(["campaign", "--pairs", "a,b",
                                                "--out", str(tmp_path)])
    arguments.plan = []
    assert asyncio.run(experiment.run_campaigns(arguments, pairs)) == 0
    assert [(pair, directory.name) for pair, directory in ran] == [("a", "pair-a"),
                                                                   ("b", "pair-b")]
    report = (ran[0][1].parent / "campaign.md").read_text()
    assert report.startswith("# Campaign on pairs a, b\n")
    assert report.index("## pair a\n\nthe plan on a") < report.index("## pair b\n\nthe plan on b")
    assert "one report for every pair" in capsys.readouterr().out
