"""
One measurement of the state the hosts are in, start to finish: observe the
state, find its endpoint, run the windows, write the report, and add its
tok/s to the compatibility ledger.

A report is labelled with the state the hosts were observed to be in, never
with the state someone believed them to be in: a measurement of drifted hosts
is refused, unless the operator names the state and accepts the drift, and
then the report carries the observed verdict next to the name.
"""

from __future__ import annotations

from pathlib import Path

from harness.hosts import counters, remote
from harness.hosts.status import observe
from harness.hosts.topology import Topology
from harness.judging import roofline
from harness.measuring import windows
from harness.measuring.profile import ProfileHosts
from harness.progress import say
from harness.reporting import report
from harness.runs.matrix import record_measurement
from operations.serving import reading as serving_reading
from operations.states import resolve_state


class NotMeasurable(RuntimeError):
    """The hosts are not in a state that can be named; the message says why."""


async def measure_state(topology: Topology, names: list[str], settings: windows.WindowSettings,
                        directory: Path, expected: str | None = None,
                        allow_drift: bool = False) -> tuple[Path, dict]:
    """
    Measure the hosts' current state (``expected``, if given, must be it).

    Returns the JSON report's path and the report.
    """
    status = await observe(topology)
    observed = status.match
    if expected is not None and observed != expected and not allow_drift:
        raise NotMeasurable(f"the hosts are not in {expected}: {status.verdict()}")
    if expected is None and observed is None:
        raise NotMeasurable(f"the hosts are in no declared state: {status.verdict()}")
    state = resolve_state(expected or observed)
    endpoint = topology.endpoint(state)
    say(f"measuring {state.name} at {endpoint.url} ({endpoint.route}); "
        f"windows: {', '.join(names)}; hosts {status.verdict()}")
    info, results = await windows.run(endpoint, names, settings,
                                      lambda: counters.snapshot(topology, beside=True),
                                      ProfileHosts(topology, state))
    bound = await single_stream_bound(topology, info, results)
    built = report.build(state.name, status.to_json(), topology, endpoint, settings, info,
                         results, bound)
    path = report.write(built, directory)
    say(f"report: {path}, {path.with_suffix('.md').name} and, as SGLang's bench_serving "
        f"lines, {path.with_suffix('.jsonl').name}; "
        f"ledger: {await record_measurement(topology, state, built)}")
    return path, built


async def single_stream_bound(topology: Topology, server_info: dict,
                              results: list[dict]) -> dict | None:
    """
    The roofline of the single window (:mod:`harness.judging.roofline`), from the model
    files on the first workstation (rank 0, or a replica of the same model).
    """
    first = topology.workstations[0]
    serving = first.settings.serving
    reading = await remote.read(
        first.name, serving_reading.shape(first.settings), topology.ssh_config, sudo=first.sudo)
    link_gbps = report.hosts(topology, results).get(first.name, {}).get("rx_rate_gbps")
    single = next((window for window in results if window["name"] == windows.SINGLE), None)
    return roofline.beside_measurement(reading.values.get("shape"),
                                       serving.gpu_memory_bandwidth_gb_s,
                                       server_info, single, link_gbps)


def failures(built: dict) -> list[str]:
    """The failed requests of a report, window by window."""
    return [f"{window['name']}: {error}" for window in built["windows"]
            for error in window["errors"]]
