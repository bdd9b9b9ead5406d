"""Services described once, rendered for systemd or runit, restarted only on change."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from pydantic import ValidationError
from pyinfra.facts.files import Directory, File, Link, Sha1File
from pyinfra.facts.runit import RunitManaged, RunitStatus
from pyinfra.facts.systemd import SystemdEnabled, SystemdStatus
from pyinfra.operations import server
from pyinfra_fakes import FakeHost, commands, describe, on

from operations import services
from operations.plumbing.facts import FileDigest, digest, shell_script
from operations.services import (
    RunningServices,
    Service,
    ServiceLog,
    ServiceProcess,
    ServiceSettled,
    render,
    unit_quote,
)
from operations.serving.sglang import process_problems
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
        "arg /usr/bin/python", "arg -m", "arg lab.sglang_sim", "children 51 44",
        "env NCCL_SOCKET_IFNAME==thunderbolt0", "env HOME=/root",
    ])
    assert process == {
        "running": True, "status": "run: sglang-replica: (pid 42) 7s", "pid": 42,
        "seconds": 7.5, "argv": ["/usr/bin/python", "-m", "lab.sglang_sim"],
        "environment": {"NCCL_SOCKET_IFNAME": "=thunderbolt0", "HOME": "/root"},
        "children": [44, 51],
    }
    stopped = ServiceProcess().process(["status down: sglang-replica: 3s, normally up"])
    assert stopped["running"] is False and stopped["pid"] is None


@pytest.mark.parametrize("variables", [(), ("WANTED",), ("WANTED", "ABSENT")])
def test_service_process_reads_only_the_variables_it_is_asked_for(
        variables: tuple[str, ...], tmp_path: Path) -> None:
    # The fact's real command, against a real process holding a secret: a runit
    # host, its sv answering for that process (the proxy's environment holds the
    # master key, and pyinfra -vvv prints a fact's output).
    secret = "sk-this-must-never-be-printed"
    server = subprocess.Popen(["sleep", "60"], env={"LITELLM_MASTER_KEY": secret,
                                                     "NOTE": f"x\nWANTED=faked {secret}",
                                                     "WANTED": "=thunderbolt0"})
    try:
        (tmp_path / "sv").write_text(f'#!/bin/sh\necho "run: $2: (pid {server.pid}) 5s"\n')
        (tmp_path / "sv").chmod(0o755)
        command = ServiceProcess().command("litellm", "runit", variables).get_raw_value()
        result = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    finally:
        server.kill()
        server.wait()
    assert result.returncode == 0, result.stderr
    assert secret not in result.stdout + result.stderr
    process = ServiceProcess().process(result.stdout.splitlines())
    assert process["pid"] == server.pid and process["argv"] == ["sleep", "60"]
    assert process["environment"] == ({"WANTED": "=thunderbolt0"} if variables else {})


def test_a_process_that_exits_as_it_is_read_is_not_running_and_not_a_wrong_process(
        tmp_path: Path) -> None:
    # A crashed rank the supervisor has not reaped yet: a zombie, whose cmdline
    # and environ read empty. Read as running, its empty environment looked like
    # a wrongly rendered service, and the crash went unnamed.
    crashed = subprocess.Popen(["sh", "-c", "exit 1"])
    try:
        while Path(f"/proc/{crashed.pid}/stat").read_text().split(") ")[1][0] != "Z":
            time.sleep(0.01)
        (tmp_path / "sv").write_text(f'#!/bin/sh\necho "run: $2: (pid {crashed.pid}) 5s"\n')
        (tmp_path / "sv").chmod(0o755)
        command = ServiceProcess().command("sglang-tp2-rank0", "runit",
                                           ("NCCL_NET",)).get_raw_value()
        result = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    finally:
        crashed.wait()
    process = ServiceProcess().process(result.stdout.splitlines())
    assert process["running"] is False and process["pid"] == crashed.pid
    assert process["status"].endswith(f"pid {crashed.pid} exited as it was read")
    rank = Service(name="sglang-tp2-rank0", description="TP rank 0", command=["python"],
                   environment={"NCCL_NET": "Socket"})
    assert process_problems(process, rank) == [
        f"sglang-tp2-rank0 is not running ({process['status']})"]


def test_service_process_refuses_a_variable_name_that_is_not_one() -> None:
    with pytest.raises(ValueError, match="environment variable"):
        ServiceProcess().command("litellm", "runit", ("A=B|.*",))


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


RELOADABLE = TRICKY.model_copy(update={"reloadable": True})


def test_only_a_reloadable_unit_says_how_to_reload_it() -> None:
    assert "ExecReload=/bin/kill -HUP $MAINPID" in render(RELOADABLE, "systemd")
    assert "ExecReload" not in render(TRICKY, "systemd")


@pytest.mark.parametrize(("init_system", "observed", "reload"), [
    ("runit", SETTLED_RUNIT, "SVDIR=/etc/service sv reload echo"),
    ("systemd", {"active": "active", "enabled": "enabled"}, "systemctl reload echo.service"),
])
def test_a_settled_reloadable_service_asked_to_reload_gets_a_reload_not_a_restart(
        init_system: str, observed: dict[str, str], reload: str) -> None:
    host = settled_host(RELOADABLE, init_system, **observed)
    host.facts[SystemdStatus] = {"echo.service": True}
    assert commands(services.present, host, service=RELOADABLE, init_system=init_system,
                    reloaded=True) == [reload]


def test_a_service_that_cannot_reload_is_not_asked_to() -> None:
    host = settled_host(TRICKY, "runit", **SETTLED_RUNIT)
    with pytest.raises(ValueError, match="cannot be reloaded"):
        commands(services.present, host, service=TRICKY, init_system="runit", reloaded=True)


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


def test_a_shell_scripts_arguments_are_its_parameters_never_its_syntax() -> None:
    hostile = ["a b", "$(id)", "'; touch /x #", ""]
    command = shell_script('for word in "$@"; do printf "%s|" "$word"; done', *hostile)
    output = subprocess.run(["/bin/sh", "-c", command.get_raw_value()],
                            capture_output=True, text=True, check=True).stdout
    assert output == "".join(f"{word}|" for word in hostile)


# Hostile values: what a unit or a run script cannot carry is refused, the rest is quoted


@pytest.mark.parametrize("field, value", [
    ("user", "sglang\nAmbientCapabilities=CAP_SYS_ADMIN"),
    ("user", "-oProxyCommand=id"),
    ("user", "%u"),
    ("user", "two words"),
    ("working_directory", "/srv\nExecStartPre=+/usr/bin/id"),
    ("working_directory", "srv"),
    ("working_directory", "-/srv"),
    ("description", "a\nExecStartPre=/bin/id"),
    ("description", "a\rb"),
    ("command", ["/usr/bin/python", "/srv/models\nExecStartPost=/bin/id"]),
    ("environment", {"A": "1\nExecStartPre=/bin/id"}),
])
def test_a_value_no_unit_or_run_script_can_carry_is_refused(field: str, value: object) -> None:
    with pytest.raises(ValidationError, match=field):
        Service(**{"name": "x", "description": "x", "command": ["/bin/true"], field: value})


@pytest.mark.parametrize("word", ["a\nb", "a\rb", "\x00", "tab\there", "\x7f"])
def test_unit_quote_never_lets_a_control_character_through(word: str) -> None:
    with pytest.raises(ValueError, match="control character"):
        unit_quote(word)


HOSTILE = Service(
    name="hostile",
    description="Serves q%h $USER \"quoted\" \\ at 100%",
    command=[sys.executable, "-c", "import sys; print(sys.argv)", "%h", "$HOME", "${X}",
             "a;b", "it's", 'say "hi"', "back\\slash", "-not-an-option-of-systemd", ""],
    environment={"WITH_PERCENT": "%n", "WITH_DOLLAR": "$PATH", "SPACED": "a b ; c"},
    user="svc.user-1",
    working_directory="/srv/my models/100% $HOME",
)


def test_a_hostile_service_renders_as_exactly_its_directives() -> None:
    unit = render(HOSTILE, "systemd")
    directives = [line.split("=", 1)[0] for line in unit.splitlines()
                  if line and not line.startswith(("#", "["))]
    assert directives == ["Description", "Wants", "After", "Type", "User", "WorkingDirectory",
                          "Environment", "Environment", "Environment", "ExecStart", "Restart",
                          "RestartSec", "TimeoutStopSec", "NoNewPrivileges", "ProtectSystem",
                          "WantedBy"]
    assert "NoNewPrivileges=yes\n" in unit and "ProtectSystem=full\n" in unit
    assert "User=svc.user-1\n" in unit
    assert "WorkingDirectory=/srv/my models/100%% $HOME\n" in unit
    assert "Description=Serves q%%h $USER \"quoted\" \\ at 100%%\n" in unit
    # systemd.exec(5): in Environment= "$ has no special meaning"; in ExecStart= it does.
    assert "Environment=WITH_PERCENT=%%n\n" in unit and "Environment=WITH_DOLLAR=$PATH\n" in unit
    assert " $$HOME $${X} " in unit


def test_a_hostile_service_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing: `make setup` installs Debian's systemd"
    unit = tmp_path / "hostile.service"
    unit.write_text(render(HOSTILE.model_copy(update={"user": "root"}), "systemd"))
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    complaints = [line for line in result.stderr.splitlines() if unit.name in line]
    assert result.returncode == 0 and complaints == [], result.stderr


def test_a_hostile_run_script_runs_exactly_its_argv_in_its_directory(tmp_path: Path) -> None:
    # The run script itself, with chpst, getent and the log directory stubbed:
    # what sh executes is the service's argv, environment and directory, byte for byte.
    directory = tmp_path / "my models" / "100% $HOME"
    directory.mkdir(parents=True)
    service = HOSTILE.model_copy(update={
        "working_directory": str(directory),
        "command": [sys.executable, "-c",
                    "import json, os, sys; print(json.dumps([sys.argv[1:], os.getcwd(), "
                    "{k: os.environ.get(k) for k in ('WITH_PERCENT', 'WITH_DOLLAR', 'SPACED')}]))",
                    *HOSTILE.command[3:]],
    })
    log = tmp_path / "service.log"
    script = (render(service, "runit")
              .replace(f"mkdir -p {services.LOG_DIR}", "true")
              .replace(shlex.quote(services.log_path(service.name)), shlex.quote(str(log))))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stubs = {"chpst": 'shift 2; exec "$@"', "getent": "echo x:x:0:0::/nonexistent:"}
    for name, body in stubs.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    result = subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    argv, cwd, environment = json.loads(log.read_text())
    assert argv == list(HOSTILE.command[3:]) and cwd == str(directory)
    assert environment == dict(HOSTILE.environment)
