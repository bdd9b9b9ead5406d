"""
The driver layer as a harness reads a host: which ``thunderbolt_net`` build is
loaded, with which parameters, and whether it is one a state declares.

Status, diagnose and a window's counters read the same facts and name the
loaded build by the same judge as the driver step (:func:`loaded_driver`).
"""

from __future__ import annotations

from typing import Any

from operations.plumbing.reading import Judgement, Query
from operations.site.settings import WorkstationSettings
from operations.states import Driver
from operations.thunderbolt.driver import (
    TBNET_E2E,
    CandidateModule,
    LoadedModule,
    ModuleFileBuildId,
    PeerCapabilities,
    SignatureEnforcement,
    loaded_driver,
)

# Where status shows this layer's lines of a workstation.
SECTION = "driver"

def loaded(settings: WorkstationSettings) -> list[Query]:
    """The loaded module alone: the build and parameters a window's counters record."""
    return [Query("module", LoadedModule(), {"module": settings.candidate.module_name})]


def reading(settings: WorkstationSettings) -> list[Query]:
    """The loaded module, and the build ``modprobe`` would load: what tells stock from the rest."""
    return [*loaded(settings), Query("stock_build", ModuleFileBuildId(),
                                 {"module": settings.candidate.module_name})]


def diagnosis(settings: WorkstationSettings) -> list[Query]:
    """
    The reading, the peer's capabilities (its E2E bit, which ``tx_e2e`` needs) and
    signature enforcement (whether an unsigned candidate may load at all).
    """
    return [*reading(settings), Query("peer", PeerCapabilities()),
            Query("signatures", SignatureEnforcement())]


def judge(settings: WorkstationSettings, values: dict[str, Any],
          expected: Driver | None = None) -> Judgement:
    """
    Which declared driver is loaded (``driver``, ``None`` for none of them), its
    ``build_id`` and the line an operator reads (``seen``); a problem if it is
    none of the declared drivers, or not ``expected``.
    """
    module = values["module"]
    if module is None:
        seen = "thunderbolt_net is not loaded"
        return Judgement({"driver": None, "build_id": None, "seen": seen}, [seen])
    parameters = " ".join(f"{key}={value}" for key, value in sorted(module["parameters"].items()))
    build = f"build {module['build_id']}  {parameters}"
    candidate_build = CandidateModule.of(settings).readable_build_id
    driver = loaded_driver(module, values["stock_build"], candidate_build)
    observed = {"driver": driver, "build_id": module["build_id"]}
    if driver is None:
        seen = ("none of the declared builds (stock, with e2e on or off, or the candidate)"
                f"  {build}")
        return Judgement({**observed, "seen": seen}, [seen])
    problems = [] if expected in (None, driver) else [f"the {driver} driver is loaded, "
                                                      f"not the {expected} driver"]
    return Judgement({**observed, "seen": f"{driver}  {build}"}, problems)


def judge_peer(values: dict[str, Any], expected: Driver) -> Judgement:
    """
    The peer's ThunderboltIP service as the driver needs it: whether a peer
    advertises one (``peer``) and the line an operator reads (``seen``); a
    problem without one, or when the candidate is to run ``tx_e2e=1`` and the
    peer does not advertise E2E (bit 0 of its protocol settings).
    """
    peer = values["peer"]
    if peer is None:
        seen = "no peer advertises a ThunderboltIP service"
        return Judgement({"peer": False, "seen": seen}, [seen])
    if expected.is_candidate and not peer["prtcstns"] & TBNET_E2E:
        seen = (f"the peer does not advertise E2E (service {peer['service']} prtcstns "
                f"0x{peer['prtcstns']:08x}, bit 0 clear) under tx_e2e=1")
        return Judgement({"peer": True, "seen": seen}, [seen])
    return Judgement({"peer": True,
                      "seen": f"the peer advertises prtcstns 0x{peer['prtcstns']:08x}"})
