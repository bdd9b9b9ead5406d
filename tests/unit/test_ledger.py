"""The compatibility ledger: what a record says, which stalls refuse which pairing, the matrix."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from operation_harness import a_run, run_operation
from pyinfra.api import OperationError
from pyinfra.facts.server import KernelVersion

from harness.hosts import remote
from harness.hosts.topology import Workstation
from harness.runs import matrix
from operations import step as steps
from operations.plumbing.facts import MARKER
from operations.run import Run
from operations.safety import ledger
from operations.safety import reading as safety_reading
from operations.safety.ledger import Controller
from operations.thunderbolt import driver
from operations.thunderbolt.driver import (
    CandidateModule,
    LoadedModule,
    ModprobeTarget,
    PeerCapabilities,
)
from operations.thunderbolt.link import XDomainLink

INTEL, ASM4242 = "8086:1137", "1b21:2425"
# Two firmwares of the same Intel controller: one that stalled, one that did not.
STALLED_NVM, HEALTHY_NVM = "35.0", "36.0"
CANDIDATE_BUILD = "c0ffee" * 6


def host(name: str, nhi: str | None, tx_e2e: str | None = None,
         kernel: str = "6.8.0-49-generic", nvm: str | None = None) -> dict:
    parameters = {"e2e": "Y", **({"tx_e2e": tx_e2e} if tx_e2e else {})}
    return {"host": name, "nhi": nhi, "router": None, "nvm_version": nvm, "kernel": kernel,
            "build_id": CANDIDATE_BUILD if tx_e2e else "5t0c4" * 8, "parameters": parameters,
            "peer_prtcstns": "0x00000007", "rate_gbps": 20.0, "lanes": 1}


@pytest.fixture
def run() -> Run:
    """A run of its own, as each test is."""
    return a_run()


# The host router's nvm_version: as the kernel prints it, absent (an older kernel,
# an Apple controller), or there but failing to read (safe mode's ENODATA).
@pytest.mark.parametrize(("nvm_file", "nvm_version"), [
    ("36.0", "36.0"), (None, None), ("unreadable", None)], ids=["shown", "absent", "unreadable"])
def test_the_controller_fact_reads_the_nhi_and_firmware_of_the_peers_domain(
        run, tmp_path, nvm_file: str | None, nvm_version: str | None) -> None:
    """The command runs here against a sysfs laid out as a real host's, domain1 the peer's."""
    sysfs = tmp_path / "sys"
    for slot, domain, (vendor, device) in (("0000:00:0d.2", 0, ("0x8086", "0x9a1b")),
                                           ("0000:05:00.0", 1, ("0x1B21", "0x2425"))):
        nhi = sysfs / "bus/pci/devices" / slot
        (nhi / f"domain{domain}").mkdir(parents=True)
        (nhi / "vendor").write_text(vendor + "\n")
        (nhi / "device").write_text(device + "\n")
        devices = sysfs / "bus/thunderbolt/devices"
        devices.mkdir(parents=True, exist_ok=True)
        (devices / f"domain{domain}").symlink_to(nhi / f"domain{domain}")
        router = devices / f"{domain}-0"
        router.mkdir()
        for name, value in (("vendor", vendor), ("device", device), ("vendor_name", "Maker"),
                            ("device_name", f"chip{domain}")):
            (router / name).write_text(value + "\n")
    # Domain 0's router has a firmware of its own: the peer's domain's is the one read.
    (sysfs / "bus/thunderbolt/devices/0-0/nvm_version").write_text("20.0\n")
    nvm = sysfs / "bus/thunderbolt/devices/1-0/nvm_version"
    if nvm_file == "unreadable":
        nvm.mkdir()  # cat fails on it, as on safe mode's ENODATA
    elif nvm_file:
        nvm.write_text(nvm_file + "\n")
    peer = sysfs / "bus/thunderbolt/devices/1-1"
    peer.mkdir()
    (peer / "uevent").write_text("DEVTYPE=thunderbolt_xdomain\n")
    command = ledger.ThunderboltController().command().replace("/sys/", f"{sysfs}/")
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    assert ledger.ThunderboltController().process(output.splitlines()) == {
        "domain": "domain1", "nhi": ASM4242, "router": "Maker chip1 (1b21:2425)",
        "nvm_version": nvm_version}


def test_a_host_without_a_controller_has_none() -> None:
    assert ledger.ThunderboltController().process(["domain0|||||||"]) is None


def test_a_host_entry_holds_what_the_facts_said_and_none_for_what_they_did_not() -> None:
    values = {
        "controller": {"domain": "domain0", "nhi": INTEL, "router": "Intel JHL8540 (8087:1137)",
                       "nvm_version": HEALTHY_NVM},
        "kernel": "6.8.0-49-generic",
        "module": {"initstate": "live", "parameters": {"e2e": "Y", "tx_e2e": "Y"},
                   "build_id": CANDIDATE_BUILD},
        "peer": {"service": "0-3.0", "prtcstns": 7},
        "xdomain": {"device": "0-3", "peer": "wsb", "rx_speed_gbps": 20.0, "tx_speed_gbps": 10.0,
                    "rx_lanes": 2, "tx_lanes": 2, "others": []},
    }
    entry = ledger.host_entry("wsa", values)
    assert entry == {"host": "wsa", "nhi": INTEL, "router": "Intel JHL8540 (8087:1137)",
                     "nvm_version": HEALTHY_NVM, "kernel": "6.8.0-49-generic",
                     "build_id": CANDIDATE_BUILD,
                     "parameters": {"e2e": "Y", "tx_e2e": "Y"}, "peer_prtcstns": "0x00000007",
                     "rate_gbps": 20.0, "lanes": 2}
    bare = ledger.host_entry("wsb", {"kernel": "6.8.0-49-generic"})
    assert (bare["nhi"], bare["nvm_version"], bare["build_id"], bare["peer_prtcstns"],
            bare["rate_gbps"]) == (None, None, None, None, None)


def test_the_identity_is_the_layers_own_facts_read_in_one_command(run) -> None:
    assert ledger.HostIdentity.members == {
        "controller": ledger.ThunderboltController, "kernel": KernelVersion,
        "module": LoadedModule, "peer": PeerCapabilities, "xdomain": XDomainLink}
    command = ledger.HostIdentity().command(module="thunderbolt_net")
    assert command.count(f"{MARKER} ") == 5 and "/sys/module/" in command
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True).stdout
    values = ledger.HostIdentity().process(output.splitlines())
    # This machine: a kernel, and (most likely) no Thunderbolt; whatever is absent is None.
    assert values["kernel"] == subprocess.run(["uname", "-r"], capture_output=True,
                                              text=True).stdout.strip()
    assert set(values) == set(ledger.HostIdentity.members)
    assert ledger.HostIdentity().default() == {
        "controller": None, "kernel": None, "module": None, "peer": None, "xdomain": None}


NOTHING_CROSSES = ("wsa: link layer: the peer 169.254.77.2 does not answer across thunderbolt0 "
                   "although it has carrier: no traffic moves (a TX credit stall under tx_e2e=1?)")
SLOW_LINK = "wsa: link layer: the link to wsb trained at 10 Gb/s over 1 lane(s), not 20 Gb/s"


@pytest.mark.parametrize(("driver", "outcome", "layer", "evidence", "stall"), [
    ("candidate", "rolled_back", "link", NOTHING_CROSSES, True),
    ("candidate", "stopped", "link", NOTHING_CROSSES, True),
    ("candidate", "rollback_failed", "link", NOTHING_CROSSES, True),
    ("candidate", "rolled_back", "link", SLOW_LINK, False),
    ("candidate", "rolled_back", "serving", "wsa: serving layer: rank 0 hangs", False),
    ("candidate", "refused", "driver", "wsa: driver layer: RX E2E is off", False),
    ("candidate", "accepted", None, "", False),
    ("stock", "rolled_back", "link", NOTHING_CROSSES, False),
])
def test_a_stall_is_a_candidate_that_failed_with_nothing_crossing_the_link(
        driver, outcome, layer, evidence, stall) -> None:
    entry = ledger.record("tp2_e2e", driver, outcome, [host("wsa", INTEL)], layer=layer,
                          evidence=evidence)
    assert entry["stall"] is stall


def test_an_unknown_outcome_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown outcome 'won'"):
        ledger.record("tp2_e2e", "candidate", "won", [])


@pytest.mark.parametrize("nvm", [None, "1.2", "2.0"])
def test_the_upstream_report_covers_every_pairing_with_the_asm4242_on_any_firmware(
        nvm: str | None) -> None:
    intel, asm4242 = Controller(INTEL, HEALTHY_NVM), Controller(ASM4242, nvm)
    assert [entry["time"] for entry in ledger.stall_reports([], [asm4242, intel])] == [
        "upstream"]
    assert ledger.stall_reports([], [asm4242, asm4242])
    assert ledger.stall_reports([], [intel, intel]) == []


def test_a_recorded_stall_covers_its_own_pairing_only() -> None:
    stalled = ledger.record("tp2_e2e", "candidate", "rolled_back",
                            [host("wsa", INTEL, "Y"), host("wsb", "8086:5781", "Y")],
                            layer="link", evidence=NOTHING_CROSSES)
    accepted = ledger.record("tp2_e2e", "candidate", "accepted",
                             [host("wsa", INTEL, "Y"), host("wsb", INTEL, "Y")])
    records = [stalled, accepted]
    assert ledger.stall_reports(records, [Controller(INTEL), Controller("8086:5781")]) == [
        stalled]
    assert ledger.stall_reports(records, [Controller(INTEL), Controller(INTEL)]) == []
    assert f"failed at the link layer (rolled_back): {NOTHING_CROSSES}" in (
        ledger.describe_stall(stalled))


def stall_on(*controllers: tuple[str, str | None]) -> dict:
    """A candidate run that stalled on these controllers, each an NHI and its firmware."""
    return ledger.record("tp2_e2e", "candidate", "rolled_back",
                         [host(f"ws{index}", nhi, "Y", nvm=nvm)
                          for index, (nhi, nvm) in enumerate(controllers)],
                         layer="link", evidence=NOTHING_CROSSES)


def test_a_stall_on_one_firmware_covers_that_firmware_and_not_another() -> None:
    stalled = stall_on((INTEL, STALLED_NVM), (INTEL, STALLED_NVM))
    on_stalled, on_healthy = Controller(INTEL, STALLED_NVM), Controller(INTEL, HEALTHY_NVM)
    assert ledger.stall_reports([stalled], [on_stalled, on_stalled]) == [stalled]
    assert ledger.stall_reports([stalled], [on_healthy, on_healthy]) == []
    # One end on another firmware: not the pairing that stalled.
    assert ledger.stall_reports([stalled], [on_healthy, on_stalled]) == []
    # An end whose firmware cannot be read may run the one that stalled.
    assert ledger.stall_reports([stalled], [Controller(INTEL), on_stalled]) == [stalled]


def test_a_stall_on_two_firmwares_covers_both_ends_in_either_order_only() -> None:
    stalled = stall_on((INTEL, HEALTHY_NVM), (INTEL, STALLED_NVM))
    on_stalled, on_healthy = Controller(INTEL, STALLED_NVM), Controller(INTEL, HEALTHY_NVM)
    assert ledger.stall_reports([stalled], [on_healthy, on_stalled]) == [stalled]
    assert ledger.stall_reports([stalled], [on_stalled, on_healthy]) == [stalled]
    assert ledger.stall_reports([stalled], [on_stalled, on_stalled]) == []
    assert ledger.stall_reports([stalled], [on_healthy, on_healthy]) == []


def test_the_ledger_is_appended_and_read_back(tmp_path) -> None:
    path = tmp_path / "deep" / "ledger.jsonl"
    assert ledger.read(path) == []
    first = ledger.record("production", "stock", "accepted", [host("wsa", INTEL)])
    second = ledger.record("tp2_e2e", "candidate", "refused", [host("wsa", INTEL)],
                           layer="driver")
    ledger.append(path, first)
    ledger.append(path, second)
    assert ledger.read(path) == [first, second]
    with path.open("a") as file:
        file.write("{not json\n")
    assert ledger.read_all(path) == ([first, second],
                                     [f"{path}:3: skipped, not a JSON line (Expecting "
                                      "property name enclosed in double quotes)"])


def test_the_run_is_recorded_once_when_it_ends(run, tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    run.observed.hosts["wsa"] = host("wsa", INTEL)
    ledger.keep(run, str(path), "tp2_e2e", "candidate", ["wsa", "wsb"])
    ledger.keep(run, str(path), "tp2_e2e", "candidate", ["wsa", "wsb"])  # the next host's call
    run.attempt.end(steps.Ending("rolled_back", "link", NOTHING_CROSSES))
    run.attempt.end(steps.Ending("accepted"))
    [entry] = ledger.read(path)
    assert (entry["state"], entry["driver"], entry["outcome"], entry["layer"], entry["stall"],
            entry["hosts"]) == ("tp2_e2e", "candidate", "rolled_back", "link", True,
                                [host("wsa", INTEL)])


def test_a_run_of_two_pairs_is_recorded_once_for_each_pair(run, tmp_path) -> None:
    """A record's key is one cable's controllers: each pair its own, never all four."""
    path = tmp_path / "ledger.jsonl"
    for name in ("wsa", "wsb", "wsc", "wsd"):
        run.observed.hosts[name] = host(name, INTEL)
    for pair in (["wsa", "wsb"], ["wsa", "wsb"], ["wsc", "wsd"], ["wsc", "wsd"]):
        ledger.keep(run, str(path), "production", "stock", pair)
    run.attempt.end(steps.Ending("accepted"))
    assert [[each["host"] for each in entry["hosts"]] for entry in ledger.read(path)] == [
        ["wsa", "wsb"], ["wsc", "wsd"]]


def test_a_dry_run_and_a_refusal_in_it_record_nothing(run, tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    run.attempt.dry = True
    ledger.keep(run, str(path), "tp2_e2e", "candidate", ["wsa", "wsb"])
    with pytest.raises(OperationError):
        refused_stock_driver(run)
    assert not path.exists()


def no_facts(cls, kwargs):
    raise AssertionError("this step reads no facts")


def refused_stock_driver(run: Run) -> None:
    """Preflight's refusal of a stock driver that modprobe cannot find."""
    def facts(cls, kwargs):
        assert cls is ModprobeTarget
        return None
    run_operation(driver.admissible, facts, run=run, loaded="stock",
                  candidate=CandidateModule("/nonexistent.ko", "0" * 64))


def test_a_refusal_is_recorded_with_its_layer(run, tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger.keep(run, str(path), "tp2_e2e", "candidate", ["wsa", "wsb"])
    with pytest.raises(OperationError):
        refused_stock_driver(run)
    [entry] = ledger.read(path)
    assert (entry["outcome"], entry["layer"], entry["evidence"]) == (
        "refused", "driver", "wsa: driver layer: modprobe finds no thunderbolt_net module for "
                             "this kernel")


def stall_check(run: Run, tmp_path: Path, pairing: tuple[str | None, str | None],
                force: bool = False, nvm: tuple[str | None, str | None] = (None, None)
                ) -> list[str]:
    run.observed.hosts.update(wsa=host("wsa", pairing[0], nvm=nvm[0]),
                              wsb=host("wsb", pairing[1], nvm=nvm[1]))
    return run_operation(ledger.no_recorded_stall, no_facts, run=run,
                         path=str(tmp_path / "ledger.jsonl"),
                         workstations=["wsa", "wsb"], force=force)


def test_preflight_refuses_the_candidate_on_the_seeded_controller(run, tmp_path) -> None:
    with pytest.raises(OperationError) as refusal:
        stall_check(run, tmp_path, (INTEL, ASM4242))
    message = str(refusal.value)
    assert message.startswith("wsa: driver layer: the candidate's TX E2E has stalled on the "
                              "controller pairing 1b21:2425 + 8086:1137")
    assert "1881f2efbf7f" in message and "force_candidate=yes" in message
    assert stall_check(run, tmp_path, (INTEL, INTEL)) == []
    assert run.attempt.caveats == []


def refused_pairing(run: Run, tmp_path: Path, nvm: tuple[str | None, str | None]) -> str | None:
    """The pairing preflight refuses two Intel controllers on, on ``nvm``; ``None`` if none."""
    try:
        stall_check(run, tmp_path, (INTEL, INTEL), nvm=nvm)
    except OperationError as refusal:
        return str(refusal).partition("controller pairing ")[2].partition("; ")[0]
    return None


def test_preflight_refuses_the_firmware_that_stalled_by_name_and_no_other(run, tmp_path) -> None:
    ledger.append(tmp_path / "ledger.jsonl", stall_on((INTEL, STALLED_NVM), (INTEL, STALLED_NVM)))
    assert refused_pairing(run, tmp_path, (STALLED_NVM, STALLED_NVM)) == (
        "8086:1137 (NVM 35.0) + 8086:1137 (NVM 35.0)")
    assert refused_pairing(run, tmp_path, (HEALTHY_NVM, HEALTHY_NVM)) is None
    assert refused_pairing(run, tmp_path, (HEALTHY_NVM, STALLED_NVM)) is None
    # Host routers that show no firmware: the stall may be theirs.
    assert refused_pairing(run, tmp_path, (None, None)) == "8086:1137 + 8086:1137"


def test_a_stall_recorded_before_firmware_was_kept_refuses_every_firmware(run, tmp_path) -> None:
    """A line as the ledger wrote it before: its host entries have no ``nvm_version``."""
    old = stall_on((INTEL, None), (INTEL, None))
    for part in old["hosts"]:
        del part["nvm_version"]
    (tmp_path / "ledger.jsonl").write_text(json.dumps(old, sort_keys=True) + "\n")
    assert refused_pairing(run, tmp_path, (STALLED_NVM, STALLED_NVM)) == (
        "8086:1137 (NVM 35.0) + 8086:1137 (NVM 35.0)")
    assert refused_pairing(run, tmp_path, (HEALTHY_NVM, STALLED_NVM)) == (
        "8086:1137 (NVM 35.0) + 8086:1137 (NVM 36.0)")
    assert refused_pairing(run, tmp_path, (None, None)) == "8086:1137 + 8086:1137"


def test_the_seeded_report_refuses_the_asm4242_on_its_firmware(run, tmp_path) -> None:
    with pytest.raises(OperationError, match=r"pairing 1b21:2425 \(NVM 2\.1\) \+ "
                                             r"8086:1137 \(NVM 36\.0\)"):
        stall_check(run, tmp_path, (INTEL, ASM4242), nvm=(HEALTHY_NVM, "2.1"))


def test_forcing_goes_ahead_and_says_so_in_capitals(run, tmp_path) -> None:
    assert stall_check(run, tmp_path, (INTEL, ASM4242), force=True) == []
    [caveat] = run.attempt.caveats
    assert caveat.startswith("FORCED: THE CANDIDATE RUNS ON THE CONTROLLER PAIRING "
                             "1b21:2425 + 8086:1137 DESPITE 1 RECORDED STALL(S)")
    assert run.observed.forced


def test_the_pairing_waits_until_both_workstations_are_observed(run, tmp_path) -> None:
    run.observed.hosts["wsa"] = host("wsa", ASM4242)
    assert run_operation(ledger.no_recorded_stall, no_facts, run=run,
                         path=str(tmp_path / "l.jsonl"),
                         workstations=["wsa", "wsb"]) == []


def test_a_controller_that_cannot_be_read_still_pairs_with_the_one_that_can(run, tmp_path) -> None:
    assert stall_check(run, tmp_path, (None, INTEL)) == []
    with pytest.raises(OperationError, match="pairing 1b21:2425 \\+ unknown"):
        stall_check(run, tmp_path, (None, ASM4242))


@pytest.mark.parametrize("bad", ['{"time": "2026-12-01T10:0', '{"state": "tp2_e2e"}', "[1, 2]",
                                 "garbage", '{"time": "t", "state": "s", "driver": "d", '
                                 '"outcome": "o", "stall": false, "hosts": [1]}'],
                         ids=["torn", "no keys", "a list", "not json", "a bad host"])
def test_a_torn_or_foreign_line_is_skipped_and_the_stall_still_refuses(run, bad: str,
                                                                       tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    stall = ledger.record("tp2_e2e", "candidate", "rolled_back",
                          [host("wsa", INTEL), host("wsb", INTEL)], layer="link",
                          evidence=NOTHING_CROSSES)
    ledger.append(path, stall)
    # A crash mid-write leaves a last line without its newline; the next record
    # must not be glued to it.
    with path.open("a") as file:
        file.write(bad)
    accepted = ledger.record("production", "stock", "accepted", [host("wsa", INTEL)])
    ledger.append(path, accepted)
    records, skipped = ledger.read_all(path)
    assert records == [stall, accepted]
    assert len(skipped) == 1 and skipped[0].startswith(f"{path}:2: skipped, ")
    with pytest.raises(OperationError, match="has stalled on the controller pairing "
                                             "8086:1137 \\+ 8086:1137"):
        stall_check(run, tmp_path, (INTEL, INTEL))


APPENDER = """
import sys
from pathlib import Path
from operations.safety import ledger
for index in range(int(sys.argv[3])):
    ledger.append(Path(sys.argv[1]), {"writer": sys.argv[2], "index": index,
                                      "evidence": "x" * 5000})
"""


def test_appends_racing_from_many_processes_never_interleave(tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    root = Path(__file__).resolve().parents[2]
    writers = [subprocess.Popen([sys.executable, "-c", APPENDER, str(path), str(writer), "40"],
                                cwd=root) for writer in range(6)]
    assert [writer.wait() for writer in writers] == [0] * 6
    lines = path.read_text().splitlines()
    entries = [json.loads(line) for line in lines]
    assert len(entries) == 240
    assert sorted((entry["writer"], entry["index"]) for entry in entries) == sorted(
        (str(writer), index) for writer in range(6) for index in range(40))


def test_the_matrix_groups_runs_by_controllers_and_firmware_kernel_driver_and_e2e() -> None:
    intel_pair = [host(name, INTEL, "Y", nvm=HEALTHY_NVM) for name in ("wsa", "wsb")]
    records = [
        ledger.record("tp2_e2e", "candidate", "accepted", intel_pair),
        ledger.record("tp2_e2e", "candidate", "measured", intel_pair, tok_s=77.1),
        ledger.record("tp2_e2e", "candidate", "measured", intel_pair, tok_s=70.0),
        ledger.record("tp2_e2e", "candidate", "rolled_back",
                      [host("wsa", INTEL, "Y"), host("wsb", ASM4242, "Y")], layer="link",
                      evidence=NOTHING_CROSSES, forced=True),
        ledger.record("tp2_stock", "stock", "accepted", [host("wsa", INTEL), host("wsb", INTEL)]),
        stall_on((INTEL, STALLED_NVM), (INTEL, STALLED_NVM)),
    ]
    lines = matrix.render(records).splitlines()
    assert lines[0] == ("| controllers (NHI, NVM) | kernel | driver | E2E (rx, tx) | outcomes "
                        "| best tok/s | hotplug (soak events) | suspend (soak events) |")
    assert lines[2] == (f"| 8086:1137 (NVM 36.0) + 8086:1137 (NVM 36.0) | 6.8.0-49-generic | "
                        f"candidate {CANDIDATE_BUILD[:12]} | rx Y tx Y | 1 accepted, 2 measured "
                        "| 77.1 | - | - |")
    # A record without firmware (written before the ledger kept it) shows its NHIs alone.
    assert lines[3].startswith("| 1b21:2425 + 8086:1137 |")
    assert lines[3].endswith("| 1 rolled_back (forced) | - | - | - |")
    assert lines[4].startswith("| 8086:1137 + 8086:1137 |")
    assert "| candidate" not in lines[4] and "| rx Y tx - |" in lines[4]
    # The same controllers on another firmware are a row of their own.
    assert lines[5].startswith("| 8086:1137 (NVM 35.0) + 8086:1137 (NVM 35.0) | ")
    assert lines[5].endswith("| 1 rolled_back | - | - | - |")
    assert len(lines) == 6
    upstream, learned, on_firmware = matrix.stalls(records)
    assert upstream.startswith("upstream revert 1881f2efbf7f of TX E2E")
    assert learned.startswith(f"{records[3]['time']}: tp2_e2e on 1b21:2425 + 8086:1137 failed "
                              "at the link layer")
    assert on_firmware.startswith(f"{records[5]['time']}: tp2_e2e on 8086:1137 (NVM 35.0) + "
                                  "8086:1137 (NVM 35.0) failed at the link layer")


def test_records_are_json_lines_with_sorted_keys(tmp_path) -> None:
    path = tmp_path / "ledger.jsonl"
    ledger.append(path, ledger.record("production", "stock", "accepted", []))
    line = path.read_text().splitlines()[0]
    assert list(json.loads(line)) == sorted(json.loads(line))


def test_the_harness_reads_the_identity_as_the_deploy_does(run) -> None:
    """Each member in a section of the harness's own script, run here; nothing nested."""
    entry = Workstation("wsa", ("workstations",), {"candidate_module_name": "thunderbolt_net"})
    queries = safety_reading.identity(entry.settings)
    assert [query.key for query in queries] == list(ledger.HostIdentity.members)
    output = subprocess.run(["sh", "-c", remote.script(queries)], capture_output=True,
                            text=True).stdout
    values = remote.parse(output, queries)
    assert values["kernel"] == subprocess.run(["uname", "-r"], capture_output=True,
                                              text=True).stdout.strip()
    assert ledger.host_entry("here", values)["kernel"] == values["kernel"]


def test_the_matrix_shows_a_soaks_plugs_and_suspends_per_pairing() -> None:
    intel_pair = [host(name, INTEL, "Y", nvm=HEALTHY_NVM) for name in ("wsa", "wsb")]
    back = {"event": "plug", "link": "back", "rate_gbps": 20.0,
            "tx_e2e": {"wsa": "Y", "wsb": "Y"}, "tx_e2e_kept": True, "recovered_seconds": 4.1}
    records = [
        ledger.record("tp2_e2e", "candidate", "measured", intel_pair, tok_s=70.0),
        ledger.record("tp2_e2e", "candidate", "hotplug", intel_pair, event=back),
        ledger.record("tp2_e2e", "candidate", "hotplug", intel_pair,
                      event={**back, "rate_gbps": 10.0, "recovered_seconds": 6.5}),
        ledger.record("tp2_e2e", "candidate", "suspend", intel_pair,
                      event={**back, "event": "suspend", "recovered_seconds": None}),
    ]
    [row] = matrix.render(records).splitlines()[2:]
    assert row.endswith("| 1 measured | 70.0 | 2/2 back at 10, 20 Gb/s, served again in <= 6.5s "
                        "| 1/1 back at 20 Gb/s, 1 not served again |")
    lost = {**back, "tx_e2e": {"wsa": "Y", "wsb": "absent"}, "tx_e2e_kept": False}
    assert "tx_e2e LOST" in matrix.event_cell([lost])
    assert matrix.event_cell([{"event": "plug", "link": "not back"}]) == (
        "0/1 back, 1 not served again")
