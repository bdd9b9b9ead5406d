"""
The compatibility ledger: which controllers, kernel and driver a run met, and how it ended.

The field's operators learnt by hand which Thunderbolt controllers take the
candidate's TX E2E. Upstream learnt it the hard way: TX E2E was reverted
(1881f2efbf7f) because an ASMedia ASM4242 never returns TX credits, and the link
then carries nothing while the XDomain handshake completes. twinbolt reads every
layer anyway, so every run appends one JSON line to a ledger on the operator's
machine (site key ``ledger.path``):

- each workstation's controller (its NHI's PCI ``vendor:device``, as
  ``lspci -n`` prints it, its host router and the router's NVM firmware
  version), kernel release,
  ``thunderbolt_net`` build-id and parameters, the peer's capabilities and the
  trained rate x lanes;
- the declared driver, and the outcome: ``accepted``, ``refused`` or, after a
  failure, ``rolled_back``, ``interrupted`` (rolled back after a signal, which
  ``interrupted`` names with its step), ``rollback_failed`` or ``stopped``, with
  the layer, or ``guarded`` when the guard restored the stock driver with no run watching
  (:mod:`operations.safety.guard`: always a stall);
- tok/s, in the records ``experiment.py measure`` appends.

A candidate run that failed at the link layer with nothing crossing it is a
stall. Preflight refuses the candidate on a controller pairing with a recorded
stall, the upstream report included (:data:`SEEDED`); ``--data
force_candidate=yes`` overrides that, loudly. A pairing is keyed by controller
and firmware (:class:`Controller`): the field report infers no safety from a
device ID, because two controllers with the same ID can still differ by
firmware, so a stall refuses the firmware it ran on, not every controller with
its ID. A record without firmware (the upstream report, records written before
the ledger kept it) counts for every firmware.

The deploy reads the hosts twice (:func:`observed`): before preflight, so that a
refused run is recorded with what it met, and after the attempt, before any
rollback, so that a failed one is recorded with what it ran. The record is
written once, when the attempt tells how the run ended (:func:`keep`).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import permutations
from pathlib import Path
from typing import Any, Protocol

from pyinfra import host, logger
from pyinfra.api import FactBase
from pyinfra.api.command import PyinfraCommand
from pyinfra.facts.server import KernelVersion

from operations import step
from operations.plumbing.facts import FactGroup
from operations.site.options import FORCING
from operations.states import Driver
from operations.thunderbolt.driver import LoadedModule, PeerCapabilities
from operations.thunderbolt.link import NO_TRAFFIC, XDOMAIN_PEERS, XDomainLink, trained_rate

LAYER = step.Layer.LEDGER

FAILED = ("rolled_back", "interrupted", "rollback_failed", "stopped")
# "guarded": the guard on a workstation found the candidate's link stalled and
# restored the stock driver, with no run watching (operations/safety/guard.py);
# "unaddressed": it found the link up without its address, which is no stall.
# "hotplug", "suspend": a soak's event and what it did (harness/runs/events.py).
OUTCOMES = ("accepted", "refused", *FAILED, "measured", "guarded", "unaddressed", "hotplug",
            "suspend")


class ThunderboltController(FactBase):
    """
    The controller of the Thunderbolt domain the peer is on (domain 0 without a
    peer): its NHI's PCI ids, its host router and the router's NVM firmware
    version; ``None`` on a host without one.

    ``domainN`` links to its NHI's PCI device, so ``domainN/..`` is the NHI. The
    host router ``N-0`` shows its firmware as ``nvm_version``, ``major.minor`` in
    the kernel's ``%x.%x``. Where it shows none, the version is ``None``, never an
    error: older kernels and controllers whose NVM the kernel cannot read (Apple's)
    have no file or fail the read, and a router in safe mode answers ``ENODATA``.
    Only this end's firmware is in this host's sysfs: an XDomain shows no
    ``nvm_version`` (``xdomain_attrs`` in ``drivers/thunderbolt/xdomain.c``), so the
    peer's firmware is the one its own host reads, in its own entry of the record.

    .. code:: python

        {"domain": "domain0", "nhi": "8086:1137", "router": "Intel JHL8540 (8087:1137)",
         "nvm_version": "36.0"}
    """

    def command(self) -> str:
        return (
            "peer=$(" + XDOMAIN_PEERS + 'echo "${d##*/}"; break; done); n=${peer%%-*}; '
            'n=${n:-0}; tb=/sys/bus/thunderbolt/devices; nhi="$tb/domain$n/.."; r="$tb/$n-0"; '
            'echo "domain$n|$(cat "$nhi/vendor")|$(cat "$nhi/device")|$(cat "$r/vendor")'
            '|$(cat "$r/device")|$(cat "$r/vendor_name")|$(cat "$r/device_name")'
            '|$(cat "$r/nvm_version" 2>/dev/null)"'
        )

    def process(self, output: list[str]) -> dict | None:
        if not output:
            return None
        (domain, vendor, device, router_vendor, router_device, vendor_name, device_name,
         nvm_version) = output[0].split("|")
        if not vendor:
            return None
        ids = f"{pci_id(router_vendor)}:{pci_id(router_device)}"
        return {"domain": domain, "nhi": f"{pci_id(vendor)}:{pci_id(device)}",
                "router": f"{vendor_name} {device_name} ({ids})".strip(),
                "nvm_version": nvm_version.strip() or None}


def pci_id(value: str) -> str:
    """``0x1B21`` as ``lspci -n`` writes it: ``1b21``."""
    return value.strip().lower().removeprefix("0x")


class HostIdentity(FactGroup):
    """
    What a ledger entry says of a host, read in one command: its controller,
    kernel release, ``thunderbolt_net`` module, the peer's capabilities, the link.
    """

    members = {"controller": ThunderboltController, "kernel": KernelVersion,
               "module": LoadedModule, "peer": PeerCapabilities, "xdomain": XDomainLink}

    @staticmethod
    def arguments(module: str) -> dict[str, dict[str, Any]]:
        """Each member's arguments: only the module's name."""
        return {"module": {"module": module}}

    def command(self, module: str) -> str:
        return self.sections(self.arguments(module))


def host_entry(name: str, values: dict[str, Any]) -> dict[str, Any]:
    """One host's entry in a record, from :class:`HostIdentity`'s value."""
    controller, module = values.get("controller"), values.get("module")
    peer, xdomain = values.get("peer"), values.get("xdomain")
    rate, lanes = trained_rate(xdomain) if xdomain else (None, None)
    return {
        "host": name,
        "nhi": controller["nhi"] if controller else None,
        "router": controller["router"] if controller else None,
        "nvm_version": controller["nvm_version"] if controller else None,
        "kernel": values.get("kernel"),
        "build_id": module["build_id"] if module else None,
        "parameters": module["parameters"] if module else {},
        "peer_prtcstns": f"0x{peer['prtcstns']:08x}" if peer else None,
        "rate_gbps": rate,
        "lanes": lanes,
    }


def record(state: str, driver: str, outcome: str, hosts: list[dict[str, Any]],
           layer: str | None = None, evidence: str = "", forced: bool = False,
           tok_s: float | None = None, lost: tuple[str, ...] = (),
           event: dict[str, Any] | None = None,
           interrupted: step.Interruption | None = None) -> dict[str, Any]:
    """
    One ledger line. ``stall`` is the judgement :func:`stall_reports` acts on: the
    candidate's run failed at the link layer because nothing crossed a link that
    trained, which is what a TX ring that never gets credits does. ``lost``: the
    hosts whose connection died during the run, which its rollback left out.
    ``event``: a soak event's outcome (a ``hotplug`` or ``suspend`` record).
    ``interrupted``: the signal that failed the run, and the step it arrived in.
    """
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown outcome {outcome!r}; outcomes are: {', '.join(OUTCOMES)}")
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "state": state,
        "driver": driver,
        "outcome": outcome,
        "layer": layer,
        "stall": (driver == Driver.CANDIDATE and layer == step.Layer.LINK
                  and (outcome == "guarded" or outcome in FAILED and NO_TRAFFIC in evidence)),
        "forced": forced,
        "tok_s": tok_s,
        "evidence": evidence,
        "lost": list(lost),
        "interrupted": ({"signal": interrupted.signal, "step": interrupted.step}
                        if interrupted else None),
        "hosts": hosts,
        **({"event": event} if event is not None else {}),
    }


# The upstream report the refusal starts from: the revert names the controller,
# neither the one at the other end nor a firmware, so the pairing is any that
# includes it, on any firmware.
SEEDED = [{
    **record("tx_e2e (upstream)", Driver.CANDIDATE, "rolled_back",
             [{"host": "upstream report", "nhi": "1b21:2425", "router": "ASMedia ASM4242"}],
             layer=step.Layer.LINK,
             evidence="upstream revert 1881f2efbf7f of TX E2E (a8065af3346e): the ASMedia "
                      "ASM4242 (1b21:2425) never returns TX credits; the TX ring freezes and "
                      f"{NO_TRAFFIC} (100% loss) though the XDomain handshake completes"),
    "time": "upstream",
}]


# What makes a JSON line a record: what the stall refusal and the matrix read.
RECORD_KEYS = {"time": str, "state": str, "driver": str, "outcome": str, "stall": bool,
               "hosts": list}


def record_problem(value: Any) -> str | None:
    """Why a JSON value is not a ledger record; ``None`` when it is one."""
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not a record"
    for key, kind in RECORD_KEYS.items():
        if not isinstance(value.get(key), kind):
            return f"no {key!r} ({kind.__name__})"
    if not all(isinstance(part, dict) for part in value["hosts"]):
        return "a host entry that is not an object"
    return None


def read_all(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """
    The ledger's records, oldest first, and a warning for each line that is not
    one (torn by a crash mid-write, or foreign), naming its line number. Such a
    line is skipped, never a reason to refuse the rest: the stall history that
    gates the candidate is in the other lines.
    """
    path = path.expanduser()
    if not path.exists():
        return [], []
    records, skipped = [], []
    text = path.read_bytes().decode("utf-8", errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            problem: str | None = f"not a JSON line ({error.msg})"
        else:
            problem = record_problem(value)
        if problem:
            skipped.append(f"{path}:{number}: skipped, {problem}")
        else:
            records.append(value)
    return records, skipped


def read(path: Path) -> list[dict[str, Any]]:
    """The ledger's records, oldest first (none without a ledger); a skipped line is warned of."""
    records, skipped = read_all(path)
    for warning in skipped:
        logger.warning(f"ledger: {warning}")
    return records


def append(path: Path, entry: dict[str, Any]) -> None:
    """
    Add one record as one atomic append: the whole line in one ``write`` under
    ``flock``, then ``fsync``, so that two runs ending at once never interleave
    and a record is on disk when the run says it is. A last line torn by a crash
    gets its newline first, in the same write, so the record is not glued to it.
    The ledger and its directory are created on first use.
    """
    path = path.expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(entry, sort_keys=True) + "\n").encode()
    descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        size = os.fstat(descriptor).st_size
        if size and os.pread(descriptor, 1, size - 1) != b"\n":
            line = b"\n" + line
        if os.write(descriptor, line) != len(line):
            raise OSError(f"{path}: a short write appending a ledger record")
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class Controller:
    """
    A controller as the ledger keys a pairing: its NHI's ``vendor:device`` and its
    host router's NVM firmware version, ``None`` where that is not known (a host
    router that shows none, the upstream report, a record written before the
    ledger kept firmware).
    """

    nhi: str
    nvm_version: str | None = None

    @classmethod
    def of(cls, part: dict[str, Any]) -> Controller:
        """A host entry's controller, NHI ``unknown`` where it could not be read."""
        return cls(part.get("nhi") or "unknown", part.get("nvm_version"))

    def __str__(self) -> str:
        return f"{self.nhi} (NVM {self.nvm_version})" if self.nvm_version else self.nhi

    def covers(self, other: Controller) -> bool:
        """
        Whether a stall recorded on this controller counts for ``other``: the same
        NHI, on the same firmware unless either is unknown. A stall without firmware
        counts for every firmware, and a firmware that cannot be read may be the one
        that stalled.
        """
        return self.nhi == other.nhi and (
            None in (self.nvm_version, other.nvm_version) or self.nvm_version == other.nvm_version)


def controllers(entry: dict[str, Any]) -> list[Controller]:
    """A record's controllers, in the order :func:`describe_pairing` shows them."""
    return sorted((Controller.of(part) for part in entry["hosts"]), key=str)


def describe_pairing(pairing: list[Controller]) -> str:
    """``8086:1137 (NVM 36.0) + 8086:1137 (NVM 36.0)``; a controller without firmware as its NHI."""
    return " + ".join(map(str, pairing))


def covered(stalled: list[Controller], pairing: list[Controller]) -> bool:
    """Whether each stalled controller covers a different one of ``pairing``."""
    return any(all(map(Controller.covers, stalled, chosen))
               for chosen in permutations(pairing, len(stalled)))


def stall_reports(records: list[dict[str, Any]], pairing: list[Controller]
                  ) -> list[dict[str, Any]]:
    """
    The recorded stalls, seeded ones first, whose controllers each cover one of
    ``pairing`` (the workstations' controllers): a record of one controller covers
    every pairing with it, and a record without firmware every firmware.
    """
    return [entry for entry in [*SEEDED, *records]
            if entry["stall"] and covered(controllers(entry), pairing)]


def describe_stall(entry: dict[str, Any]) -> str:
    if entry["time"] == "upstream":
        return entry["evidence"]
    if entry["outcome"] == "guarded":
        return f"{entry['time']}: {entry['evidence']}"
    return (f"{entry['time']}: {entry['state']} on {describe_pairing(controllers(entry))} "
            f"failed at the {entry['layer']} layer ({entry['outcome']}): {entry['evidence']}")


@dataclass
class Observations:
    """
    What a run has seen of each workstation, whether it was forced past a
    recorded stall, and which pairs' records the ledger will write at its ending.
    """

    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The ledger records of the guard's events this run read, by host.
    guarded: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    forced: bool = False
    # The pairs whose record the ledger will write when the run ends.
    kept: set[tuple[str, ...]] = field(default_factory=set)

    def pairing(self, names: list[str]) -> list[Controller] | None:
        """
        The controllers of the named workstations, once each has been observed
        this run, in the order :func:`describe_pairing` shows them.
        """
        if any(name not in self.hosts for name in names):
            return None
        return sorted((Controller.of(self.hosts[name]) for name in names), key=str)


class Observing(Protocol):
    """
    What the ledger needs of the run (an :class:`operations.run.Run`): what it
    observed, and its attempt, whose ending it records.
    """

    observed: Observations
    attempt: step.Attempt


def keep(run: Observing, path: str, state: str, driver: str, pair: list[str]) -> None:
    """
    Have the run's ending appended to the ledger at ``path``, with what the run
    observed of ``pair``'s workstations: one record a pair, since a record's key
    is one cable's controllers. ``deploy.py`` calls this on every workstation;
    the first call of each pair counts.
    """
    observed = run.observed
    if tuple(pair) in observed.kept:
        return
    observed.kept.add(tuple(pair))

    def write(ending: step.Ending) -> None:
        hosts = [entry for name, entry in observed.hosts.items() if name in pair]
        append(Path(path), record(state, driver, ending.outcome, hosts,
                                  layer=ending.layer, evidence=ending.evidence,
                                  forced=observed.forced, lost=ending.lost,
                                  interrupted=ending.interrupted))

    run.attempt.listeners.append(write)


# Operations


@step.operation(LAYER, is_idempotent=True)
def observed(run: Observing, module: str) -> Iterator[PyinfraCommand]:
    """
    Note this workstation's controller, kernel, driver and link for the run's record.

    Read-only. The record is written when the run ends (:func:`keep`): this only
    remembers what the host showed when the step ran.

    + run: the :class:`~operations.run.Run`, whose observations this adds to
    + module: the ``thunderbolt_net`` module's name

    **Example:**

    .. code:: python

        ledger.observed(name="Ledger: what this run meets", run=run, module="thunderbolt_net")
    """
    entry = run.observed.hosts[host.name] = host_entry(
        host.name, host.get_fact(HostIdentity, module=module))
    host.noop(f"controller {Controller.of(entry)}, kernel {entry['kernel']}, "
              f"{module} {entry['build_id'] or 'not loaded'}")
    yield from ()


@step.operation(step.Layer.DRIVER, is_idempotent=True)
def no_recorded_stall(run: Observing, path: str, workstations: list[str], force: bool = False
                      ) -> Iterator[PyinfraCommand]:
    """
    Refuse the candidate on a controller pairing with a recorded stall, before any change.

    The ledger at ``path`` and the upstream report (:data:`SEEDED`) are the record;
    a stall counts for its controllers on the firmware it ran (:meth:`Controller.covers`).
    Judged once every workstation has been observed: at execute time, or earlier
    when pyinfra predicts changes host by host and both are known.

    + run: the :class:`~operations.run.Run`, which observed the workstations
    + path: the ledger, on this machine
    + workstations: the workstations, whose controllers make the pairing
    + force: go ahead anyway (``--data force_candidate=yes``), saying so in capitals

    **Example:**

    .. code:: python

        ledger.no_recorded_stall(name="Preflight: no stall is recorded for these controllers",
                                 run=run, path="~/.local/state/twinbolt/ledger.jsonl",
                                 workstations=["ws0", "ws1"])
    """
    controllers_now = run.observed.pairing(workstations)
    if controllers_now is None:
        host.noop("the pairing is judged once both workstations are observed")
        return
    if any(controller.nhi == "unknown" for controller in controllers_now):
        # Not a reason to refuse, but the operator must know the check saw nothing.
        host.log_styled("no Thunderbolt controller could be read (/sys/bus/thunderbolt/devices/"
                        "domainN/../vendor): recorded stalls cannot be matched to it",
                        fg="yellow", log_func=logger.warning)
    records, skipped = read_all(Path(path))
    for warning in skipped:
        host.log_styled(f"ledger: {warning}", fg="yellow", log_func=logger.warning)
    # The guard's events this run read count at once, though they are written only as it runs.
    guarded = [entry for entries in run.observed.guarded.values() for entry in entries
               if entry not in records]
    stalls = stall_reports([*records, *guarded], controllers_now)
    pair = describe_pairing(controllers_now)
    if stalls and not force:
        step.refuse(step.Layer.DRIVER, [
            f"the candidate's TX E2E has stalled on the controller pairing {pair}",
            *(describe_stall(entry) for entry in stalls),
            f"override at your own risk with --data {FORCING}",
        ])
    elif stalls:
        warning = (f"FORCED: THE CANDIDATE RUNS ON THE CONTROLLER PAIRING {pair} DESPITE "
                   f"{len(stalls)} RECORDED STALL(S) ({FORCING})")
        if not run.observed.forced:
            run.observed.forced = True
            run.attempt.caveats.append(warning)
        host.log_styled(warning, fg="red", log_func=logger.warning)
        host.noop("forced past a recorded stall")
    else:
        host.noop(f"no stall is recorded for {pair}")
    yield from ()
