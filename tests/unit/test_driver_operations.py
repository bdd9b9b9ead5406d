"""The driver layer's operations, given facts, yield the right commands or none."""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from operation_harness import run_operation
from pyinfra.api import OperationError
from pyinfra.facts.files import Directory, File, Sha1File
from pyinfra.facts.server import KernelVersion, TmpDir

from lab.modules import build
from operations.safety import guard
from operations.thunderbolt import driver
from operations.thunderbolt.driver import (
    CandidateModule,
    LoadedModule,
    ModprobeTarget,
    ModuleFileBuildId,
    PeerCapabilities,
    PersistentModuleCopies,
    SignatureEnforcement,
    build_id_from_note,
    build_problems,
    loaded_driver,
)

RELEASE = __import__("os").uname().release
STOCK_FILE = f"/lib/modules/{RELEASE}/kernel/drivers/net/thunderbolt/thunderbolt_net.ko"
STOCK_BUILD = "3c2064ecc8a43a44b08a2d6b40df18360923bf58"
STAGED = "/run/twinbolt/thunderbolt_net.ko"


@pytest.fixture(scope="module")
def candidate(tmp_path_factory: pytest.TempPathFactory) -> CandidateModule:
    path = build("candidate", tmp_path_factory.mktemp("ko") / "thunderbolt_net.ko")
    return CandidateModule(str(path), hashlib.sha256(path.read_bytes()).hexdigest())


def facts(candidate: CandidateModule, loaded: str | None = "stock", peer: int = 7,
          e2e: str = "Y", staged: bool = False, persistent: dict | None = None,
          enforcement: list[str] | None = None):
    """Facts of a workstation with the given driver loaded and the given peer."""
    module = None
    if loaded == "stock":
        module = {"initstate": "live", "parameters": {"e2e": e2e}, "build_id": STOCK_BUILD}
    elif loaded == "candidate":
        module = {"initstate": "live", "parameters": {"e2e": e2e, "tx_e2e": "Y"},
                  "build_id": candidate.build_id}
    sha1 = hashlib.sha1(Path(candidate.path).read_bytes()).hexdigest()
    values = {
        LoadedModule: module,
        ModprobeTarget: STOCK_FILE,
        ModuleFileBuildId: STOCK_BUILD,
        PeerCapabilities: {"service": "0-1.0", "prtcstns": peer},
        PersistentModuleCopies: persistent or {"files": {STOCK_FILE: "aa"}, "config": []},
        KernelVersion: RELEASE,
        SignatureEnforcement: enforcement or [],
        TmpDir: "/tmp",
        File: {"size": 1, "mode": 600} if staged else None,
        Sha1File: sha1 if staged else None,
        Directory: {"mode": 700} if staged else None,
    }
    return lambda cls, kwargs: values[cls]


def test_build_id_is_read_from_the_kernel_note() -> None:
    note = bytes.fromhex("04000000" "14000000" "03000000") + b"GNU\0" + bytes(range(20))
    assert build_id_from_note(note) == bytes(range(20)).hex()


def test_loaded_module_fact_parses_sysfs() -> None:
    note = ("04 00 00 00 14 00 00 00 03 00 00 00 47 4e 55 00 " + "ab " * 20).replace(" ", "")
    parsed = LoadedModule().process(
        ["initstate live", "parameter e2e Y", "parameter tx_e2e Y", f"note {note}"])
    assert parsed == {"initstate": "live", "parameters": {"e2e": "Y", "tx_e2e": "Y"},
                      "build_id": "ab" * 20}
    assert LoadedModule().process([]) is None


def test_the_judge_names_the_build_by_build_id_and_tx_e2e() -> None:
    def module(build: str, **parameters: str) -> dict:
        return {"initstate": "live", "build_id": build, "parameters": {"e2e": "Y", **parameters}}
    candidate_build = "c" * 40
    assert loaded_driver(module(STOCK_BUILD), STOCK_BUILD, candidate_build) == "stock"
    assert loaded_driver(module(candidate_build, tx_e2e="Y"), STOCK_BUILD,
                         candidate_build) == "candidate"
    # insmod ignored tx_e2e=1, or the candidate's own build has it off: neither build.
    assert loaded_driver(module(candidate_build, tx_e2e="N"), STOCK_BUILD, candidate_build) is None
    assert loaded_driver(module("d" * 40), STOCK_BUILD, candidate_build) is None
    assert loaded_driver(None, STOCK_BUILD, candidate_build) is None
    assert build_problems(module(candidate_build, tx_e2e="Y"), "stock", STOCK_BUILD,
                          candidate_build, STOCK_FILE) == [
        f"the loaded build-id {candidate_build} is not that of {STOCK_FILE}, the file modprobe "
        f"loads ({STOCK_BUILD})", "parameters/tx_e2e exists: a candidate build is loaded"]


@pytest.mark.parametrize("initstate", ["coming", "going"])
def test_a_module_still_loading_or_unloading_is_no_build(initstate: str) -> None:
    # The build-id and parameters are the stock driver's, but insmod has not
    # finished (coming) or rmmod is under way (going): neither is loaded yet.
    module = {"initstate": initstate, "build_id": STOCK_BUILD, "parameters": {"e2e": "Y"}}
    assert build_problems(module, "stock", STOCK_BUILD, "c" * 40) == [
        "thunderbolt_net is not loaded"]
    assert loaded_driver(module, STOCK_BUILD, "c" * 40) is None


def test_candidate_is_staged_in_run_and_inserted_with_tx_e2e(candidate) -> None:
    commands = run_operation(driver.module, facts(candidate), loaded="candidate",
                             candidate=candidate)
    assert commands == [
        "mkdir -p /run/twinbolt",
        "chmod 700 /run/twinbolt",
        f"upload {candidate.path} {STAGED}",
        "chmod 600 /run/twinbolt/thunderbolt_net.ko",
        f"sh -c {shlex.quote(driver.SWAP_TO_CANDIDATE)} - thunderbolt_net {STAGED}",
    ]


# The swap script, run here with stand-in rmmod and insmod over a stand-in
# /sys/module, as the hosts run it.
FAKE_KMOD = {
    "rmmod": 'rm -r "$SYS/$1"; [ -e "$AUTOLOADS" ] && [ "$(cat "$AUTOLOADS")" -gt 0 ] && '
             '{ echo $(( $(cat "$AUTOLOADS") - 1 )) > "$AUTOLOADS"; mkdir "$SYS/$1"; '
             'echo stock > "$SYS/$1/build"; }; exit 0',
    "insmod": '[ -e "$SYS/thunderbolt_net" ] && { echo "insmod: File exists" >&2; exit 1; }; '
              '[ -e "$REJECT" ] && { echo "insmod: Key was rejected by service" >&2; exit 1; }; '
              'mkdir "$SYS/thunderbolt_net" && echo candidate > "$SYS/thunderbolt_net/build"',
}


def swap(tmp_path: Path, autoloads: int, reject: bool = False) -> subprocess.CompletedProcess:
    """The swap from a loaded stock module, udev loading it again after ``autoloads`` rmmods."""
    sys_module, bin_dir = tmp_path / "sys-module", tmp_path / "bin"
    (sys_module / "thunderbolt_net").mkdir(parents=True)
    (sys_module / "thunderbolt_net" / "build").write_text("stock\n")
    bin_dir.mkdir()
    for name, body in FAKE_KMOD.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "autoloads").write_text(f"{autoloads}\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SYS": str(sys_module),
           "AUTOLOADS": str(tmp_path / "autoloads"), "REJECT": str(tmp_path / "reject")}
    if reject:
        (tmp_path / "reject").touch()
    script = driver.SWAP_TO_CANDIDATE.replace("/sys/module", str(sys_module))
    return subprocess.run(["sh", "-c", script, "-", "thunderbolt_net", STAGED],
                          capture_output=True, text=True, env=env)


def test_the_swap_ends_on_the_candidate_though_udev_loads_the_stock_module_again(
        tmp_path: Path) -> None:
    done = swap(tmp_path, autoloads=2)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "sys-module" / "thunderbolt_net" / "build").read_text() == "candidate\n"
    assert done.stderr.count("was loaded again right after rmmod (udev autoload?)") == 2


def test_a_swap_that_udev_always_undoes_fails_with_that_evidence(tmp_path: Path) -> None:
    failed = swap(tmp_path, autoloads=99)
    assert failed.returncode == 1
    assert "was loaded again after each of 5 rmmods: udev autoloads it" in failed.stderr


def test_an_insmod_refused_for_its_own_reason_is_not_retried(tmp_path: Path) -> None:
    failed = swap(tmp_path, autoloads=0, reject=True)
    assert failed.returncode == 1
    assert failed.stderr.strip() == "insmod: Key was rejected by service"


def test_a_loaded_candidate_changes_nothing(candidate) -> None:
    assert run_operation(driver.module, facts(candidate, "candidate", staged=True),
                         loaded="candidate", candidate=candidate) == []


def test_stock_replaces_the_candidate_and_removes_the_staged_copy(candidate) -> None:
    commands = run_operation(driver.module, facts(candidate, "candidate", staged=True),
                             loaded="stock", candidate=candidate)
    assert commands == ["rmmod thunderbolt_net && modprobe thunderbolt_net", f"rm -f {STAGED}"]


def test_stock_loads_when_nothing_is_loaded_and_is_a_noop_when_loaded(candidate) -> None:
    assert run_operation(driver.module, facts(candidate, None), loaded="stock",
                         candidate=candidate) == ["modprobe thunderbolt_net"]
    assert run_operation(driver.module, facts(candidate), loaded="stock",
                         candidate=candidate) == []


@pytest.mark.parametrize(("e2e", "wanted", "commands"), [
    ("Y", "stock_e2e_off", ["rmmod thunderbolt_net && modprobe thunderbolt_net e2e=0"]),
    ("N", "stock", ["rmmod thunderbolt_net && modprobe thunderbolt_net"]),
    ("N", "stock_e2e_off", []),
])
def test_receive_side_e2e_changes_only_by_a_reload_of_the_stock_file(candidate, e2e, wanted,
                                                                     commands) -> None:
    # e2e is read at load (mode 0444): the stock build with another e2e is another driver.
    assert run_operation(driver.module, facts(candidate, e2e=e2e), loaded=wanted,
                         candidate=candidate) == commands


def test_the_stock_build_with_e2e_off_is_judged_by_its_file_and_its_e2e(candidate) -> None:
    e2e_off = {"initstate": "live", "parameters": {"e2e": "N"}, "build_id": STOCK_BUILD}
    assert loaded_driver(e2e_off, STOCK_BUILD, candidate.build_id) == "stock_e2e_off"
    assert run_operation(driver.verified, facts(candidate, e2e="N"), loaded="stock_e2e_off",
                         candidate=candidate) == []
    [message] = run_operation(driver.verified, facts(candidate), loaded="stock_e2e_off",
                              candidate=candidate)
    assert message == ("fail: driver layer: RX E2E is on (parameters/e2e is Y), but "
                       "stock_e2e_off loads it with e2e=0")


@pytest.mark.parametrize(("kwargs", "evidence"), [
    ({"peer": 6}, "does not advertise E2E (service 0-1.0 prtcstns 0x00000006"),
    ({"e2e": "N"}, "RX E2E is off"),
])
def test_candidate_is_refused_without_e2e_on_both_ends(candidate, kwargs, evidence) -> None:
    with pytest.raises(OperationError, match="wsa: driver layer") as refused:
        run_operation(driver.admissible, facts(candidate, **kwargs), loaded="candidate",
                      candidate=candidate)
    assert evidence in str(refused.value)


def test_a_wrong_checksum_or_kernel_is_refused(candidate, tmp_path) -> None:
    wrong = CandidateModule(candidate.path, "ab" * 32)
    with pytest.raises(OperationError, match="but the pinned one is abab"):
        run_operation(driver.admissible, facts(candidate), loaded="candidate", candidate=wrong)
    assert wrong.problems(RELEASE) and candidate.problems("5.0.0-other") == [
        f"candidate {candidate.path} was built for kernel {RELEASE}, but this host runs 5.0.0-other"
    ]
    missing = CandidateModule(str(tmp_path / "absent.ko"), candidate.sha256)
    assert missing.problems(RELEASE) == [f"candidate module file {missing.path} does not exist"]


def test_a_stock_build_is_not_a_candidate(tmp_path) -> None:
    stock = build("stock", tmp_path / "thunderbolt_net.ko")
    fake = CandidateModule(str(stock), hashlib.sha256(stock.read_bytes()).hexdigest())
    assert fake.problems(RELEASE) == [f"candidate {stock} does not declare the tx_e2e parameter"]


def test_verification_names_every_difference_but_only_judges_when_executing(candidate) -> None:
    wrong = facts(candidate, "candidate", staged=True)
    [message] = run_operation(driver.verified, wrong, loaded="stock", candidate=candidate)
    assert message.startswith("fail: driver layer: ")
    assert "parameters/tx_e2e exists" in message and f"{STAGED} is still present" in message
    assert run_operation(driver.verified, wrong, executing=False, loaded="stock",
                         candidate=candidate) == []


def test_a_persistent_candidate_copy_fails_verification(candidate) -> None:
    persistent = {"files": {f"/lib/modules/{RELEASE}/updates/thunderbolt_net.ko":
                            candidate.sha256}, "config": []}
    [message] = run_operation(driver.verified, facts(candidate, persistent=persistent),
                              loaded="stock", candidate=candidate)
    assert f"installed persistently at /lib/modules/{RELEASE}/updates" in message


def test_signature_enforcement_is_read_from_sig_enforce_and_the_lockdown_mode() -> None:
    read = SignatureEnforcement().process
    assert read(["sig_enforce N", "lockdown [none] integrity confidentiality"]) == []
    assert read(["sig_enforce", "lockdown"]) == []
    assert read(["sig_enforce Y", "lockdown none [integrity] confidentiality"]) == [
        "sig_enforce=Y", "lockdown=integrity"]


def test_an_unsigned_candidate_is_refused_where_the_kernel_enforces_signatures(candidate) -> None:
    with pytest.raises(OperationError, match="wsa: driver layer") as refused:
        run_operation(driver.admissible, facts(candidate, enforcement=["sig_enforce=Y"]),
                      loaded="candidate", candidate=candidate)
    assert "refuses unsigned modules (sig_enforce=Y)" in str(refused.value)
    assert "mokutil --import" in str(refused.value)
    # The stock driver needs no candidate: nothing to refuse.
    assert run_operation(driver.admissible, facts(candidate, enforcement=["sig_enforce=Y"]),
                         loaded="stock", candidate=candidate) == []


def test_a_signed_candidate_loads_where_the_kernel_enforces_signatures(candidate, tmp_path) -> None:
    signed = tmp_path / "thunderbolt_net.ko"
    signed.write_bytes(Path(candidate.path).read_bytes() + b"\x00" * 12
                       + driver.MODULE_SIGNATURE_MARK)
    pinned = CandidateModule(str(signed), hashlib.sha256(signed.read_bytes()).hexdigest())
    assert pinned.signed and not candidate.signed
    assert run_operation(driver.admissible, facts(pinned, enforcement=["lockdown=integrity"]),
                         loaded="candidate", candidate=pinned) == []


class SwapJudge:
    """``driver.swap_planned`` asked the way deploy.py's ``_if`` asks it: on the host."""

    @staticmethod
    def _inner(**arguments):
        yield f"swap planned: {driver.swap_planned(**arguments)}"


@pytest.mark.parametrize(("loaded", "wanted", "staged", "swaps"), [
    ("stock", "stock", False, False),
    ("stock", "candidate", False, True),
    ("candidate", "candidate", True, False),
    ("candidate", "stock", True, True),
    (None, "stock", False, True),
    # A staged copy left over is tidied, not reloaded for: the TP ranks need not stop.
    ("stock", "stock", True, False),
])
def test_the_ranks_stop_for_exactly_the_swaps_the_driver_step_makes(candidate, loaded, wanted,
                                                                     staged, swaps) -> None:
    situation = facts(candidate, loaded, staged=staged)
    [answer] = run_operation(SwapJudge, situation, loaded=wanted, candidate=candidate)
    reloads = [command for command in run_operation(driver.module, situation, loaded=wanted,
                                                    candidate=candidate)
               if "modprobe" in command or "insmod" in command]
    assert answer == f"'swap planned: {swaps}'"
    assert bool(reloads) is swaps


def another_build_loaded(situation):
    """The same workstation, an earlier pinned build of the candidate loaded."""
    older = {"initstate": "live", "parameters": {"e2e": "Y", "tx_e2e": "Y"}, "build_id": "0" * 40}
    return lambda cls, kwargs: older if cls is LoadedModule else situation(cls, kwargs)


class DisarmJudge:
    """``guard.disarm_first`` asked the way deploy.py's ``_if`` asks it: on the host."""

    @staticmethod
    def _inner(**arguments):
        yield f"disarm first: {guard.disarm_first(**arguments)}"


@pytest.mark.parametrize(("loaded", "wanted", "disarms"), [
    # The pinned build stays loaded: the guard watches on.
    ("candidate", "candidate", False),
    # A new pinned build while staying in a candidate state: a reload, candidate to candidate.
    ("another candidate", "candidate", True),
    ("stock", "candidate", True),
    ("candidate", "stock", True),
    # No guard watches a stock driver: whatever one left goes, reload or not.
    ("stock", "stock", True),
])
def test_the_guard_is_disarmed_before_any_reload_candidate_to_candidate_too(
        candidate, loaded, wanted, disarms) -> None:
    situation = facts(candidate, loaded.removeprefix("another "), staged=True)
    if loaded == "another candidate":
        situation = another_build_loaded(situation)
    [answer] = run_operation(DisarmJudge, situation, loaded=wanted, candidate=candidate)
    assert answer == f"'disarm first: {disarms}'"


# Each branch of the driver judges, pinned by what it reports (issue 29 part 5).


@pytest.mark.parametrize(("path", "sha256"), [("", ""), (None, "ab" * 32), ("set", "")])
def test_a_candidate_without_path_or_sha256_is_not_configured(candidate, path, sha256) -> None:
    unpinned = CandidateModule(candidate.path if path == "set" else path, sha256)
    assert unpinned.problems(RELEASE) == ["no candidate module configured (candidate path and "
                                          "sha256)"]


def test_a_candidate_names_each_of_its_problems(tmp_path) -> None:
    stock = build("stock", tmp_path / "thunderbolt_net.ko")
    fake = CandidateModule(str(stock), hashlib.sha256(stock.read_bytes()).hexdigest())
    assert fake.problems("5.0.0-other") == [
        f"candidate {stock} does not declare the tx_e2e parameter",
        f"candidate {stock} was built for kernel {RELEASE}, but this host runs 5.0.0-other"]


def test_a_candidate_without_vermagic_says_it_names_no_kernel(tmp_path, monkeypatch) -> None:
    from lab import modules
    fields = modules._modinfo_fields
    monkeypatch.setattr(modules, "_modinfo_fields", lambda variant: [
        field for field in fields(variant) if not field.startswith("vermagic=")])
    path = build("candidate", tmp_path / "thunderbolt_net.ko")
    bare = CandidateModule(str(path), hashlib.sha256(path.read_bytes()).hexdigest())
    assert bare.problems(RELEASE) == [
        f"candidate {path} was built for kernel (none), but this host runs {RELEASE}"]


def test_the_candidate_judge_names_a_foreign_build_id() -> None:
    module = {"initstate": "live", "build_id": "d" * 40,
              "parameters": {"e2e": "Y", "tx_e2e": "Y"}}
    assert build_problems(module, "candidate", STOCK_BUILD, "c" * 40) == [
        f"the loaded build-id {'d' * 40} is not the candidate's {'c' * 40}"]


def test_a_clean_stock_driver_verifies(candidate) -> None:
    # A persistent file that is not the candidate (the distribution's) is no problem.
    assert run_operation(driver.verified, facts(candidate), loaded="stock",
                         candidate=candidate) == []


def test_persistent_configuration_is_named_by_its_tx_e2e_lines(candidate) -> None:
    persistent = {"files": {}, "config": ["options thunderbolt_net tx_e2e=1",
                                          "blacklist thunderbolt_net"]}
    [message] = run_operation(driver.verified, facts(candidate, persistent=persistent),
                              loaded="stock", candidate=candidate)
    assert message == ("fail: driver layer: persistent configuration mentions tx_e2e: "
                       "options thunderbolt_net tx_e2e=1")


@pytest.mark.parametrize(("e2e", "shown"), [("N", "N"), (None, "None")])
def test_verification_names_rx_e2e_off(candidate, e2e, shown) -> None:
    [message] = run_operation(driver.verified, facts(candidate, e2e=e2e), loaded="stock",
                              candidate=candidate)
    assert message == f"fail: driver layer: RX E2E is off (parameters/e2e is {shown})"


def test_a_staged_copy_is_the_candidates_own_while_it_is_loaded(candidate) -> None:
    assert run_operation(driver.verified, facts(candidate, "candidate", staged=True),
                         loaded="candidate", candidate=candidate) == []


def test_verification_names_the_file_modprobe_loads(candidate) -> None:
    [message] = run_operation(driver.verified, facts(candidate, "candidate"), loaded="stock",
                              candidate=candidate)
    assert f"is not that of {STOCK_FILE}, the file modprobe loads ({STOCK_BUILD})" in message


def test_verification_with_nothing_loaded_says_only_that(candidate) -> None:
    assert run_operation(driver.verified, facts(candidate, None), loaded="stock",
                         candidate=candidate) == [
        "fail: driver layer: thunderbolt_net is not loaded"]


def test_a_candidate_build_without_tx_e2e_says_it_is_absent() -> None:
    module = {"initstate": "live", "build_id": "c" * 40, "parameters": {"e2e": "Y"}}
    assert build_problems(module, "candidate", STOCK_BUILD, "c" * 40) == [
        "parameters/tx_e2e is absent, not Y (insmod ignores parameters a module does not "
        "declare)"]


# Production converges whatever the candidate's path holds (issue 44): a stock
# build is judged without the candidate's file.


def unusable(tmp_path: Path, kind: str) -> CandidateModule:
    """A candidate whose path is missing, or holds what no module reader can read."""
    path = tmp_path / ("thunderbolt_net.ko.zst" if kind == "compressed text" else
                       "thunderbolt_net.ko")
    if kind == "text":
        path.write_text("a text file\n")
    elif kind == "compressed text":
        path.write_bytes(subprocess.run(["zstd", "-q", "-c"], input=b"text\n",
                                        capture_output=True, check=True).stdout)
    return CandidateModule(str(path), "ab" * 32)


@pytest.mark.parametrize("kind", ["missing", "text", "compressed text"])
def test_production_converges_whatever_the_candidate_path_holds(candidate, tmp_path,
                                                                kind) -> None:
    broken = unusable(tmp_path, kind)
    # What a failed attempt left: the candidate loaded, its copy staged.
    left = facts(candidate, "candidate", staged=True)
    [planned] = run_operation(SwapJudge, left, loaded="stock", candidate=broken)
    assert planned == "'swap planned: True'"
    assert run_operation(driver.module, left, loaded="stock", candidate=broken) == [
        "rmmod thunderbolt_net && modprobe thunderbolt_net", f"rm -f {STAGED}"]
    [found] = run_operation(driver.verified, left, loaded="stock", candidate=broken)
    assert "parameters/tx_e2e exists: a candidate build is loaded" in found
    restored = facts(candidate)
    assert run_operation(driver.admissible, restored, loaded="stock", candidate=broken) == []
    assert run_operation(driver.module, restored, loaded="stock", candidate=broken) == []
    assert run_operation(driver.verified, restored, loaded="stock", candidate=broken) == []


def test_a_candidate_that_is_no_module_fails_the_driver_step_with_what_it_is(tmp_path) -> None:
    text = tmp_path / "thunderbolt_net.ko"
    text.write_text("a text file\n")
    pinned = CandidateModule(str(text), hashlib.sha256(text.read_bytes()).hexdigest())
    assert run_operation(driver.module, facts(pinned), loaded="candidate",
                         candidate=pinned) == [
        f"fail: driver layer: candidate {text} is not a kernel module: not an ELF file: it "
        "begins b'a text file\\n'"]


def test_a_compressed_candidate_is_read_decompressed(candidate, tmp_path) -> None:
    packed = tmp_path / "thunderbolt_net.ko.zst"
    packed.write_bytes(subprocess.run(["zstd", "-q", "-c", candidate.path], capture_output=True,
                                      check=True).stdout)
    pinned = CandidateModule(str(packed), hashlib.sha256(packed.read_bytes()).hexdigest())
    assert pinned.build_id == candidate.build_id
    assert pinned.problems(RELEASE) == []
