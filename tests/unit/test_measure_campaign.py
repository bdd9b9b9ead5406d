"""The campaign's plan and order, its refusals, and its restore, with steps stood in for."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from harness import progress
from harness.measuring import windows
from harness.measuring.windows import WindowSettings
from harness.reporting import linktest_report
from harness.runs import campaign
from harness.runs.campaign import Campaign, CampaignRefused, StepFailed

REPO = Path(__file__).resolve().parents[2]


def test_the_default_plan_changes_one_layer_per_step():
    names = [state.name for state in campaign.check_plan(campaign.PLAN)]
    assert names == ["production", "tp2_stock_nospec", "tp2_stock", "tp2_e2e", "tp2_e2e_nospec"]


def test_a_step_changing_two_layers_is_refused():
    with pytest.raises(CampaignRefused, match="tp2_stock -> tp2_e2e_nospec changes driver and "
                                              "speculative"):
        campaign.check_plan(["tp2_stock_nospec", "tp2_stock", "tp2_e2e_nospec"])
    with pytest.raises(CampaignRefused, match="production -> tp2_stock changes serving and "
                                              "speculative"):
        campaign.check_plan(["tp2_stock"])
    with pytest.raises(CampaignRefused, match="changes nothing"):
        campaign.check_plan(["tp2_stock_nospec", "tp2_stock_nospec"])
    with pytest.raises(CampaignRefused, match="unknown state 'tp3'"):
        campaign.check_plan(["tp3"])


def test_leaving_production_counts_the_fallback_with_the_serving_layer():
    production, nospec = campaign.check_plan(["tp2_stock_nospec"])
    assert campaign.layers_changed(production, nospec) == ["serving"]


def test_the_command_line_refuses_before_reading_the_inventory():
    result = subprocess.run(
        [sys.executable, "experiment.py", "campaign", "--states", "tp2_stock_nospec,tp2_e2e"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"TWINBOLT_SITE": "/nonexistent/site.toml", "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "campaign refused: the step tp2_stock_nospec -> tp2_e2e changes driver and " \
           "speculative" in result.stderr


class Rehearsal(Campaign):
    """A campaign whose steps only record that they ran, failing where told to."""

    def __init__(self, directory: Path, fail: str | None = None, baseline: bool = True,
                 transport: bool = False, trials: int = 1,
                 plan: tuple[str, ...] = campaign.PLAN) -> None:
        super().__init__(None, campaign.check_plan(plan, baseline), ["single"],
                         WindowSettings(), directory, baseline=baseline,
                         linktest_seconds=1 if transport else None, trials=trials)
        self.fail = fail
        self.ran: list[str] = []
        self.trials_ran: list[tuple[int, str]] = []

    async def act(self, name: str) -> str:
        self.ran.append(name)
        if name == self.fail:
            raise StepFailed(f"{name} broke: exit code 1")
        return "done"

    async def preflight(self) -> str:
        return await self.act("preflight")

    async def deploy(self, state: str) -> str:
        return await self.act(f"deploy {state}")

    async def verify(self, state: str) -> str:
        return await self.act(f"verify {state}")

    async def measure(self, state: str, trial: int) -> str:
        self.trials_ran.append((trial, state))
        return await self.act(f"measure {state}")

    async def linktest(self, state: str, seconds: int) -> str:
        return await self.act(f"linktest {state} ({seconds} s)")


def test_the_transport_stage_changes_the_driver_alone_and_returns_to_production():
    states = campaign.check_plan(campaign.TRANSPORT)
    assert [state.name for state in states] == [
        "production", "production_tx_e2e", "production_e2e_off", "production"]
    assert all(campaign.layers_changed(before, after) == ["driver"]
               for before, after in zip(states, states[1:], strict=False))
    assert not any(state.tensor_parallel for state in states)


def test_the_transport_is_tested_before_the_model_states_each_with_a_linktest(tmp_path):
    rehearsal = Rehearsal(tmp_path, transport=True)
    result = asyncio.run(rehearsal.run())
    assert rehearsal.ran[:10] == [
        "preflight", "linktest production (1 s)",
        "deploy production_tx_e2e", "verify production_tx_e2e", "linktest production_tx_e2e (1 s)",
        "deploy production_e2e_off", "verify production_e2e_off",
        "linktest production_e2e_off (1 s)",
        "deploy production", "verify production",
    ]
    assert rehearsal.ran[10:12] == ["measure production", "deploy tp2_stock_nospec"]
    assert rehearsal.ran[-2:] == ["deploy production", "verify production"]
    assert "deploy production_e2e_off (changes driver)" in [step["name"]
                                                             for step in result["steps"]]
    assert result["failed_step"] is None


def test_a_transport_step_that_fails_ends_in_a_verified_production_before_any_model_state(
        tmp_path):
    rehearsal = Rehearsal(tmp_path, fail="linktest production_tx_e2e (1 s)", transport=True)
    result = asyncio.run(rehearsal.run())
    assert rehearsal.ran[-3:] == ["linktest production_tx_e2e (1 s)", "deploy production",
                                  "verify production"]
    assert not any(name.startswith(("measure", "deploy tp2")) for name in rehearsal.ran)
    assert (result["failed_step"], result["restored"]) == ("linktest production_tx_e2e", True)


def test_a_campaign_measures_each_state_then_restores_and_verifies_production(tmp_path):
    rehearsal = Rehearsal(tmp_path)
    result = asyncio.run(rehearsal.run())
    assert rehearsal.ran == [
        "preflight", "measure production",
        "deploy tp2_stock_nospec", "verify tp2_stock_nospec", "measure tp2_stock_nospec",
        "deploy tp2_stock", "verify tp2_stock", "measure tp2_stock",
        "deploy tp2_e2e", "verify tp2_e2e", "measure tp2_e2e",
        "deploy tp2_e2e_nospec", "verify tp2_e2e_nospec", "measure tp2_e2e_nospec",
        "deploy production", "verify production",
    ]
    assert result["failed_step"] is None and result["restored"] is True
    steps = [step["name"] for step in result["steps"]]
    assert "deploy tp2_e2e (changes driver)" in steps
    assert "deploy tp2_stock_nospec (changes serving)" in steps
    assert (tmp_path / "campaign.json").exists()
    assert "completed; production restored and verified" in (tmp_path / "campaign.md").read_text()


def test_a_failure_converges_back_to_production_and_names_the_step(tmp_path):
    rehearsal = Rehearsal(tmp_path, fail="deploy tp2_e2e")
    result = asyncio.run(rehearsal.run())
    assert rehearsal.ran[-3:] == ["deploy tp2_e2e", "deploy production", "verify production"]
    assert "measure tp2_e2e" not in rehearsal.ran
    assert result["failed_step"] == "deploy tp2_e2e (changes driver)"
    assert result["failure"] == "deploy tp2_e2e broke: exit code 1"
    assert result["restored"] is True
    text = (tmp_path / "campaign.md").read_text()
    assert "failed at step 'deploy tp2_e2e (changes driver)'; production restored" in text
    assert "deploy tp2_e2e broke" in text


def test_a_failed_preflight_changes_nothing(tmp_path):
    rehearsal = Rehearsal(tmp_path, fail="preflight")
    result = asyncio.run(rehearsal.run())
    assert rehearsal.ran == ["preflight"]
    assert result["failed_step"] == "preflight" and result["restored"] is None
    assert "nothing was changed" in campaign.outcome(result)


def test_a_restore_that_fails_is_reported_as_such(tmp_path):
    rehearsal = Rehearsal(tmp_path, fail="verify production")
    result = asyncio.run(rehearsal.run())
    assert result["failed_step"] == "verify production" and result["restored"] is False
    assert "PRODUCTION WAS NOT RESTORED" in campaign.outcome(result)


def test_a_failed_command_is_reported_with_its_exit_code_and_last_lines():
    code, tail = asyncio.run(campaign.run_command(
        "fail", [sys.executable, "-c", "print('one'); print('two'); raise SystemExit(3)"]))
    assert code == 3 and tail == ["one", "two"]
    assert campaign.reason(code, tail) == "exit code 3:\none\ntwo"


def test_without_the_baseline_only_the_move_out_of_production_may_change_several_layers():
    production, stock, e2e = campaign.check_plan(["tp2_stock", "tp2_e2e"], baseline=False)
    assert (production.name, stock.name, e2e.name) == ("production", "tp2_stock", "tp2_e2e")
    with pytest.raises(campaign.CampaignRefused, match="changes serving and speculative"):
        campaign.check_plan(["tp2_stock", "tp2_e2e"])
    with pytest.raises(campaign.CampaignRefused, match="tp2_e2e -> tp2_stock_nospec changes"):
        campaign.check_plan(["tp2_e2e", "tp2_stock_nospec"], baseline=False)


def test_without_the_baseline_production_is_not_measured(tmp_path):
    rehearsal = Rehearsal(tmp_path, baseline=False)
    asyncio.run(rehearsal.run())
    assert "measure production" not in rehearsal.ran
    assert rehearsal.ran[:2] == ["preflight", "deploy tp2_stock_nospec"]


def visits(plan: tuple[str, ...], trials: int, baseline: bool = True) -> list[tuple[int, str]]:
    return [(trial, state.name)
            for trial, state in campaign.order(campaign.check_plan(plan, baseline), trials,
                                               baseline)]


def test_trials_interleave_abba_so_that_drift_lands_on_every_state_alike():
    assert visits(("tp2_stock", "tp2_e2e"), 3, baseline=False) == [
        (1, "tp2_stock"), (1, "tp2_e2e"), (2, "tp2_e2e"), (2, "tp2_stock"),
        (3, "tp2_stock"), (3, "tp2_e2e")]
    # Over an even number of trials, every state's mean place in the order is the same:
    # a linear drift adds as much to each.
    order = visits(campaign.PLAN, 4)
    places = {name: [index for index, (_, state) in enumerate(order) if state == name]
              for name in ("production", *campaign.PLAN)}
    assert {sum(indices) / len(indices) for indices in places.values()} == {(len(order) - 1) / 2}
    assert all(len(indices) == 4 for indices in places.values())
    # Nothing is drawn: the same plan and trials give the same order, as the report records it.
    assert order == visits(campaign.PLAN, 4) and visits(campaign.PLAN, 1) == order[:5]


@pytest.mark.parametrize("trials", [1, 2, 3, 5])
def test_consecutive_visits_differ_by_one_layer_or_measure_the_same_state_again(trials):
    states = campaign.order(campaign.check_plan(campaign.PLAN), trials)
    for (_, before), (_, after) in zip(states, states[1:], strict=False):
        assert before == after or len(campaign.layers_changed(before, after)) == 1


def test_each_trial_measures_every_state_deploying_only_where_the_state_changes(tmp_path):
    rehearsal = Rehearsal(tmp_path, baseline=False, trials=3, plan=("tp2_stock", "tp2_e2e"))
    result = asyncio.run(rehearsal.run())
    assert rehearsal.ran == [
        "preflight",
        "deploy tp2_stock", "verify tp2_stock", "measure tp2_stock",
        "deploy tp2_e2e", "verify tp2_e2e", "measure tp2_e2e",
        "measure tp2_e2e", "deploy tp2_stock", "verify tp2_stock", "measure tp2_stock",
        "measure tp2_stock", "deploy tp2_e2e", "verify tp2_e2e", "measure tp2_e2e",
        "deploy production", "verify production"]
    assert rehearsal.trials_ran == [(1, "tp2_stock"), (1, "tp2_e2e"), (2, "tp2_e2e"),
                                    (2, "tp2_stock"), (3, "tp2_stock"), (3, "tp2_e2e")]
    assert result["failed_step"] is None and result["trials"] == 3
    assert result["visits"] == [list(visit) for visit in rehearsal.trials_ran]
    assert result["order"] == campaign.ORDER
    assert "measure tp2_e2e (trial 2 of 3)" in [step["name"] for step in result["steps"]]
    text = (tmp_path / "campaign.md").read_text()
    assert ("- 3 trial(s), in the order ABBA: odd trials pass over the plan forward, even trials "
            "backward") in text
    assert "tp2_stock (1), tp2_e2e (1), tp2_e2e (2), tp2_stock (2), tp2_stock (3)" in text


def test_the_campaign_plans_prefix_and_long_cold_and_warm(tmp_path):
    plan = campaign.check_plan(("tp2_stock", "tp2_e2e"), baseline=False)
    planned = Campaign(None, plan, ["single", "long", "prefix_warm"], WindowSettings(),
                       tmp_path).windows
    assert planned == ["single", "long", "long_warm", "prefix", "prefix_warm"]
    everything = Campaign(None, plan, windows.names(), WindowSettings(), tmp_path).windows
    assert {"prefix", "prefix_warm", "long", "long_warm"} <= set(everything)


def test_the_time_spent_measuring_is_told_apart_from_converging_and_proving():
    steps = [campaign.Step("preflight", True, 5.0),
             campaign.Step("linktest production", True, 25.0),
             campaign.Step("deploy tp2_e2e (changes driver)", True, 40.0),
             campaign.Step("verify tp2_e2e", True, 10.0),
             campaign.Step("measure tp2_e2e (trial 1 of 3)", True, 20.0)]
    assert campaign.time_spent(steps) == {"measuring_seconds": 45.0,
                                          "converging_and_proving_seconds": 55.0,
                                          "measuring_share": 0.45}
    assert campaign.time_spent([])["measuring_share"] is None


def test_the_time_left_is_the_pace_so_far_times_the_visits_left():
    assert campaign.time_left([], 6) == "time left unknown until a state is measured"
    assert campaign.time_left([30.0, 50.0], 4) == "about 2 min 40 s left"


def test_a_windows_progress_line_names_the_trial_the_state_and_the_time_left(capsys):
    with progress.placed("trial 2 of 3, tp2_e2e", "about 1 min 0 s left"):
        progress.say(progress.where("window single") + ": reading counters")
    progress.say(progress.where("window single") + ": done")
    assert capsys.readouterr().err.splitlines() == [
        "trial 2 of 3, tp2_e2e, window single (about 1 min 0 s left): reading counters",
        "window single: done"]


def test_a_number_of_trials_out_of_bounds_is_one_line_and_runs_nothing():
    result = subprocess.run(
        [sys.executable, "experiment.py", "campaign", "--trials", "0"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={"TWINBOLT_SITE": "/nonexistent/site.toml", "PATH": "/usr/bin:/bin"})
    assert (result.returncode, result.stderr) == (
        1, "experiment: campaign: --trials must be in [1, 50]\n")


def test_the_campaign_report_draws_the_transport_chart_beside_its_tables(tmp_path):
    from test_linktest import report as linktest

    run = Campaign(None, campaign.check_plan(["tp2_stock"], baseline=False), ["single"],
                   WindowSettings(), tmp_path, baseline=False)
    run.linktests = [linktest_report.write(built, tmp_path)
                     for built in (linktest("stock", 14.0, 7), linktest("candidate", 16.0, 0))]
    result = run.finish("t", restored=True)
    assert result["transport_chart"] == "transport.png"
    assert (tmp_path / "transport.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "![transport](transport.png)" in (tmp_path / "campaign.md").read_text()


def test_a_campaign_says_before_any_window_that_this_machine_is_busy(tmp_path, monkeypatch,
                                                                      capsys):
    """Others used 100 CPU seconds on this machine while production was checked."""
    class Production:
        match = campaign.BASELINE

    async def observed(topology):
        return Production()

    async def verified(state, topology):
        return "37 passed"
    used = iter([0.0, 100.0])
    monkeypatch.setattr(campaign, "observe", observed)
    monkeypatch.setattr(campaign, "verify", verified)
    monkeypatch.setattr(campaign.disturbance, "machine_cpu_seconds", lambda: next(used))
    plan = campaign.check_plan(campaign.PLAN)
    said = asyncio.run(Campaign(None, plan, ["single"], WindowSettings(), tmp_path).preflight())
    assert said.startswith("37 passed; hosts observed in production; this machine: processes "
                           "outside the measurement used")
    assert "campaign: this machine: processes outside the measurement used" in \
        capsys.readouterr().err


def test_a_measurements_step_names_its_disturbed_windows():
    built = {"windows": [{"name": "single", "disturbed": "wsa: ..."},
                         {"name": "concurrent", "disturbed": None},
                         {"name": "single", "disturbed": None, "again": True}]}
    assert campaign.disturbed(built) == "; disturbed, left out: single"
    assert campaign.disturbed({"windows": built["windows"][1:]}) == ""
