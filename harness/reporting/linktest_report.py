"""
A linktest's report: JSON, Markdown beside the field report's network-only
figures, a chart, and the table ``experiment.py compare`` shows across them.

The field report's network-only section measured the stock driver's control, the
candidate, and the stock driver with receive-side E2E off; a linktest is set
beside the one its driver layer is. A figure the report does not give says "not
reported", and nothing else does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.hosts.counters import combined
from harness.judging import field_report
from harness.judging.field_report import NOT_REPORTED, Reported
from harness.reporting.compare import axis_top
from harness.reporting.report import number, replaced, table, write_text
from operations.serving.transport import UBUNTU_CONGESTION_CONTROL
from operations.states import Driver

# What a linktest report says it is, and the flows it runs at once each way.
FORMAT = "twinbolt-linktest/1"
FLOW_COUNTS = (1, 2, 4)


@dataclass(frozen=True)
class FieldColumn:
    """What the field report's network-only section gives for one driver."""

    label: str
    figures: dict[str, Reported]


# The field report's network-only figures (harness/judging/field_report.py, listed in
# docs/field-report.md), by the driver each part measured.
FIELD_NETWORK: dict[Driver, FieldColumn] = {
    Driver.STOCK: FieldColumn("stock-direction control", {
        "gbit_s_4_flows": field_report.STOCK_LINK_GBIT_S,
        "retransmissions": field_report.STOCK_LINK_RETRANSMISSIONS,
        "receiver_errors": field_report.STOCK_LINK_RECEIVER_ERRORS,
    }),
    Driver.STOCK_E2E_OFF: FieldColumn("stock, receive-side E2E off (e2e=0)", {
        # Words, not a count.
        "receiver_errors": field_report.E2E_OFF_RECEIVER_ERRORS,
    }),
    Driver.CANDIDATE: FieldColumn("candidate (tx_e2e=1)", {
        "probe_loss": field_report.CANDIDATE_PROBE_LOSS,
        "probe_mean_ms": field_report.CANDIDATE_PROBE_MEAN_MS,
        "loaded_probe_loss": field_report.CANDIDATE_LOADED_PROBE_LOSS,
    }),
}
FIELD_NOTE = (f"*Field*: the field report's network-only figures ({field_report.PAGE}), one "
              "hardware pair, each of them one observation, with no interval; 'not reported' "
              "only where it gives none.")
# (figure, what the row measures, digits)
FIGURES = (
    ("gbit_s_4_flows", "Gbit/s delivered, 4 flows (mean of the directions)", 3),
    ("retransmissions", "TCP retransmissions, 4-flow runs (host-wide, both hosts)", 0),
    ("receiver_errors", "receiver errors, 4-flow runs (both receivers)", 0),
    ("probe_loss", "loss of the low-rate probes (both directions)", 3),
    ("probe_mean_ms", "mean probe RTT, ms (both directions)", 3),
    ("probe_p99_ms", "p99 probe RTT, ms (worst direction)", 3),
    ("loaded_probe_loss", "probe loss under 4 flows", 3),
)


def of_kind(report: dict[str, Any], kind: str, flows: int | None = None) -> list[dict[str, Any]]:
    return [run for run in report["runs"]
            if run["kind"] == kind and (flows is None or run.get("flows") == flows)]


def mean(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) / len(known) if known and len(known) == len(values) else None


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The figures set beside the field report's, and beside other linktests."""
    loaded = of_kind(report, "flows", FLOW_COUNTS[-1])
    idle = of_kind(report, "probes")

    def total(name: str) -> int | None:
        return combined([run["link"]["totals"][name] for run in loaded])

    sent = sum(run["sent"] for run in idle)
    return {
        "state": report["state"],
        "driver": report["observed"]["layers"].get("driver"),
        "gbit_s_4_flows": mean([run["gbit_s"] for run in loaded]),
        "retransmissions": total("retransmissions"),
        "receiver_errors": total("receiver_errors"),
        "probe_loss": 1 - sum(run["received"] for run in idle) / sent if sent else None,
        "probe_mean_ms": mean([run["mean_ms"] for run in idle]),
        "probe_p99_ms": max((run["p99_ms"] for run in idle if run["p99_ms"] is not None),
                            default=None),
        "loaded_probe_loss": mean([run["loss"] for run in of_kind(report, "load_and_ping")]),
        "capped": [f"{run['direction']} x{run['flows']}" for run in of_kind(report, "flows")
                   if run["capped"]],
    }


def ratio(value: float | None, field: Reported | None) -> str:
    if value is None or field is None or not field.value:
        return "—"
    return f"{value / field.value:.2f}×"


def beside_the_field(report: dict[str, Any]) -> list[str]:
    """The report's figures beside the field's for the same driver, each with its ratio."""
    row = headline(report)
    column = FIELD_NETWORK.get(row["driver"])
    if column is None:
        return [f"The driver layer was {row['driver']!r}, which the field report did not "
                "measure: there is no field column to set beside it."]
    body = []
    for key, title, digits in FIGURES:
        field = column.figures.get(key)
        body.append([title, number(row[key], digits), field.text if field else NOT_REPORTED,
                     ratio(row[key], field)])
    return [*table(["measure", f"lab ({row['state']})", f"field, {column.label}",
                    "lab / field"], body), "", FIELD_NOTE]


def congestion_words(report: dict[str, Any]) -> str:
    """Which congestion control the flows ran: CUBIC, as on Ubuntu, unless the kernel lacks it."""
    ran = sorted({str(run.get("congestion")) for run in of_kind(report, "flows")})
    if ran == [UBUNTU_CONGESTION_CONTROL]:
        return (f"TCP: {UBUNTU_CONGESTION_CONTROL}, asked per flow, as an Ubuntu host runs it.")
    return (f"TCP: {', '.join(ran)} ran, not {UBUNTU_CONGESTION_CONTROL} (an Ubuntu host's "
            "default, which backs off on loss where BBR does not): this kernel lacks it, or "
            "the report predates the request.")


def markdown(report: dict[str, Any]) -> str:
    runs = [[run["direction"], str(run["flows"]), number(run["gbit_s"], 3),
             number(run["trained_gbps"], 1), str(run["retransmits"]),
             number(run["link"]["totals"]["receiver_errors"], 0),
             number(run["link"]["totals"]["retransmissions"], 0),
             "**link up but capped**" if run["capped"] else ""]
            for run in of_kind(report, "flows")]
    pings = [[run["direction"], "idle" if run["kind"] == "probes" else f"under {run['flows']} "
              "flows", f"{run['received']}/{run['sent']}", number(run["loss"], 3),
              number(run["mean_ms"], 3), number(run["p99_ms"], 3)]
             for run in report["runs"] if run["kind"] in ("probes", "load_and_ping")]
    errors = [[run["direction"], str(run["flows"]), host,
               ", ".join(f"{name} {value}" for name, value in delta["counters"].items()
                         if name.startswith("rx_") and name.endswith("errors")) or "reset",
               str(delta["sockets"]["retrans"])]
              for run in of_kind(report, "flows") for host, delta in run["link"]["hosts"].items()]
    return "\n".join([
        f"## Linktest: {report['state']} ({report['observed']['verdict']})", "",
        f"Flows of {report['seconds']:g} s each; measured {report['measured_at']}. "
        f"{congestion_words(report)}", "",
        *table(["direction", "flows", "Gbit/s", "trained Gb/s", "iperf3 retransmits",
                "receiver errors", "host retransmissions", ""], runs), "",
        *table(["direction", "probes", "replies", "loss", "mean ms", "p99 ms"], pings), "",
        "### Receiver errors by kind, and TP-socket retransmissions, per run", "",
        *table(["direction", "flows", "host", "receiver errors", "peer-socket retrans"],
               errors), "",
        "### The field report's network-only figures beside these", "",
        *beside_the_field(report), "",
    ]) + "\n"


def write(report: dict[str, Any], directory: Path) -> Path:
    """Write ``linktest-<state>-<time>.json``, its ``.md`` and its ``.png``; the JSON's path."""
    stamp = report["measured_at"].replace(":", "").replace("+0000", "Z")
    path = directory / f"linktest-{report['state']}-{stamp}.json"
    write_text(path, json.dumps(report, indent=1) + "\n")
    write_text(path.with_suffix(".md"), markdown(report))
    chart(report, path.with_suffix(".png"))
    return path


def is_linktest(report: dict[str, Any]) -> bool:
    return report.get("format") == FORMAT


def comparison(reports: list[dict[str, Any]]) -> str:
    """Linktests side by side: one row each, the figures the field report gives."""
    rows = [headline(report) for report in reports]
    body = [[row["state"], str(row["driver"]),
             *(number(row[key], digits) for key, _, digits in FIGURES),
             ", ".join(row["capped"]) or "—"] for row in rows]
    header = ["state", "driver", *(title for _, title, _ in FIGURES), "capped runs"]
    return "\n".join(["### Linktests", "", *table(header, body)]) + "\n"


def chart(report: dict[str, Any], path: Path) -> Path:
    """Gbit/s per direction and flow count against the trained rate, and the probes' RTT."""
    import matplotlib

    matplotlib.use("Agg")  # no display: over SSH and in CI
    import matplotlib.pyplot as plt

    figure, (rates, rtts) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    runs = of_kind(report, "flows")
    labels = [f"{run['direction']}\nx{run['flows']}" for run in runs]
    bars = rates.bar(range(len(runs)), [run["gbit_s"] for run in runs],
                     color=["tab:red" if run["capped"] else "tab:blue" for run in runs])
    rates.bar_label(bars, labels=[number(run["gbit_s"], 2) for run in runs], fontsize=8)
    for trained in set(report["trained_gbps"].values()):
        rates.axhline(trained, color="grey", linestyle="--", linewidth=1)
    rates.set_xticks(range(len(runs)), labels, fontsize=8)
    rates.set_title("delivered Gbit/s (dashed: trained rate)")
    pings = [run for run in report["runs"] if run["kind"] in ("probes", "load_and_ping")]
    rtts.bar(range(len(pings)), [run["mean_ms"] or 0 for run in pings], color="tab:green")
    rtts.set_xticks(range(len(pings)), [f"{run['direction']}\n{run['kind']}" for run in pings],
                    fontsize=8)
    rtts.set_title("mean probe RTT, ms")
    figure.suptitle(f"twinbolt linktest: {report['state']}")
    with replaced(path) as temporary:
        figure.savefig(temporary, dpi=100, format="png")
    plt.close(figure)
    return path


# The transport chart's panels: (headline key, title); the last two are counts.
TRANSPORT_PANELS = (
    ("gbit_s_4_flows", "Gbit/s delivered, 4 flows (mean of the directions)"),
    ("receiver_errors", "receiver errors, 4-flow runs (both receivers)"),
    ("retransmissions", "TCP retransmissions, 4-flow runs (both hosts)"),
)


def transport_chart(reports: list[dict[str, Any]], path: Path) -> Path:
    """
    The network-only A/B in one chart: the linktests' states side by side, in
    Gbit/s, receiver errors and retransmissions, each axis from zero.
    """
    import matplotlib

    matplotlib.use("Agg")  # no display: over SSH and in CI
    import matplotlib.pyplot as plt

    rows = [headline(report) for report in reports]
    labels = [f"{row['state']}\n({row['driver']})" for row in rows]
    figure, axes = plt.subplots(1, len(TRANSPORT_PANELS), figsize=(15, 4.5),
                                constrained_layout=True)
    for axis, (key, title) in zip(axes, TRANSPORT_PANELS, strict=True):
        values = [row[key] or 0 for row in rows]
        bars = axis.bar(range(len(rows)), values, color="tab:blue")
        axis.bar_label(bars, labels=[number(row[key], 2 if key == "gbit_s_4_flows" else 0)
                                     for row in rows], fontsize=8)
        axis.set_ylim(bottom=0, top=axis_top(values))
        axis.set_xticks(range(len(rows)), labels, fontsize=8)
        axis.set_title(title, fontsize=9)
    figure.suptitle("twinbolt transport: the link alone, state by state")
    with replaced(path) as temporary:
        figure.savefig(temporary, dpi=100, format="png")
    plt.close(figure)
    return path
