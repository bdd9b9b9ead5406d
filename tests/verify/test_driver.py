"""The driver layer: which thunderbolt_net build is loaded, and that nothing of the
candidate would survive a reboot."""

from __future__ import annotations

import pytest
from verify_helpers import fact, read

from operations.safety import reading as safety_reading
from operations.safety.guard import NAME as GUARD
from operations.states import STOCK_BUILDS, State
from operations.thunderbolt.driver import (
    RX_E2E,
    TBNET_E2E,
    CandidateModule,
    ModuleFileBuildId,
    PeerCapabilities,
    build_id_from_note,
)

MODULE = "/sys/module/thunderbolt_net"
XDOMAIN_DEVICES = "/sys/bus/thunderbolt/devices"


def candidate_of(workstation) -> CandidateModule:
    return CandidateModule.of(workstation.settings)


def loaded_build_id(workstation) -> str:
    note = workstation.host.run(f"od -An -tx1 -v {MODULE}/notes/.note.gnu.build-id")
    assert note.rc == 0, f"{workstation.name}: thunderbolt_net is not loaded ({note.stderr})"
    return build_id_from_note(bytes.fromhex("".join(note.stdout.split())))


def stock_build_id(workstation) -> tuple[str, str]:
    """The file modprobe would load, and its build-id, read as the driver layer reads it."""
    module = workstation.settings.candidate.module_name
    path = workstation.host.check_output(f"modinfo -n {module}")
    reader = ModuleFileBuildId()
    out = workstation.host.check_output(reader.command(path=path).get_raw_value())
    build = reader.process(out.splitlines())
    assert build, f"{workstation.name}: {path} has no readable GNU build-id"
    return path, build


def test_the_declared_build_is_loaded(workstation, state: State) -> None:
    loaded = loaded_build_id(workstation)
    if state.driver == "candidate":
        expected = candidate_of(workstation).build_id
        assert loaded == expected, (
            f"{workstation.name}: loaded build-id {loaded} is not the candidate's {expected}; "
            f"converge with: pyinfra inventory.py deploy.py --data state={state.name}")
    else:
        path, expected = stock_build_id(workstation)
        assert loaded == expected, (
            f"{workstation.name}: loaded build-id {loaded} is not {path} ({expected}), the file "
            "modprobe loads; restore with: pyinfra inventory.py deploy.py --data state=production")


def test_tx_e2e_is_on_for_the_candidate_and_absent_for_stock(workstation, state: State) -> None:
    parameter = workstation.host.file(f"{MODULE}/parameters/tx_e2e")
    if state.driver == "candidate":
        assert parameter.exists, f"{workstation.name}: the loaded module has no tx_e2e parameter"
        assert parameter.content_string.strip() == "Y", (
            f"{workstation.name}: tx_e2e reads {parameter.content_string.strip()}, not Y")
    else:
        assert not parameter.exists, (
            f"{workstation.name}: tx_e2e exists, so a candidate build is loaded in {state.name}")


def test_rx_e2e_is_as_the_state_loads_it(workstation, state: State) -> None:
    """On, except in the field report's control, the stock build loaded with ``e2e=0``."""
    e2e = workstation.host.file(f"{MODULE}/parameters/e2e").content_string.strip()
    assert e2e == RX_E2E[state.driver], (
        f"{workstation.name}: RX E2E is {e2e}, not {RX_E2E[state.driver]} as {state.name} "
        f"loads it; converge with: pyinfra inventory.py deploy.py --data state={state.name}")


def test_no_candidate_copy_or_option_persists(workstation, state: State) -> None:
    candidate = candidate_of(workstation)
    found = workstation.host.run(
        "find /lib/modules -name 'thunderbolt_net.ko*' -type f -exec sha256sum {} +").stdout
    copies = [line.split()[1] for line in found.splitlines()
              if line.split()[0] == candidate.sha256]
    assert copies == [], f"{workstation.name}: candidate copies under /lib/modules: {copies}"
    options = workstation.host.run(
        "grep -rsl tx_e2e /etc/modprobe.d /etc/modules-load.d /etc/modules "
        "/etc/initramfs-tools").stdout.split()
    assert options == [], f"{workstation.name}: persistent tx_e2e configuration in {options}"
    run_dir = workstation.settings.run_dir
    staged = workstation.host.file(f"{run_dir}/thunderbolt_net.ko")
    if state.driver in STOCK_BUILDS:
        assert not staged.exists, f"{workstation.name}: {staged.path} is left behind"
    else:
        assert staged.exists and staged.sha256sum == candidate.sha256, (
            f"{workstation.name}: the loaded candidate's staged file {staged.path} is missing "
            "or not the pinned build")


def test_the_peer_advertises_e2e_while_the_candidate_runs(workstation, state: State) -> None:
    """tx_e2e=1 is inert unless the peer's ThunderboltIP service has E2E (prtcstns bit 0)."""
    if state.driver != "candidate":
        pytest.skip(f"{state.name} runs the {state.driver} driver: tx_e2e is not in use")
    # Found as the driver layer's preflight finds it: the service whose key is "network".
    peer = fact(workstation, PeerCapabilities)
    assert peer, (
        f"{workstation.name}: no XDomain service with key 'network' under {XDOMAIN_DEVICES}: "
        "the peer's thunderbolt_net advertises no ThunderboltIP service")
    assert peer["prtcstns"] & TBNET_E2E, (
        f"{workstation.name}: the peer advertises no E2E ({peer['service']} prtcstns "
        f"{peer['prtcstns']:#x}, bit 0 clear), so tx_e2e=1 is inert in {state.name}; reload the "
        "peer's driver with e2e=1, or converge production")


def test_the_guard_is_armed_exactly_while_the_candidate_is_loaded(workstation,
                                                                  state: State) -> None:
    """A stall with no run watching is restored by the guard; a stock state needs none."""
    armed = safety_reading.judge(workstation.settings, read(workstation, safety_reading.reading(
        workstation.settings))).observed["armed"]
    if state.driver == "candidate":
        assert armed, (
            f"{workstation.name}: the candidate is loaded but its guard ({GUARD}) is not "
            f"running, so a stall with no run watching stays; converge with: pyinfra "
            f"inventory.py deploy.py --data state={state.name}")
    else:
        assert not armed, (
            f"{workstation.name}: the guard ({GUARD}) runs though {state.name} loads the "
            f"{state.driver} driver; converge with: pyinfra inventory.py deploy.py --data "
            f"state={state.name}")
