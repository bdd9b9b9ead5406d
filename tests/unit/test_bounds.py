"""
Every remote command and every wait is bounded (issue 30): a host whose
connection drops silently fails its step, instead of holding the run until TCP
gives up; the rollback's own run is bounded too.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from operation_harness import a_run, run_operation
from pyinfra.api import Config, Inventory, OperationError, State
from pyinfra.api.connect import connect_all
from pyinfra.api.operation import add_op
from pyinfra.api.operations import run_ops
from pyinfra.context import ctx_host, ctx_state
from pyinfra.facts.server import Command

from harness.hosts.topology import Topology
from harness.measuring.windows import WindowSettings
from harness.runs import campaign
from operations import bounds
from operations import run as runs
from operations import step as steps
from operations.safety import rollback
from operations.site import hosts
from operations.site.hosts import InventoryEntry
from operations.site.model import COMMAND_TIMEOUT, command_timeout_data, load_site
from operations.site.settings import HostSettings, WorkstationSettings
from operations.step import Layer, operation

MINIMAL_SITE = (Path(__file__).parent / "minimal_site.toml").read_text()


@operation(Layer.SERVING)
def a_serving_step_that_hangs() -> Iterator[str]:
    """A remote command that never answers in time, as over a connection that dropped."""
    yield "sleep 5"


def local_state(data: dict) -> State:
    state = State(Inventory(([("@local", data)], {})), Config())
    connect_all(state)
    return state


def test_a_command_past_its_bound_fails_its_step_under_its_layer() -> None:
    # The bound as a site gives it: pyinfra's _timeout in host data, no argument at the call.
    state = local_state(command_timeout_data(1))
    run = runs.begin(state, "tp2_e2e", None)
    add_op(state, a_serving_step_that_hangs, name="Serving: a step that hangs",
           _ignore_errors=True)
    run_ops(state)
    assert run.attempt.layers == [Layer.SERVING]
    assert run.attempt.messages() == ["@local: Serving: a step that hangs: a command failed"]


def test_a_fact_read_past_its_bound_gives_its_default() -> None:
    # pyinfra bounds a fact's command by the same _timeout; what it then returns is
    # the fact's default (None), and the failure is pyinfra's to report.
    state = local_state(command_timeout_data(1))
    host = state.inventory.get_host("@local")
    with ctx_state.use(state), ctx_host.use(host):
        assert host.get_fact(Command, command="sleep 5", _ignore_errors=True) is None


def test_the_site_bounds_every_host_and_the_settings_read_the_same_value(write_site) -> None:
    site = load_site(write_site())
    hosts = [*site.workstation_hosts(), *site.gateway_hosts()]
    assert {data[COMMAND_TIMEOUT] for _, data in hosts} == {300}
    # One key, pyinfra's own: not also a flat ssh_ key that could disagree with it.
    assert not any("ssh_command_timeout_seconds" in data for _, data in hosts)
    (name, data), _ = site.workstation_hosts()
    assert WorkstationSettings.of(InventoryEntry(name, ("workstations",), data)
                                  ).command_timeout == 300


def test_a_sites_own_bound_reaches_pyinfra(write_site) -> None:
    site = load_site(write_site(MINIMAL_SITE + "\n[ssh]\ncommand_timeout_seconds = 45\n"))
    assert {data[COMMAND_TIMEOUT] for _, data in site.gateway_hosts()} == {45}


def test_a_wait_is_bounded_by_itself_and_one_command_more() -> None:
    # --data _timeout=60 overrides pyinfra's bound and twinbolt's derived ones alike.
    settings = HostSettings.of(InventoryEntry("ws", (), {COMMAND_TIMEOUT: 60}))
    assert settings.bound(900) == 960
    assert settings.bound(29.5) == 90
    # Data with no bound (an old inventory's) takes the site model's default.
    assert HostSettings.of(InventoryEntry("ws", (), {})).command_timeout == 300


def test_the_rollbacks_bound_holds_every_wait_of_production_in_full() -> None:
    waits = (900, 900, 30, 120.0)
    assert rollback.rollback_timeout(300, waits) == (
        sum(waits) + rollback.ROLLBACK_SLACK_COMMANDS * 300)


@pytest.fixture
def failed_attempt() -> steps.Attempt:
    run = a_run()
    run.attempt.record("wsb", "op1", "wsb: link layer: no carrier")
    return run.attempt


def test_a_rollback_past_its_bound_is_stopped_and_named(failed_attempt, monkeypatch) -> None:
    logged: list[str] = []
    fake_host = SimpleNamespace(name="wsa", executing_op_hash="rollback", connector=None,
                                log_styled=lambda message, **_: logged.append(message))
    pyinfra_state = SimpleNamespace(**{steps.RUN_ATTRIBUTE: SimpleNamespace(
        attempt=failed_attempt)})
    # A fake rollback: a process that outlives its bound.
    never_ends = [sys.executable, "-c", "import time; time.sleep(30)"]
    assert rollback.run_rollback(pyinfra_state, fake_host, never_ends, [], timeout=0.5) is False
    assert failed_attempt.rollback_expired == 0.5
    assert failed_attempt.messages()[-1] == (
        f"wsa: rollback layer: the rollback to production ({' '.join(never_ends)}) did not end "
        "within its bound of 0.5s and was stopped; check that every host answers over SSH; "
        "the hosts are as after an interrupted run")
    # The run still ends non-zero, saying the rollback failed and why.
    with pytest.raises(OperationError,
                       match=r"the rollback to production failed too \(stopped after 0.5s\): "
                             "the hosts need an operator"):
        run_operation(rollback.concluded, lambda cls, kwargs: None, attempt=failed_attempt,
                      on_failure="rollback", speakers=("wsa",))


def test_the_rollback_step_gives_its_run_the_bound(failed_attempt, monkeypatch) -> None:
    failed_attempt.rollback_command = ["pyinfra", "-y", "inventory.py", "deploy.py"]
    run = a_run()
    run.attempt = failed_attempt
    given: list[tuple] = []
    real = steps.FunctionCommand
    monkeypatch.setattr(rollback, "FunctionCommand",
                        lambda function, args, kwargs: given.append(args) or real(function, args,
                                                                                  kwargs))
    assert run_operation(rollback.rolled_back, lambda cls, kwargs: None, run=run,
                         on_failure="rollback", speakers=("wsa",), timeout=2400) == [
        "call run_rollback"]
    [(_, _, timeout)] = given
    assert timeout == 2400


def test_the_lab_is_bounded_by_default_and_a_runs_data_overrides_it(run_pyinfra) -> None:
    def bounds(*arguments: str) -> dict[str, int]:
        result = run_pyinfra("inventory.py", "debug-inventory", "--json", *arguments)
        assert result.returncode == 0, result.stderr
        return {host["name"]: HostSettings.of(InventoryEntry(host["name"], (), host["data"])
                                              ).command_timeout
                for host in json.loads(result.stdout)}

    assert bounds() == {"wsa": 300, "wsb": 300, "gw": 300}
    assert set(bounds("--data", "_timeout=60").values()) == {60}


# A process that outlives any small bound, and starts one that would outlive it
# too (as a deploy starts its rollback); it prints its own pid, then the child's
# pid and process group.
OUTLIVES_ITS_BOUND = [sys.executable, "-c", (
    "import os, subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
    "print(os.getpid(), child.pid, os.getpgid(child.pid), flush=True)\n"
    "time.sleep(30)\n")]


def gone(pid: int) -> bool:
    """No such process, or only its zombie, waiting for whoever adopted it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "Z"
    except FileNotFoundError:
        return True


def default_site_rank0() -> WorkstationSettings:
    """Rank 0 of the default site: no key of its own, every bound the site model's default."""
    return WorkstationSettings.of(InventoryEntry("wsa", ("workstations",), {}))


def test_the_rollback_and_a_deploy_are_bounded_by_production_waits_of_the_site() -> None:
    pair = default_site_rank0()
    # The default site: both serving starts (900 s), the link (30 s), the proxy (120 s),
    # four commands of 300 s.
    assert bounds.production_waits(pair) == (900, 900, 30, 120.0)
    assert bounds.rollback_timeout(pair) == rollback.rollback_timeout(300, (900, 900, 30, 120))
    assert bounds.rollback_timeout(pair) == 3150
    # A deploy: its attempt, then its rollback step, as deploy.py bounds it.
    assert bounds.deploy_timeout(pair) == 3150 + pair.bound(3150) == 6600
    shorter = WorkstationSettings.of(InventoryEntry("wsa", ("workstations",),
                                                    {COMMAND_TIMEOUT: 60}))
    assert bounds.deploy_timeout(shorter) == 2 * (1950 + 4 * 60) + 60


def test_the_campaign_deploys_within_the_sites_bound(monkeypatch) -> None:
    rank0 = InventoryEntry("wsa", ("workstations",), {})
    topology = Topology((rank0,), None, Path("ssh_config"))
    assert topology.deploy_timeout == bounds.deploy_timeout(WorkstationSettings.of(rank0))
    given: list[tuple[str, list[str], float | None]] = []

    async def ran(label: str, argv: list[str], timeout: float | None = None):
        given.append((label, argv[2:], timeout))
        return 0, []

    monkeypatch.setattr(campaign, "run_command", ran)
    deploying = campaign.Campaign(topology, [], [], WindowSettings(), Path("unused"))
    asyncio.run(deploying.deploy("tp2_e2e"))
    assert given == [("deploy tp2_e2e",
                      ["inventory.py", "deploy.py", "--data", "state=tp2_e2e"], 6600)]
    # One pair of several: that pair's group and the gateway alone.
    given.clear()
    pair_b = campaign.Campaign(replace(topology, pair="b"), [], [], WindowSettings(),
                               Path("unused"))
    asyncio.run(pair_b.deploy("tp2_e2e"))
    assert given[0][1][:2] == ["--limit", "pair_b"]


def test_the_campaign_verifies_within_four_commands_bounds(monkeypatch) -> None:
    rank0 = InventoryEntry("wsa", ("workstations",), {COMMAND_TIMEOUT: 60})
    topology = Topology((rank0,), None, Path("ssh_config"))
    assert topology.verify_timeout == bounds.verify_timeout(WorkstationSettings.of(rank0)) == 240
    assert bounds.verify_timeout(default_site_rank0()) == 1200
    given: list[tuple[str, list[str], float | None]] = []

    async def ran(label: str, argv: list[str], timeout: float | None = None):
        given.append((label, argv[3:6], timeout))
        return 0, ["3 passed"]

    monkeypatch.setattr(campaign, "run_command", ran)
    proof = campaign.Campaign(topology, [], [], WindowSettings(), Path("unused"))
    assert asyncio.run(proof.verify("tp2_e2e")) == "3 passed"
    assert given == [("verify tp2_e2e", ["tests/verify", "--state", "tp2_e2e"], 240)]


def test_a_command_past_its_bound_is_killed_with_what_it_started_and_named() -> None:
    started = time.monotonic()
    with pytest.raises(campaign.StepFailed) as failed:
        asyncio.run(campaign.run_command("deploy tp2_e2e", OUTLIVES_ITS_BOUND, timeout=1))
    assert time.monotonic() - started < 10
    message = str(failed.value)
    assert message.startswith(
        f"`{' '.join(OUTLIVES_ITS_BOUND)}` did not end within its bound of 1s and was stopped; "
        "check that every host answers over SSH (a host lost mid-run); its last lines say "
        "where it was:\n")
    leader, child, group = map(int, message.splitlines()[-1].split())
    # The command and what it started are one group of their own, which was stopped.
    assert group == leader != os.getpgid(0)
    deadline = time.monotonic() + 5
    while not gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert gone(child)


class Rehearsed(campaign.Campaign):
    """A campaign whose deploys are the real ones (a fake pyinfra), the rest stood in for."""

    async def preflight(self) -> str:
        return "hosts observed in production"

    async def verify(self, state: str) -> str:
        return "passed"

    async def measure(self, state: str, trial: int) -> str:
        return "measured"


def test_a_deploy_past_its_bound_fails_its_step_and_production_is_still_restored(
        tmp_path: Path, monkeypatch) -> None:
    # pyinfra, as deploy() finds it beside the interpreter: production converges at
    # once, any other state hangs, as a deploy to a host lost mid-run does.
    fake = tmp_path / "pyinfra"
    fake.write_text('#!/bin/sh\ncase "$*" in *state=production*) echo converged;; '
                    '*) exec sleep 30;; esac\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    topology = SimpleNamespace(deploy_timeout=1, deploy_options=[])
    rehearsal = Rehearsed(topology, campaign.check_plan(["tp2_stock_nospec"]), [],
                          WindowSettings(), tmp_path / "report", linktest_seconds=None)
    result = asyncio.run(rehearsal.run())
    assert result["failed_step"] == "deploy tp2_stock_nospec (changes serving)"
    assert result["failure"].startswith(
        f"`{fake} -y inventory.py deploy.py --data state=tp2_stock_nospec` did not end within "
        "its bound of 1s and was stopped; check that every host answers over SSH")
    assert [step["name"] for step in result["steps"]][-2:] == ["restore production",
                                                               "verify production"]
    assert result["restored"] is True
    # experiment.py's exit code follows the failed step.
    assert campaign.outcome(result) == (
        "failed at step 'deploy tp2_stock_nospec (changes serving)'; "
        "production restored and verified")


def test_the_inventory_is_listed_within_one_commands_bound() -> None:
    assert hosts.LISTING_TIMEOUT == HostSettings.of(InventoryEntry("ws", (), {})
                                                    ).command_timeout == 300
    assert inspect.signature(hosts.inventory_entries).parameters["timeout"].default == 300


def test_an_inventory_that_never_loads_is_stopped_and_named(tmp_path: Path) -> None:
    # The real pyinfra, on an inventory that never finishes loading.
    (tmp_path / "inventory.py").write_text("import time\ntime.sleep(30)\n")
    started = time.monotonic()
    with pytest.raises(TimeoutError, match=(
            r"^listing the inventory \(pyinfra inventory.py debug-inventory --json\) did not "
            r"end within its bound of 1s and was stopped; check what inventory.py reads: ")):
        hosts.inventory_entries(tmp_path, timeout=1)
    assert time.monotonic() - started < 10
