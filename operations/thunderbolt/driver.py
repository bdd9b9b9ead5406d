"""
The driver layer: which ``thunderbolt_net`` build the workstations run.

``stock`` is the distribution's module, loaded by ``modprobe``;
``stock_e2e_off`` is the same file loaded with ``e2e=0``, receive-side E2E off
(a parameter read only at load, so a change of it is a reload). ``candidate`` is
a pinned out-of-tree build that adds the opt-in ``tx_e2e`` parameter; it is
staged in ``/run/twinbolt`` (tmpfs, gone on reboot) and loaded with ``insmod``,
never copied under ``/lib/modules``, into the initramfs or into ``modprobe.d``.

A load is not proof: ``insmod`` ignores parameters a module does not declare, so
the candidate is accepted only when ``parameters/tx_e2e`` reads ``Y`` and the
loaded build-id is the candidate's own.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from pyinfra import host
from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.facts.files import File
from pyinfra.facts.server import KernelVersion
from pyinfra.operations import files

from operations.plumbing import module_file
from operations.plumbing.facts import EmptyMeansSomething, shell_script
from operations.plumbing.phase import executing
from operations.site.settings import WorkstationSettings
from operations.states import STOCK_BUILDS, Driver
from operations.step import Layer, failing, operation, refuse

LAYER = Layer.DRIVER
TBNET_E2E = 0x1
# The RX E2E parameter each build is loaded with, as /sys/module shows it.
RX_E2E = {driver: "Y" if driver.rx_e2e else "N" for driver in Driver}


def build_id_from_note(note: bytes) -> str:
    """The descriptor of an ELF note (``/sys/module/*/notes/.note.gnu.build-id``) as hex."""
    name_size = int.from_bytes(note[0:4], "little")
    desc_size = int.from_bytes(note[4:8], "little")
    desc_start = 12 + (name_size + 3) // 4 * 4
    return note[desc_start : desc_start + desc_size].hex()


# Facts


class LoadedModule(FactBase):
    """
    A module as the kernel shows it under ``/sys/module/<name>``, or ``None`` when
    it is not loaded. This kernel-side view is the truth; ``lsmod`` and
    ``/proc/modules`` are not always there.

    .. code:: python

        {"initstate": "live", "parameters": {"e2e": "Y", "tx_e2e": "Y"}, "build_id": "3c20…"}
    """

    def command(self, module: str) -> StringCommand:
        script = (
            'd=/sys/module/"$1"; [ -e "$d/initstate" ] || exit 0; '
            'echo "initstate $(cat "$d/initstate")"; '
            'for p in "$d"/parameters/*; do [ -e "$p" ] && echo "parameter ${p##*/} $(cat "$p")"; '
            "done; "
            'echo "note $(od -An -tx1 -v "$d/notes/.note.gnu.build-id" | tr -d " \\n")"'
        )
        return shell_script(script, module)

    def process(self, output: list[str]) -> dict | None:
        if not output:
            return None
        module: dict = {"initstate": None, "parameters": {}, "build_id": None}
        for line in output:
            kind, _, rest = line.partition(" ")
            if kind == "initstate":
                module["initstate"] = rest.strip()
            elif kind == "parameter":
                key, _, value = rest.partition(" ")
                module["parameters"][key] = value.strip()
            elif kind == "note" and rest.strip():
                module["build_id"] = build_id_from_note(bytes.fromhex(rest.strip()))
        return module


# Distributions install modules plain (.ko) or compressed (Ubuntu since 23.10
# and Fedora .ko.zst, others .ko.xz or .ko.gz); readelf reads only a plain ELF,
# so a compressed file is decompressed into a temporary file first. "$1" is the
# file, or empty for the file modprobe would load for the module "$2".
BUILD_ID_SCRIPT = (
    'f=${1:-$(modinfo -n "$2" 2>/dev/null)}; [ -f "$f" ] || exit 0; '
    'case "$f" in *.zst) d="zstd -dcq";; *.xz) d="xz -dc";; *.gz) d="gzip -dc";; *) d=cat;; esac; '
    't=$(mktemp) || exit 1; $d "$f" > "$t" && readelf -n "$t" 2>/dev/null; rm -f "$t"'
)


class ModuleFileBuildId(FactBase):
    """
    The GNU build-id of a module file, plain or compressed, or ``None`` without
    the file. The one reader of a module file: the driver layer, ``status`` and
    the testinfra checks all ask it.

    + path: the module file; or, empty, the file ``modprobe`` would load for ``module``
    """

    def requires_command(self, path: str = "", module: str = "") -> str:
        return "readelf"

    def command(self, path: str = "", module: str = "") -> StringCommand:
        return shell_script(BUILD_ID_SCRIPT, path, module)

    def process(self, output: list[str]) -> str | None:
        for line in output:
            if "Build ID:" in line:
                return line.split("Build ID:")[1].strip()
        return None


class ModprobeTarget(FactBase):
    """The file ``modprobe <name>`` would load (``modinfo -n``), or ``None``."""

    def command(self, module: str) -> StringCommand:
        return StringCommand("modinfo", "-n", QuoteString(module), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() if output else None


class PeerCapabilities(FactBase):
    """
    The peer's ThunderboltIP capabilities (``prtcstns``) from the XDomain service
    whose ``key`` is ``network``; ``None`` while no peer driver advertises one.

    .. code:: python

        {"service": "0-1.0", "prtcstns": 7}
    """

    def command(self) -> str:
        return (
            "for d in /sys/bus/thunderbolt/devices/*; do "
            '[ "$(cat "$d/key" 2>/dev/null)" = network ] && '
            'echo "${d##*/} $(cat "$d/prtcstns")"; done; true'
        )

    def process(self, output: list[str]) -> dict | None:
        for line in output:
            service, _, value = line.partition(" ")
            return {"service": service, "prtcstns": int(value.strip(), 16)}
        return None


class PersistentModuleCopies(EmptyMeansSomething):
    """
    Every ``<name>.ko*`` under ``/lib/modules`` with its sha256, and every line of
    modprobe, modules-load or initramfs configuration that names the module.

    .. code:: python

        {"files": {"/lib/modules/6.8/updates/thunderbolt_net.ko": "9f2c…"},
         "config": ["/etc/modprobe.d/tb.conf:options thunderbolt_net tx_e2e=1"]}
    """

    def command(self, module: str) -> StringCommand:
        script = (
            'find /lib/modules -name "$1.ko*" -type f -exec sha256sum {} + 2>/dev/null; '
            "grep -rsH -e \"$1\" /etc/modprobe.d /etc/modules-load.d /etc/modules "
            "/etc/initramfs-tools/modules | sed 's/^/config /'; true"
        )
        return shell_script(script, module)

    def process(self, output: list[str]) -> dict:
        copies: dict = {"files": {}, "config": []}
        for line in output:
            if line.startswith("config "):
                copies["config"].append(line.removeprefix("config "))
            else:
                digest, _, path = line.partition("  ")
                copies["files"][path.strip()] = digest
        return copies


class SignatureEnforcement(EmptyMeansSomething):
    """
    Whether this kernel refuses unsigned modules, and why: module signature
    enforcement (``sig_enforce``, set by Secure Boot or ``module.sig_enforce=1``),
    or a lockdown mode that forbids unsigned modules (integrity, confidentiality).
    An empty list when unsigned modules load.

    .. code:: python

        ["sig_enforce=Y", "lockdown=integrity"]
    """

    def command(self) -> str:
        return ("echo sig_enforce $(cat /sys/module/module/parameters/sig_enforce 2>/dev/null); "
                "echo lockdown $(cat /sys/kernel/security/lockdown 2>/dev/null)")

    def process(self, output: list[str]) -> list[str]:
        found = []
        for line in output:
            key, _, value = line.partition(" ")
            if key == "sig_enforce" and value.strip() == "Y":
                found.append("sig_enforce=Y")
            if key == "lockdown":
                active = next((mode.strip("[]") for mode in value.split()
                               if mode.startswith("[")), "none")
                if active != "none":
                    found.append(f"lockdown={active}")
        return found


# The candidate, inspected on the machine that runs pyinfra


@dataclass(frozen=True)
class CandidateModule:
    """
    The pinned candidate ``.ko`` on the operator's machine.

    Everything about it is checked here, before it is uploaded anywhere: the
    file exists, its sha256 is the pinned one, it declares ``tx_e2e``, and its
    vermagic names the kernel it will be loaded into.
    """

    path: str | None
    sha256: str | None
    name: str = "thunderbolt_net"

    @classmethod
    def of(cls, settings: WorkstationSettings) -> CandidateModule:
        """The candidate the site names for this workstation."""
        return cls(settings.candidate.path, settings.candidate.sha256,
                   settings.candidate.module_name)

    @cached_property
    def _file(self) -> module_file.ModuleFile:
        return module_file.read(self.path or "")

    @property
    def build_id(self) -> str:
        """The GNU build-id the loaded candidate is recognised by."""
        if self._file.build_id is None:
            raise module_file.NotAModule(f"candidate {self.path} carries no GNU build-id note")
        return self._file.build_id

    @property
    def readable_build_id(self) -> str | None:
        """
        The build-id, or None when the file is missing or no ELF module: a report
        still reads the host, and :meth:`problems` says why.
        """
        try:
            return self.build_id
        except (OSError, module_file.NotAModule):
            return None

    @property
    def signed(self) -> bool:
        """Whether a module signature is appended (what ``scripts/sign-file`` writes)."""
        with open(self.path or "", "rb") as stream:
            stream.seek(0, 2)
            stream.seek(max(0, stream.tell() - len(MODULE_SIGNATURE_MARK)))
            return stream.read() == MODULE_SIGNATURE_MARK

    @property
    def vermagic_release(self) -> str:
        return self._file.modinfo.get("vermagic", [""])[0].split(" ")[0]

    @property
    def parameters(self) -> list[str]:
        return [entry.split(":")[0] for entry in self._file.modinfo.get("parmtype", [])]

    def problems(self, kernel_release: str) -> list[str]:
        """What makes this file unfit to load into ``kernel_release``; empty when fit."""
        if not self.path or not self.sha256:
            return ["no candidate module configured (candidate path and sha256)"]
        local = Path(self.path)
        if not local.is_file():
            return [f"candidate module file {local} does not exist"]
        digest = hashlib.sha256(local.read_bytes()).hexdigest()
        if digest != self.sha256:
            return [f"candidate {local} has sha256 {digest}, but the pinned one is {self.sha256}"]
        found = []
        try:
            parameters, release = self.parameters, self.vermagic_release
        except module_file.NotAModule as error:
            return [f"candidate {local} is not a kernel module: {error}"]
        if "tx_e2e" not in parameters:
            found.append(f"candidate {local} does not declare the tx_e2e parameter")
        if release != kernel_release:
            found.append(
                f"candidate {local} was built for kernel {release or '(none)'}, "
                f"but this host runs {kernel_release}"
            )
        return found


# The trailer the kernel's sign-file appends to a signed module (MODULE_SIG_STRING).
MODULE_SIGNATURE_MARK = b"~Module signature appended~\n"
SIGN_WITH_MOK = (
    "sign it with a Machine Owner Key: enroll one with `mokutil --import MOK.der` (and "
    "reboot to confirm), sign with `/usr/src/linux-headers-$(uname -r)/scripts/sign-file "
    "sha256 MOK.priv MOK.der thunderbolt_net.ko`, then pin the signed file's sha256"
)


# Unload whatever is loaded and insert the staged candidate ("$1" the module, "$2"
# the file). An XDomain hotplug event can make udev load the stock module again
# between rmmod and insmod, and insmod then fails with "File exists": unload it
# again, a bounded number of times. Any other refusal ends it at once, in
# insmod's own words.
SWAP_TO_CANDIDATE = (
    'for attempt in 1 2 3 4 5; do '
    '[ -e "/sys/module/$1" ] && { rmmod "$1" || exit 1; }; '
    'insmod "$2" tx_e2e=1 && exit 0; '
    '[ -e "/sys/module/$1" ] || exit 1; '
    'echo "twinbolt: $1 was loaded again right after rmmod (udev autoload?): '
    'unloading it again" >&2; done; '
    'echo "twinbolt: $1 was loaded again after each of 5 rmmods: udev autoloads it; '
    'stop what triggers it (or blacklist $1 for the experiment) and retry" >&2; exit 1'
)


def staged_path(run_dir: str, candidate: CandidateModule) -> str:
    return f"{run_dir}/{candidate.name}.ko"


def candidate_refusals(candidate: CandidateModule) -> list[str]:
    """Why the candidate may not be loaded on this host now; empty when it may."""
    found = candidate.problems(host.get_fact(KernelVersion))
    enforcement = host.get_fact(SignatureEnforcement)
    if enforcement and not found and not candidate.signed:
        # insmod would refuse it only after the stock driver is gone.
        found.append(f"this kernel refuses unsigned modules ({', '.join(enforcement)}) and "
                     f"the candidate {candidate.path} carries no signature: {SIGN_WITH_MOK}")
    module = host.get_fact(LoadedModule, module=candidate.name)
    if module is not None and module["parameters"].get("e2e") != "Y":
        found.append(
            f"RX E2E is off (/sys/module/{candidate.name}/parameters/e2e is "
            f"{module['parameters'].get('e2e')}); tx_e2e takes effect only with it on, "
            "towards a peer that advertises it: converge production first"
        )
    peer = host.get_fact(PeerCapabilities)
    if peer is None:
        found.append("no peer advertises a ThunderboltIP network service: is its driver loaded?")
    elif not peer["prtcstns"] & TBNET_E2E:
        found.append(
            f"the peer does not advertise E2E (service {peer['service']} prtcstns "
            f"0x{peer['prtcstns']:08x}, bit 0 clear): if it runs thunderbolt_net with e2e=0, "
            "converge production first"
        )
    return found


def persistence_problems(candidate: CandidateModule, run_dir: str) -> list[str]:
    """Candidate copies or options that would outlive a reboot."""
    copies = host.get_fact(PersistentModuleCopies, module=candidate.name)
    found = [
        f"a candidate copy is installed persistently at {path}"
        for path, digest in copies["files"].items()
        if digest == candidate.sha256
    ]
    found += [f"persistent configuration mentions tx_e2e: {line}"
              for line in copies["config"] if "tx_e2e" in line]
    return found


def build_problems(module: dict | None, wanted: Driver, stock_build: str | None,
                   candidate_build: str | None, stock_file: str | None = None) -> list[str]:
    """
    The driver layer's judge: why the loaded ``thunderbolt_net`` (a
    :class:`LoadedModule`) is not the ``wanted`` build; empty when it is.

    The candidate is its build-id with ``tx_e2e=Y`` (insmod ignores parameters
    a module does not declare); a stock build is the build-id of the file
    modprobe loads (``stock_build``; ``stock_file`` names it in the evidence),
    with no ``tx_e2e`` at all. Each is loaded with its own ``e2e``
    (:data:`RX_E2E`), which only a reload changes.
    """
    if module is None or module["initstate"] != "live":
        return ["thunderbolt_net is not loaded"]
    build, parameters, wanted = module["build_id"], module["parameters"], Driver(wanted)
    if wanted.is_candidate:
        found = [] if build == candidate_build else [
            f"the loaded build-id {build} is not the candidate's {candidate_build}"]
        if parameters.get("tx_e2e") != "Y":
            found.append(f"parameters/tx_e2e is {parameters.get('tx_e2e', 'absent')}, not Y "
                         "(insmod ignores parameters a module does not declare)")
    else:
        found = [] if build == stock_build else [
            f"the loaded build-id {build} is not that of {stock_file or 'the file'}, the file "
            f"modprobe loads ({stock_build})"]
        if "tx_e2e" in parameters:
            found.append("parameters/tx_e2e exists: a candidate build is loaded")
    rx_e2e = parameters.get("e2e")
    if rx_e2e != RX_E2E[wanted]:
        found.append(f"RX E2E is {'on' if rx_e2e == 'Y' else 'off'} (parameters/e2e is {rx_e2e})"
                     + ("" if wanted.rx_e2e else f", but {wanted} loads it with e2e=0"))
    return found


def loaded_driver(module: dict | None, stock_build: str | None,
                  candidate_build: str | None) -> Driver | None:
    """Which build :func:`build_problems` finds loaded: ``None`` for neither."""
    return next((driver for driver in Driver
                 if not build_problems(module, driver, stock_build, candidate_build)), None)


def stock_module(loaded: Driver, module_name: str) -> tuple[str | None, str | None]:
    """
    The file ``modprobe`` would load on this host, and its build-id; read only
    when a stock build is wanted (the candidate is judged by its own build-id).
    """
    if loaded not in STOCK_BUILDS:
        return None, None
    stock_file = host.get_fact(ModprobeTarget, module=module_name)
    return stock_file, (host.get_fact(ModuleFileBuildId, path=stock_file) if stock_file else None)


def candidate_build(loaded: Driver, candidate: CandidateModule) -> str | None:
    """
    The candidate's build-id, read from its file only when the candidate is
    wanted. A stock build is judged without it (by the file modprobe loads, and
    a candidate by its ``tx_e2e``), so that production converges, a rollback
    above all, whatever the candidate's path holds.
    """
    return candidate.build_id if Driver(loaded).is_candidate else None


def driver_problems(loaded: Driver, candidate: CandidateModule, run_dir: str) -> list[str]:
    """Everything that differs from the wanted driver on this host; empty when it holds."""
    module = host.get_fact(LoadedModule, module=candidate.name)
    stock_file, stock_build = stock_module(loaded, candidate.name)
    found = build_problems(module, loaded, stock_build, candidate_build(loaded, candidate),
                           stock_file)
    if loaded in STOCK_BUILDS and host.get_fact(File, path=staged_path(run_dir, candidate)):
        found.append(f"the staged candidate {staged_path(run_dir, candidate)} is still present")
    return found + persistence_problems(candidate, run_dir)


def swap_planned(loaded: Driver, candidate: CandidateModule) -> bool:
    """
    Whether :func:`module` would reload ``thunderbolt_net`` on this host now,
    taking the link away: the one answer its swap acts on and the TP ranks
    above it stop for. Leftovers it only tidies (a staged copy, a persistent
    option) cut nothing.
    """
    _, stock_build = stock_module(loaded, candidate.name)
    return bool(build_problems(host.get_fact(LoadedModule, module=candidate.name), loaded,
                               stock_build, candidate_build(loaded, candidate)))


# Operations


@operation(LAYER, is_idempotent=True)
def admissible(loaded: Driver, candidate: CandidateModule) -> Iterator[PyinfraCommand]:
    """
    Refuse, before anything changes, a driver that cannot be loaded on this host.

    A stock build needs the file ``modprobe`` would load. The candidate needs
    a file whose sha256 is the pinned one, that declares ``tx_e2e`` and was built
    for the running kernel, RX E2E on, and a peer that advertises E2E: without
    those ``tx_e2e`` would load and do nothing, or stall the link.

    + loaded: ``stock``, ``stock_e2e_off`` or ``candidate``
    + candidate: the pinned ``CandidateModule``

    **Example:**

    .. code:: python

        driver.admissible(
            name="Preflight: the candidate driver can be loaded",
            loaded=Driver.CANDIDATE,
            candidate=CandidateModule("/srv/tb/thunderbolt_net.ko", "9f2c…"),
        )
    """
    if Driver(loaded).is_candidate:
        found = candidate_refusals(candidate)
    elif host.get_fact(ModprobeTarget, module=candidate.name) is None:
        found = [f"modprobe finds no {candidate.name} module for this kernel"]
    else:
        found = []
    if found:
        refuse(LAYER, found)
    host.noop(f"the {loaded} driver can be loaded")
    # An operation is a generator, even one that only proves.
    yield from ()


@operation(LAYER)
def module(
    loaded: Driver, candidate: CandidateModule, run_dir: str = "/run/twinbolt"
) -> Iterator[PyinfraCommand]:
    """
    Load the wanted ``thunderbolt_net`` build, swapping only if another is loaded.

    The candidate is staged in ``run_dir`` (tmpfs) and loaded with ``insmod
    <file> tx_e2e=1``; a stock build is loaded with ``modprobe`` (``e2e=0`` for
    ``stock_e2e_off``) and the staged copy removed. A reload takes the link
    down: wait for it with ``link.trained``.

    + loaded: ``stock``, ``stock_e2e_off`` or ``candidate``
    + candidate: the pinned ``CandidateModule``
    + run_dir: where the candidate is staged; must be a tmpfs

    **Example:**

    .. code:: python

        driver.module(
            name="Driver: thunderbolt_net is the candidate build",
            loaded=Driver.CANDIDATE,
            candidate=CandidateModule("/srv/tb/thunderbolt_net.ko", "9f2c…"),
        )
    """
    staged = staged_path(run_dir, candidate)
    if Driver(loaded).is_candidate:
        # Only the file is checked again here: the peer's capabilities vanish while the
        # other workstation reloads in this same step, and preflight proved them.
        found = candidate.problems(host.get_fact(KernelVersion))
        if found:
            # Preflight checked this; something changed since: fail into the rollback.
            yield failing(LAYER, found)
            return
        swap = swap_planned(loaded, candidate)
        yield from files.directory._inner(path=run_dir, mode="0700")
        yield from files.put._inner(
            src=candidate.path, dest=staged, mode="0600", create_remote_dir=False
        )
        if swap:
            yield shell_script(SWAP_TO_CANDIDATE, candidate.name, staged)
        else:
            host.noop("the candidate is loaded with tx_e2e=Y")
        return
    if swap_planned(loaded, candidate):
        loaded_now = host.get_fact(LoadedModule, module=candidate.name)
        unload = ["rmmod", QuoteString(candidate.name), "&&"] if loaded_now else []
        # Should udev load the stock module first, modprobe finds it loaded; the
        # verification then names a wrong e2e.
        yield StringCommand(*unload, "modprobe", QuoteString(candidate.name),
                            *Driver(loaded).modprobe_options)
    else:
        host.noop(f"the {loaded} driver is loaded")
    yield from files.file._inner(path=staged, present=False)


@operation(LAYER, is_idempotent=True)
def verified(
    loaded: Driver, candidate: CandidateModule, run_dir: str = "/run/twinbolt"
) -> Iterator[PyinfraCommand]:
    """
    Prove the wanted driver is loaded, by build-id and parameters, and that no
    candidate copy or option would survive a reboot.

    + loaded: ``stock``, ``stock_e2e_off`` or ``candidate``
    + candidate: the pinned ``CandidateModule`` (its build-id and sha256)
    + run_dir: where a staged candidate would be

    **Example:**

    .. code:: python

        driver.verified(name="Verify: the stock driver is loaded", loaded=Driver.STOCK,
                        candidate=candidate)
    """
    found = driver_problems(loaded, candidate, run_dir)
    if found and executing():
        yield failing(LAYER, found)
        return
    host.noop(f"the {loaded} driver is loaded and nothing of the candidate persists")
