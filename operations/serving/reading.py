"""
The serving layer as a harness reads a host: which SGLang services run, what
the TP group's sockets and the link's counters did, what ran beside the
servers, and on the gateway, the router and the replicas it fronts.

Status, diagnose, a window's counters and the profile window each read what
they need of these, with the layer's own facts and arguments, and judge what
runs by the layer's judge (:func:`serving_of`).
"""

from __future__ import annotations

from typing import Any

from operations.plumbing.reading import Judgement, Query
from operations.services import RunningServices, ServiceLog, ServiceLogMatches, ServiceProcess
from operations.serving.gpu import GpuProcesses, Gpus
from operations.serving.neighbours import ProcessCpu
from operations.serving.router import RouterWorkers
from operations.serving.sglang import (
    GPU_SERVICES,
    ROUTER,
    SGLANG_SERVICES,
    service_for,
    serving_of,
)
from operations.serving.transport import (
    Connections,
    LinkCounters,
    ModelShape,
    PeerSockets,
    connection_problems,
    connections_of,
)
from operations.site.settings import GatewaySettings, WorkstationSettings
from operations.states import ServingMode

# NCCL_DEBUG=INFO's lines: NCCL's interface, channels and transport.
NCCL_INFO = "NCCL INFO"


# Where status shows this layer's lines of a workstation.
SECTION = "serving"

def reading(settings: WorkstationSettings) -> list[Query]:
    """The SGLang services running on a workstation."""
    return [Query("services", RunningServices(),
                  {"prefix": SGLANG_SERVICES, "init_system": settings.serving.init_system})]


def sockets(settings: WorkstationSettings) -> list[Query]:
    """The TP group's sockets to the peer, each with its retransmissions."""
    return [Query("sockets", PeerSockets(), {"peer": settings.peer_link_address})]


def transport(settings: WorkstationSettings) -> list[Query]:
    """The link's interface counters and the TP sockets: what a window's traffic did."""
    return [Query("counters", LinkCounters(), {"interface": settings.link.interface}),
            *sockets(settings)]


def beside(settings: WorkstationSettings) -> list[Query]:
    """What ran beside the servers: its processes' CPU seconds, the GPU's compute processes."""
    return [Query("cpu", ProcessCpu(),
                  {"services": GPU_SERVICES, "init_system": settings.serving.init_system}),
            Query("gpu", GpuProcesses())]


def connections() -> list[Query]:
    """Every process's established connections, and the host's addresses."""
    return [Query("connections", Connections())]


def gpus() -> list[Query]:
    """The host's GPUs."""
    return [Query("gpus", Gpus())]


def ranks(settings: WorkstationSettings, serving: ServingMode, lines: int) -> list[Query]:
    """
    The process of the server ``serving`` runs on this workstation, and the last
    ``lines`` of its log, each filed under the service's name.
    """
    init_system = settings.serving.init_system
    name = service_for(serving, settings.rank)
    return [Query(f"process {name}", ServiceProcess(),
                  {"service": name, "init_system": init_system}),
            Query(f"log {name}", ServiceLog(),
                  {"service": name, "init_system": init_system, "lines": lines})]


def process(settings: WorkstationSettings, serving: ServingMode,
            values: dict[str, Any]) -> dict[str, Any]:
    """The process of the server ``serving`` runs on this workstation, as :func:`ranks` read it."""
    return values[f"process {service_for(serving, settings.rank)}"]


def nccl(settings: WorkstationSettings, serving: ServingMode) -> list[Query]:
    """NCCL's INFO lines in the log of the server ``serving`` runs on this workstation."""
    return [Query("nccl", ServiceLogMatches(),
                  {"service": service_for(serving, settings.rank),
                   "init_system": settings.serving.init_system, "text": NCCL_INFO})]


def shape(settings: WorkstationSettings) -> list[Query]:
    """The served model's shape, from its files: what the roofline prices."""
    return [Query("shape", ModelShape(), {"model_path": settings.serving.model_path})]


def router(settings: GatewaySettings) -> list[Query]:
    """Whether the router runs on the gateway, and which replicas it fronts."""
    roles = settings.roles
    return [Query("router", RunningServices(), {"prefix": ROUTER,
                                                "init_system": roles.init_system}),
            Query("workers", RouterWorkers(), {"url": settings.router_url,
                                               "key_file": roles.router_key_file})]


def judge(settings: WorkstationSettings, values: dict[str, Any]) -> Judgement:
    """
    What a workstation serves (``serving``, ``None`` for no declared mode), the
    services that run (``running``) and the line an operator reads (``seen``);
    a problem if what runs is no declared mode.
    """
    # A host that could not be read shows no service.
    running = values.get("services", [])
    serving = serving_of(running, settings.rank)
    found = [] if serving else [f"runs {', '.join(running) or 'nothing'}, no declared mode"]
    return Judgement({"serving": serving, "running": running,
                      "seen": ", ".join(running) or "no SGLang service"}, found)


def judge_connections(settings: WorkstationSettings, process: dict[str, Any],
                      connections: dict[str, Any]) -> Judgement:
    """
    The connections the TP rank's ``process`` holds (``held``, from every
    process's ``connections``); why they are not the TP group's, across the link.
    """
    held = connections_of(connections, process["pid"]) if process["pid"] else []
    return Judgement({"held": held}, connection_problems(
        held, connections["addresses"], settings.link_address, settings.peer_link_address,
        settings.serving.port, settings.link.interface))
