"""
The end-to-end tests' tools: real pyinfra runs, real testinfra checks.

Helpers here run the project's own commands exactly as an operator types them,
and read the hosts over the lab's SSH config to prove what changed and what did
not. Every test that moves the hosts leaves them in a verified production.
"""

from __future__ import annotations

import functools
import json
import re
import shlex
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from operations import services
from operations.gateway.front import front_name
from operations.plumbing import keys
from operations.safety import guard
from operations.serving import sglang as serving
from operations.site.hosts import InventoryEntry, in_group, inventory_entries
from operations.site.settings import GatewaySettings, WorkstationSettings

REPO = Path(__file__).resolve().parents[2]
PYTHON = REPO / ".venv" / "bin" / "python"
PYINFRA = REPO / ".venv" / "bin" / "pyinfra"
SSH_CONFIG = REPO / ".lab" / "ssh" / "config"
# The lab's link is back within about 2 s of a load; a wait that must run out need not
# cost the default 30 s, twice (the failed run, then the rollback's own wait).
SHORT_LINK_WAIT = ("--data", "link_wait_seconds=10")


@dataclass
class DeployRun:
    """One ``pyinfra inventory.py deploy.py`` run: exit code, results and what it printed."""

    returncode: int
    results: dict
    output: str

    def changed_hosts(self) -> set[str]:
        return {host for op in self.results.get("operations", []) for host in op["success"]}

    def failed_hosts(self) -> set[str]:
        return set(self.results.get("failed_hosts", []) or [])


def deploy(state: str | None, *extra: str, timeout: float = 600) -> DeployRun:
    data = ["--data", f"state={state}"] if state is not None else []
    result = subprocess.run(
        [str(PYINFRA), "-y", "--json", "inventory.py", "deploy.py", *data, *extra],
        cwd=REPO, capture_output=True, text=True, timeout=timeout,
    )
    try:
        results = json.loads(result.stdout).get("results", {}) if result.stdout.strip() else {}
    except json.JSONDecodeError:
        results = {}
    return DeployRun(result.returncode, results or {}, result.stdout + result.stderr)


def deploy_meanwhile(state: str, marker: str, meanwhile: Callable[[int], object], *extra: str,
                     timeout: float = 600) -> DeployRun:
    """
    A deploy to ``state`` during which ``meanwhile(pid)`` is done, as soon as the
    run prints ``marker`` (the title of the step it has reached); what it printed,
    without pyinfra's JSON results. The run leads a process group of its own, as
    a terminal's job does: ``os.killpg(pid, signal.SIGINT)`` is a Ctrl-C.
    """
    with tempfile.TemporaryFile("w+") as printed:
        running = subprocess.Popen(
            [str(PYINFRA), "-y", "inventory.py", "deploy.py", "--data", f"state={state}",
             *extra], cwd=REPO, stdout=printed, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + timeout
            while running.poll() is None and time.monotonic() < deadline:
                printed.seek(0)
                if marker in printed.read():
                    meanwhile(running.pid)
                    break
                time.sleep(0.2)
            returncode = running.wait(timeout=max(deadline - time.monotonic(), 1))
        finally:
            if running.poll() is None:
                running.kill()
                running.wait()
        printed.seek(0)
        output = printed.read()
    assert marker in output, f"the run never reached {marker!r}: {output[-3000:]}"
    return DeployRun(returncode, {}, output)


def refused_for_a_recorded_stall(pairing: str, *extra: str) -> DeployRun:
    """A ``tp2_e2e`` run that the ledger refuses on ``pairing``, having changed nothing."""
    before = snapshot()
    started = time.monotonic()
    run = deploy("tp2_e2e", *extra)
    print(f"refusal on a recorded stall: {time.monotonic() - started:.1f}s")
    assert run.returncode != 0
    assert ("driver layer: the candidate's TX E2E has stalled on the controller pairing "
            f"{pairing}") in run.output, run.output[-3000:]
    assert "force_candidate=yes" in run.output
    assert snapshot() == before, "a refused run must change nothing"
    return run


def dry_run(state: str, timeout: float = 600) -> DeployRun:
    """
    ``pyinfra inventory.py deploy.py --data state=NAME --dry``, exactly as an operator
    types it: no ``-y`` and no ``--json``, so pyinfra prints its plan, the
    ``--> Detected changes:`` table (read it with :func:`pyinfra_table`), and exits.
    """
    result = subprocess.run(
        [str(PYINFRA), "inventory.py", "deploy.py", "--data", f"state={state}", "--dry"],
        cwd=REPO, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )
    return DeployRun(result.returncode, {}, result.stdout + result.stderr)


# pyinfra's tables, as pyinfra_cli.prints.print_rows lays them out: every column
# left-justified to its widest cell plus four spaces, so a column starts at the
# same offset in each row as in the header; a title may hold single spaces.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
TABLE_TITLE = re.compile(r"\S+(?: \S+)*")
# The columns that name hosts a run changed (Success, in --> Results:) or would
# change (Change and Conditional Change, in --> Detected changes:); "-" is none.
CHANGE_COLUMNS = ("Success", "Change", "Conditional Change")
TOTAL_ROW = "Grand total"


def pyinfra_table(output: str, heading: str) -> list[dict[str, str]]:
    """
    The rows of the last table pyinfra printed under ``--> HEADING``, each keyed by
    the header's column titles: ``"Results:"`` after a run (Operation, Hosts,
    Success, Error, No Change), ``"Detected changes:"`` for a plan (Operation,
    Change, Conditional Change). Raises ``AssertionError`` when there is no such
    table, so a missing table can never read as an empty one.
    """
    lines = ANSI_ESCAPE.sub("", output).splitlines()
    found = [index for index, line in enumerate(lines) if line.strip() == f"--> {heading}"]
    if not found or found[-1] + 1 >= len(lines):
        raise AssertionError(f"pyinfra printed no '--> {heading}' table:\n{output[-2000:]}")
    header = lines[found[-1] + 1]
    columns = [(match.start(), match.group()) for match in TABLE_TITLE.finditer(header)]
    if not columns or columns[0][1] != "Operation":
        raise AssertionError(f"'--> {heading}' is not followed by a table header: {header!r}")
    ends = [start for start, _ in columns[1:]] + [None]
    rows = []
    for line in lines[found[-1] + 2:]:
        if not line.strip() or line.lstrip().startswith("-->"):
            break
        rows.append({title: line[start:end].strip()
                     for (start, title), end in zip(columns, ends, strict=True)})
    return rows


def reported_changes(rows: list[dict[str, str]]) -> dict[str, dict[str, str]]:
    """
    Each operation whose row names a host changed or to be changed, with those cells:
    ``{"Serving: the replicas run": {"Change": "2 (wsa, wsb)"}}``; empty when none does.
    """
    changes = {}
    for row in rows:
        if row.get("Operation") == TOTAL_ROW:
            continue
        cells = {column: row[column] for column in CHANGE_COLUMNS
                 if row.get(column, "-") not in ("-", "")}
        if cells:
            changes[row["Operation"]] = cells
    return changes


def verify(state: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``pytest tests/verify --state NAME`` (``extra``: ``--pair b``), as the operator runs it."""
    return subprocess.run(
        [str(PYTHON.with_name("pytest")), "tests/verify", "--state", state, *extra, "-q", "-p",
         "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=600,
    )


def ssh(host: str, command: str) -> str:
    result = subprocess.run(["ssh", "-F", str(SSH_CONFIG), host, command],
                            capture_output=True, text=True, timeout=60)
    return result.stdout


# What a run could change, named by the inventory itself


# Data keys name a host's own files by their ending; a key of another layer's
# prefix (the lab's group data reaches every lab host) names files elsewhere.
FILE_KEY = re.compile(r"_(file|dir)$")
VENV_KEY = re.compile(r"_venv$")
# Secrets are watched by metadata (inode, size, mode, owner, mtime), never by content.
SECRET_KEY = re.compile(r"keys?_file$")
LAYER_PREFIXES = {
    "workstations": ("serving_", "link_", "candidate_"),
    "gateway": ("gateway_roles_",),
}
# Paths on the machine running twinbolt: its SSH files and the SGLang servers' keys.
LOCAL_PREFIXES = ("ssh_", "serving_api_key_file", "serving_admin_api_key_file")


@dataclass(frozen=True)
class Watched:
    """What :func:`snapshot` reads on one host, all of it from the inventory's data."""

    files: tuple[str, ...]
    secrets: tuple[str, ...]
    directories: tuple[str, ...]
    venvs: tuple[str, ...]
    services: tuple[tuple[str, str], ...]
    module: str | None


def owns(entry: InventoryEntry, key: str) -> bool:
    """Whether a data key describes this host (its own layer's prefix, or none)."""
    if key.startswith(LOCAL_PREFIXES):
        return False
    for group, prefixes in LAYER_PREFIXES.items():
        if key.startswith(prefixes):
            return group in entry.groups
    return True


def watched(entry: InventoryEntry) -> Watched:
    """
    A host's files and services, from its merged inventory data: every path its own
    ``*_file``/``*_dir`` keys name (``run_dir``, the gateway's LiteLLM config and
    master key, a site's ``/etc/twinbolt/...``), the directories holding those
    files, its ``*_venv`` keys, and each twinbolt service it runs (the SGLang
    replica and TP ranks on a workstation; sglang-router and the LiteLLM proxy on
    the gateway) with its rendered unit or run script.
    """
    data = entry.data
    files, secrets, directories, venvs = [], [], [], []
    for key, value in sorted(data.items()):
        if not (isinstance(value, str) and value.startswith("/") and owns(entry, key)):
            continue
        if VENV_KEY.search(key):
            venvs.append(value)
        elif not FILE_KEY.search(key):
            continue
        elif key.endswith("_dir"):
            directories.append(value)
        else:
            (secrets if SECRET_KEY.search(key) else files).append(value)
            directories.append(str(Path(value).parent))
    names: tuple[str, ...] = ()
    init = None
    if "workstations" in entry.groups:
        names, init = serving.GPU_SERVICES, data["serving_init_system"]
    elif "gateway" in entry.groups:
        roles = GatewaySettings.of(entry).roles
        names = (serving.ROUTER, roles.litellm_service, front_name(roles.litellm_service))
        init = roles.init_system
    files += [services.rendered_path(name, init) for name in names]
    return Watched(
        files=tuple(dict.fromkeys(files)),
        secrets=tuple(dict.fromkeys(secrets)),
        directories=tuple(dict.fromkeys(directories)),
        venvs=tuple(dict.fromkeys(venvs)),
        services=tuple((name, init) for name in names),
        module=data.get("candidate_module_name") if "workstations" in entry.groups else None,
    )


# Each line is "WHAT<TAB>VALUE"; snapshot() keys them "HOST: WHAT". A service's
# main pid is found as operations/services.py's ServiceProcess finds it.
SERVICE_SCRIPT = r"""
if [ "$2" = runit ]; then
  status=$(sv status "$3/$1" 2>&1 | head -n 1)
  state=${status%%:*}
  pid=$(echo "$status" | sed -n 's/^run: [^(]*(pid \([0-9]*\)).*/\1/p')
  enabled=$(readlink "$3/$1" || echo "not linked")
else
  state=$(systemctl show -p ActiveState --value "$1.service" 2>&1)
  pid=$(systemctl show -p MainPID --value "$1.service" 2>/dev/null)
  enabled=$(systemctl is-enabled "$1.service" 2>&1)
fi
started=-
if [ -n "$pid" ] && [ "$pid" != 0 ] && [ -r "/proc/$pid/stat" ]; then
  # Field 22 of stat, counted after the command name: clock ticks after boot.
  started=$(sed 's/.*) //' "/proc/$pid/stat" | cut -d' ' -f20)
fi
printf 'service %s\t%s pid %s started %s, enabled: %s\n' "$1" "$state" "${pid:--}" \
  "$started" "$enabled"
"""

FILE_SCRIPT = r"""
for f in "$@"; do
  if [ -e "$f" ]; then
    printf 'file %s\t%s %s\n' "$f" "$(stat -c '%F %a %U:%G %s %Y %i' "$f")" \
      "$(sha256sum < "$f" | cut -d' ' -f1)"
  else printf 'file %s\tmissing\n' "$f"; fi
done
"""

SECRET_SCRIPT = r"""
for f in "$@"; do
  printf 'secret %s\t%s\n' "$f" "$(stat -c '%F %a %U:%G %s %Y %i' "$f" 2>&1)"
done
"""

# A directory itself is read without its mtime, which any entry that comes and goes
# changes: the host lock a refused run took and released, bookkeeping, leaves only that.
DIRECTORY_SCRIPT = r"""
for d in "$@"; do
  if [ -d "$d" ]; then
    printf 'directory %s\t. %s\n' "$d" "$(stat -c '%F %a %U' "$d")"
    find "$d" -xdev -mindepth 1 -printf '%P %y %m %u %s %T@\n' | sort |
      while IFS= read -r entry; do printf 'directory %s\t%s\n' "$d" "$entry"; done
  else printf 'directory %s\tmissing\n' "$d"; fi
done
"""

VENV_SCRIPT = r"""
for v in "$@"; do
  printf 'venv %s\t%s\n' "$v" \
    "$(ls -d "$v"/lib/python*/site-packages/*.dist-info 2>&1 | sha256sum | cut -d' ' -f1)"
done
"""

MODULE_SCRIPT = r"""
m=/sys/module/$1
printf 'module %s\t%s\n' "$1" "$(cat "$m/initstate" 2>&1)"
for p in "$m"/parameters/*; do [ -e "$p" ] && printf 'module %s\t%s=%s\n' "$1" "${p##*/}" \
  "$(cat "$p")"; done
printf 'module %s\tbuild-id %s\n' "$1" \
  "$(od -An -tx1 -v "$m/notes/.note.gnu.build-id" 2>&1 | tr -d ' \n')"
"""

# The init systems' own view, every service's: which exist, which are linked to
# run or enabled, and their run scripts and unit files (the lab's own among them).
INIT_SCRIPT = r"""
for d in "$1" "$2" "$3" "$3/multi-user.target.wants"; do
  printf 'init %s\t%s\n' "$d" "$(ls "$d" 2>&1 | tr '\n' ' ')"; done
for f in "$2"/*/run "$3"/*.service; do [ -e "$f" ] && printf 'init %s\t%s\n' "$f" \
  "$(sha256sum < "$f" | cut -d' ' -f1)"; done
true
"""


def part(script: str, *arguments: str) -> str:
    return " ".join(["sh", "-c", shlex.quote(script), "-", *map(shlex.quote, arguments)])


def snapshot_command(what: Watched) -> str:
    """One shell command reading everything ``what`` names; ``VALUE`` lines are stable."""
    parts = [part(FILE_SCRIPT, *what.files), part(SECRET_SCRIPT, *what.secrets),
             part(DIRECTORY_SCRIPT, *what.directories), part(VENV_SCRIPT, *what.venvs)]
    parts += [part(SERVICE_SCRIPT, name, init, services.RUNIT_SVDIR)
              for name, init in what.services]
    if what.module:
        parts.append(part(MODULE_SCRIPT, what.module))
    parts.append(part(INIT_SCRIPT, services.RUNIT_SVDIR, services.RUNIT_SOURCEDIR,
                      services.SYSTEMD_DIR))
    return "; ".join(parts) + "; echo end"


def parse_snapshot(host: str, output: str) -> dict[str, str]:
    """``WHAT<TAB>VALUE`` lines as ``{"HOST: WHAT": "VALUE\\n…"}``; fails unless complete."""
    lines = output.splitlines()
    if not lines or lines[-1] != "end":
        raise AssertionError(f"{host}: the snapshot did not complete: {output[-1000:]!r}")
    found: dict[str, list[str]] = {}
    for line in lines[:-1]:
        what, _, value = line.partition("\t")
        found.setdefault(f"{host}: {what}", []).append(value)
    return {what: "\n".join(values) for what, values in found.items()}


@functools.cache
def inventory() -> tuple[InventoryEntry, ...]:
    return tuple(inventory_entries(REPO))


def init_system() -> services.InitSystem:
    """The init system the lab's hosts run, as the inventory tells twinbolt."""
    return next(entry.data["serving_init_system"] for entry in inventory()
                if "workstations" in entry.groups)


def service_process(host: str, service: str) -> dict:
    """A service's process on ``host``, read as twinbolt reads it (``ServiceProcess``)."""
    fact = services.ServiceProcess()
    command = fact.command(service, init_system()).get_raw_value()
    return fact.process(ssh(host, command).splitlines())


def service_log(host: str, service: str) -> str:
    """Everything a service logged: its runit log file, or its journal."""
    return ssh(host, services.ServiceLog().command(service, init_system(), 100000)
               .get_raw_value())


def restarted(host: str, name: str) -> None:
    """Restart a service on ``host`` through its init system."""
    command = (f"systemctl restart {name}.service" if init_system() == "systemd"
               else f"sv restart {services.RUNIT_SVDIR}/{name}")
    result = subprocess.run(["ssh", "-F", str(SSH_CONFIG), host, command],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, f"{host}: {command}: {result.stderr}"


def guard_disarmed(host: str) -> None:
    """The guard stopped on ``host`` as a run disarms it before a driver reload."""
    for command in services.SUPERVISORS[init_system()].transient_stop(guard.NAME):
        ssh(host, command.get_raw_value())


def removed(host: str, *names: str) -> None:
    """Services stopped and no longer started at boot, as if never installed; files stay."""
    if init_system() == "systemd":
        units = " ".join(f"{name}.service" for name in names)
        ssh(host, f"systemctl disable --now {units}")
    else:
        links = " ".join(f"{services.RUNIT_SVDIR}/{name}" for name in names)
        ssh(host, f"sv -w 30 down {links}; rm -f {links}")


def snapshot() -> dict[str, str]:
    """
    What a run could change on each host, keyed ``"HOST: WHAT"``: every file and
    directory the inventory's data names (a secret by its metadata only), the
    virtualenvs it names, each twinbolt service's state, main pid and start time
    (a restart shows as a new pid or start), and on workstations the loaded driver.

    The lab's own ``lab-large`` backend is not twinbolt's and is left out: no
    deploy manages it, and the ``fallback_down`` fault stops it on purpose.
    """
    taken: dict[str, str] = {}
    for entry in inventory():
        result = subprocess.run(
            ["ssh", "-F", str(SSH_CONFIG), entry.name, snapshot_command(watched(entry))],
            capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            raise AssertionError(f"{entry.name}: cannot take a snapshot: {result.stderr}")
        taken.update(parse_snapshot(entry.name, result.stdout))
    return taken


def lab(*arguments: str) -> None:
    """A lab command that must succeed; its own words when it does not."""
    done = subprocess.run([str(PYTHON), "-m", "lab", *arguments], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, f"lab {' '.join(arguments)}: {done.stdout}{done.stderr}"


@contextmanager
def fault(name: str) -> Iterator[None]:
    """A lab fault switched on for the block, and off again whatever happens."""
    lab("fault", name, "on")
    try:
        yield
    finally:
        lab("fault", name, "off")


def master_key() -> str:
    """The gateway's LiteLLM master key, read where the inventory says it lives."""
    gateway = next(entry for entry in inventory() if "gateway" in entry.groups)
    key = ssh(gateway.name, f"cat {shlex.quote(gateway.data['gateway_roles_master_key_file'])}")
    assert key.strip(), "the gateway holds no master key"
    return key.strip()


def secrets() -> dict[str, str]:
    """Every key a report, a log tail or pyinfra's output must never hold, by name."""
    rank0 = next(entry for entry in inventory() if "workstations" in entry.groups)
    serving = WorkstationSettings.of(rank0).serving
    return {"the master key": master_key(),
            "the SGLang servers' key": keys.local_key(serving.api_key_file),
            "their admin key": keys.local_key(serving.admin_api_key_file)}


def places_holding(secret: str, texts: dict[str, str]) -> list[str]:
    """The names of the texts (outputs, reports, ledgers) in which ``secret`` appears."""
    return [name for name, text in texts.items() if secret in text]


def files_under(directory: Path) -> dict[str, str]:
    """Every file below ``directory``, by path, as text (binary files read leniently)."""
    return {str(path): path.read_bytes().decode(errors="replace")
            for path in sorted(directory.rglob("*")) if path.is_file()}


@dataclass(frozen=True)
class Asked:
    """One request of a :class:`SmallClient`: when it left, how it ended, who served it."""

    started: float
    status: int | None
    served_by: str
    seconds: float


@dataclass
class SmallClient:
    """
    A user asking ``small`` through the gateway's proxy, from here, every
    ``interval`` seconds, with no retry of its own: a refused connection or an
    error is the user's.
    """

    url: str
    key: str
    interval: float = 0.25
    answers: list[Asked] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def ask(self) -> None:
        started = time.monotonic()
        try:
            response = httpx.post(
                f"{self.url}/v1/chat/completions", timeout=60,
                headers={"Authorization": f"Bearer {self.key}"},
                json={"model": "small", "max_tokens": 8,
                      "messages": [{"role": "user", "content": "a user of small"}]})
            status, served_by = response.status_code, response.headers.get(
                "x-litellm-model-id", "")
        except httpx.HTTPError as error:
            status, served_by = None, f"{type(error).__name__}: {error}"
        self.answers.append(Asked(started, status, served_by, time.monotonic() - started))

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            self.ask()
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - started)))

    @contextmanager
    def asking(self) -> Iterator[SmallClient]:
        """Ask in the background for as long as the ``with`` block lasts."""
        thread = threading.Thread(target=self.run, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            self.stop.set()
            thread.join()

    def between(self, start: float, end: float = float("inf")) -> list[Asked]:
        """The requests that left from ``start`` (``time.monotonic()``) until ``end``."""
        return [answer for answer in self.answers if start <= answer.started < end]


# What uvicorn does to a connection that a retiring proxy worker accepted but had
# not read yet when the reload's SIGTERM reached it (docs/gateway.md): closed with
# the request unread. The port never closes; this race remains, and is counted.
def refusals(answers: list[Asked], slowest: float = 5.0) -> list[Asked]:
    """
    The requests a user would call failed: not answered 200 (refused, reset,
    an error), or slower than ``slowest``.
    """
    return [answer for answer in answers if answer.status != 200 or answer.seconds > slowest]


def client_figures(answers: list[Asked]) -> str:
    """Requests sent, refused, the p99 and the longest answer, for a test's printout."""
    if not answers:
        return "no request"
    seconds = sorted(answer.seconds for answer in answers)
    p99 = seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))]
    failed = sum(answer.status != 200 for answer in answers)
    return (f"{len(answers)} requests, {failed} not answered 200, p99 {p99:.2f}s, "
            f"longest {seconds[-1]:.2f}s")


def small_client(interval: float = 0.25) -> SmallClient:
    """A user of ``small`` on the lab's gateway (four requests a second by default)."""
    gateway = in_group(list(inventory()), "gateway")[0]
    return SmallClient(GatewaySettings.of(gateway).proxy_url, master_key(), interval)
