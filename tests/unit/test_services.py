"""Services described once, rendered for systemd or runit, restarted only on change."""

from __future__ import annotations

import hashlib
import shlex
import subprocess
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.runit import RunitManaged, RunitStatus
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import server
from pyinfra_fakes import FakeHost, commands, describe, on

from operations import services
from operations.facts import FileDigest, digest
from operations.services import (
    RunningServices,
    Service,
    ServiceLog,
    ServiceProcess,
    ServiceSettled,
    render,
    unit_quote,
)
from tests.conformance.conformance_helpers import systemd_complaints

TRICKY = Service(
    name="echo",
    description="An echo server at 100%",
    command=["/opt/my tools/bin/echo", "--greeting", "it's $HOME", "50%", 'say "hi"', "a\\b"],
    environment={"NCCL_SOCKET_IFNAME": "=thunderbolt0", "SPACED": "a b"},
    user="echo",
    working_directory="/var/lib/echo",
)


def host_with(facts: dict[type, object], files: dict[str, str] | None = None,
              links: dict[str, str] | None = None,
              directories: tuple[str, ...] = ()) -> FakeHost:
    """A fake host whose filesystem facts answer from ``files`` (path: sha1) and ``links``."""
    files = files or {}
    links = links or {}
    table = {
        File: lambda path: {"mode": 755, "size": 1} if path in files else None,
        Sha1File: lambda path: files.get(path),
        Directory: lambda path: {"mode": 755} if path in directories else None,
        Link: lambda path: {"link_target": links[path]} if path in links else None,
        # Nothing read in one command: present takes the path that reads each part.
        ServiceSettled: {},
    }
    table.update(facts)
    return FakeHost(table)


def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


# The description


def test_a_service_name_or_variable_a_shell_would_mangle_is_refused() -> None:
    with pytest.raises(ValidationError, match="name"):
        Service(name="my service", description="x", command=["/bin/true"])
    with pytest.raises(ValidationError, match="environment"):
        Service(name="x", description="x", command=["/bin/true"], environment={"A-B": "1"})
    with pytest.raises(ValidationError, match="command"):
        Service(name="x", description="x", command=[])


# Rendering


def test_the_runit_run_script_logs_to_its_file_and_execs_the_exact_argv() -> None:
    script = render(TRICKY, "runit")
    assert script.startswith("#!/bin/sh\n")
    assert "exec >>/var/log/twinbolt/echo.log 2>&1\n" in script
    assert "cd /var/lib/echo || exit 1\n" in script
    exports = {line.split("=", 1)[0].removeprefix("export "): shlex.split(line.split("=", 1)[1])
               for line in script.splitlines() if line.startswith("export ") and "=" in line}
    assert exports == {"NCCL_SOCKET_IFNAME": ["=thunderbolt0"], "SPACED": ["a b"]}
    last = shlex.split(script.splitlines()[-1])
    assert last == ["exec", "chpst", "-u", "echo", *TRICKY.command]


def test_the_runit_run_script_is_valid_sh() -> None:
    checked = subprocess.run(["sh", "-n"], input=render(TRICKY, "runit"), text=True,
                             capture_output=True)
    assert checked.returncode == 0, checked.stderr


def test_the_systemd_unit_escapes_specifiers_and_variables() -> None:
    unit = render(TRICKY, "systemd")
    assert "Description=An echo server at 100%%\n" in unit
    assert "User=echo\n" in unit and "WorkingDirectory=/var/lib/echo\n" in unit
    assert "Environment=NCCL_SOCKET_IFNAME==thunderbolt0\n" in unit
    assert 'Environment="SPACED=a b"\n' in unit
    assert ('ExecStart="/opt/my tools/bin/echo" --greeting "it\'s $$HOME" 50%% '
            '"say \\"hi\\"" "a\\\\b"\n') in unit


@pytest.mark.parametrize("word, quoted", [
    ("plain", "plain"), ("100%", "100%%"), ("$X", "$$X"), ("a b", '"a b"'), ("", '""'),
])
def test_unit_quote(word: str, quoted: str) -> None:
    assert unit_quote(word) == quoted


def test_a_unit_that_needs_quoting_is_read_by_systemd_as_written(tmp_path: Path) -> None:
    # Every unit twinbolt renders is verified in tests/conformance; this one needs
    # each of systemd's escapes.
    assert systemd_complaints(TRICKY, tmp_path) == []


# Facts


def test_service_process_reads_argv_and_environment() -> None:
    process = ServiceProcess().process([
        "status run: sglang-replica: (pid 42) 7s", "pid 42", "started 1000 100 17.5",
        "arg /usr/bin/python", "arg -m", "arg lab.sglang_sim",
        "env NCCL_SOCKET_IFNAME==thunderbolt0", "env HOME=/root",
    ])
    assert process == {
        "running": True, "status": "run: sglang-replica: (pid 42) 7s", "pid": 42,
        "seconds": 7.5, "argv": ["/usr/bin/python", "-m", "lab.sglang_sim"],
        "environment": {"NCCL_SOCKET_IFNAME": "=thunderbolt0", "HOME": "/root"},
    }
    stopped = ServiceProcess().process(["status down: sglang-replica: 3s, normally up"])
    assert stopped["running"] is False and stopped["pid"] is None


def test_running_services_and_log_facts() -> None:
    assert RunningServices().process(["sglang-tp2-rank0", "", "sglang-replica"]) == [
        "sglang-replica", "sglang-tp2-rank0"]
    assert ServiceLog().process(["\x1b[2m2026\x1b[0m \x1b[32m INFO\x1b[0m ready"]) == [
        "2026  INFO ready"]


# Operations


RUN = "/etc/sv/echo/run"


def test_a_services_account_is_created_only_when_missing(monkeypatch) -> None:
    monkeypatch.setattr(server.user, "_inner",
                        lambda user, system: iter([f"create {user} (system {system})"]))

    def created(exists: bool) -> list[str]:
        with on(host_with({services.AccountExists: exists})):
            return list(services.account_present("sglang-router"))

    assert created(True) == []
    assert created(False) == ["create sglang-router (system True)"]


def test_a_new_runit_service_is_rendered_linked_and_started() -> None:
    host = host_with({RunitManaged: set(), RunitStatus: {}}, directories=("/etc/sv/echo",))
    done = commands(services.present, host, service=TRICKY, init_system="runit")
    assert done[0] == f"upload {RUN}"
    assert "ln -s /etc/sv/echo /etc/service/echo" in done
    assert done[-1] == "SVDIR=/etc/service sv start echo"
    assert not any("restart" in command for command in done)


RUNNING = {RunitManaged: {"echo"}, RunitStatus: {"echo": True}}
LINKED = {"/etc/service/echo": "/etc/sv/echo"}


def test_an_unchanged_running_runit_service_is_left_alone() -> None:
    host = host_with(RUNNING, files={RUN: sha1(render(TRICKY, "runit"))},
                     directories=("/etc/sv/echo",), links=LINKED)
    assert commands(services.present, host, service=TRICKY, init_system="runit") == []
    assert "service echo is running" in host.noops


def test_a_changed_runit_service_is_uploaded_and_restarted() -> None:
    host = host_with(RUNNING, files={RUN: "0" * 40}, directories=("/etc/sv/echo",),
                     links=LINKED)
    done = commands(services.present, host, service=TRICKY, init_system="runit")
    assert done[0] == f"upload {RUN}"
    assert done[-1] == "SVDIR=/etc/service sv restart echo"


def test_the_state_can_ask_for_a_restart_of_an_unchanged_service() -> None:
    host = host_with(RUNNING, files={RUN: sha1(render(TRICKY, "runit"))},
                     directories=("/etc/sv/echo",), links=LINKED)
    done = commands(services.present, host, service=TRICKY, init_system="runit",
                    restarted=True)
    assert done == ["SVDIR=/etc/service sv restart echo"]


def test_a_changed_systemd_unit_is_reloaded_and_restarted() -> None:
    host = host_with(
        {SystemdStatus: {"echo.service": True}, SystemdEnabled: {"echo.service": True}},
        files={"/etc/systemd/system/echo.service": "0" * 40},
        directories=("/etc/systemd/system",),
    )
    done = commands(services.present, host, service=TRICKY, init_system="systemd")
    assert done[0] == "upload /etc/systemd/system/echo.service"
    assert "systemctl daemon-reload" in done
    assert done[-1] == "systemctl restart echo.service"


def test_an_absent_runit_service_is_stopped_before_its_link_goes() -> None:
    host = host_with(RUNNING, files={"/etc/sv/echo/down": "x"}, links=LINKED)
    done = commands(services.absent, host, service="echo", init_system="runit")
    assert done.index("SVDIR=/etc/service sv stop echo") < done.index("rm -f /etc/service/echo")


def test_absent_on_a_host_that_never_had_the_service_does_nothing() -> None:
    host = host_with({RunitManaged: set()})
    assert commands(services.absent, host, service="echo", init_system="runit") == []


# A settled service, read in one command

SETTLED_RUNIT = {"link": "/etc/sv/echo", "status": "run: /etc/service/echo: (pid 42) 9s"}


def settled_host(service: Service, init_system: str, **observed: str) -> FakeHost:
    """A host that answers only ServiceSettled: reading anything else fails the test."""
    return FakeHost({ServiceSettled: {
        "file": digest(render(service, init_system), services.SUPERVISORS[init_system].mode),
        **observed}})


@pytest.mark.parametrize(("service", "init_system", "observed"), [
    (TRICKY, "runit", SETTLED_RUNIT),
    (TRICKY.model_copy(update={"at_boot": False}), "runit", {**SETTLED_RUNIT, "down": "yes"}),
    (TRICKY, "systemd", {"active": "active", "enabled": "enabled"}),
    (TRICKY.model_copy(update={"at_boot": False}), "systemd",
     {"active": "active", "enabled": "disabled"}),
])
def test_a_settled_service_is_left_alone_after_one_read(service: Service, init_system: str,
                                                        observed: dict[str, str]) -> None:
    host = settled_host(service, init_system, **observed)
    assert commands(services.present, host, service=service, init_system=init_system) == []
    path = services.rendered_path("echo", init_system)
    assert host.noops == [f"service echo runs, {path} unchanged"]


@pytest.mark.parametrize(("service", "init_system", "change"), [
    (TRICKY, "runit", {"file": "755 " + "0" * 40}),
    (TRICKY, "runit", {"file": digest(render(TRICKY, "runit"), "644")}),
    (TRICKY, "runit", {"link": ""}),
    (TRICKY, "runit", {"status": "down: /etc/service/echo: 3s, normally up"}),
    (TRICKY.model_copy(update={"at_boot": False}), "runit", {}),  # no down file
    (TRICKY, "systemd", {"active": "failed", "enabled": "enabled"}),
    (TRICKY, "systemd", {"active": "active", "enabled": "disabled"}),
])
def test_anything_unsettled_is_read_part_by_part_and_converged(
        service: Service, init_system: str, change: dict[str, str]) -> None:
    observed = {**(SETTLED_RUNIT if init_system == "runit" else {}), **change}
    host = settled_host(service, init_system, **observed)
    with pytest.raises(AssertionError, match="unexpected fact"):
        commands(services.present, host, service=service, init_system=init_system)


def test_a_start_only_runit_service_without_its_down_file_is_not_settled() -> None:
    once = TRICKY.model_copy(update={"at_boot": False})
    assert not services.SUPERVISORS["runit"].settled(once, SETTLED_RUNIT)
    assert services.SUPERVISORS["runit"].settled(once, {**SETTLED_RUNIT, "down": "yes"})


def test_a_restart_asked_for_is_not_skipped_for_a_settled_service() -> None:
    host = host_with({**RUNNING, ServiceSettled: {"file": digest(render(TRICKY, "runit"), "755"),
                                                 **SETTLED_RUNIT}},
                     files={RUN: sha1(render(TRICKY, "runit"))},
                     directories=("/etc/sv/echo",), links=LINKED)
    done = commands(services.present, host, service=TRICKY, init_system="runit",
                    restarted=True)
    assert done == ["SVDIR=/etc/service sv restart echo"]


def test_the_settled_fact_reads_key_value_lines() -> None:
    fact = ServiceSettled()
    assert fact.process(["file 755 abc", "link /etc/sv/echo", "status run: x: (pid 1) 2s"]) == {
        "file": "755 abc", "link": "/etc/sv/echo", "status": "run: x: (pid 1) 2s"}
    command = fact.command("echo", "/etc/sv/echo/run", "runit").get_raw_value()
    assert command.endswith("- echo /etc/sv/echo/run")


# Start-only services (a TP rank): never started at boot, never restarted on exit

ONCE = TRICKY.model_copy(update={"at_boot": False})


def test_a_new_start_only_runit_service_gets_its_down_file_before_its_link_and_runs_once(
        ) -> None:
    done: list[str] = []

    def status(service: str, svdir: str) -> dict:
        # runit cannot report on a service it does not manage yet: asking before
        # the link would print a failure in a run that succeeds.
        assert f"ln -s /etc/sv/{service} {svdir}/{service}" in done, done
        return {}
    host = host_with({RunitManaged: set(), RunitStatus: status}, directories=("/etc/sv/echo",))
    with on(host):
        for command in services.present._inner(service=ONCE, init_system="runit"):
            done.append(describe(command))
    assert done.index("touch /etc/sv/echo/down") < done.index(
        "ln -s /etc/sv/echo /etc/service/echo")
    assert done[-1] == "SVDIR=/etc/service sv once echo"
    assert not any(" sv start " in command or " sv up " in command for command in done)


def test_a_changed_start_only_runit_service_is_stopped_then_run_once() -> None:
    host = host_with(RUNNING, files={RUN: "0" * 40, "/etc/sv/echo/down": "x"},
                     directories=("/etc/sv/echo",), links=LINKED)
    done = commands(services.present, host, service=ONCE, init_system="runit")
    assert done[-2:] == ["SVDIR=/etc/service sv -v -w 90 down echo",
                         "SVDIR=/etc/service sv once echo"]


def test_a_running_start_only_runit_service_is_left_alone() -> None:
    host = host_with(RUNNING, files={RUN: sha1(render(ONCE, "runit")), "/etc/sv/echo/down": "x"},
                     directories=("/etc/sv/echo",), links=LINKED)
    assert commands(services.present, host, service=ONCE, init_system="runit") == []


def test_a_start_only_systemd_unit_is_started_not_enabled_and_not_restarted_on_failure() -> None:
    unit = render(ONCE, "systemd")
    assert "Restart=no" in unit and "Restart=on-failure" not in unit
    assert "Restart=on-failure" in render(TRICKY, "systemd")
    host = host_with(
        {SystemdStatus: {}, SystemdEnabled: {}},
        files={"/etc/systemd/system/echo.service": sha1(unit)},
        directories=("/etc/systemd/system",),
    )
    done = commands(services.present, host, service=ONCE, init_system="systemd")
    assert done[-1] == "systemctl start echo.service"
    assert not any("enable" in command for command in done)



def test_a_file_digest_is_its_mode_and_sha1_read_in_one_command(tmp_path: Path) -> None:
    path = tmp_path / "run"
    path.write_text("#!/bin/sh\nexec true\n")
    path.chmod(0o750)
    fact = FileDigest()

    def read(target: Path) -> str | None:
        output = subprocess.run(["/bin/sh", "-c", fact.command(str(target)).get_raw_value()],
                                capture_output=True, text=True, check=True).stdout
        return fact.process(output.splitlines()) if output else fact.default()
    assert read(path) == digest("#!/bin/sh\nexec true\n", "750")
    assert read(tmp_path / "absent") is None
