"""
A real site: its hosts and settings, read from the TOML file named by ``TWINBOLT_SITE``.

The file is validated once, here, when the inventory loads: a mistyped key, a
value SGLang would refuse or a malformed checksum stops the run before any host
is touched, with a message naming the key and what it may be, instead of
surfacing halfway through a transition with production already stopped.

The models' defaults are the only place a default is written. Each host gets the
site as flat pyinfra host data: TOML ``[section] key`` becomes ``section_key``
(nested tables join with ``_`` too); a host table's ``ssh_*`` keys and
``[ssh]`` become pyinfra's own SSH connector keys, ``[ssh]
command_timeout_seconds`` pyinfra's ``_timeout`` (:func:`command_timeout_data`),
and a host's ``sudo`` the data of :func:`sudo_data`. ``group_data/`` publishes
the same names with these defaults (:data:`WORKSTATION_DEFAULTS`,
:data:`GATEWAY_DEFAULTS`) for the embedded lab, which has no site file, and
``operations/site/settings.py`` reads them back as one typed object per host.
"""

import os
import re
import tomllib
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    HttpUrl,
    IPvAnyAddress,
    Strict,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_core import to_jsonable_python
from pyinfra.api.exceptions import InventoryError

from operations.plumbing import module_file
from operations.plumbing.connect import connection_data
from operations.site.releases import QUANTIZATIONS
from operations.site.syntax import (
    AbsolutePath,
    AccountName,
    Argument,
    EnvironmentName,
    FreeText,
    HostName,
    InterfaceName,
    ModuleName,
    ServiceAccount,
    ServiceName,
    no_control_characters,
)

SITE_ENV = "TWINBOLT_SITE"
# The module twinbolt swaps, and the name its candidate's .modinfo must give.
MODULE_NAME = "thunderbolt_net"
# LiteLLM's own master key variable (operations/gateway/proxy.py sets it for the proxy).
MASTER_KEY_ENV = "LITELLM_MASTER_KEY"

# The host data key twinbolt's own SSH readers (the harness, testinfra) consult;
# pyinfra's is its global argument ``_sudo``. Both come from :func:`sudo_data`.
SUDO = "sudo"
# pyinfra's global argument that bounds each command of an operation or a fact:
# where the site's [ssh] command_timeout_seconds lands (command_timeout_data).
COMMAND_TIMEOUT = "_timeout"


class SiteError(InventoryError):
    """
    The site file is missing, unreadable or invalid.

    An ``InventoryError`` because the inventory is where it is raised: pyinfra's
    CLI then prints the message and exits non-zero, without a traceback.
    """


def _one_line(path: Path) -> Path:
    no_control_characters(str(path))
    return path


def _from_site_dir(path: Path, info: ValidationInfo) -> Path:
    # Relative to the site file, not to wherever pyinfra happens to be run from.
    return (info.context or {}).get("site_dir", Path()) / path.expanduser()


class MissingFile(ValueError):
    """A local file the site names is not there; the refusal names the host it is for."""


def _existing_file(path: Path) -> Path:
    # pyinfra would find out per host, mid-connect, with a traceback each.
    if not path.is_file():
        raise MissingFile(f"no such file: {path}" + ("" if not path.exists() else
                                                    " (it is not a regular file)"))
    return path


def _thunderbolt_net_module(path: Path) -> Path:
    # A file that is no module (a text file, a module of another name) would fail
    # only mid-run, on the workstations, or keep production itself from converging.
    try:
        name = module_file.read(path).name
    except (OSError, module_file.NotAModule) as error:
        raise ValueError(f"{path} is not a {MODULE_NAME} kernel module: {error}") from None
    if name != MODULE_NAME:
        found = (f"its .modinfo names the module {name!r}" if name
                 else "its .modinfo names no module (no name= entry)")
        raise ValueError(f"{path} is not a {MODULE_NAME} kernel module: {found}")
    return path


def _lowercase_sha256(value: str) -> str:
    value = value.lower()
    if len(value) != 64 or any(char not in "0123456789abcdef" for char in value):
        raise ValueError("must be 64 hexadecimal digits, as printed by sha256sum")
    return value


def _not_a_boolean(value: Any) -> Any:
    # Strict numbers refuse true themselves; a Literal of numbers would take it as 1.
    if isinstance(value, bool):
        raise ValueError("must be a number, not true or false")
    return value


def _link_local(address: IPv4Address) -> IPv4Address:
    # An address from another network is the usual slip, and it is a dangerous
    # one: the peer would still answer, over the LAN, and "prove" the cable.
    if not address.is_link_local:
        raise ValueError("must be an IPv4 link-local address (169.254.0.0/16)")
    return address


# Free text: one line (operations/site/syntax.py says why); narrower types where a
# value lands in a unit, an ssh_config or a command line as syntax.
Text = FreeText
# Numbers are strict: pydantic would read a TOML or --data true as 1 (and
# command_timeout_seconds = true as a bound of one second), or a float as the
# integer it happens to equal. A float may be written as an integer (20 for 20.0),
# never as inf or nan.
PositiveCount = Annotated[int, Strict(), Field(gt=0)]
PositiveNumber = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
Port = Annotated[int, Strict(), Field(ge=1, le=65535)]
# The longest bound or wait a site may set: a day. A bound is there to end a run
# that hangs with production's GPUs borrowed and the pair locked, and a
# rollback's bound is the sum of them (operations/bounds.py). The longest wait of
# a converge, a model's load, takes minutes; a value above a day is a slip of
# units (milliseconds for seconds) or a way around the bound, never a wait.
MAX_SECONDS = 24 * 60 * 60
Seconds = Annotated[int, Strict(), Field(gt=0, le=MAX_SECONDS)]
LocalPath = Annotated[Path, AfterValidator(_one_line), AfterValidator(_from_site_dir)]
# A file on the machine running twinbolt that a run reads: it must be there at load.
LocalFile = Annotated[Path, AfterValidator(_one_line), AfterValidator(_from_site_dir),
                     AfterValidator(_existing_file)]
# The candidate: a thunderbolt_net module, plain or compressed
# (operations/plumbing/module_file.py).
CandidateFile = Annotated[LocalFile, AfterValidator(_thunderbolt_net_module)]
Sha256 = Annotated[str, AfterValidator(_lowercase_sha256)]
LinkLocalAddress = Annotated[IPv4Address, AfterValidator(_link_local)]
Version = Annotated[str, StringConstraints(pattern=r"^\d+(\.\d+)*$")]

# Any --quantization choice of some supported SGLang release (argparse exits 2 on
# anything else); whether the release installed on a workstation accepts it is the
# serving layer's preflight (operations/site/releases.py). NVFP4 checkpoints are
# "modelopt_fp4"; there is no plain "nvfp4".
Quantization = Literal[QUANTIZATIONS]


class _Section(BaseModel):
    # extra="forbid": a mistyped key is an error, not a silently ignored setting.
    model_config = ConfigDict(extra="forbid", frozen=True)


class SiteHost(_Section):
    """
    A host twinbolt reaches over SSH; the ``ssh_*`` keys are pyinfra's own, and
    ``sudo`` runs every command of a non-root ``ssh_user`` through passwordless sudo.
    """

    name: HostName
    ssh_hostname: HostName
    ssh_user: AccountName = "root"
    ssh_port: Port = 22
    ssh_key: LocalFile | None = None
    sudo: bool = False

    @model_validator(mode="after")
    def _root_or_sudo(self) -> "SiteHost":
        # Without root the first insmod or service start would fail halfway
        # through a transition, with production already stopped. sudo as root is
        # pointless, yet harmless wherever sudo is installed: it is allowed.
        if self.ssh_user != "root" and not self.sudo:
            raise ValueError(
                f"ssh_user {self.ssh_user!r} is not root, and twinbolt needs root (it loads "
                "kernel modules and manages services): set sudo = true and give "
                f"{self.ssh_user} passwordless sudo on the host, or set ssh_user = \"root\""
            )
        return self


class Workstation(SiteHost):
    """A GPU workstation: one end of the Thunderbolt link."""

    thunderbolt_address: LinkLocalAddress
    # Where SGLang listens: every address by default (the router, the probes and
    # clients come from elsewhere). SGLang asks no key, so a site with other
    # networks names the one the router reaches it on (ssh_hostname's address).
    # Not the host's own name: Debian and Ubuntu map it to 127.0.1.1.
    listen_address: IPvAnyAddress = IPv4Address("0.0.0.0")


class Ssh(_Section):
    """SSH settings shared by every host."""

    known_hosts_file: LocalFile | None = None
    # twinbolt swaps kernel modules as root: a host key never seen before is a
    # reason to stop. pyinfra's own default would be "accept-new".
    strict_host_key_checking: Literal["yes", "accept-new"] = "yes"
    # The bound on one remote command (pyinfra's _timeout: command_timeout_data).
    # pyinfra's own is none: a host whose connection drops silently would hold
    # the run until TCP gives up, with production's GPUs borrowed. Above the
    # longest single command twinbolt runs (a pip install on the gateway); a step
    # that waits longer (a serving start) is bounded by its own wait instead.
    command_timeout_seconds: Seconds = 300


class Link(_Section):
    """What a healthy Thunderbolt link looks like after it (re)trains."""

    interface: InterfaceName = "thunderbolt0"
    # speed x lanes, as the XDomain reports them (rx_speed "20.0 Gb/s", rx_lanes 1).
    expected_rate_gbps: PositiveNumber = 20.0
    expected_lanes: Annotated[Literal[1, 2], BeforeValidator(_not_a_boolean)] = 1
    # Loading thunderbolt_net creates a new interface with no address. "twinbolt":
    # the link layer applies the declared address after every load; "system": the
    # host's own network manager does (matched by name), and twinbolt waits for it.
    address_owner: Literal["twinbolt", "system"] = "twinbolt"
    # Both workstations' thunderbolt_address are hosts of one network of this length
    # (Site._one_link_network).
    prefix_length: Annotated[int, Strict(), Field(ge=8, le=30)] = 16
    # How long a link may take to come back after a load: retraining, the peer's
    # XDomain service, the address (a slow network manager's above all).
    wait_seconds: Seconds = 30


class Candidate(_Section):
    """The pinned candidate ``thunderbolt_net`` module, built elsewhere and uploaded."""

    path: CandidateFile
    sha256: Sha256
    module_name: ModuleName = MODULE_NAME
    # While the candidate is loaded, a link that carries nothing this long makes
    # the guard on the workstation restore the stock driver (operations/safety/guard.py).
    guard_stall_seconds: Annotated[int, Strict(), Field(ge=6, le=3600)] = 30


class Serving(_Section):
    """How SGLang runs on the workstations, as replicas or as TP ranks."""

    # Arguments of SGLang's command line, and served_model_name also the
    # description of its unit: never an option, one line.
    model_path: Argument
    served_model_name: Argument
    quantization: Quantization = "modelopt_fp4"
    # None: leave SGLang's own default (the model's context, the memory heuristic).
    context_length: PositiveCount | None = None
    mem_fraction_static: Annotated[float, Strict(), Field(gt=0, lt=1)] | None = None
    # None: NEXTN drafts with the model's own MTP head.
    draft_model_path: Argument | None = None
    port: Port = 30000
    dist_init_port: Port = 5757
    python: AbsolutePath
    sglang_module: ModuleName = "sglang.launch_server"
    # The release the SGLang facts twinbolt relies on (NEXTN flags, /server_info;
    # docs/serving.md) hold for: tests/conformance parses the rendered command
    # lines with this release's own parser.
    min_sglang_version: Version = "0.5.9"
    # Never root (operations/site/syntax.py says why).
    user: ServiceAccount
    init_system: Literal["systemd", "runit"] = "systemd"
    # On each workstation; SGLang's caches follow the user's home, not this.
    working_directory: AbsolutePath = "/"
    # Loading a 27B model, capturing CUDA graphs and autotuning take minutes;
    # past this bound a start that has not served a real completion has failed.
    start_timeout_seconds: Seconds = 900
    # GPU memory (MiB, in all) that processes twinbolt did not start may hold
    # before a run refuses: a desktop's X server, say.
    foreign_gpu_memory_mib: Annotated[int, Strict(), Field(ge=0)] = 0
    # On the machine running twinbolt, mode 0600: the key every SGLang server asks
    # of its callers (--api-key), and the one its admin endpoints ask instead
    # (--admin-api-key: /flush_cache, /start_profile). The probes and the harness
    # read them there; twinbolt puts them into keys_file on each workstation and
    # gives the first to the router and the proxy on the gateway (docs/serving.md).
    api_key_file: LocalPath = Field(Path("~/.config/twinbolt/sglang_api_key"),
                                    validate_default=True)
    admin_api_key_file: LocalPath = Field(Path("~/.config/twinbolt/sglang_admin_key"),
                                          validate_default=True)
    # On each workstation: the file SGLang's --config reads both keys from,
    # owned by user, mode 0600, so that no command line holds them.
    keys_file: AbsolutePath = "/etc/twinbolt/sglang_keys.yaml"
    # Each workstation GPU's memory bandwidth, for the measurement's roofline
    # (harness/judging/roofline.py); NVIDIA's figure for an RTX 5090.
    gpu_memory_bandwidth_gb_s: PositiveNumber = 1792.0

    @model_validator(mode="after")
    def _distinct_ports(self) -> "Serving":
        if self.port == self.dist_init_port:
            raise ValueError("port and dist_init_port must differ: rank 0 binds both")
        return self


class LargeBackend(_Section):
    """The alternate larger backend behind the gateway's ``large`` role."""

    api_base: HttpUrl
    served_model_name: Text
    # A variable of the proxy's own environment; never its master key, which the
    # proxy would then send to the large backend with every request.
    api_key_env: EnvironmentName | None = None
    # A path on the gateway.
    api_key_file: AbsolutePath | None = None

    @model_validator(mode="after")
    def _one_key_source(self) -> "LargeBackend":
        if self.api_key_env and self.api_key_file:
            raise ValueError("set api_key_env or api_key_file, not both")
        if self.api_key_env == MASTER_KEY_ENV:
            raise ValueError(
                f"api_key_env must not be {MASTER_KEY_ENV}: that is the proxy's own master "
                "key, which it would send to the large backend; name the variable that "
                "holds the backend's key, or use api_key_file")
        return self


class GatewayRoles(_Section):
    """The gateway's services: LiteLLM (the public roles) and sglang-router."""

    # Not sglang-router's default 30000: that is SGLang's port, and a gateway
    # may run a backend too (the lab's does).
    router_port: Port = 30080
    # The users' port, where the proxy's front (haproxy) listens; LiteLLM itself
    # listens behind it on the gateway's loopback, at litellm_backend_port.
    litellm_port: Port = 4000
    litellm_backend_port: Port = 4100
    # Where the router and the proxy listen. Not the gateway's own name: Debian
    # and Ubuntu map it to 127.0.1.1, where no client elsewhere can connect.
    listen_address: IPvAnyAddress = IPv4Address("0.0.0.0")
    # A path on the gateway; LiteLLM refuses to start without a master key.
    master_key_file: AbsolutePath = "/etc/twinbolt/litellm_master_key"
    # A path on the gateway; the config holds no secret.
    litellm_config_file: AbsolutePath = "/etc/twinbolt/litellm.yaml"
    # twinbolt installs litellm[proxy] into this virtualenv on the gateway,
    # from requirements-litellm.lock (hash-pinned).
    litellm_venv: AbsolutePath = "/opt/twinbolt/litellm"
    # The proxy reads the master key, so it runs as an account of its own
    # (created if missing) that owns the key file.
    litellm_user: ServiceAccount = "litellm"
    # twinbolt's proxy as a service (systemd unit or runit service). A gateway
    # that already runs the site's own LiteLLM under this name, or on
    # litellm_port, is refused: run twinbolt's beside it under another name and
    # port (docs/gateway.md).
    litellm_service: ServiceName = "litellm"
    init_system: Literal["systemd", "runit"] = "systemd"
    # twinbolt installs sglang-router into this virtualenv on the gateway.
    router_venv: AbsolutePath = "/opt/twinbolt/sglang-router"
    # Where pip on the gateway finds the locked distributions: its own
    # configuration when empty; say ["--index-url", "https://mirror/simple"], or
    # ["--no-index", "--find-links", "/srv/wheelhouse"] for a gateway offline.
    pip_options: list[Text] = Field(default_factory=list)
    # The router keeps no state, but not nobody's account either, which owns what
    # NFS and user namespaces cannot map (systemd: "Special user nobody configured,
    # this is not safe!"): an unprivileged account of its own, created if missing.
    router_user: ServiceAccount = "sglang-router"
    # A path on the gateway: the key the router's worker API (/workers) asks of
    # every caller, generated there if missing, readable by router_user alone.
    router_key_file: AbsolutePath = "/etc/twinbolt/router_control_key"
    # Paths on the gateway: the SGLang servers' key ([serving] api_key_file), as
    # the router sends it to its workers and asks it of the proxy (router_user's),
    # and as the proxy sends it to the router (litellm_user's).
    router_worker_key_file: AbsolutePath = "/etc/twinbolt/router_worker_key"
    litellm_small_key_file: AbsolutePath = "/etc/twinbolt/litellm_small_key"
    large: LargeBackend

    @model_validator(mode="after")
    def _distinct_ports(self) -> "GatewayRoles":
        ports = {"router_port": self.router_port, "litellm_port": self.litellm_port,
                 "litellm_backend_port": self.litellm_backend_port}
        if len(set(ports.values())) < len(ports):
            raise ValueError(f"{', '.join(ports)} must all differ")
        return self


class Ledger(_Section):
    """The compatibility ledger, on the machine running twinbolt: one JSON line per run."""

    path: LocalPath = Path("~/.local/state/twinbolt/ledger.jsonl")


# The sections a site gives its hosts as flat host data (``prefix_field``), by
# prefix, the name each has in the site file and on Site: the one table the site's
# inventory data, the hosts' settings, the overrides and group_data/ derive from.
# [ssh] reaches every host, as pyinfra's own keys; the others, one kind of host.
WORKSTATION_SECTIONS: dict[str, type[_Section]] = {
    "link": Link, "candidate": Candidate, "serving": Serving, "ledger": Ledger,
}
GATEWAY_SECTIONS: dict[str, type[_Section]] = {"gateway_roles": GatewayRoles}
SECTIONS: dict[str, type[_Section]] = {"ssh": Ssh, **WORKSTATION_SECTIONS, **GATEWAY_SECTIONS}


# The Thunderbolt link is one cable, and a cable joins two hosts: the only
# place a pair's workstations are counted. The TP group's size and each host's
# peer are read from its pair (tp_group_data).
CABLE_ENDS = 2
# The pair a site of the one-pair form (``[[workstations]]``) declares, named as
# the lab's first pair.
FIRST_PAIR = "a"
# A pair's name: the suffix of its inventory group (``pair_<name>``, a Python
# name, as pyinfra's inventory file defines its groups), and a word in a
# ``--limit``, the ledger and the reports.
PairName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9]{0,15}$")]


PAIR_GROUP_PREFIX = "pair_"


def pair_group(name: str) -> str:
    """
    The inventory group of the pair ``name``: its workstations, rank 0 first, and
    the gateway, which is in every run (``--limit pair_b`` moves pair b alone).
    """
    return f"{PAIR_GROUP_PREFIX}{name}"


def _one_cable(workstations: list[Workstation]) -> list[Workstation]:
    if len(workstations) != CABLE_ENDS:
        raise ValueError(
            f"must be exactly {CABLE_ENDS}, not {len(workstations)}: the Thunderbolt link "
            "is one cable, and a cable has two ends")
    return workstations


def _distinct_pair_names(pairs: list["Pair"]) -> list["Pair"]:
    names = [pair.name for pair in pairs]
    if len(set(names)) != len(names):
        raise ValueError(f"pair names must be distinct, got {', '.join(names)}")
    return pairs


class Pair(_Section):
    """
    Two workstations joined by one Thunderbolt cable, rank 0 first: one TP group
    in a TP state, two of the router's replicas in production.
    """

    name: PairName
    workstations: Annotated[list[Workstation], AfterValidator(_one_cable)]

    @property
    def group(self) -> str:
        return pair_group(self.name)


class Site(_Section):
    """
    A whole site: its pairs of workstations, one gateway in front of every pair,
    and their settings. A site of one pair may list its two workstations alone
    (``[[workstations]]``, rank 0 first), the form of every site before pairs:
    that is the pair :data:`FIRST_PAIR`.
    """

    workstations: Annotated[list[Workstation], AfterValidator(_one_cable)] = Field(
        default_factory=list)
    pairs: Annotated[list[Pair], Field(min_length=1), AfterValidator(_distinct_pair_names)] = (
        Field(default_factory=list))
    gateway: SiteHost
    ssh: Ssh = Field(default_factory=Ssh)
    link: Link = Field(default_factory=Link)
    candidate: Candidate
    serving: Serving
    gateway_roles: GatewayRoles
    ledger: Ledger = Field(default_factory=Ledger)

    @model_validator(mode="after")
    def _one_form(self) -> "Site":
        if self.workstations and self.pairs:
            raise ValueError("give the workstations as [[pairs]] or, for a site of one pair, "
                             "as [[workstations]]: not both")
        if not (self.workstations or self.pairs):
            raise ValueError("no workstations: give [[pairs]], each with its two "
                             "[[pairs.workstations]], or for a site of one pair its two "
                             "[[workstations]]")
        return self

    @property
    def every_pair(self) -> list[Pair]:
        """The site's pairs: the one-pair form's is :data:`FIRST_PAIR`."""
        return self.pairs or [Pair(name=FIRST_PAIR, workstations=self.workstations)]

    @model_validator(mode="after")
    def _distinct_hosts(self) -> "Site":
        names = [host.name for pair in self.every_pair for host in pair.workstations]
        names.append(self.gateway.name)
        if len(set(names)) != len(names):
            raise ValueError(f"host names must be distinct, got {', '.join(names)}")
        return self

    @model_validator(mode="after")
    def _one_link_network(self) -> "Site":
        # The link layer applies each address with this prefix (address_owner
        # "twinbolt"): addresses in two networks, or a network's own or broadcast
        # address, would leave the peer unreachable across the cable. Each cable
        # is a network of its own: two pairs may use the same addresses.
        for pair in self.every_pair:
            addresses = [workstation.thunderbolt_address for workstation in pair.workstations]
            whose = f"pair {pair.name}: " if self.pairs else ""
            if len(set(addresses)) != len(addresses):
                raise ValueError(f"{whose}the workstations' thunderbolt_address values must differ")
            if problem := link_network_problem(addresses, self.link.prefix_length):
                raise ValueError(whose + problem)
        return self

    def workstation_hosts(self) -> list[tuple[str, dict[str, Any]]]:
        """
        The ``workstations`` inventory group, pair by pair and rank 0 first in
        each, with each host's TP group's data.
        """

        shared = self._sections_data(WORKSTATION_SECTIONS)
        hosts = []
        for pair in self.every_pair:
            links = [str(workstation.thunderbolt_address) for workstation in pair.workstations]
            hosts += [
                (
                    workstation.name,
                    {
                        **self._ssh_data(workstation),
                        **tp_group_data(pair.name, links, rank),
                        "serving_listen_address": str(workstation.listen_address),
                        **shared,
                    },
                )
                for rank, workstation in enumerate(pair.workstations)
            ]
        return hosts

    def pair_groups(self) -> dict[str, list[str]]:
        """Each pair's inventory group (:func:`pair_group`): its workstations, then the gateway."""
        return {pair.group: [*(workstation.name for workstation in pair.workstations),
                             self.gateway.name]
                for pair in self.every_pair}

    def gateway_hosts(self) -> list[tuple[str, dict[str, Any]]]:
        """The ``gateway`` inventory group: its one host."""

        return [
            (
                self.gateway.name,
                {
                    **self._ssh_data(self.gateway),
                    **self._sections_data(GATEWAY_SECTIONS),
                },
            )
        ]

    def _sections_data(self, sections: dict[str, type[_Section]]) -> dict[str, Any]:
        """The site's ``sections``, each as the flat host data its prefix names."""
        return {key: value for prefix in sections for key, value
                in _flat(prefix, getattr(self, prefix).model_dump(mode="json")).items()}

    def _ssh_data(self, host: SiteHost) -> dict[str, Any]:
        data = {
            **host.model_dump(mode="json", include=set(SiteHost.model_fields) - {"name", "sudo"}),
            **_flat("ssh", self.ssh.model_dump(mode="json",
                                               exclude={"command_timeout_seconds"})),
        }
        # pyinfra type-checks its connector keys and refuses None: an unset
        # key must be absent so that pyinfra's own default applies.
        return {
            **{key: value for key, value in data.items() if value is not None},
            **sudo_data(host.sudo),
            **command_timeout_data(self.ssh.command_timeout_seconds),
            **connection_data(host.ssh_hostname, host.ssh_port),
        }


def link_network_problem(addresses: Sequence[IPv4Address], prefix_length: int) -> str | None:
    """
    Why ``addresses`` cannot share one link network of ``prefix_length``, or None:
    they must all be hosts of the same network, none its network or broadcast address.
    """
    network = IPv4Network((addresses[0], prefix_length), strict=False)
    if strays := [str(address) for address in addresses if address not in network]:
        return (f"the workstations' thunderbolt_address values must be in one network of "
                f"link.prefix_length {prefix_length}: {', '.join(strays)} is not in {network}")
    if reserved := [str(address) for address in addresses
                    if address in (network.network_address, network.broadcast_address)]:
        return (f"thunderbolt_address {', '.join(reserved)} is the network or broadcast "
                f"address of {network} (link.prefix_length {prefix_length}); pick a host address")
    return None


def tp_group_data(pair: str, link_addresses: Sequence[str], rank: int) -> dict[str, Any]:
    """
    The host data a workstation of ``rank`` in the pair ``pair`` finds its TP
    group by, from the pair's link addresses, rank 0 first: the pair's name, the
    group's size (one rank a workstation), this host's address, where rank 0
    holds the rendezvous, and the peer across the cable. The site and the
    embedded lab both build it here.
    """
    peers = [address for other, address in enumerate(link_addresses) if other != rank]
    # One cable, so one peer (CABLE_ENDS): the link layer proves the cable to it.
    (peer,) = peers
    return {
        "pair": pair,
        "rank": rank,
        "tp_size": len(link_addresses),
        "thunderbolt_address": link_addresses[rank],
        "rank0_thunderbolt_address": link_addresses[0],
        "peer_thunderbolt_address": peer,
    }


def sudo_data(sudo: bool) -> dict[str, bool]:
    """
    The host data that runs a host's commands under sudo: none, or two keys.

    ``_sudo`` is pyinfra's own global argument: pyinfra takes a global argument
    found in host data as the default of every operation and fact of the run
    (``pyinfra.api.arguments.pop_global_arguments``), and the rollback's new run
    reads the same site. :data:`SUDO` is for twinbolt's own SSH commands, which
    pyinfra does not run. Absent, not false, without sudo: a false ``_sudo``
    would override ``pyinfra --sudo``, and the lab's root hosts need no key.
    """
    return {SUDO: True, "_sudo": True} if sudo else {}


def command_timeout_data(seconds: int) -> dict[str, int]:
    """
    The host data that bounds each remote command of a host to ``seconds``:
    pyinfra's own global argument :data:`COMMAND_TIMEOUT`, the default of every
    operation and fact of the run, as ``_sudo`` is (:func:`sudo_data`), the
    rollback's new run included. An operation given its own ``_timeout`` (a
    step that waits longer) keeps it. ``--data _timeout=N`` overrides it for a
    run, for pyinfra and for twinbolt's derived bounds alike
    (``operations/site/settings.py``).
    """
    return {COMMAND_TIMEOUT: seconds}


def flat_key(prefix: str, key: str) -> str:
    """The host data name of a site key: ``[serving] port`` is ``serving_port``."""
    return f"{prefix}_{key}"


def nested_section(field: FieldInfo) -> type[BaseModel] | None:
    """The model of a field that is a table of its own (``gateway_roles.large``), else None."""
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _flat(prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(_flat(flat_key(prefix, key), value))
        else:
            flat[flat_key(prefix, key)] = value
    return flat


def site_default(model: type[BaseModel], field: str) -> Any:
    """A field's default, for code that needs one without writing it twice."""

    return model.model_fields[field].get_default(call_default_factory=True)


def section_defaults(model: type[BaseModel], prefix: str) -> dict[str, Any]:
    """
    A section's defaults as the flat host data a site gives (``prefix_field``, as
    JSON), for ``group_data/`` to publish: every field that has one, nested
    sections' too, so a field added to a model is here with no other edit (and
    ``group_data/``'s test asks for its line there).
    """
    defaults: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        if section := nested_section(field):
            defaults.update(section_defaults(section, flat_key(prefix, name)))
        elif not field.is_required():
            defaults[flat_key(prefix, name)] = to_jsonable_python(site_default(model, name))
    return defaults


def _sections_defaults(sections: dict[str, type[_Section]]) -> dict[str, Any]:
    return {key: value for prefix, model in sections.items()
            for key, value in section_defaults(model, prefix).items()}


# Every default of a kind of host's sections (:func:`section_defaults`), by its
# host data name: group_data/ publishes each by name, one line a key, so that
# grep finds where a lab host's value comes from; a unit test holds the names
# there to these keys.
WORKSTATION_DEFAULTS: dict[str, Any] = _sections_defaults(WORKSTATION_SECTIONS)
GATEWAY_DEFAULTS: dict[str, Any] = _sections_defaults(GATEWAY_SECTIONS)


def load_site(path: str | os.PathLike[str]) -> Site:
    """
    Read and validate a site file (the inventory passes the one ``TWINBOLT_SITE`` names).

    Every problem is reported at once, one ``file: key.path: what is wrong`` line
    each, as a :class:`SiteError`.
    """

    path = Path(path)
    try:
        with path.open("rb") as file:
            document = tomllib.load(file)
    except FileNotFoundError:
        raise SiteError(
            f"site file {path} does not exist (it is named by {SITE_ENV}; "
            f"unset {SITE_ENV} to target the embedded lab)"
        ) from None
    except OSError as error:
        raise SiteError(f"site file {path} cannot be read: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise SiteError(f"{path}: not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise SiteError(f"{path}: not UTF-8 text, as TOML must be: byte "
                        f"{error.object[error.start]:#04x} at offset {error.start}") from None

    try:
        return Site.model_validate(document, context={"site_dir": path.parent.resolve()})
    except ValidationError as error:
        lines = [f"{path}: {_describe(problem, document)}" for problem in error.errors()]
        raise SiteError("\n".join(lines)) from None


def _describe(problem: Any, document: dict[str, Any]) -> str:
    location = problem["loc"]
    where = ".".join(str(part) for part in location) or "(top level)"
    host = _host_at(location, document)
    if host and isinstance(problem.get("ctx", {}).get("error"), MissingFile):
        where = f"{where} (host {host})"
    if problem["type"] == "missing":
        return f"{where}: required, but missing"
    if problem["type"] == "extra_forbidden":
        allowed = ", ".join(_model_at(location[:-1]).model_fields)
        return f"{where}: unknown key; allowed here: {allowed}"
    return f"{where}: {problem_message(problem)}"


def problem_message(problem: Any) -> str:
    """What pydantic found wrong with one value, in the site's words, with the value."""
    if problem["type"] == "value_error":
        message = str(problem["ctx"]["error"])
    else:
        message = re.sub(r"^Input\b", "value", problem["msg"])
    if isinstance(problem["input"], (str, int, float)):
        message = f"{message} (got {problem['input']!r})"
    return message


def _host_at(location: tuple[Any, ...], document: dict[str, Any]) -> str | None:
    """The name of the host a problem's key belongs to, when the file gives one."""
    try:
        if location[:1] == ("workstations",) and len(location) > 2:
            entry = document["workstations"][location[1]]
        elif location[:1] == ("pairs",) and location[2:3] == ("workstations",) \
                and len(location) > 4:
            entry = document["pairs"][location[1]]["workstations"][location[3]]
        elif location[:1] == ("gateway",) and len(location) > 1:
            entry = document["gateway"]
        else:
            return None
        name = entry["name"]
    except (KeyError, IndexError, TypeError):
        return None
    return name if isinstance(name, str) else None


def _model_at(location: tuple[Any, ...]) -> type[BaseModel]:
    model: type[BaseModel] = Site
    for part in location:
        # A list index names an item of the list whose model is already in hand.
        if isinstance(part, str):
            annotation = model.model_fields[part].annotation
            model = next(
                candidate
                for candidate in (annotation, *get_args(annotation))
                if isinstance(candidate, type) and issubclass(candidate, BaseModel)
            )
    return model
