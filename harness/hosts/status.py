"""
Which declared state the hosts are observed to be in, layer by layer and host
by host: the reconcile loop's "observed" and "diff", read-only.

Each layer is read with its own facts (one SSH round trip per host, see
:mod:`harness.hosts.remote`) and, for the speculative decoder, from rank 0's or the
replicas' ``/server_info`` (what runs, not what a unit file says). The observed
layers are compared with every declared state's, layer by layer, the gateway's
fallback too, though a declared state derives it. A layer the hosts disagree
on, or that cannot be read, is :class:`Unknown`: it matches no declared value,
so the hosts are reported "drifted" with the evidence rather than rounded to
the nearest state.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from harness.hosts import remote
from harness.hosts.topology import Topology
from operations.gateway import reading as gateway_reading
from operations.plumbing.reading import Judgement
from operations.safety import reading as safety_reading
from operations.serving import reading as serving_reading
from operations.serving.sglang import ROUTER, server_info, speculative_of
from operations.site.settings import GatewaySettings, WorkstationSettings
from operations.states import DECLARED, STATES, ServingMode, Speculative, State
from operations.thunderbolt import driver_reading, link_reading

# A workstation's layers, in the order status shows them: each reads the host
# (``reading``), judges what it read (``judge``) and shows it under its ``SECTION``.
WORKSTATION_LAYERS = (driver_reading, link_reading, safety_reading, serving_reading)


@dataclass(frozen=True)
class Unknown:
    """A layer that cannot be given one value; equal to no declared value."""

    reason: str

    def __str__(self) -> str:
        return f"unknown: {self.reason}"


@dataclass
class Status:
    """
    The observed state: ``layers`` (a value or :class:`Unknown` per layer),
    ``rows`` (section, host, what was seen), the replicas of other pairs that
    serve small beside this one, and the declared state it matches, or the
    closest one and its differences.
    """

    layers: dict[str, Any]
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    # The replicas of other pairs the router fronts (:func:`fronted_elsewhere`).
    fronted_elsewhere: list[str] = field(default_factory=list)

    def differences(self, declared: State) -> list[str]:
        # All four layers, the derived fallback too: a run cut midway can leave
        # the gateway where the serving layer says otherwise.
        return [layer for layer in DECLARED if self.layers[layer] != getattr(declared, layer)]

    @property
    def match(self) -> str | None:
        return next((name for name, state in STATES.items() if not self.differences(state)),
                    None)

    def closest(self) -> tuple[str, list[str]]:
        name = min(STATES, key=lambda name: len(self.differences(STATES[name])))
        return name, self.differences(STATES[name])

    def verdict(self) -> str:
        if self.match:
            return f"matches: {self.match}"
        name, layers = self.closest()
        wanted = ", ".join(
            f"{layer} is {describe(self.layers[layer])}, {name} has "
            f"{describe(getattr(STATES[name], layer))}" for layer in layers
        )
        return f"drifted: closest is {name}; {wanted}"

    def render(self) -> str:
        lines = []
        section = None
        for name, host, text in self.rows:
            if name != section:
                lines.append(name)
                section = name
            lines.append(f"  {host:<6} {text}")
        lines.append("")
        lines.append("observed: " + "  ".join(f"{layer}={describe(self.layers[layer])}"
                                               for layer in DECLARED))
        lines.append(self.verdict())
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "layers": {layer: _json(value) for layer, value in self.layers.items()},
            "hosts": [{"section": name, "host": host, "seen": text}
                      for name, host, text in self.rows],
            "match": self.match,
            "verdict": self.verdict(),
        }


def describe(value: object) -> str:
    if isinstance(value, Speculative):
        return (f"{value.algorithm} {value.num_steps}/{value.eagle_topk}/"
                f"{value.num_draft_tokens}")
    if value is None:
        return "off"
    if isinstance(value, bool):
        return "present" if value else "absent"
    return str(value)


def _json(value: object) -> object:
    if isinstance(value, Speculative):
        return value.model_dump()
    if isinstance(value, Unknown):
        return {"unknown": value.reason}
    return value


def agreed(values: dict[str, Any], what: str) -> Any:
    """The one value every host shows, or :class:`Unknown` naming who shows what."""
    distinct = {repr(value) for value in values.values()}
    if len(distinct) == 1:
        return next(iter(values.values()))
    return Unknown(f"{what} differs: " + ", ".join(f"{host} {describe(value)}"
                                                   for host, value in values.items()))


# Reading the hosts


def workstation_queries(settings: WorkstationSettings) -> list[remote.Query]:
    """Each layer's reading of a workstation, in one list: one SSH round trip."""
    return [query for layer in WORKSTATION_LAYERS for query in layer.reading(settings)]


def gateway_queries(settings: GatewaySettings) -> list[remote.Query]:
    """
    The router and the replicas it fronts (other pairs' keep serving small), and
    the proxy: the running proxy's routing is the truth, its file what it would load next.
    """
    return [*serving_reading.router(settings), *gateway_reading.reading(settings)]


async def guard_states(topology: Topology) -> dict[str, Judgement | str]:
    """
    Each workstation's guard as the safety layer judges it: whether it is armed,
    and its events no run has read; an unreachable host reads as its error.
    """
    queries = {entry: safety_reading.reading(entry.settings) for entry in topology.workstations}
    readings = await remote.read_all(queries, topology.ssh_config)
    return {entry.name: readings[entry.name].error
            or safety_reading.judge(entry.settings, readings[entry.name].values)
            for entry in topology.workstations}


def guard_fired(guards: dict[str, Judgement | str]) -> list[str]:
    """Why the guard is not quietly armed, by host: events, not running, unreadable."""
    found = []
    for name, guard in guards.items():
        if isinstance(guard, str):
            found.append(f"{name}: the guard cannot be read: {guard}")
            continue
        found += [f"{name}: {problem}" for problem in guard.problems]
    return found


async def server_infos(urls: list[str], headers: dict[str, str]) -> dict[str, dict | None]:
    """
    Each server's ``/server_info``, or ``None`` where none answers (rank 1, a
    stopped one): asked as the serving layer asks it, with the servers' key, all at once.
    """
    answers = await asyncio.gather(*(asyncio.to_thread(server_info, url, headers)
                                     for url in urls))
    return {url: answer.body if answer.ok and isinstance(answer.body, dict) else None
            for url, answer in zip(urls, answers, strict=True)}


async def observe(topology: Topology) -> Status:
    """Read every host and every server once, and judge the layers."""
    hosts = {entry: workstation_queries(entry.settings)
             for entry in topology.workstations}
    if topology.gateway:
        hosts[topology.gateway] = gateway_queries(topology.gateway.settings)
    urls = [entry.settings.server_url for entry in topology.workstations]
    readings, infos = await asyncio.gather(remote.read_all(hosts, topology.ssh_config),
                                           server_infos(urls, topology.headers))
    fronted = fronted_elsewhere(topology, readings, urls)
    status = Status(layers={}, fronted_elsewhere=fronted)
    for reading in readings.values():
        if reading.error:
            status.rows.append(("unreachable", reading.host, reading.error))
    judged = judged_workstations(topology, readings)
    status.rows += [(section, host, line) for section, by_host in judged.items()
                    for host, judgement in by_host.items() for line in judgement.lines]
    status.layers["driver"] = driver_layer(topology, judged[driver_reading.SECTION])
    status.layers["serving"] = serving_layer(topology, judged[serving_reading.SECTION],
                                             readings, status.rows, fronted)
    status.layers["speculative"] = speculative_layer(topology, infos, status.rows)
    status.layers["gateway_fallback"] = gateway_layer(topology, readings, status.rows)
    if fronted and status.layers["serving"] == ServingMode.TENSOR_PARALLEL:
        # Other pairs serve small while this one is out: as good as the fallback.
        status.rows.append(("gateway", topology.gateway.name,
                            f"small is served by other pairs' replicas: {', '.join(fronted)}"))
        status.layers["gateway_fallback"] = True
    return status


def fronted_elsewhere(topology: Topology, readings: dict[str, remote.Reading],
                      urls: list[str]) -> list[str]:
    """
    The replicas of other pairs the router fronts now (its ``/workers``, read
    with its key on the gateway): none on a site of one pair, or while it is
    stopped or does not say.
    """
    if topology.pair is None or topology.gateway is None:
        return []
    reading = readings[topology.gateway.name]
    listed = None if reading.error else reading.values.get("workers")
    return [worker["url"] for worker in listed or [] if worker["url"] not in urls]


# Judging each layer


def judged_workstations(topology: Topology, readings: dict[str, remote.Reading]
                        ) -> dict[str, dict[str, Judgement]]:
    """
    Each layer's judgement of each workstation that could be read, by section
    then host: one pass over the layers. The link and the guard are no layer of
    a declared state, but every state needs them: shown, not matched.
    """
    return {layer.SECTION: {entry.name: layer.judge(entry.settings, readings[entry.name].values)
                            for entry in topology.workstations
                            if not readings[entry.name].error}
            for layer in WORKSTATION_LAYERS}


def by_host(topology: Topology, judged: dict[str, Judgement],
            value: Callable[[dict[str, Any]], Any]) -> dict[str, Any]:
    """Each workstation's ``value`` of what its layer observed; unknown where it was not read."""
    return {entry.name: value(judged[entry.name].observed) if entry.name in judged
            else Unknown("unreachable") for entry in topology.workstations}


def driver_of(observed: dict[str, Any]) -> Any:
    build = observed["build_id"]
    return observed["driver"] or Unknown(f"build {build}" if build else "not loaded")


def serving_of_host(observed: dict[str, Any]) -> Any:
    return observed["serving"] or Unknown(", ".join(observed["running"]) or "nothing")


def driver_layer(topology: Topology, judged: dict[str, Judgement]) -> Any:
    return agreed(by_host(topology, judged, driver_of), "the driver")


def serving_layer(topology: Topology, judged: dict[str, Judgement],
                  readings: dict[str, remote.Reading], rows: list[tuple[str, str, str]],
                  fronted: list[str]) -> Any:
    shape = by_host(topology, judged, serving_of_host)
    router = False
    if topology.gateway:
        reading = readings[topology.gateway.name]
        router = ROUTER in reading.values.get("router", [])
        rows.append(("serving", topology.gateway.name,
                     f"{ROUTER} {'running' if router else 'stopped'}"))
    value = agreed(shape, "serving")
    # The router belongs to the replicas: it runs with them and only with them,
    # though with another pair's (``fronted``) while this one runs a TP group.
    if value == ServingMode.REPLICAS and not router:
        return Unknown(f"replicas without {ROUTER}")
    if value == ServingMode.TENSOR_PARALLEL and router and not fronted:
        return Unknown(f"TP ranks with {ROUTER} still running")
    return value


def speculative_layer(topology: Topology, infos: dict[str, dict | None],
                      rows: list[tuple[str, str, str]]) -> Any:
    seen = {}
    for entry in topology.workstations:
        url = entry.settings.server_url
        info = infos[url]
        if info is None:
            rows.append(("speculative", entry.name, f"no /server_info at {url}"))
            continue
        try:
            value = speculative_of(info)
        except ValueError:
            value = Unknown(f"speculative algorithm {info.get('speculative_algorithm')}")
        seen[entry.name] = value
        rows.append(("speculative", entry.name,
                     f"{describe(value)} (/server_info: speculative_algorithm="
                     f"{info.get('speculative_algorithm')}, tp_size={info.get('tp_size')})"))
    if not seen:
        return Unknown("no server answers /server_info")
    return agreed(seen, "the speculative decoder")


def gateway_layer(topology: Topology, readings: dict[str, remote.Reading],
                  rows: list[tuple[str, str, str]]) -> Any:
    if topology.gateway is None:
        return Unknown("the inventory has no gateway")
    name = topology.gateway.name
    reading = readings[name]
    if reading.error:
        return Unknown("unreachable")
    judged = gateway_reading.judge(topology.gateway.settings, reading.values)
    rows.append(("gateway", name, judged.observed["seen"]))
    return Unknown(judged.problems[0]) if judged.problems else judged.observed["fallback"]
