"""
The serving layer on the workstations: SGLang (its part on the gateway,
sglang-router, is ``operations/serving/router.py``).

``production`` runs one single-GPU replica per workstation (``sglang-replica``)
behind sglang-router on the gateway (``sglang-router``). The TP states run one
server split across the workstations, one rank each: ``sglang-tp2-rank0`` on the
first, ``sglang-tp2-rank1`` on the second, NCCL and Gloo pinned to the Thunderbolt
interface. A GPU holds a replica or a rank, never both: replicas stop before
ranks start and ranks stop before replicas start.

A server is accepted only by a real chat completion of the requested length,
asked from the machine running pyinfra (see ``operations/plumbing/probes.py``), and for
TP only from rank 0, whose ``/server_info`` must also report the group's
``tp_size`` (one rank a workstation of the site) and the declared speculative
settings (NEXTN is reported as EAGLE). The other ranks are never probed: their
``/health`` is a dummy that always answers 200.

The SGLang version is read by importing the package that provides the server
module with the service's own interpreter and working directory and printing
its ``__version__``: ``sglang`` for ``sglang.launch_server`` (SGLang sets
``sglang.__version__`` from its release), ``lab.sglang_sim`` for the lab's
simulator (a package run with ``-m``). Nothing is started and no GPU is touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version
from pyinfra import host, inventory, logger
from pyinfra.api import (
    FunctionCommand,
    Host,
    QuoteString,
    StringCommand,
)
from pyinfra.api.command import PyinfraCommand
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Which
from pyinfra.operations import apt

from operations import services
from operations.plumbing import keys, probes
from operations.plumbing.facts import EmptyMeansSomething, shell_script
from operations.plumbing.phase import elsewhere, executing
from operations.plumbing.probes import Proofs, Proven
from operations.services import InitSystem, Service, ServiceProcess, log_tails
from operations.serving import transport
from operations.site import releases
from operations.site.model import pair_group
from operations.site.settings import WorkstationSettings, derived, http_url
from operations.states import ServingMode, Speculative
from operations.step import Layer, failing, operation, refuse

LAYER = Layer.SERVING
REPLICA = "sglang-replica"
TP_RANKS = ("sglang-tp2-rank0", "sglang-tp2-rank1")
ROUTER = "sglang-router"
# Every service that puts SGLang on a workstation's GPU.
GPU_SERVICES = (REPLICA, *TP_RANKS)
SGLANG_SERVICES = "sglang-"
# SGLang reports the NEXTN drafter under the name of the worker that runs it.
REPORTED_ALGORITHM = {"NEXTN": "EAGLE"}
# A few tokens: enough for a real completion (and, in TP, for its all-reduces to show on
# the link), short enough that every converge can afford one per server.
ACCEPTANCE_TOKENS = 8
# How long a link's byte counters may lag the traffic (drivers that refresh them on a timer).
COUNTER_LAG_SECONDS = 2.0

# What a bounded wait polls: given the seconds left, what is still wrong and
# whether waiting can still help (see probes.wait_until).
Check = Callable[..., tuple[list[str], bool]]


# What runs: the site's settings and the services built from them


@dataclass(frozen=True)
class Sglang:
    """
    SGLang on one workstation, as its settings describe it (``operations/site/settings.py``).

    ``address`` is where the router, the acceptance probes and clients reach the
    server: the host's settings' ``address`` (its ``ssh_hostname``).
    ``link_address``, ``peer_link_address`` and ``rank0_link_address`` are this
    host's, its peer's and rank 0's addresses on the Thunderbolt link, where the
    TP group meets and talks; ``tp_size`` is the group's size, one rank a
    workstation of the site. Each field is the host's setting of its name
    (:func:`~operations.site.settings.derived`): the host's own, ``[link]
    interface`` and ``[serving]``'s.
    """

    address: str
    rank: int
    tp_size: int
    link_address: str
    peer_link_address: str
    rank0_link_address: str
    interface: str
    python: str
    sglang_module: str
    model_path: str
    served_model_name: str
    quantization: str | None
    context_length: int | None
    mem_fraction_static: float | None
    draft_model_path: str | None
    port: int
    dist_init_port: int
    # A number where pyinfra read ``--data serving_min_sglang_version=9.9`` as one.
    min_sglang_version: str | float
    user: str
    init_system: InitSystem
    working_directory: str
    start_timeout_seconds: float
    # The keys' files on the machine running twinbolt, and SGLang's --config on the host.
    api_key_file: Path | str
    admin_api_key_file: Path | str
    keys_file: str
    # Where the server listens (site key workstations.listen_address).
    listen_address: str = "0.0.0.0"

    @classmethod
    def from_host(cls, workstation: Host) -> Sglang:
        """A workstation's settings (any inventory host, not only the current one)."""
        settings = WorkstationSettings.of(workstation)
        return derived(cls, settings, settings.link, settings.serving)

    @property
    def url(self) -> str:
        return http_url(self.address, self.port)

    @property
    def tp_rank_name(self) -> str:
        return TP_RANKS[self.rank]

    @property
    def headers(self) -> dict[str, str]:
        """What a caller of the server's API shows it: its ``--api-key``."""
        return keys.bearer(self.api_key_file)

    def keys_config(self) -> str:
        """The YAML ``--config`` reads both keys from: SGLang's own flag names."""
        return (f"api-key: {keys.local_key(self.api_key_file)}\n"
                f"admin-api-key: {keys.local_key(self.admin_api_key_file)}\n")


def server_command(sglang: Sglang) -> list[str]:
    """The argv every SGLang server here starts with: the model and how it is served."""
    argv = [
        sglang.python, "-m", sglang.sglang_module,
        # Its keys: read from a file, on no command line (SGLang 0.5.9 and later
        # take any flag from --config's YAML).
        "--config", sglang.keys_file,
        "--model-path", sglang.model_path,
        "--served-model-name", sglang.served_model_name,
        # Every address unless the site names one: the router, the acceptance
        # probes and clients come from elsewhere, and a workstation's own name
        # may resolve to loopback on it.
        "--host", sglang.listen_address,
        "--port", str(sglang.port),
        "--enable-metrics",
        # Without it SGLang leaves cached_tokens out of usage.
        "--enable-cache-report",
    ]
    if sglang.quantization:
        argv += ["--quantization", sglang.quantization]
    if sglang.context_length:
        argv += ["--context-length", str(sglang.context_length)]
    if sglang.mem_fraction_static:
        argv += ["--mem-fraction-static", str(sglang.mem_fraction_static)]
    return argv


def speculative_args(speculative: Speculative | None, draft_model_path: str | None) -> list[str]:
    """The speculative decoder's flags; none at all for a state without one."""
    if speculative is None:
        return []
    argv = [
        "--speculative-algorithm", speculative.algorithm,
        "--speculative-num-steps", str(speculative.num_steps),
        "--speculative-eagle-topk", str(speculative.eagle_topk),
        "--speculative-num-draft-tokens", str(speculative.num_draft_tokens),
    ]
    if draft_model_path:
        argv += ["--speculative-draft-model-path", draft_model_path]
    return argv


def tp_environment(interface: str, address: str) -> dict[str, str]:
    """Every socket of the TP group on the Thunderbolt link only, over plain TCP."""
    return {
        # A leading "=" is an exact name: without it NCCL takes any interface
        # whose name starts with "thunderbolt0".
        "NCCL_SOCKET_IFNAME": f"={interface}",
        # The link-local address is IPv4; NCCL would otherwise try IPv6 first.
        "NCCL_SOCKET_FAMILY": "AF_INET",
        # Gloo takes one concrete name, not NCCL's prefix or exclusion lists.
        "GLOO_SOCKET_IFNAME": interface,
        # SGLang's own sockets take the host's default address unless told.
        "SGLANG_HOST_IP": address,
        "NCCL_IB_DISABLE": "1",
        "NCCL_NET": "Socket",
        # NCCL's own word on where it went (its interface, its channels' transport),
        # written once as the group forms; nothing per collective.
        "NCCL_DEBUG": "INFO",
        "NCCL_DEBUG_SUBSYS": "INIT,NET",
    }


def replica_service(sglang: Sglang) -> Service:
    """Production's single-GPU server on one workstation."""
    return Service(
        name=REPLICA,
        description=f"SGLang replica serving {sglang.served_model_name} (twinbolt production)",
        command=server_command(sglang),
        user=sglang.user,
        working_directory=sglang.working_directory,
    )


def tp_rank_service(sglang: Sglang, speculative: Speculative | None) -> Service:
    """This workstation's rank of the TP server, one node and one GPU a workstation."""
    return Service(
        name=sglang.tp_rank_name,
        description=(
            f"SGLang TP2 rank {sglang.rank} serving {sglang.served_model_name} "
            f"(speculative {speculative.algorithm if speculative else 'off'})"
        ),
        command=[
            *server_command(sglang),
            # One GPU a workstation: as many nodes as ranks.
            "--tp-size", str(sglang.tp_size),
            "--nnodes", str(sglang.tp_size),
            "--node-rank", str(sglang.rank),
            "--dist-init-addr", f"{sglang.rank0_link_address}:{sglang.dist_init_port}",
            *speculative_args(speculative, sglang.draft_model_path),
        ],
        environment=tp_environment(sglang.interface, sglang.link_address),
        user=sglang.user,
        working_directory=sglang.working_directory,
        # A rank needs its peer: alone after a reboot, or restarted after a crash, it
        # only waits for a rendezvous that never comes.
        at_boot=False,
    )


# Facts


class SglangVersion(EmptyMeansSomething):
    """
    The version of the SGLang that ``python -m module`` would run, or the error.

    .. code:: python

        {"version": "0.5.9"}
        {"error": "ModuleNotFoundError: No module named 'sglang'"}
    """

    SCRIPT = (
        "import importlib, importlib.util, sys\n"
        "name = sys.argv[1]\n"
        "spec = importlib.util.find_spec(name)\n"
        "if spec is None:\n"
        "    sys.exit(f'No module named {name!r}')\n"
        "package = name if spec.submodule_search_locations is not None "
        "else name.rpartition('.')[0]\n"
        "print('version', importlib.import_module(package).__version__)\n"
    )

    def command(self, python: str, module: str, working_directory: str = "/",
                user: str = "root") -> StringCommand:
        # As the serving user, as the service will run it: importing runs the
        # venv's and the working directory's code, which root must not run.
        script = 'cd "$1" && exec "$2" -c "$3" "$4"'
        as_user = [] if user == "root" else ["runuser", "-u", QuoteString(user), "--"]
        return StringCommand(
            *as_user, shell_script(script, working_directory, python, self.SCRIPT, module),
            "2>&1", "||", "true",
        )

    def process(self, output: list[str]) -> dict:
        for line in output:
            if line.startswith("version "):
                return {"version": line.removeprefix("version ").strip()}
        return {"error": output[-1].strip() if output else "no output"}


# Evidence


def version_problems(found: dict, minimum: str | float) -> list[str]:
    """Why the SGLang found is not at least ``minimum``; empty when it is."""
    if "version" not in found:
        return [f"cannot read the SGLang version: {found.get('error')}"]
    try:
        too_old = Version(found["version"]) < Version(str(minimum))
    except InvalidVersion:
        return [f"SGLang reports an unreadable version {found['version']!r}"]
    if too_old:
        return [
            f"SGLang {found['version']} is older than the minimum {minimum} "
            "(serving.min_sglang_version): NEXTN with TP2 needs the release that merges "
            "FlashInfer autotune caches across the target and draft workers"
        ]
    return []


def quantization_problems(found: dict, quantization: str | None, python: str) -> list[str]:
    """
    Why the SGLang found refuses the site's ``--quantization``, with the fix; empty
    when it accepts it, when the site sets none, or when it has no readable version
    (:func:`version_problems` says so where a state needs one).
    """
    if not quantization or "version" not in found:
        return []
    installed = found["version"]
    accepting = releases.CHOICES[releases.QUANTIZATION][quantization]
    try:
        if accepting.accept(installed):
            return []
        too_new = accepting.until is not None and Version(installed) >= Version(accepting.until)
    except InvalidVersion:
        return []
    instead = ", ".join(releases.accepted(releases.QUANTIZATION, installed))
    other_release = (f"install an SGLang before {accepting.until}" if too_new
                     else f"upgrade SGLang to {accepting.since} or later")
    return [
        f"SGLang {installed} refuses --quantization {quantization} (serving.quantization): "
        f"only {accepting} accepts it. Set serving.quantization to a value {installed} "
        f"accepts ({instead}), or {other_release} for {python}"
    ]


def process_problems(process: dict, service: Service, argv: bool = True) -> list[str]:
    """
    Whether the running process is the rendered service, by argv and environment.

    ``argv=False`` for a program that overwrites its own command line (sglang-router
    shows ``sglang::router``): then only the environment can be compared.
    """
    if not process.get("running"):
        return [f"{service.name} is not running ({process.get('status') or 'no status'})"]
    found = []
    if argv and process["argv"] != service.command:
        found.append(
            f"{service.name} (pid {process['pid']}) runs {' '.join(process['argv'])!r}, "
            f"not the rendered {' '.join(service.command)!r}"
        )
    for key, value in service.environment.items():
        if process["environment"].get(key) != value:
            found.append(
                f"{service.name} (pid {process['pid']}) has {key}="
                f"{process['environment'].get(key, '(unset)')}, not {value}"
            )
    return found


def service_for(serving: ServingMode, rank: int) -> str:
    """The SGLang service a workstation of rank ``rank`` runs for ``serving``."""
    return REPLICA if serving == ServingMode.REPLICAS else TP_RANKS[rank]


def serving_of(running: list[str], rank: int) -> ServingMode | None:
    """
    The serving layer's judge on one workstation, from its running SGLang
    services: the :class:`ServingMode` whose service alone runs; ``None`` else.
    """
    return next((serving for serving in ServingMode
                 if running == [service_for(serving, rank)]), None)


def replica_runs(sglang: Sglang, running: bool = True) -> bool:
    """
    Whether production's replica runs on this workstation (``running=False``:
    whether it does not): what a refusal before any change keeps serving.
    Read when asked, for deploy.py's ``_if``.
    """
    replicas = host.get_fact(services.RunningServices, prefix=REPLICA,
                             init_system=sglang.init_system)
    return (REPLICA in replicas) == running


def reported_speculative(speculative: Speculative | None) -> dict[str, object]:
    """What ``/server_info`` reports for ``speculative`` (SGLang names NEXTN's drafter EAGLE)."""
    if speculative is None:
        return {"speculative_algorithm": None}
    return {
        "speculative_algorithm": REPORTED_ALGORITHM.get(speculative.algorithm,
                                                        speculative.algorithm),
        "speculative_num_steps": speculative.num_steps,
        "speculative_eagle_topk": speculative.eagle_topk,
        "speculative_num_draft_tokens": speculative.num_draft_tokens,
    }


def speculative_of(info: dict) -> Speculative | None:
    """
    The speculative layer's judge: the declared form of what ``/server_info``
    reports, the inverse of :func:`reported_speculative`. ``ValueError`` for an
    algorithm or settings no state declares.
    """
    reported = info.get("speculative_algorithm")
    if reported is None:
        return None
    declared = {shown: name for name, shown in REPORTED_ALGORITHM.items()}
    return Speculative(algorithm=declared.get(reported, reported),
                       num_steps=info.get("speculative_num_steps"),
                       eagle_topk=info.get("speculative_eagle_topk"),
                       num_draft_tokens=info.get("speculative_num_draft_tokens"))


def server_info_problems(info: object, tp_size: int, speculative: Speculative | None,
                         served_model_name: str) -> list[str]:
    """Whether ``/server_info`` reports the declared parallelism and speculative settings."""
    if not isinstance(info, dict):
        return [f"/server_info is not a JSON object: {info!r:.200}"]
    wanted = {"tp_size": tp_size, "served_model_name": served_model_name,
              **reported_speculative(speculative)}
    return [
        f"/server_info reports {key}={info.get(key)!r}, expected {value!r}"
        for key, value in wanted.items()
        if info.get(key) != value
    ]


def server_info(url: str, headers: dict[str, str], timeout: float = 5.0) -> probes.Answer:
    """
    ``/server_info``, or ``/get_server_info`` on releases that only have the old
    name, asked with the server's key (``headers``).
    """
    answer = probes.get(f"{url}/server_info", timeout, headers)
    if answer.status == 404:
        answer = probes.get(f"{url}/get_server_info", timeout, headers)
    return answer


def tp_log_tails() -> str:
    """Every rank's log of this host's pair: a TP failure is often visible only on another rank."""
    pair = inventory.get_group(pair_group(WorkstationSettings.of(host).pair))
    workstations = [member for member in pair if "workstations" in member.groups]
    ranks = [Sglang.from_host(workstation) for workstation in workstations]
    return log_tails([(workstation, rank.tp_rank_name, rank.init_system)
                      for workstation, rank in zip(workstations, ranks, strict=True)])


def keys_written(sglang: Sglang) -> Generator[PyinfraCommand, None, bool]:
    """
    The server's keys in the file its ``--config`` names; whether they changed,
    which a running server reads only as it starts again.
    """
    return (yield from keys.key_put(sglang.api_key_file, sglang.keys_file, sglang.user,
                                    sglang.keys_config()))


def stuck(sglang: Sglang, service: Service, proofs: Proofs,
          tokens: int = ACCEPTANCE_TOKENS) -> list[str]:
    """
    Why a server that runs as rendered, and has had its whole start bound, still
    serves no real completion; empty when it serves, is younger, or is not running.

    Such a server is not in the declared state, and only a restart can bring it
    there: a hung scheduler does not recover by itself. One that serves, and
    whose ``/server_info`` agrees, is proven for this run: its acceptance does
    not ask again.
    """
    process = host.get_fact(ServiceProcess, service=service.name,
                            init_system=sglang.init_system,
                            variables=tuple(service.environment))
    if (not process.get("running") or (process.get("seconds") or 0) < sglang.start_timeout_seconds
            or process_problems(process, service)):
        return []
    return serves(sglang, service, process["pid"], 1, None, tokens,
                  probes.REQUEST_TIMEOUT_SECONDS, proofs)[0]


def serves(sglang: Sglang, service: Service, pid: int, tp_size: int,
           speculative: Speculative | None, tokens: int,
           timeout: float, proofs: Proofs) -> tuple[list[str], list[str]]:
    """
    Why the server at ``pid`` serves no real completion, then, if it does, where
    its ``/server_info`` disagrees with the declared settings. A server that
    passes both is proven for this run (``proofs``).
    """
    answer = probes.chat_completion(sglang.url, sglang.served_model_name, tokens,
                                    timeout=timeout, headers=sglang.headers)
    if failed := probes.completion_problems(answer, tokens):
        return failed, []
    disagrees = server_info_problems(server_info(sglang.url, sglang.headers).body, tp_size,
                                     speculative, sglang.served_model_name)
    if not disagrees:
        proofs.remember(Proven(host.name, service.name), pid)
    return [], disagrees


def server_check(sglang: Sglang, service: Service, tp_size: int,
                 speculative: Speculative | None, tokens: int, proofs: Proofs) -> Check:
    """
    The acceptance of one SGLang server this host runs, as a check for
    :func:`probes.wait_until`: the process is the rendered service and stays the
    same process, it serves a real completion, and ``/server_info`` agrees.
    """
    first_pid: list[int] = []

    def check(seconds_left: float = probes.REQUEST_TIMEOUT_SECONDS) -> tuple[list[str], bool]:
        process = host.get_fact(ServiceProcess, service=service.name,
                                init_system=sglang.init_system,
                                variables=tuple(service.environment))
        found = process_problems(process, service)
        if process.get("pid") and not first_pid:
            first_pid.append(process["pid"])
        if found:
            # Seen running and now gone or replaced: it crashed; waiting will
            # only watch the supervisor restart it into the same crash.
            return found, not first_pid
        if process["pid"] != first_pid[0]:
            return [f"{service.name} exited and was restarted (pid {first_pid[0]} -> "
                    f"{process['pid']})"], False
        if proofs.made(Proven(host.name, service.name), process["pid"]):
            return [], False
        failed, disagrees = serves(sglang, service, process["pid"], tp_size, speculative,
                                   tokens, min(probes.REQUEST_TIMEOUT_SECONDS, seconds_left),
                                   proofs)
        if failed:
            return failed + probes.green_health(sglang.url), True
        return disagrees, False

    return check


def transport_check(sglang: Sglang, service: Service, tokens: int) -> Check:
    """
    The TP group's transport (:mod:`operations.serving.transport`), as a check for
    :func:`probes.wait_until`: a completion of ``tokens`` tokens bracketed by the
    link's byte counters, and the rank's connections. Waiting cannot mend a
    wrong interface, so a failure is final.
    """

    def carried() -> int:
        counters = host.get_fact(transport.LinkCounters, interface=sglang.interface)
        return counters.get("rx_bytes", 0) + counters.get("tx_bytes", 0)

    def check(seconds_left: float = probes.REQUEST_TIMEOUT_SECONDS) -> tuple[list[str], bool]:
        shape = host.get_fact(transport.ModelShape, model_path=sglang.model_path)
        if shape is None:
            return [f"{sglang.model_path}/config.json gives no model shape (num_hidden_layers, "
                    "hidden_size): the TP group's transport cannot be proven"], False
        before = carried()
        answer = probes.chat_completion(sglang.url, sglang.served_model_name, tokens,
                                        timeout=min(probes.REQUEST_TIMEOUT_SECONDS, seconds_left),
                                        headers=sglang.headers)
        if found := probes.completion_problems(answer, tokens):
            return found, True
        # A driver may refresh its statistics on a timer: give them time to catch up.
        deadline = time.monotonic() + COUNTER_LAG_SECONDS
        while ((moved := carried() - before) < transport.one_way_bytes(shape, tokens)
               and time.monotonic() < deadline):
            time.sleep(probes.POLL_SECONDS_MIN)
        process = host.get_fact(ServiceProcess, service=service.name,
                                init_system=sglang.init_system)
        reading = host.get_fact(transport.Connections)
        connections = transport.connections_of(reading, process["pid"]) if process["pid"] else []
        found = (transport.connection_problems(connections, reading["addresses"],
                                               sglang.link_address, sglang.peer_link_address,
                                               sglang.port, sglang.interface)
                 + transport.volume_problems(moved, shape, tokens, sglang.interface))
        if not found:
            logger.info(f"    [{host.name}] "
                        + transport.volume_carried(moved, shape, tokens, sglang.interface))
        return found, False

    return check


def accept(what: str, check: Check, timeout: float,
           tails: Callable[[], str]) -> Iterator[PyinfraCommand]:
    """
    Accept at once what already holds; otherwise wait for it with progress and a
    bound, and fail with the evidence and ``tails()`` (the logs) when it never holds.
    """
    found, _ = check()
    if not found:
        host.noop(f"{what}: already")
        return
    outcome: dict = {}
    yield FunctionCommand(probes.wait_until, (what, check, timeout, outcome), {})
    if outcome.get("found"):
        yield failing(LAYER, [f"{what}: no", *outcome["found"], tails()])


# Operations


@operation(LAYER, is_idempotent=True)
def admissible(sglang: Sglang | None, serving: ServingMode, speculative: Speculative | None,
               tokens: int = ACCEPTANCE_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Refuse, before anything changes, a serving target this workstation cannot reach.

    The SGLang servers' keys must be readable, and safe, where twinbolt runs
    (:func:`~operations.plumbing.keys.local_key`). The weights must be on the
    host. A NEXTN TP state needs SGLang at least
    ``sglang.min_sglang_version``. The installed SGLang must accept the site's
    ``--quantization`` (:mod:`operations.site.releases`), in every state, or the
    server would exit 2 at its start. Leaving production needs production working:
    a running replica must serve a real completion before its GPU is borrowed.

    + sglang: this workstation's :class:`Sglang` settings; ``None`` elsewhere (a no-op)
    + serving: what the target state serves: ``replicas`` or ``tp2``
    + speculative: the target state's speculative decoder, or ``None``
    + tokens: the length of the completion asked of a running replica

    **Example:**

    .. code:: python

        sglang.admissible(
            name="Preflight: SGLang can serve tp2_e2e here",
            sglang=Sglang.from_host(host),
            serving=ServingMode.TENSOR_PARALLEL,
            speculative=NEXTN_3_1_4,
        )
    """
    if elsewhere(sglang, "workstation"):
        return
    found = []
    try:
        sglang.keys_config()
    except keys.KeyFileProblem as problem:
        found.append(f"the SGLang servers' keys, on the machine running twinbolt: {problem}")
    if not host.get_fact(Directory, path=sglang.model_path):
        found.append(f"the weights {sglang.model_path} are not on this host")
    if speculative and sglang.draft_model_path:
        if not host.get_fact(Directory, path=sglang.draft_model_path):
            found.append(f"the draft weights {sglang.draft_model_path} are not on this host")
    tensor_parallel = serving == ServingMode.TENSOR_PARALLEL
    needs_minimum = tensor_parallel and speculative is not None
    if needs_minimum or sglang.quantization:
        version = host.get_fact(SglangVersion, python=sglang.python, module=sglang.sglang_module,
                                working_directory=sglang.working_directory, user=sglang.user)
        if needs_minimum:
            found += version_problems(version, sglang.min_sglang_version)
        found += quantization_problems(version, sglang.quantization, sglang.python)
    if tensor_parallel and replica_runs(sglang):
        answer = probes.chat_completion(sglang.url, sglang.served_model_name, tokens,
                                        timeout=probes.REQUEST_TIMEOUT_SECONDS,
                                        headers=sglang.headers)
        found += [f"production's replica fails before the experiment (converge "
                  f"production first, which restarts a hung replica): {problem}"
                  for problem in probes.completion_problems(answer, tokens)]
    if found:
        refuse(LAYER, found)
    host.noop(f"SGLang can serve {serving} on this workstation")
    yield from ()


# What the network-only window (``experiment.py linktest``) runs on a workstation:
# Debian's package, which a desktop install rarely has.
LINKTEST_PACKAGE = "iperf3"


@operation(LAYER, is_idempotent=True)
def linktest_tool(sglang: Sglang | None) -> Iterator[PyinfraCommand]:
    """
    Install ``iperf3`` where it is missing, as the serving layer installs what a
    workstation needs: the linktest measures the link in any state whose link is
    up, and refuses a workstation without it.

    + sglang: this workstation's :class:`Sglang` settings; ``None`` elsewhere (a no-op)

    **Example:**

    .. code:: python

        sglang.linktest_tool(name="Serving: iperf3 is installed", sglang=Sglang.from_host(host))
    """
    if elsewhere(sglang, "workstation"):
        return
    if host.get_fact(Which, command=LINKTEST_PACKAGE):
        host.noop(f"{LINKTEST_PACKAGE} is installed")
        return
    yield from apt.packages._inner(packages=[LINKTEST_PACKAGE], update=True)


@operation(LAYER)
def replica(sglang: Sglang | None, proofs: Proofs,
            present: bool = True) -> Iterator[PyinfraCommand]:
    """
    Run, or stop, production's single-GPU SGLang replica on this workstation.

    A replica that has been up longer than its start bound and serves no real
    completion (hung) is restarted: converging production must be able to repair it.

    + sglang: this workstation's :class:`Sglang` settings; ``None`` elsewhere (a no-op)
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`, where a replica that
      serves is remembered as proven
    + present: whether the replica should run

    **Example:**

    .. code:: python

        sglang.replica(name="Serving: the replica is stopped",
                        sglang=Sglang.from_host(host), proofs=run.proofs, present=False)
    """
    if elsewhere(sglang, "workstation"):
        return
    if present:
        service = replica_service(sglang)
        keys_changed = yield from keys_written(sglang)
        yield from services.present._inner(
            service=service, init_system=sglang.init_system,
            restarted=keys_changed or bool(stuck(sglang, service, proofs)))
    else:
        yield from services.absent._inner(service=REPLICA, init_system=sglang.init_system)


@operation(LAYER)
def tp_rank(sglang: Sglang | None, speculative: Speculative | None = None, present: bool = True,
            restarted: bool = False) -> Iterator[PyinfraCommand]:
    """
    Run, or stop, this workstation's rank of the TP server.

    The rank is the host's ``rank``; rank 0 hosts the rendezvous on its link
    address. A rank of the other number left on this host is stopped too.

    + sglang: this workstation's :class:`Sglang` settings; ``None`` elsewhere (a no-op)
    + speculative: the state's speculative decoder, or ``None``
    + present: whether the rank should run; ``False`` stops either rank
    + restarted: restart a running rank even if its service is unchanged

    **Example:**

    .. code:: python

        sglang.tp_rank(
            name="Serving: the TP ranks run",
            sglang=Sglang.from_host(host),
            speculative=NEXTN_3_1_4,
        )
    """
    if elsewhere(sglang, "workstation"):
        return
    for name in TP_RANKS:
        if not present or name != sglang.tp_rank_name:
            yield from services.absent._inner(service=name, init_system=sglang.init_system)
    if present:
        keys_changed = yield from keys_written(sglang)
        yield from services.present._inner(service=tp_rank_service(sglang, speculative),
                                           init_system=sglang.init_system,
                                           restarted=restarted or keys_changed)


@operation(LAYER)
def tp_rank_stopped_for_change(sglang: Sglang | None,
                               speculative: Speculative | None) -> Iterator[PyinfraCommand]:
    """
    Stop this workstation's TP rank before its own service changes (say, another
    speculative setting). A rank that runs as the target declares is left alone;
    one whose driver is to change is stopped by ``tp_rank(present=False)`` under
    the driver layer's ``swap_planned``, in deploy.py.

    Every rank stops in this step and they start together later: restarting a
    running group rank by rank races, each new rank losing the others' old ones.

    + sglang: this workstation's :class:`Sglang` settings; ``None`` elsewhere (a no-op)
    + speculative: the target state's speculative decoder, or ``None``

    **Example:**

    .. code:: python

        sglang.tp_rank_stopped_for_change(
            name="Serving: the TP ranks stop if they are to change",
            sglang=Sglang.from_host(host),
            speculative=None,
        )
    """
    if elsewhere(sglang, "workstation"):
        return
    running = host.get_fact(services.RunningServices, prefix="sglang-tp2-",
                            init_system=sglang.init_system)
    wanted = tp_rank_service(sglang, speculative)
    if not running:
        host.noop("no TP rank runs")
        return
    if running == [wanted.name] and not services.rendered_differs(wanted, sglang.init_system):
        host.noop(f"{wanted.name} runs as declared")
        return
    for name in running:
        yield from services.absent._inner(service=name, init_system=sglang.init_system)


@operation(LAYER, is_idempotent=True)
def replica_accepted(sglang: Sglang | None, proofs: Proofs,
                     tokens: int = ACCEPTANCE_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Accept this workstation's replica only by a real completion of ``tokens`` tokens
    from its port, waiting up to ``sglang.start_timeout_seconds`` seconds with progress.

    + sglang: this workstation's :class:`Sglang` settings; ``None`` elsewhere (a no-op)
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`
    + tokens: the completion's length

    **Example:**

    .. code:: python

        sglang.replica_accepted(name="Serving: the replica answers",
                                 sglang=Sglang.from_host(host), proofs=run.proofs)
    """
    if elsewhere(sglang, "workstation"):
        return
    service = replica_service(sglang)
    yield from accept(
        f"the replica at {sglang.url} serves a real completion",
        server_check(sglang, service, tp_size=1, speculative=None, tokens=tokens,
                     proofs=proofs),
        sglang.start_timeout_seconds,
        lambda: log_tails([(host, REPLICA, sglang.init_system)]),
    )


@operation(LAYER, is_idempotent=True)
def tp_accepted(sglang: Sglang | None, proofs: Proofs, speculative: Speculative | None = None,
                tokens: int = ACCEPTANCE_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Accept the TP server only by rank 0: a real completion of ``tokens`` tokens,
    and ``/server_info`` reporting the group's ``tp_size`` and ``speculative``.
    The other ranks are never probed; their ``/health`` always answers 200.

    + sglang: this workstation's :class:`Sglang` settings; ``None`` elsewhere (a no-op)
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`
    + speculative: the state's speculative decoder, or ``None``
    + tokens: the completion's length

    **Example:**

    .. code:: python

        sglang.tp_accepted(name="Serving: rank 0 serves", sglang=Sglang.from_host(host),
                            proofs=run.proofs, speculative=NEXTN_3_1_4)
    """
    if elsewhere(sglang, "workstation"):
        return
    if sglang.rank != 0:
        host.noop(f"rank {sglang.rank} is accepted through rank 0, never by its own dummy /health")
        return
    service = tp_rank_service(sglang, speculative)
    serves = server_check(sglang, service, tp_size=sglang.tp_size, speculative=speculative,
                          tokens=tokens, proofs=proofs)
    over_the_link = transport_check(sglang, service, tokens)

    def check(seconds_left: float = probes.REQUEST_TIMEOUT_SECONDS) -> tuple[list[str], bool]:
        found, worth_waiting = serves(seconds_left)
        return (found, worth_waiting) if found else over_the_link(seconds_left)

    yield from accept(
        f"TP rank 0 at {sglang.url} serves a real completion as tp_size {sglang.tp_size} over "
        f"{sglang.interface}",
        check,
        sglang.start_timeout_seconds,
        tp_log_tails,
    )


@operation(LAYER, is_idempotent=True)
def verified(sglang: Sglang | None, serving: ServingMode, speculative: Speculative | None,
             proofs: Proofs, tokens: int = ACCEPTANCE_TOKENS) -> Iterator[PyinfraCommand]:
    """
    Prove this workstation serves as the state says, with the evidence if not.

    Replicas: the replica is the rendered service and serves a real completion;
    no TP rank runs. TP: this rank is the rendered service, NCCL and Gloo pinned
    to the link; no replica runs; rank 0 serves a real completion and reports
    the declared settings.

    + sglang: this workstation's :class:`Sglang` settings; ``None`` elsewhere (a no-op)
    + serving: what the state serves: ``replicas`` or ``tp2``
    + speculative: the state's speculative decoder, or ``None``
    + proofs: the run's :class:`~operations.plumbing.probes.Proofs`, proofs its acceptance made
    + tokens: the completion's length

    **Example:**

    .. code:: python

        sglang.verified(name="Verify: serving", sglang=Sglang.from_host(host),
                         serving=ServingMode.REPLICAS, speculative=None, proofs=run.proofs)
    """
    if elsewhere(sglang, "workstation"):
        return
    if not executing():
        host.noop("verified when the run executes")
        return
    running = host.get_fact(services.RunningServices, prefix=SGLANG_SERVICES,
                            init_system=sglang.init_system)
    tensor_parallel = serving == ServingMode.TENSOR_PARALLEL
    if tensor_parallel:
        wanted = tp_rank_service(sglang, speculative)
        check = server_check(sglang, wanted, sglang.tp_size, speculative, tokens, proofs)
    else:
        wanted = replica_service(sglang)
        check = server_check(sglang, wanted, 1, None, tokens, proofs)
    found = [f"{name} runs, but the state runs {wanted.name} here"
             for name in running if name != wanted.name]
    if tensor_parallel and sglang.rank != 0:
        found += process_problems(
            host.get_fact(ServiceProcess, service=wanted.name, init_system=sglang.init_system,
                          variables=tuple(wanted.environment)),
            wanted,
        )
    else:
        found += check()[0]
    if found:
        yield failing(LAYER, [*found, tp_log_tails() if tensor_parallel
                              else log_tails([(host, wanted.name, sglang.init_system)])])
        return
    host.noop(f"this workstation serves {serving} as declared")


