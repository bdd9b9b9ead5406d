"""
Long-running services, described once and rendered for the host's init system.

A :class:`Service` says what runs (argv, environment, user, working directory);
``templates/`` turns it into a systemd unit (``/etc/systemd/system/NAME.service``,
logs in the journal) or a runit service (``/etc/sv/NAME/run`` linked from
``/etc/service/NAME``, logs appended to ``/var/log/twinbolt/NAME.log``). pyinfra's
own ``systemd``/``runit`` operations start and stop it; a running service is
restarted only when its rendered file changed or the caller says the state
needs it. Each init system is one :class:`Supervisor` (where the file goes, its
status, its logs, start and stop): nothing else branches on which one it is.

Nothing here knows SGLang: the serving and gateway layers describe their
services with it.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints
from pyinfra import host
from pyinfra.api import FactBase, Host, QuoteString, StringCommand, operation
from pyinfra.api.command import PyinfraCommand
from pyinfra.api.util import get_template
from pyinfra.facts.runit import RunitManaged, RunitStatus
from pyinfra.operations import files, runit, server, systemd

from operations.plumbing import connect
from operations.plumbing.facts import (
    EmptyMeansSomething,
    FileDigest,
    digest,
    digest_script,
    shell_script,
)
from operations.site.settings import http_url
from operations.site.syntax import (
    ENVIRONMENT_NAME,
    AbsolutePath,
    AccountName,
    EnvironmentName,
    control_characters,
    no_control_characters,
)

InitSystem = Literal["systemd", "runit"]

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"
SYSTEMD_DIR = "/etc/systemd/system"
RUNIT_SOURCEDIR = "/etc/sv"
RUNIT_SVDIR = "/etc/service"
LOG_DIR = "/var/log/twinbolt"
# A transient runit service's directory: in /run, supervised by a runsv of its own.
RUNIT_TRANSIENT_DIR = "/run/twinbolt-runit"
# Start runsv on "$1" unless it runs (its control pipe appears when it is up),
# then the service once.
RUNSV_ONCE = (
    'sv status "$1" >/dev/null 2>&1 || { setsid runsv "$1" </dev/null >/dev/null 2>&1 & }; '
    'i=0; until sv status "$1" >/dev/null 2>&1; do '
    '[ $i -ge 50 ] && { echo "runsv did not start on $1" >&2; exit 1; }; '
    "i=$((i + 1)); sleep 0.1; done; "
    'sv once "$1"'
)
# Stop the service and its runsv, then remove the directory.
RUNSV_EXIT = (
    '[ -d "$1" ] || exit 0; sv -w 30 down "$1" >/dev/null 2>&1; sv exit "$1" >/dev/null 2>&1; '
    'i=0; while sv status "$1" >/dev/null 2>&1 && [ $i -lt 50 ]; do i=$((i + 1)); sleep 0.1; done; '
    'rm -rf "$1"'
)
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# How much of a service's log an error message quotes.
LOG_LINES = 15
# An access log's line: uvicorn's, as SGLang (and the lab's simulator) write it,
# or gunicorn's, as the gateway's proxy does, with the response's size after it.
ACCESS_LOG_LINE = re.compile(
    r'"(GET|POST|PUT|DELETE|HEAD|PRI) \S+ HTTP/[\d.]+" \d{3}( (\d+|-))?\s*$')


# One line each: a newline in a word would split ExecStart= or start a directive.
Word = Annotated[str, AfterValidator(no_control_characters)]


class Service(BaseModel):
    """
    One long-running process, independent of the init system that supervises it.

    + name: the unit or runit service name (``sglang-replica``)
    + description: one line for ``systemctl status`` and the run script's header
    + command: the argv, the program first; never a shell string
    + environment: variables set for the process, in this order
    + user: the account it runs as
    + working_directory: its current directory
    + at_boot: started at boot and restarted when it fails; ``False`` for a
      start-only service that runs only when twinbolt starts it, once (a TP
      rank that comes back alone after a reboot, or restarts without its peer,
      only loops)
    + reloadable: it reads its configuration again on ``SIGHUP`` without
      closing its port (the gateway's proxy: gunicorn forks new workers on the
      socket it keeps), so a new configuration never refuses a client
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_.-]*$")]
    description: Annotated[Word, StringConstraints(min_length=1)]
    command: Annotated[list[Word], Field(min_length=1)]
    environment: dict[EnvironmentName, Word] = Field(default_factory=dict)
    user: AccountName = "root"
    working_directory: AbsolutePath = "/"
    at_boot: bool = True
    reloadable: bool = False


@dataclass(frozen=True)
class GatewayService:
    """
    A service of the gateway's own (sglang-router, the LiteLLM proxy): where
    clients reach it (the gateway's ``address``), what it binds (the site's
    ``gateway_roles.listen_address``), how it runs, and where pip finds what its
    venv holds (``gateway_roles.pip_options``); its ``port``, ``venv`` and
    ``user`` are its role's own (``gateway_roles.router_port``, ``litellm_port``
    ...), each derived by its name (:func:`~operations.site.settings.derived`).
    """

    address: str
    listen_address: str
    port: int
    venv: str
    user: str
    init_system: InitSystem
    pip_options: tuple[str, ...]

    @property
    def url(self) -> str:
        return http_url(self.address, self.port)


def unit_path(name: str) -> str:
    return f"{SYSTEMD_DIR}/{name}.service"


def run_script_path(name: str) -> str:
    return f"{RUNIT_SOURCEDIR}/{name}/run"


def log_path(name: str, log_dir: str = LOG_DIR) -> str:
    """Where a runit service's output goes (systemd services log to the journal)."""
    return f"{log_dir}/{name}.log"


class Supervisor:
    """
    What twinbolt asks of an init system: where a service's file goes, how to read
    its status, its running services and its log, and how to start and stop it.
    systemd and runit each answer once, here; nothing else branches on them.
    """

    template: Path
    mode: str

    def rendered_path(self, name: str) -> str:
        raise NotImplementedError

    def log_location(self, name: str) -> str:
        """Where an operator reads the service's log."""
        raise NotImplementedError

    def status_script(self) -> str:
        """Shell that sets ``status`` (one line) and ``pid`` (or empty) for service ``$1``."""
        raise NotImplementedError

    def running_script(self) -> str:
        """Shell that prints the running services whose name starts with ``$1``."""
        raise NotImplementedError

    def log_command(self, service: str, lines: int) -> StringCommand:
        raise NotImplementedError

    def settled_script(self) -> str:
        """Shell that prints, as ``key value`` lines, what :meth:`settled` judges for ``$1``."""
        raise NotImplementedError

    def settled(self, service: Service, observed: dict[str, str]) -> bool:
        """Whether ``service`` already runs as :meth:`start` would leave it."""
        raise NotImplementedError

    def start(self, service: Service, changed: bool,
              restarted: bool) -> Iterator[PyinfraCommand]:
        """Keep ``service`` running (its file just ``changed`` or not), restarted if asked."""
        raise NotImplementedError

    def reload(self, name: str) -> Iterator[PyinfraCommand]:
        """Have the running ``reloadable`` service ``name`` read its configuration again."""
        raise NotImplementedError

    def reread(self) -> Iterator[PyinfraCommand]:
        """Have the init system read a rewritten file before the service's next start."""
        raise NotImplementedError

    def stop(self, name: str) -> Iterator[PyinfraCommand]:
        """Stop the service and keep it from starting again; its file stays."""
        raise NotImplementedError

    def stop_script(self) -> str:
        """Shell that stops service ``$1`` and waits for it, as a script on the host does it."""
        raise NotImplementedError

    def transient_active_script(self) -> str:
        """Shell that prints ``active`` while the transient service ``$1`` runs."""
        raise NotImplementedError

    def transient_left_script(self) -> str:
        """
        Shell that prints ``left`` while anything of the transient service ``$1``
        remains, running or exited: what :meth:`transient_stop` removes.
        """
        raise NotImplementedError

    def transient_start(self, service: Service) -> Iterator[PyinfraCommand]:
        """
        Run ``service`` once, supervised but never persistent: nothing of it is
        written outside ``/run``, so a reboot forgets it, and it is not
        restarted when it exits.
        """
        raise NotImplementedError

    def transient_stop(self, name: str) -> Iterator[PyinfraCommand]:
        """Stop the transient service ``name`` and forget it; nothing when it is not there."""
        raise NotImplementedError


class Systemd(Supervisor):
    """A unit in ``/etc/systemd/system``, its output in the journal."""

    template = TEMPLATES / "systemd.service.j2"
    mode = "644"

    def rendered_path(self, name: str) -> str:
        return unit_path(name)

    def log_location(self, name: str) -> str:
        return f"journalctl -u {name}.service"

    def status_script(self) -> str:
        return ('status=$(systemctl show -p ActiveState -p SubState -p MainPID -p NRestarts '
                '"$1.service" 2>&1 | tr "\\n" " "); '
                'pid=$(systemctl show -p MainPID --value "$1.service" 2>/dev/null); ')

    def running_script(self) -> str:
        return ('systemctl list-units --type=service --state=running --plain --no-legend "$1*" '
                "| awk '{print $1}' | sed 's/\\.service$//'; ")

    def log_command(self, service: str, lines: int) -> StringCommand:
        return StringCommand(
            "journalctl", "--no-pager", "-o", "cat", "-n", str(int(lines)), "-u",
            QuoteString(f"{service}.service"), "2>/dev/null", "||", "true",
        )

    def settled_script(self) -> str:
        return ('echo "active $(systemctl is-active "$1.service" 2>/dev/null)"; '
                'echo "enabled $(systemctl is-enabled "$1.service" 2>/dev/null)"; ')

    def settled(self, service: Service, observed: dict[str, str]) -> bool:
        enabled = observed.get("enabled") == "enabled"
        return observed.get("active") == "active" and enabled == service.at_boot

    def start(self, service: Service, changed: bool,
              restarted: bool) -> Iterator[PyinfraCommand]:
        # Not at boot: started, neither enabled nor restarted when it exits.
        yield from systemd.service._inner(
            service=f"{service.name}.service", running=True, enabled=service.at_boot,
            restarted=changed or restarted, daemon_reload=changed,
        )

    def reread(self) -> Iterator[PyinfraCommand]:
        yield from systemd.daemon_reload._inner()

    def reload(self, name: str) -> Iterator[PyinfraCommand]:
        # The unit's ExecReload= sends SIGHUP to its main process.
        yield from systemd.service._inner(service=f"{name}.service", reloaded=True)

    def stop(self, name: str) -> Iterator[PyinfraCommand]:
        yield from systemd.service._inner(service=f"{name}.service", running=False,
                                          enabled=False)

    def stop_script(self) -> str:
        return 'systemctl stop "$1.service"'

    def transient_active_script(self) -> str:
        return 'systemctl is-active --quiet "$1.service" && echo active; '

    def transient_left_script(self) -> str:
        # --collect unloads the unit once it has exited; until then it is loaded.
        return ('[ "$(systemctl show -p LoadState --value "$1.service" 2>/dev/null)" = loaded ] '
                "&& echo left; ")

    def transient_start(self, service: Service) -> Iterator[PyinfraCommand]:
        # A transient unit lives in /run/systemd/transient; --collect unloads it
        # once it has exited, failed or not.
        environment = [f"--setenv={key}={value}" for key, value in service.environment.items()]
        yield StringCommand(
            "systemd-run", "--quiet", "--collect", f"--unit={service.name}",
            QuoteString(f"--description={service.description}"), f"--uid={service.user}",
            QuoteString(f"--working-directory={service.working_directory}"),
            *(QuoteString(word) for word in environment), "--",
            *(QuoteString(word) for word in service.command),
        )

    def transient_stop(self, name: str) -> Iterator[PyinfraCommand]:
        yield StringCommand("systemctl", "stop", QuoteString(f"{name}.service"))


class Runit(Supervisor):
    """A run script in ``/etc/sv``, linked from ``/etc/service``, its output in ``LOG_DIR``."""

    template = TEMPLATES / "runit.run.j2"
    mode = "755"

    def rendered_path(self, name: str) -> str:
        return run_script_path(name)

    def log_location(self, name: str) -> str:
        return log_path(name)

    def status_script(self) -> str:
        return (f'status=$(sv status {RUNIT_SVDIR}/"$1" 2>&1 | head -n 1); '
                "pid=$(echo \"$status\" | sed -n 's/^run: [^(]*(pid \\([0-9]*\\)).*/\\1/p'); ")

    def running_script(self) -> str:
        return (f'for s in {RUNIT_SVDIR}/"$1"*; do [ -e "$s" ] && sv status "$s"; done '
                "| sed -n 's|^run: [^:]*/\\([^/:]*\\): .*|\\1|p'; ")

    def log_command(self, service: str, lines: int) -> StringCommand:
        return StringCommand("tail", "-n", str(int(lines)), QuoteString(log_path(service)),
                             "2>/dev/null", "||", "true")

    def settled_script(self) -> str:
        return (f'echo "link $(readlink {RUNIT_SVDIR}/"$1")"; '
                f'[ -e {RUNIT_SOURCEDIR}/"$1"/down ] && echo "down yes"; '
                f'echo "status $(sv status {RUNIT_SVDIR}/"$1" 2>/dev/null | head -n 1)"; ')

    def settled(self, service: Service, observed: dict[str, str]) -> bool:
        # A start-only service keeps its down file, so runsvdir never starts it alone.
        return (observed.get("link") == f"{RUNIT_SOURCEDIR}/{service.name}"
                and observed.get("status", "").startswith("run:")
                and (service.at_boot or observed.get("down") == "yes"))

    def start(self, service: Service, changed: bool,
              restarted: bool) -> Iterator[PyinfraCommand]:
        if service.at_boot:
            yield from runit.service._inner(service=service.name, running=True,
                                            restarted=changed or restarted, svdir=RUNIT_SVDIR,
                                            sourcedir=RUNIT_SOURCEDIR)
        else:
            yield from started_once(service.name, restarted=changed or restarted)

    def reread(self) -> Iterator[PyinfraCommand]:
        # runsv runs the run script afresh at each start.
        yield from ()

    def reload(self, name: str) -> Iterator[PyinfraCommand]:
        # runit's "sv reload" sends SIGHUP to the process the run script execs.
        yield StringCommand(f"SVDIR={RUNIT_SVDIR}", "sv", "reload", QuoteString(name))

    def stop(self, name: str) -> Iterator[PyinfraCommand]:
        if name not in host.get_fact(RunitManaged, service=name, svdir=RUNIT_SVDIR):
            host.noop(f"runit service {name} is not managed")
            return
        # Stopped first, waiting for it to exit: removing the link alone leaves the
        # process to runsvdir's next scan, with the GPU still held meanwhile.
        yield from runit.service._inner(
            service=name, running=False, svdir=RUNIT_SVDIR, sourcedir=RUNIT_SOURCEDIR
        )
        yield from runit.manage._inner(
            service=name, managed=False, svdir=RUNIT_SVDIR, sourcedir=RUNIT_SOURCEDIR
        )

    def stop_script(self) -> str:
        return f'sv -w 90 stop {RUNIT_SVDIR}/"$1"'

    def transient_active_script(self) -> str:
        return (f'sv status {RUNIT_TRANSIENT_DIR}/"$1" 2>/dev/null | grep -q "^run:" '
                "&& echo active; ")

    def transient_left_script(self) -> str:
        return f'[ -d {RUNIT_TRANSIENT_DIR}/"$1" ] && echo left; '

    def transient_start(self, service: Service) -> Iterator[PyinfraCommand]:
        # Its own runsv, outside runsvdir's scan directory, on a directory in /run:
        # its down file keeps runsv from starting it, "sv once" from restarting it.
        directory = f"{RUNIT_TRANSIENT_DIR}/{service.name}"
        yield from files.directory._inner(path=directory, mode="0700")
        # Its log in /run too, beside its directory: kept after a disarm, until the reboot.
        yield from files.put._inner(src=StringIO(render(service, "runit", RUNIT_TRANSIENT_DIR)),
                                    dest=f"{directory}/run", mode="0755")
        yield from files.file._inner(path=f"{directory}/down")
        yield shell_script(RUNSV_ONCE, directory)

    def transient_stop(self, name: str) -> Iterator[PyinfraCommand]:
        yield shell_script(RUNSV_EXIT, f"{RUNIT_TRANSIENT_DIR}/{name}")


SUPERVISORS: dict[InitSystem, Supervisor] = {"systemd": Systemd(), "runit": Runit()}


def rendered_path(name: str, init_system: InitSystem) -> str:
    return SUPERVISORS[init_system].rendered_path(name)


def refuse_control_characters(value: str, where: str) -> None:
    """A control character has no quoting in a unit file: a newline starts a directive."""
    if found := control_characters(value):
        raise ValueError(f"{value!r} cannot be written into {where}: it holds the control "
                         f"character(s) {', '.join(found)}")


def unit_quote(word: str, variables: bool = True) -> str:
    """
    One word of a systemd ``ExecStart=`` line, or with ``variables=False`` of an
    ``Environment=`` line.

    systemd expands ``%`` specifiers in both, and ``$`` variables in
    ``ExecStart=`` only (in ``Environment=`` "``$`` has no special meaning",
    systemd.exec(5)), so those are escaped; words with blanks, quotes or
    backslashes are double-quoted. A control character is refused: no quoting
    keeps a newline on its line.
    """
    refuse_control_characters(word, "a systemd unit")
    word = word.replace("%", "%%")
    if variables:
        word = word.replace("$", "$$")
    if word and not re.search(r"[\s\"'\\;]", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def unit_value(value: str) -> str:
    """
    The value of a systemd directive that takes it raw, unquoted (``User=``,
    ``WorkingDirectory=``, ``Description=``): its ``%`` specifiers escaped. A
    control character, or a trailing backslash (which continues the line), is
    refused; so is a leading ``-`` or ``+`` that some directives read as a flag.
    """
    refuse_control_characters(value, "a systemd unit")
    if value.endswith("\\") or value[:1] in ("-", "+", "!", "@", ":", "~"):
        raise ValueError(f"{value!r} cannot be written as a systemd directive's value: it "
                         "starts with a prefix character or ends with a backslash")
    return value.replace("%", "%%")


def template_context(service: Service, log_dir: str = LOG_DIR) -> dict[str, object]:
    """
    What both templates are rendered with: the service, where runit's wrapper
    logs it, and the quoting for each format.
    """
    return {
        "service": service,
        "log_dir": log_dir,
        "log_path": log_path(service.name, log_dir),
        "sh": shlex.quote,
        "sh_join": shlex.join,
        "unit_quote": unit_quote,
        "unit_value": unit_value,
        "unit_join": lambda words: " ".join(unit_quote(word) for word in words),
    }


def render(service: Service, init_system: InitSystem, log_dir: str = LOG_DIR) -> str:
    """
    The file :func:`present` uploads, rendered locally (pyinfra's own jinja2
    environment); a runit service logs into ``log_dir``.
    """
    return get_template(str(SUPERVISORS[init_system].template)).render(
        template_context(service, log_dir))


def rendered_digest(service: Service, init_system: InitSystem) -> str:
    """The mode and SHA-1 of the file :func:`present` writes, as :class:`FileDigest` reads one."""
    return digest(render(service, init_system), SUPERVISORS[init_system].mode)


def rendered_differs(service: Service, init_system: InitSystem) -> bool:
    """
    Whether the host's rendered file is missing or not what :func:`present`
    would write: its content or its mode, as :func:`present` compares them.
    """
    return (host.get_fact(FileDigest, path=rendered_path(service.name, init_system))
            != rendered_digest(service, init_system))


def observed(service: Service, init_system: InitSystem) -> tuple[str | None, bool]:
    """
    In one read: the digest of the host's rendered file for ``service`` (``None``
    without one), and whether the init system runs it as :func:`present` would
    leave it, its file aside (running, and enabled at boot or start-only as declared).
    """
    supervisor = SUPERVISORS[init_system]
    seen = host.get_fact(ServiceSettled, service=service.name,
                         path=supervisor.rendered_path(service.name), init_system=init_system)
    return seen.get("file"), supervisor.settled(service, seen)


# Facts


class AccountExists(EmptyMeansSomething):
    """
    Whether the account ``user`` a service runs as exists. pyinfra's ``Users``
    reads every account with its lastlog, a quarter of a second each converge.
    """

    def command(self, user: str) -> StringCommand:
        return shell_script('id -u "$1" >/dev/null 2>&1 && echo yes', user)

    def process(self, output: list[str]) -> bool:
        return bool(output) and output[0].strip() == "yes"


REDACTED = "<redacted>"
# Each argument of a command line as an ``arg`` line, the value of a key's flag
# replaced (``--api-key VALUE``, ``--control-plane-api-keys=VALUE``), on the host:
# sglang-router holds its keys on its command line from its start until it renames
# itself, and ``pyinfra -vvv`` prints a fact's output.
KEY_FLAG_PATTERN = "^--[A-Za-z0-9_-]*(key|keys|secret|token|password)"
ARGV_REDACTED = (
    f'{{ line = $0; if (hide) line = "{REDACTED}"; '
    f'else if (line ~ /{KEY_FLAG_PATTERN}=/) sub(/=.*/, "={REDACTED}", line); '
    f'print "arg " line; hide = ($0 ~ /{KEY_FLAG_PATTERN}$/) }}'
)


class ServiceProcess(EmptyMeansSomething):
    """
    The process an init system runs for a service, read from ``/proc``: its argv and
    the named ``variables`` of its environment are what actually runs, whatever the
    rendered file now says.

    Only the variables a check compares are read, never the whole environment:
    the proxy's holds ``LITELLM_MASTER_KEY`` and the large backend's key, and a
    fact's output is printed by ``pyinfra -vvv``.

    .. code:: python

        {"running": True, "status": "run: sglang-replica: (pid 4242) 73s", "pid": 4242,
         "seconds": 73.2, "argv": ["/opt/sglang/bin/python", "-m", "sglang.launch_server", ...],
         "environment": {"NCCL_IB_DISABLE": "1", ...}, "children": [4250, 4251]}

    A process that exits while it is read keeps its ``pid`` with ``running``
    false: it was there, and is gone.
    """

    def command(self, service: str, init_system: InitSystem,
                variables: tuple[str, ...] = ()) -> StringCommand:
        for name in variables:
            if not ENVIRONMENT_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an environment variable's name")
        script = SUPERVISORS[init_system].status_script() + (
            'echo "status $status"; '
            '[ -n "$pid" ] && [ "$pid" != 0 ] && [ -r "/proc/$pid/cmdline" ] || exit 0; '
            'echo "pid $pid"; '
            # Started this many clock ticks after boot (field 22 of stat, after the name).
            "echo \"started $(sed 's/.*) //' /proc/$pid/stat | cut -d' ' -f20) "
            "$(getconf CLK_TCK) $(cut -d' ' -f1 /proc/uptime)\"; "
            f"tr '\\0' '\\n' < \"/proc/$pid/cmdline\" | awk '{ARGV_REDACTED}'; "
            # Its children (a gunicorn's workers), which a reload replaces.
            'echo "children $(cat /proc/$pid/task/*/children 2>/dev/null)"; '
            # Each wanted name (an identifier: no regex syntax), as NUL-separated
            # entries, so that a value holding a newline cannot fake another's.
            'shift; for name in "$@"; do '
            "grep -z -m 1 -e \"^$name=\" \"/proc/$pid/environ\" | tr '\\0' '\\n' "
            "| head -n 1 | sed 's/^/env /'; done; "
            # A process that exits while it is read leaves a zombie whose
            # cmdline and environ read empty: that is a crash, not a wrong process.
            "state=$(sed 's/.*) //' \"/proc/$pid/stat\" 2>/dev/null | cut -d' ' -f1); "
            'case "$state" in ""|Z|X) echo "exited";; esac; true'
        )
        return shell_script(script, service, *variables)

    def process(self, output: list[str]) -> dict:
        process: dict = {"running": False, "status": "", "pid": None, "seconds": None,
                         "argv": [], "environment": {}, "children": []}
        for line in output:
            kind, _, value = line.partition(" ")
            if kind == "status":
                process["status"] = value.strip()
            elif kind == "pid":
                process["pid"] = int(value)
                process["running"] = True
            elif kind == "started":
                ticks, per_second, uptime = value.split()
                process["seconds"] = float(uptime) - int(ticks) / int(per_second)
            elif kind == "arg":
                process["argv"].append(value)
            elif kind == "children":
                process["children"] = sorted(int(pid) for pid in value.split())
            elif kind == "env":
                key, _, val = value.partition("=")
                process["environment"][key] = val
            elif kind == "exited":
                process["running"] = False
                process["status"] += f"; pid {process['pid']} exited as it was read"
        return process


class ServiceSettled(FactBase):
    """
    In one command, what :func:`present` would otherwise read with a dozen of
    pyinfra's facts: the rendered file's mode and SHA-1, and the init system's
    view of the service (:meth:`Supervisor.settled_script`).

    .. code:: python

        {"file": "755 3f786850e387550fdab836ed7e6dc881de23001b",
         "link": "/etc/sv/sglang-router", "status": "run: /etc/service/sglang-router: (pid 42) 9s"}
    """

    default = dict

    def command(self, service: str, path: str, init_system: InitSystem) -> StringCommand:
        script = digest_script('"$2"') + SUPERVISORS[init_system].settled_script() + "true"
        return shell_script(script, service, path)

    def process(self, output: list[str]) -> dict[str, str]:
        return dict(line.strip().partition(" ")[::2] for line in output if line.strip())


class ServicePids(FactBase):
    """
    The main process of each of ``services`` that runs, in one command.

    .. code:: python

        {"sglang-replica": 4242}
    """

    default = dict

    def command(self, services: tuple[str, ...], init_system: InitSystem) -> StringCommand:
        script = ("pid_of() { " + SUPERVISORS[init_system].status_script()
                  + 'echo "$1 $pid"; }; for s in "$@"; do pid_of "$s"; done')
        return shell_script(script, *services)

    def process(self, output: list[str]) -> dict[str, int]:
        pids = {}
        for line in output:
            service, _, pid = line.strip().partition(" ")
            if pid.isdigit() and int(pid):
                pids[service] = int(pid)
        return pids


class RunningServices(FactBase):
    """
    The names of the running services whose name starts with ``prefix``.

    .. code:: python

        ["sglang-replica"]
    """

    default = list

    def command(self, prefix: str, init_system: InitSystem) -> StringCommand:
        script = SUPERVISORS[init_system].running_script() + "true"
        return shell_script(script, prefix)

    def process(self, output: list[str]) -> list[str]:
        return sorted(line.strip() for line in output if line.strip())


# More lines than a service logs between two starts: its whole log, searched.
WHOLE_LOG_LINES = 1_000_000


# A key in a log line, as SGLang prints its arguments at start (``api_key='sk-…'``,
# ``admin_api_key=…``) or a command line shows one (``--api-key sk-…``): the
# value is replaced on the host, so that no output of pyinfra's holds it.
REDACT_KEYS = r"""s#(api[_-]key['"]?[:=]? *['"]?)[A-Za-z0-9._~+/=-]{8,}#\1<redacted>#g"""


def redacted(command: StringCommand) -> StringCommand:
    """``command``'s output with every key in it replaced (:data:`REDACT_KEYS`)."""
    return StringCommand("(", command, ")", "|", "sed", "-E", QuoteString(REDACT_KEYS))


class ServiceLog(FactBase):
    """
    The last lines a service logged: its runit log file, or its systemd journal.

    .. code:: python

        ["[2026-01-01 10:00:00] Load weight begin. ...", "..."]
    """

    default = list

    def command(self, service: str, init_system: InitSystem, lines: int = 20) -> StringCommand:
        return redacted(SUPERVISORS[init_system].log_command(service, lines))

    def process(self, output: list[str]) -> list[str]:
        # Colour codes (sglang-router logs in colour) only garble an error message.
        return [ANSI_ESCAPE.sub("", line) for line in output]


# Operations


@operation()
def present(
    service: Service, init_system: InitSystem, restarted: bool = False, reloaded: bool = False
) -> Iterator[PyinfraCommand]:
    """
    Render a service, and keep it running: enabled at boot, or, for a service
    not ``at_boot``, started once (a systemd unit neither enabled nor restarted;
    a runit service with a ``down`` file, started with ``sv once``).

    A running service is restarted when its rendered file changed, or when
    ``restarted`` says the state needs it (say, the link under it was replaced).
    A ``reloaded`` one, running from an unchanged file, only reads its
    configuration again (``Service.reloadable``): its port never closes.

    + service: the :class:`Service` to run
    + init_system: ``systemd`` (a unit, logs in the journal) or ``runit`` (a run
      script in ``/etc/sv``, linked from ``/etc/service``, logs appended to
      ``/var/log/twinbolt/NAME.log``)
    + restarted: restart it even if its rendered file is unchanged
    + reloaded: reload it (``SIGHUP``) if it runs from an unchanged file, else
      start or restart it as its file says

    **Example:**

    .. code:: python

        services.present(
            name="Run the echo server",
            service=Service(name="echo", description="An echo server",
                            command=["/usr/bin/socat", "TCP-LISTEN:7,fork", "EXEC:cat"]),
            init_system="systemd",
        )
    """
    supervisor = SUPERVISORS[init_system]
    path = supervisor.rendered_path(service.name)
    on_disk, settled = observed(service, init_system)
    if not restarted and on_disk == rendered_digest(service, init_system) and settled:
        if reloaded:
            if not service.reloadable:
                raise ValueError(f"service {service.name} cannot be reloaded: it does not "
                                 "read its configuration again on SIGHUP")
            yield from supervisor.reload(service.name)
            return
        host.noop(f"service {service.name} runs, {path} unchanged")
        return
    changed = False
    for command in files.template._inner(
        src=str(supervisor.template),
        dest=path,
        mode=supervisor.mode,
        **template_context(service),
    ):
        changed = True
        yield command
    yield from supervisor.start(service, changed, restarted)


@operation()
def rendered(service: Service, init_system: InitSystem) -> Iterator[PyinfraCommand]:
    """
    Render a service's file without touching the running process: what it would
    run after its next start, for a service that took the change live through
    its own API (the router's workers). systemd is told to read the unit again.

    + service: the :class:`Service` whose file to write
    + init_system: ``systemd`` or ``runit``

    **Example:**

    .. code:: python

        services.rendered(
            name="The router's unit names the workers it fronts now",
            service=router_service(router),
            init_system="systemd",
        )
    """
    supervisor = SUPERVISORS[init_system]
    changed = False
    for command in files.template._inner(src=str(supervisor.template),
                                         dest=supervisor.rendered_path(service.name),
                                         mode=supervisor.mode, **template_context(service)):
        changed = True
        yield command
    if changed:
        yield from supervisor.reread()


def account_present(user: str) -> Iterator[PyinfraCommand]:
    """The system account a service runs as, created if missing."""
    if not host.get_fact(AccountExists, user=user):
        yield from server.user._inner(user=user, system=True)


def started_once(name: str, restarted: bool) -> Iterator[PyinfraCommand]:
    """
    A runit service that runs once when started: ``sv up`` (and so pyinfra's own
    start and restart) would have runsv restart it whenever it exits.
    """
    # runit's status of a service it does not manage yet is an error, not "down".
    managed = name in host.get_fact(RunitManaged, service=name, svdir=RUNIT_SVDIR)
    running = managed and host.get_fact(RunitStatus, service=name, svdir=RUNIT_SVDIR).get(name)
    # Managed, its down file keeping runsvdir from starting it at boot.
    yield from runit.service._inner(service=name, running=None, enabled=False,
                                    svdir=RUNIT_SVDIR, sourcedir=RUNIT_SOURCEDIR)
    if running and restarted:
        yield StringCommand(f"SVDIR={RUNIT_SVDIR}", "sv", "-v", "-w", "90", "down",
                            QuoteString(name))
        running = False
    if running:
        host.noop(f"service {name} is running")
    else:
        yield StringCommand(f"SVDIR={RUNIT_SVDIR}", "sv", "once", QuoteString(name))


@operation()
def absent(service: str, init_system: InitSystem) -> Iterator[PyinfraCommand]:
    """
    Stop a service and keep it from starting again.

    The rendered file stays, as an available but disabled service: the systemd
    unit is disabled, the runit link in ``/etc/service`` removed.

    + service: the service's name
    + init_system: ``systemd`` or ``runit``

    **Example:**

    .. code:: python

        services.absent(name="Stop the echo server", service="echo", init_system="systemd")
    """
    yield from SUPERVISORS[init_system].stop(service)


def log_tails(workstations: list[tuple[Host, str, InitSystem]]) -> str:
    """
    The last lines of each named service's log, host by host, for an error message.

    HTTP access lines are left out: the acceptance probes' own requests would
    push out what the server said about loading, joining and crashing.
    A host whose connection has died is said to be, not read: its loss is the
    evidence, and a failed read would fail that host in the middle of another's step.
    """
    sections = []
    for other, name, init_system in workstations:
        where = SUPERVISORS[init_system].log_location(name)
        if connect.lost(other):
            sections.append(f"  {other.name} {name}: not read, the connection to "
                            f"{other.name} was lost")
            continue
        lines = other.get_fact(ServiceLog, service=name, init_system=init_system,
                               lines=LOG_LINES * 20, _ignore_errors=True)
        lines = [line for line in lines if not ACCESS_LOG_LINE.search(line)][-LOG_LINES:]
        body = "\n".join(f"    | {line}" for line in lines) or "    (empty)"
        sections.append(f"  {other.name} {name}, last lines of {where} (requests left out):"
                        f"\n{body}")
    return "\n".join(sections)


class ServiceLogMatches(ServiceLog):
    """
    The last lines of a service's whole log that hold ``text``: lines logged
    once at start (NCCL's choice of transport, say) that :class:`ServiceLog`'s
    last lines have long scrolled past.

    .. code:: python

        ["... NCCL INFO NET/Socket : Using [0]thunderbolt0:169.254.77.1<0>", "..."]
    """

    def command(self, service: str, init_system: InitSystem, text: str,
                lines: int = 40) -> StringCommand:
        whole = SUPERVISORS[init_system].log_command(service, WHOLE_LOG_LINES)
        return redacted(StringCommand("(", whole, ")", "|", "grep", "-F", "--",
                                      QuoteString(text), "|", "tail", "-n", str(int(lines))))
