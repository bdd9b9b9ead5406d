"""The guard: its script as a shell runs it, and the operations that arm it and read it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from dataclasses import fields, replace
from pathlib import Path
from unittest.mock import patch

import pytest
from operation_harness import a_run, run_operation
from pyinfra.api import OperationError
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.facts.files import Directory, File, Md5File, Sha1File, Sha256File
from pyinfra.facts.server import TmpDir
from pyinfra.operations import files

from harness.hosts.status import guard_fired
from operations.plumbing.facts import FileDigest, digest
from operations.plumbing.reading import Judgement
from operations.run import Run
from operations.safety import guard, ledger
from operations.safety import reading as safety_reading
from operations.safety.guard import Guard, GuardState
from operations.services import RUNSV_EXIT, RUNSV_ONCE
from operations.thunderbolt.link import ExpectedLink

SHELLS = [shell for shell in ("sh", "dash", "bash") if shutil.which(shell)]


LINK = ExpectedLink(interface="thunderbolt0", link_address="169.254.77.1",
                    peer_link_address="169.254.77.2", expected_rate_gbps=20.0, expected_lanes=1,
                    address_owner="twinbolt", prefix_length=16, wait_seconds=30)
LINK_FIELDS = {field.name for field in fields(ExpectedLink)}


def a_guard(tmp_path: Path, init_system: str = "systemd", **changes: object) -> Guard:
    """A guard; ``changes`` to its own fields or to its link's."""
    link = {name: changes.pop(name) for name in list(changes) if name in LINK_FIELDS}
    fields = dict(link=replace(LINK, **link), guard_stall_seconds=30,
                  module_name="thunderbolt_net", rank_service="sglang-tp2-rank0",
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


def test_the_guard_reads_the_host_where_the_kernel_shows_it() -> None:
    script = a_guard(Path("/var/lib/twinbolt")).script()
    assert "\nsysfs=/sys\n" in script and "\nuptime=/proc/uptime\n" in script


# The bench's stand-ins for the host, each logging what it was asked to "calls".
# ping answers with the exit status on line N of "answers" for its Nth call (the
# bench's default after them) and first sources "on-ping-N" if there is one; sleep
# moves the fake uptime on by "step" seconds, then sources "on-sleep-N"; date
# steps by "jump" from its third call; ip shows the address once "addressed"
# exists, and applying it makes it.
STUBS = {
    "ping": 'n=$(($(cat "$B/pings" 2>/dev/null || echo 0) + 1)); echo "$n" > "$B/pings"\n'
            'echo "ping $*" >> "$B/calls"\n'
            '[ -f "$B/on-ping-$n" ] && . "$B/on-ping-$n"\n'
            'status=$(sed -n "${n}p" "$B/answers" 2>/dev/null)\n'
            'exit "${status:-$(cat "$B/ping")}"',
    "sleep": '/bin/sleep 0.01\nread -r up _ < "$B/uptime"\n'
             'echo "$((${up%.*} + $(cat "$B/step"))).42 1.00" > "$B/uptime"\n'
             'n=$(($(cat "$B/sleeps" 2>/dev/null || echo 0) + 1)); echo "$n" > "$B/sleeps"\n'
             '[ -f "$B/on-sleep-$n" ] && . "$B/on-sleep-$n"; exit 0',
    "date": 'n=$(($(cat "$B/dates" 2>/dev/null || echo 0) + 1)); echo "$n" > "$B/dates"\n'
            'jump=0; [ "$n" -gt 2 ] && jump=$(cat "$B/jump")\n'
            'echo $((1796400000 + 2 * n + jump))',
    "ip": 'echo "ip $*" >> "$B/calls"\n'
          'case "$*" in\n'
          '*" addr show "*) [ -e "$B/addressed" ] && echo "7: lo    inet 169.254.77.1/16 '
          'scope link lo\\       valid_lft forever preferred_lft forever" ;;\n'
          '"addr replace "*) touch "$B/addressed" ;;\n'
          'esac; exit 0',
    "systemctl": 'echo "systemctl $*" >> "$B/calls"',
    "rmmod": 'echo "rmmod $*" >> "$B/calls"; cat "$B/events.jsonl" > "$B/seen-by-rmmod"\n'
             '[ -e "$B/hang-rmmod" ] && exec /bin/sleep 60; rm -r "$B/sys/module/$1"',
    "modprobe": 'echo "modprobe $*" >> "$B/calls"\n[ -e "$B/hang-modprobe" ] && exec /bin/sleep 60'
                '\nexit 0',
}


class Bench:
    """
    A workstation for the guard's script: a fake sysfs with the link (carrier,
    ifindex, counters) and the module, a fake ``/proc/uptime``, and stand-ins for
    the commands it runs (:data:`STUBS`). The interface is ``lo``, which has
    carrier and ifindex 1 on any machine, so that a script that reads the real
    ``/sys`` sees a link too.
    """

    def __init__(self, tmp_path: Path, ping: int = 1, step: int = 2, jump: int = 0,
                 addressed: bool = True, loaded: bool = True) -> None:
        self.root = tmp_path
        self.net = tmp_path / "sys/class/net/lo"
        (self.net / "statistics").mkdir(parents=True)
        self.set_link(ifindex=1, tx_bytes=5000, rx_bytes=4000, rx_errors=2)
        (self.net / "carrier").write_text("1\n")
        if loaded:
            (tmp_path / "sys/module/thunderbolt_net/parameters").mkdir(parents=True)
            (tmp_path / "sys/module/thunderbolt_net/parameters/tx_e2e").write_text("Y\n")
        for name, value in (("ping", ping), ("step", step), ("jump", jump)):
            (tmp_path / name).write_text(f"{value}\n")
        (tmp_path / "uptime").write_text("1000.42 1.00\n")
        if addressed:
            (tmp_path / "addressed").touch()
        (tmp_path / "bin").mkdir()
        for name, body in STUBS.items():
            (tmp_path / "bin" / name).write_text(f"#!/bin/sh\n{body}\n")
            (tmp_path / "bin" / name).chmod(0o755)
        self.env = {**os.environ, "B": str(tmp_path),
                    "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"}

    def set_link(self, **values: int) -> None:
        """The device's ifindex and counters, as its sysfs shows them now."""
        for name, value in values.items():
            path = self.net / name if name == "ifindex" else self.net / "statistics" / name
            path.write_text(f"{value}\n")

    def guard(self, **changes: object) -> Guard:
        return a_guard(self.root, interface="lo", sysfs=str(self.root / "sys"),
                       uptime_path=str(self.root / "uptime"),
                       staged_candidate=str(self.root / "thunderbolt_net.ko"), **changes)

    def run(self, watch: Guard, seconds: float) -> subprocess.CompletedProcess | None:
        """The guard's script, run until it exits; ``None`` if it watches after ``seconds``."""
        (self.root / "guard.sh").write_text(watch.script())
        try:
            return subprocess.run(["sh", str(self.root / "guard.sh")], env=self.env,
                                  capture_output=True, text=True, timeout=seconds)
        except subprocess.TimeoutExpired:
            return None

    def calls(self) -> list[str]:
        path = self.root / "calls"
        return path.read_text().splitlines() if path.exists() else []

    def events(self) -> list[dict]:
        path = self.root / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def restored(calls: list[str]) -> list[str]:
    return [call for call in calls if call.split()[0] in ("rmmod", "modprobe", "systemctl")]


def test_a_link_that_carries_nothing_has_the_guard_stop_the_rank_and_load_stock(
        tmp_path) -> None:
    bench = Bench(tmp_path)
    (tmp_path / "thunderbolt_net.ko").write_bytes(b"candidate")
    ran = bench.run(bench.guard(guard_stall_seconds=10), seconds=30)
    assert ran is not None and ran.returncode == 0, ran and ran.stdout + ran.stderr
    assert restored(bench.calls()) == ["systemctl stop sglang-tp2-rank0.service",
                                       "rmmod thunderbolt_net", "modprobe thunderbolt_net"]
    assert not (tmp_path / "thunderbolt_net.ko").exists()
    [intent, done] = bench.events()
    assert done["stalled_seconds"] == 10 and done["peer"] == "169.254.77.2"
    assert done["rank_stopped"] is True and done["stock_loaded"] is True
    assert done["tx_e2e"] == "Y" and done["rx_errors"] == [2, 2]
    assert (done["tx_bytes"], done["rx_bytes"]) == (0, 0)
    assert "restoring the stock thunderbolt_net" in ran.stdout


def test_the_evidence_is_written_before_the_restore_and_completed_after(tmp_path) -> None:
    """A restore that hangs, or a reboot during it, still leaves the stall recorded."""
    bench = Bench(tmp_path)
    ran = bench.run(bench.guard(guard_stall_seconds=10), seconds=30)
    assert ran is not None and ran.returncode == 0, ran and ran.stdout + ran.stderr
    [intent] = [json.loads(line) for line in (tmp_path / "seen-by-rmmod").read_text()
                .splitlines()]
    assert intent["state"] == "restoring" and intent["kind"] == "stall"
    assert intent["rank_stopped"] is None and intent["stock_loaded"] is None
    assert intent["stalled_seconds"] == 10 and intent["tx_e2e"] == "Y"
    # Read back, the completion replaces the line it completes.
    lines = [f"event {line}" for line in Path(bench.guard().events_path).read_text().splitlines()]
    [event] = GuardState().process(lines)["events"]
    assert event == {**intent, "state": "done", "rank_stopped": True, "stock_loaded": True}
    assert GuardState().process(lines[::-1])["events"] == [event]


@pytest.mark.parametrize("hangs", ["rmmod", "modprobe"])
def test_a_module_command_that_hangs_is_bounded_and_the_restore_recorded(tmp_path,
                                                                        hangs: str) -> None:
    # rmmod runs while the candidate is loaded; modprobe alone when it is not.
    bench = Bench(tmp_path, loaded=hangs == "rmmod")
    (tmp_path / f"hang-{hangs}").touch()
    started = time.monotonic()
    ran = bench.run(bench.guard(guard_stall_seconds=4, module_seconds=1), seconds=20)
    assert ran is not None, "the guard still waits on a hanging module command"
    assert ran.returncode != 0 and time.monotonic() - started < 10
    assert restored(bench.calls())[-1] == f"{hangs} thunderbolt_net"
    assert bench.events()[-1]["state"] == "done"
    assert bench.events()[-1]["stock_loaded"] is False
    assert "the stock thunderbolt_net is NOT loaded" in ran.stdout


def test_a_wall_clock_step_fires_nothing_a_stall_is_timed_since_boot(tmp_path) -> None:
    # Three lost pings (6 s since boot), the wall clock stepped +1 h after two of them.
    bench = Bench(tmp_path, ping=0, jump=3600)
    (tmp_path / "answers").write_text("1\n1\n1\n")
    assert bench.run(bench.guard(guard_stall_seconds=30), seconds=3) is None
    assert restored(bench.calls()) == [] and bench.events() == []


def test_a_stall_is_timed_since_boot_whatever_the_wall_clock_does(tmp_path) -> None:
    # 80 s since boot without an answer, the wall clock stepped back 1 h meanwhile.
    bench = Bench(tmp_path, jump=-3600)
    ran = bench.run(bench.guard(guard_stall_seconds=80), seconds=30)
    assert ran is not None and ran.returncode == 0, "an 80 s stall did not fire the guard"
    assert bench.events()[-1]["stalled_seconds"] == 80


def test_a_peer_that_answers_never_fires_the_guard(tmp_path) -> None:
    bench = Bench(tmp_path, ping=0)
    assert bench.run(bench.guard(guard_stall_seconds=4), seconds=3) is None
    calls = bench.calls()
    assert sum(call.startswith("ping ") for call in calls) > 10
    assert restored(calls) == [] and bench.events() == []


def test_a_link_without_carrier_is_no_stall(tmp_path) -> None:
    """The cable out or the peer asleep: the candidate's ring is not what stopped."""
    bench = Bench(tmp_path)
    (bench.net / "carrier").write_text("0\n")
    assert bench.run(bench.guard(guard_stall_seconds=4), seconds=2) is None
    assert restored(bench.calls()) == [] and bench.events() == []


def test_a_carrier_lost_mid_silence_pauses_it_and_the_silence_counts_on_after(
        tmp_path) -> None:
    """
    The peer's guard reloading its driver drops this host's carrier for a moment:
    the seconds already unanswered still count, those without carrier do not.
    """
    bench = Bench(tmp_path)
    # Three lost pings (4 s unanswered), three rounds without carrier, then lost pings again.
    (tmp_path / "on-ping-3").write_text(f"echo 0 > {bench.net}/carrier\n")
    (tmp_path / "on-sleep-7").write_text(f"echo 1 > {bench.net}/carrier\n")
    ran = bench.run(bench.guard(guard_stall_seconds=10), seconds=30)
    assert ran is not None and ran.returncode == 0, ran and ran.stdout + ran.stderr
    assert "lost carrier after 4 s unanswered: no stall; paused" in ran.stdout
    assert "still does not answer across lo: 4 s unanswered so far" in ran.stdout
    # 4 s before the carrier went, 6 s after it came back: the 7th ping fires it.
    assert sum(call.startswith("ping ") for call in bench.calls()) == 7
    assert bench.events()[-1]["stalled_seconds"] == 10
    assert restored(bench.calls())[-2:] == ["rmmod thunderbolt_net", "modprobe thunderbolt_net"]


def test_an_interface_without_its_address_gets_it_from_a_guard_of_twinbolt_s_own(
        tmp_path) -> None:
    """A new thunderbolt0 after a plug: ping cannot even send (network unreachable)."""
    bench = Bench(tmp_path, ping=2, addressed=False)
    (tmp_path / "on-ping-1").write_text('echo 0 > "$B/ping"\n')
    ran = bench.run(bench.guard(guard_stall_seconds=4), seconds=3)
    assert ran is None, ran and ran.stdout
    calls = bench.calls()
    assert "ip addr replace 169.254.77.1/16 dev lo" in calls
    assert restored(calls) == [] and bench.events() == []
    # Addressed, the link is watched again: its pings go on.
    assert sum(call.startswith("ping ") for call in calls) > 10


def test_an_interface_without_its_address_the_site_owns_is_reported_unaddressed(
        tmp_path) -> None:
    bench = Bench(tmp_path, ping=2, addressed=False)
    ran = bench.run(bench.guard(guard_stall_seconds=10, address_owner="system"), seconds=3)
    assert ran is None, ran and ran.stdout
    calls = bench.calls()
    assert restored(calls) == [] and not any(" replace " in call for call in calls)
    [event] = bench.events()
    assert event["kind"] == "unaddressed" and event["unaddressed_seconds"] == 10
    assert (event["interface"], event["address"]) == ("lo", "169.254.77.1")
    described = guard.summary(event)
    assert described.startswith("found the link unaddressed: ") and "no stall" in described


def test_byte_counters_restarted_by_a_device_made_anew_never_go_negative(tmp_path) -> None:
    bench = Bench(tmp_path)
    # After the first lost ping, the device is made anew: another ifindex, counters from zero.
    (tmp_path / "on-ping-2").write_text(
        f'echo 9 > {bench.net}/ifindex; echo 300 > {bench.net}/statistics/tx_bytes; '
        f'echo 0 > {bench.net}/statistics/rx_bytes\n')
    ran = bench.run(bench.guard(guard_stall_seconds=10), seconds=30)
    assert ran is not None and ran.returncode == 0
    event = bench.events()[-1]
    assert (event["tx_bytes"], event["rx_bytes"]) == (300, 0)
    # On the same device, a counter that went back is not known.
    bench = Bench(tmp_path / "again")
    (tmp_path / "again/on-ping-2").write_text(f"echo 10 > {bench.net}/statistics/tx_bytes\n")
    ran = bench.run(bench.guard(guard_stall_seconds=10), seconds=30)
    assert ran is not None and bench.events()[-1]["tx_bytes"] is None
    assert "(unknown bytes sent, 0 received" in guard.describe_event(bench.events()[-1])


def guard_facts(armed: bool, script: str | None, events: list[dict] | None = None,
                left: bool | None = None):
    """
    A workstation whose guard runs or not (and has left something, by default if
    it runs), with this script in place (``None``: none).
    """
    values = {
        GuardState: {"armed": armed, "left": armed if left is None else left,
                     "events": events or []},
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


def test_under_runit_the_guard_writes_nothing_outside_run(tmp_path) -> None:
    """Its run script logs beside its directory in /run, not in the persistent /var/log."""
    uploaded: dict[str, str] = {}

    def put(src, dest: str, mode: str):
        uploaded[dest] = src.getvalue()
        yield f"upload {dest}"

    with patch.object(files.put, "_inner", put):
        commands = run_operation(guard.armed, guard_facts(False, None),
                                 guard=a_guard(tmp_path, "runit"))
    run_script = uploaded["/run/twinbolt-runit/twinbolt-guard/run"]
    assert "exec >>/run/twinbolt-runit/twinbolt-guard.log 2>&1" in run_script
    assert not any("/var/" in line for line in run_script.splitlines()), run_script
    assert all("/run/" in command for command in commands if " /" in command), commands


def test_under_runit_disarming_a_guard_that_exited_leaves_nothing(tmp_path) -> None:
    """After a restore the guard has exited: its runsv and directory go all the same."""
    state = GuardState().process(["left"])
    assert (state["armed"], state["left"]) == (False, True)
    disarmed = run_operation(guard.armed, guard_facts(False, None, left=True),
                             guard=a_guard(tmp_path, "runit"), present=False)
    assert disarmed[0] == f"sh -c '{RUNSV_EXIT}' - /run/twinbolt-runit/twinbolt-guard"
    assert run_operation(guard.armed, guard_facts(False, None, left=False),
                         guard=a_guard(tmp_path, "runit"), present=False) == []


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
    assert GuardState().process([]) == {"armed": False, "left": False, "events": []}


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


def ledger_of(tmp_path: Path, lines: list[str]) -> list[dict]:
    """The ledger records a run writes from the guard's events file as these lines hold it."""
    path = tmp_path / "ledger.jsonl"
    path.parent.mkdir(exist_ok=True)
    Path(guard.EVENTS).write_text("".join(f"{line}\n" for line in lines))
    read_events(holding_the_lock(), path)
    return ledger.read(path)


def test_an_unaddressed_link_is_never_recorded_as_a_stall(tmp_path, events_here) -> None:
    unaddressed = {"kind": "unaddressed", "time": 1796411691, "interface": "thunderbolt0",
                   "address": "169.254.77.1", "unaddressed_seconds": 30}
    [written] = ledger_of(tmp_path, [json.dumps(unaddressed)])
    assert written["outcome"] == "unaddressed" and written["stall"] is False
    assert not ledger.stall_reports([written], [ledger.Controller.of(HOST)] * 2)


def test_a_restore_that_never_finished_is_still_a_stall(tmp_path, events_here) -> None:
    """The guard's intent line alone: its restore hung, or the host went down during it."""
    intent = {**EVENT, "kind": "stall", "state": "restoring", "rank_stopped": None,
              "stock_loaded": None}
    [written] = ledger_of(tmp_path, [json.dumps(intent)])
    assert written["outcome"] == "guarded" and written["stall"] is True
    assert ledger.stall_reports([written], [ledger.Controller.of(HOST)] * 2)
    assert "the restore did not finish" in written["evidence"]
    # Completed, it is one event, its outcome the completion's.
    done = {**intent, "state": "done", "rank_stopped": True, "stock_loaded": True}
    [written] = ledger_of(tmp_path / "done", [json.dumps(intent), json.dumps(done)])
    assert written["stall"] and written["evidence"].endswith(
        "TP rank stopped, the stock driver loaded")


def test_an_event_is_described_for_an_operator() -> None:
    text = guard.describe_event(EVENT)
    assert "did not answer for 30 s with tx_e2e=Y" in text
    assert "70 bytes sent, 0 received, rx_errors 0 -> 4" in text
    assert text.endswith("TP rank stopped, the stock driver loaded")
    assert "did NOT load" in guard.describe_event({**EVENT, "stock_loaded": False})


def test_a_campaign_or_soak_names_a_guard_that_did_not_stay_quietly_armed() -> None:
    def judged(armed: bool, *events: dict) -> Judgement:
        return safety_reading.judge(None, {"guard": {"armed": armed, "events": list(events)}})

    assert guard_fired({"wsa": judged(True), "wsb": judged(True)}) == []
    found = guard_fired({"wsa": judged(False, EVENT), "wsb": judged(False),
                         "gw": "ssh: timed out"})
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


def test_a_restore_recorded_unfinished_is_not_recorded_again_once_it_finishes(
        tmp_path, events_here) -> None:
    """A run read the intent line alone; the guard appended how it ended after: one stall."""
    intent = {**EVENT, "kind": "stall", "state": "restoring", "rank_stopped": None,
              "stock_loaded": None}
    [unfinished] = ledger_of(tmp_path, [json.dumps(intent)])
    done = {**intent, "state": "done", "rank_stopped": True, "stock_loaded": True}
    assert ledger_of(tmp_path, [json.dumps(done)]) == [unfinished]
