"""
The compatibility ledger read back: ``experiment.py matrix`` prints controller
pairing (each NHI with its NVM firmware) x kernel x driver x E2E setting ->
outcomes, and ``measure`` adds its tok/s to the ledger.

The records are written by the runs themselves (``operations/safety/ledger.py``); this
only groups them. The driver column is the declared driver with the build-ids
seen loaded of it, and the E2E column the parameters seen loaded: a refused
candidate run shows no candidate build-id and ``tx -``, which is the truth.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.hosts import remote
from harness.hosts.topology import Topology
from harness.reporting.report import headline, table
from operations.safety import ledger
from operations.safety import reading as safety_reading
from operations.states import Driver, State


def ledger_path(topology: Topology) -> Path:
    """The ledger the inventory names (``[ledger] path``), as the deploy writes it."""
    return Path(topology.workstations[0].settings.ledger.path).expanduser()


def row_key(entry: dict[str, Any]) -> tuple[str, str, str, str]:
    hosts = entry["hosts"]
    kernels = sorted({str(part.get("kernel")) for part in hosts})
    # A build-id counts under the driver declared only if it is that driver (the
    # candidate declares tx_e2e): a refused candidate run left the stock one loaded.
    build_ids = sorted({
        part["build_id"][:12] for part in hosts
        if part.get("build_id")
        and ("tx_e2e" in part.get("parameters", {})) == (entry["driver"] == Driver.CANDIDATE)
    })
    settings = sorted({
        f"rx {part.get('parameters', {}).get('e2e', '-')} "
        f"tx {part.get('parameters', {}).get('tx_e2e', '-')}"
        for part in hosts
    })
    return (ledger.describe_pairing(ledger.controllers(entry)), ", ".join(kernels),
            " ".join([entry["driver"], *build_ids]), ", ".join(settings))


EVENT_KINDS = ("hotplug", "suspend")


def event_cell(outcomes: list[dict[str, Any]]) -> str:
    """
    A soak's plugs or suspends on one row: how many brought the link back, at
    what rates, whether ``tx_e2e`` stayed set, and the slowest recovery.
    """
    if not outcomes:
        return "-"
    back = [outcome for outcome in outcomes if outcome.get("link") == "back"]
    rates = sorted({f"{outcome['rate_gbps']:g}" for outcome in back})
    kept = all(outcome.get("tx_e2e_kept", True) for outcome in back)
    recovered = [outcome["recovered_seconds"] for outcome in back
                 if outcome.get("recovered_seconds") is not None]
    return (f"{len(back)}/{len(outcomes)} back"
            + (f" at {', '.join(rates)} Gb/s" if rates else "")
            + ("" if kept else ", tx_e2e LOST")
            + (f", served again in <= {max(recovered):g}s" if recovered else "")
            + ("" if len(recovered) == len(outcomes) else
               f", {len(outcomes) - len(recovered)} not served again"))


def render(records: list[dict[str, Any]]) -> str:
    """The matrix as a Markdown table, one row per combination, in order of first use."""
    outcomes: dict[tuple[str, ...], Counter[str]] = defaultdict(Counter)
    events: dict[tuple[str, ...], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    best: dict[tuple[str, ...], float] = {}
    for entry in records:
        key = row_key(entry)
        if entry["outcome"] in EVENT_KINDS:
            events[key][entry["outcome"]].append(entry.get("event") or {})
            continue
        outcomes[key][entry["outcome"] + (" (forced)" if entry.get("forced") else "")] += 1
        if entry.get("tok_s") is not None:
            best[key] = max(best.get(key, 0.0), entry["tok_s"])
    rows = [
        [*key, ", ".join(f"{count} {outcome}" for outcome, count in outcomes[key].items())
         or "-", f"{best[key]:.1f}" if key in best else "-",
         *(event_cell(events[key][kind]) for kind in EVENT_KINDS)]
        for key in dict.fromkeys([*outcomes, *events])
    ]
    header = ["controllers (NHI, NVM)", "kernel", "driver", "E2E (rx, tx)", "outcomes",
              "best tok/s", "hotplug (soak events)", "suspend (soak events)"]
    return "\n".join(table(header, rows))


def stalls(records: list[dict[str, Any]]) -> list[str]:
    """Every stall the preflight would act on, the upstream report first."""
    return [ledger.describe_stall(entry)
            for entry in [*ledger.SEEDED, *records] if entry["stall"]]


async def hosts_now(topology: Topology) -> list[dict[str, Any]]:
    """Each workstation's part of a record, as the hosts are now."""
    readings = await remote.read_all({entry: safety_reading.identity(entry.settings)
                                      for entry in topology.workstations}, topology.ssh_config)
    return [ledger.host_entry(name, reading.values) for name, reading in readings.items()]


async def record_measurement(topology: Topology, state: State, built: dict[str, Any]) -> Path:
    """Append a ``measured`` record: the hosts as they are now, and the single-stream tok/s."""
    path = ledger_path(topology)
    ledger.append(path, ledger.record(state.name, state.driver, "measured",
                                      await hosts_now(topology),
                                      tok_s=headline(built)["single_tok_s"]))
    return path


async def record_events(topology: Topology, state: State, outcomes: list[dict[str, Any]],
                        describe: Callable[[dict[str, Any]], str]) -> Path:
    """
    Append a ``hotplug`` record for each plug and a ``suspend`` record for each
    suspend of a soak, with its outcome: the hosts as they are after it.
    """
    path = ledger_path(topology)
    hosts = await hosts_now(topology)
    for outcome in outcomes:
        kind = "hotplug" if outcome["event"] == "plug" else "suspend"
        ledger.append(path, ledger.record(state.name, state.driver, kind, hosts,
                                          evidence=describe(outcome), event=outcome))
    return path
