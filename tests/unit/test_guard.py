"""The guard: its script as a shell runs it, and the operations that arm it and read it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from operation_harness import a_run, run_operation
from pyinfra.api import OperationError
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.facts.files import Directory, File, Md5File, Sha1File, Sha256File
from pyinfra.facts.server import TmpDir

from harness.status import guard_fired
from operations import guard, ledger
from operations.facts import FileDigest, digest
from operations.guard import Guard, GuardState
from operations.run import Run
from operations.services import RUNSV_EXIT, RUNSV_ONCE

SHELLS = [shell for shell in ("sh", "dash", "bash") if shutil.which(shell)]


def a_guard(tmp_path: Path, init_system: str = "systemd", **changes: object) -> Guard:
    fields = dict(interface="thunderbolt0", peer_address="169.254.77.2", stall_seconds=30,
                  module="thunderbolt_net", rank_service="sglang-tp2-rank0",
                  init_system=init_system, run_dir="/run/twinbolt",
                  staged_candidate="/run/twinbolt/thunderbolt_net.ko",
                  events_path=str(tmp_path / "events.jsonl"))
    return Guard(**{**fields, **changes})


@pytest.mark.parametrize("shell", SHELLS)
def test_the_guard_script_and_the_transient_runit_scripts_parse(tmp_path, shell: str) -> None:
    for init_system in ("systemd", "runit"):
        script = a_guard(tmp_path, init_system,
                         staged_candidate="/run/my twinbolt/thunderbolt_net.ko").script()
        parsed = subprocess.run([shell, "-n"], input=script, capture_output=True, text=True)
        assert parsed.returncode == 0, parsed.stderr
        # A value with a blank is one word, quoted for the shell.
        assert "\nstaged='/run/my twinbolt/thunderbolt_net.ko'\n" in script
    for script in (RUNSV_ONCE, RUNSV_EXIT):
        parsed = subprocess.run([shell, "-n", "-c", script], capture_output=True, text=True)
        assert parsed.returncode == 0, parsed.stderr


def fake_tools(tmp_path: Path, ping_answers: bool) -> dict[str, str]:
    """A PATH whose ping, systemctl and modprobe log their arguments; sleep is short."""
    tools = tmp_path / "bin"
    tools.mkdir()
    log = tmp_path / "calls"
    for name, status in (("ping", 0 if ping_answers else 1), ("systemctl", 0), ("modprobe", 0),
                         ("rmmod", 0)):
        (tools / name).write_text(f'#!/bin/sh\necho "{name} $*" >> {log}\nexit {status}\n')
        (tools / name).chmod(0o755)
    (tools / "sleep").write_text("#!/bin/sh\nexec /bin/sleep 0.05\n")
    (tools / "sleep").chmod(0o755)
    return {**os.environ, "PATH": f"{tools}:{os.environ['PATH']}"}


def test_a_link_that_carries_nothing_has_the_guard_stop_the_rank_and_load_stock(
        tmp_path) -> None:
    # The loopback interface stands for thunderbolt0: it exists, with real counters;
    # a module that is not loaded is only loaded, never removed first.
    staged = tmp_path / "thunderbolt_net.ko"
    staged.write_bytes(b"candidate")
    watch = a_guard(tmp_path, interface="lo", stall_seconds=1, module="twinbolt_absent_module",
                    staged_candidate=str(staged))
    (tmp_path / "guard.sh").write_text(watch.script())
    ran = subprocess.run(["sh", str(tmp_path / "guard.sh")], env=fake_tools(tmp_path, False),
                         capture_output=True, text=True, timeout=30)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "systemctl stop sglang-tp2-rank0.service" in calls
    assert calls[-1] == "modprobe twinbolt_absent_module"
    assert not any(call.startswith("rmmod") for call in calls)
    assert not staged.exists()
    [event] = [json.loads(line) for line in Path(watch.events_path).read_text().splitlines()]
    assert event["stalled_seconds"] >= 1 and event["peer"] == "169.254.77.2"
    assert event["rank_stopped"] is True and event["stock_loaded"] is True
    assert event["tx_e2e"] == "absent" and len(event["rx_errors"]) == 2
    assert "restoring the stock twinbolt_absent_module" in ran.stdout


def test_a_peer_that_answers_never_fires_the_guard(tmp_path) -> None:
    watch = a_guard(tmp_path, interface="lo", stall_seconds=1, module="twinbolt_absent_module")
    (tmp_path / "guard.sh").write_text(watch.script())
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["sh", str(tmp_path / "guard.sh")], env=fake_tools(tmp_path, True),
                       capture_output=True, text=True, timeout=3)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert len(calls) > 10 and all(call.startswith("ping ") for call in calls)
    assert not Path(watch.events_path).exists()


def test_a_link_without_carrier_is_no_stall(tmp_path) -> None:
    """The cable out or the peer asleep: the candidate's ring is not what stopped."""
    watch = a_guard(tmp_path, interface="twinbolt_none0", stall_seconds=1)
    (tmp_path / "guard.sh").write_text(watch.script())
    with pytest.raises(subprocess.TimeoutExpired):
        subprocess.run(["sh", str(tmp_path / "guard.sh")], env=fake_tools(tmp_path, False),
                       capture_output=True, text=True, timeout=2)
    assert not (tmp_path / "calls").exists()
    assert not Path(watch.events_path).exists()


def guard_facts(armed: bool, script: str | None, events: list[dict] | None = None):
    """A workstation whose guard runs or not, with this script in place (``None``: none)."""
    values = {
        GuardState: {"armed": armed, "events": events or []},
        FileDigest: digest(script, guard.SCRIPT_MODE) if script is not None else None,
        File: {"mode": 700, "size": 1} if script is not None else None,
        Sha1File: None, Md5File: None, Sha256File: None, Directory: None, TmpDir: "/tmp",
    }
    return lambda cls, kwargs: values[cls]


def test_arming_uploads_the_script_and_starts_a_transient_unit(tmp_path) -> None:
    watch = a_guard(tmp_path)
    commands = run_operation(guard.armed, guard_facts(False, None), guard=watch)
    assert any(command.startswith("upload ") and command.endswith(" /run/twinbolt/guard.sh")
               for command in commands), commands
    start = commands[-1]
    assert start.startswith("systemd-run --quiet --collect --unit=twinbolt-guard ")
    assert start.endswith("-- /bin/sh /run/twinbolt/guard.sh")
    # Armed with the same script: nothing; with another, restarted.
    assert run_operation(guard.armed, guard_facts(True, watch.script()), guard=watch) == []
    changed = run_operation(guard.armed, guard_facts(True, "old"), guard=watch)
    assert changed[-2:] == ["systemctl stop twinbolt-guard.service", start]


def test_under_runit_the_guard_is_its_own_runsv_in_run(tmp_path) -> None:
    commands = run_operation(guard.armed, guard_facts(False, None),
                             guard=a_guard(tmp_path, "runit"))
    directory = "/run/twinbolt-runit/twinbolt-guard"
    assert any(command.endswith(f" {directory}/run") for command in commands), commands
    assert commands[-1].endswith(f"- {directory}") and "runsv" in commands[-1]
    assert not any("/etc/service" in command or "/etc/sv" in command for command in commands)
    disarmed = run_operation(guard.armed, guard_facts(True, "any"),
                             guard=a_guard(tmp_path, "runit"), present=False)
    assert "sv exit" in disarmed[0] and disarmed[0].endswith(f"- {directory}")


def test_disarming_stops_it_and_removes_the_script(tmp_path) -> None:
    watch = a_guard(tmp_path)
    commands = run_operation(guard.armed, guard_facts(True, "x"), guard=watch, present=False)
    assert commands == ["systemctl stop twinbolt-guard.service", "rm -f /run/twinbolt/guard.sh"]
    assert run_operation(guard.armed, guard_facts(False, None), guard=watch,
                         present=False) == []


EVENT = {"time": 1796411691, "stalled_seconds": 30, "peer": "169.254.77.2", "tx_e2e": "Y",
         "rx_errors": [0, 4], "tx_bytes": 70, "rx_bytes": 0, "rank_stopped": True,
         "stock_loaded": True}
HOST = {"host": "wsa", "nhi": "8086:1137", "router": "Intel JHL8540", "nvm_version": "35.0"}


def test_the_guard_state_is_read_from_its_status_and_events() -> None:
    state = GuardState().process(["active", f"event {json.dumps(EVENT)}", "event {\"time\": 1"])
    assert state["armed"] is True
    assert state["events"][0] == EVENT
    assert state["events"][1] == {"unreadable": '{"time": 1'}
    assert GuardState().process([]) == {"armed": False, "events": []}


@pytest.fixture
def events_here(tmp_path, monkeypatch) -> list[str]:
    """
    The guard's event files under ``tmp_path``, and the commands ``guard.reported``
    runs at once run here by ``sh``, as on the host; each one's script is listed.
    """
    monkeypatch.setattr(guard, "EVENTS", str(tmp_path / "guard-events.jsonl"))
    monkeypatch.setattr(guard, "REPORTED", str(tmp_path / "guard-events.reported.jsonl"))
    ran: list[str] = []

    def run_here(command) -> tuple[bool, CommandOutput]:
        ran.append(command.get_raw_value())
        result = subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True,
                                text=True)
        lines = [OutputLine("stdout", line) for line in result.stdout.splitlines()]
        lines += [OutputLine("stderr", line) for line in result.stderr.splitlines()]
        return result.returncode == 0, CommandOutput(lines)

    monkeypatch.setattr(guard, "run_now", run_here)
    return ran


def holding_the_lock() -> Run:
    """A run that holds wsa's lock and has observed its controller."""
    run = a_run()
    run.locks.holding.add("wsa")
    run.observed.hosts["wsa"] = HOST
    return run


def read_events(run: Run, ledger_path: Path) -> list[str]:
    return run_operation(guard.reported, guard_facts(False, None), run=run,
                         init_system="systemd", ledger_path=str(ledger_path))


def test_the_next_run_names_each_event_records_a_stall_and_moves_the_events(
        tmp_path, events_here) -> None:
    path = tmp_path / "ledger.jsonl"
    run = holding_the_lock()
    shell: list[str] = []
    predicted = run_operation(guard.reported, guard_facts(False, None, [EVENT]), executing=False,
                              shell=shell, run=run, init_system="systemd", ledger_path=str(path))
    assert predicted == [] and shell == [] and events_here == [] and not path.exists()
    [entry] = run.observed.guarded["wsa"]
    assert entry["outcome"] == "guarded" and entry["stall"] is True
    assert "rx_errors 0 -> 4" in entry["evidence"] and "the guard on wsa" in entry["evidence"]

    Path(guard.EVENTS).write_text(json.dumps(EVENT) + "\n")
    assert read_events(run, path) == []
    [written] = ledger.read(path)
    assert written["stall"] and written["hosts"] == [HOST] and written["event"] == EVENT
    assert sorted(file.name for file in tmp_path.iterdir()) == [
        "guard-events.reported.jsonl", "ledger.jsonl"]
    assert json.loads(Path(guard.REPORTED).read_text()) == EVENT
    # That controller on that firmware is refused from now on; the healthy firmware is not.
    stalled = [ledger.Controller.of(HOST), ledger.Controller.of({**HOST, "host": "wsb"})]
    assert ledger.stall_reports([written], stalled)
    healthy = [ledger.Controller.of({**HOST, "nvm_version": "36.0"})] * 2
    assert not ledger.stall_reports([written], healthy)


def test_an_event_is_described_for_an_operator() -> None:
    text = guard.describe_event(EVENT)
    assert "did not answer for 30 s with tx_e2e=Y" in text
    assert "70 bytes sent, 0 received, rx_errors 0 -> 4" in text
    assert text.endswith("TP rank stopped, the stock driver loaded")
    assert "did NOT load" in guard.describe_event({**EVENT, "stock_loaded": False})


def test_a_campaign_or_soak_names_a_guard_that_did_not_stay_quietly_armed() -> None:
    assert guard_fired({"wsa": {"armed": True, "events": []},
                        "wsb": {"armed": True, "events": []}}) == []
    found = guard_fired({"wsa": {"armed": False, "events": [EVENT]},
                         "wsb": {"armed": False, "events": []},
                         "gw": {"error": "ssh: timed out"}})
    assert found[0].startswith("wsa: the guard restored stock: ")
    assert found[1:] == ["wsb: the guard is not armed",
                         "gw: the guard cannot be read: ssh: timed out"]


# Events are read under the lock, moved aside at once, and recorded once (issue 44)


def test_a_run_that_does_not_hold_the_lock_leaves_the_events_in_place(tmp_path,
                                                                      events_here) -> None:
    """A run the lock refused (one from another operator machine, say) takes nothing."""
    Path(guard.EVENTS).write_text(json.dumps(EVENT) + "\n")
    run = holding_the_lock()
    run.locks.holding.clear()
    with pytest.raises(OperationError, match="wsa: lock layer: the guard's events are read only "
                                             "under this run's lock"):
        read_events(run, tmp_path / "ledger.jsonl")
    assert events_here == [] and not (tmp_path / "ledger.jsonl").exists()
    assert json.loads(Path(guard.EVENTS).read_text()) == EVENT


def test_the_events_are_renamed_aside_before_they_are_read(tmp_path, events_here,
                                                           monkeypatch) -> None:
    """An event the guard appends while a run reads goes to a new file, for the next run."""
    later = {**EVENT, "time": EVENT["time"] + 600}
    moving = guard.run_now

    def guard_appends_meanwhile(command) -> tuple[bool, CommandOutput]:
        result = moving(command)
        if guard.MOVE_ASIDE in command.get_raw_value():
            with open(guard.EVENTS, "a") as events:
                events.write(json.dumps(later) + "\n")
        return result

    Path(guard.EVENTS).write_text(json.dumps(EVENT) + "\n")
    monkeypatch.setattr(guard, "run_now", guard_appends_meanwhile)
    read_events(holding_the_lock(), tmp_path / "ledger.jsonl")
    assert [entry["event"] for entry in ledger.read(tmp_path / "ledger.jsonl")] == [EVENT]
    assert json.loads(Path(guard.REPORTED).read_text()) == EVENT
    assert [json.loads(line) for line in Path(guard.EVENTS).read_text().splitlines()] == [later]


def test_events_read_again_after_a_run_failed_to_finish_are_recorded_once(
        tmp_path, events_here, monkeypatch) -> None:
    path = tmp_path / "ledger.jsonl"
    Path(guard.EVENTS).write_text(json.dumps(EVENT) + "\n")
    moving = guard.run_now
    monkeypatch.setattr(guard, "run_now", lambda command: (
        (False, CommandOutput([OutputLine("stderr", "No space left on device")]))
        if guard.FINISH_MOVED in command.get_raw_value() else moving(command)))
    first = holding_the_lock()
    read_events(first, path)
    [moved] = [file for file in tmp_path.iterdir() if file.name.startswith("guard-events.jsonl.")]
    assert moved.name == f"guard-events.jsonl.{first.owner.token}"

    monkeypatch.setattr(guard, "run_now", moving)
    again = holding_the_lock()
    read_events(again, path)
    [written] = ledger.read(path)
    assert written["event"] == EVENT
    # Already in the ledger: the stall refusal counts it from there, not twice.
    assert again.observed.guarded["wsa"] == []
    assert not moved.exists() and not Path(guard.EVENTS).exists()
    assert json.loads(Path(guard.REPORTED).read_text()) == EVENT


def test_a_rename_that_fails_refuses_the_run_and_records_nothing(tmp_path, events_here,
                                                                 monkeypatch) -> None:
    Path(guard.EVENTS).write_text(json.dumps(EVENT) + "\n")
    monkeypatch.setattr(guard, "run_now", lambda command: (
        False, CommandOutput([OutputLine("stderr", "mv: cannot move: Read-only file system")])))
    with pytest.raises(OperationError, match=r"wsa: ledger layer: the guard's events could not "
                                             r"be moved aside to be read \(mv: cannot move: "
                                             r"Read-only file system\); nothing was recorded"):
        read_events(holding_the_lock(), tmp_path / "ledger.jsonl")
    assert not (tmp_path / "ledger.jsonl").exists()


def test_status_still_shows_events_a_run_moved_aside_and_did_not_finish_with(
        tmp_path, events_here) -> None:
    later = {**EVENT, "time": EVENT["time"] + 600}
    Path(f"{guard.EVENTS}.0123abcd").write_text(json.dumps(EVENT) + "\n")
    Path(guard.EVENTS).write_text(json.dumps(later) + "\n")
    command = GuardState().command("runit").get_raw_value()
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    assert sorted(GuardState().process(output.splitlines())["events"],
                  key=lambda event: event["time"]) == [EVENT, later]
