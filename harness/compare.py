"""
Measurements side by side: a Markdown table with ratios, and a PNG chart.

Each ratio is taken against a reference row: by default the row above, so that
in a campaign (one layer changed per step) every ratio is the effect of the one
layer the "changed" column names; or against a named baseline state.

Below it, the stock driver and the candidate are set beside the field report's
own figures, so a reader sees which of its claims the measurements reproduce,
and which it never made.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import server_stats
from harness.report import accept_length_cell, headline, number, replaced, table
from operations.states import STATES, layers_changed

# (headline key, column title, digits, whether a ratio column follows)
COLUMNS = (
    ("single_tok_s", "single tok/s", 1, True),
    ("roofline_single_tok_s", "roofline single tok/s", 1, False),
    ("aggregate_tok_s", "aggregate tok/s", 1, True),
    ("per_request_tok_s", "per-request tok/s", 1, False),
    ("accept_length", "accept length", 2, False),
    ("receiver_errors", "receiver errors", 0, True),
    ("socket_retransmissions", "TP-socket retransmissions", 0, True),
    ("max_socket_retransmissions", "max per socket", 0, False),
    ("retransmissions", "host-wide retransmissions", 0, True),
    ("gib_per_1k_tokens", "GiB / 1k output tokens", 3, True),
)
CHARTED = ("single_tok_s", "aggregate_tok_s", "accept_length", "receiver_errors",
           "socket_retransmissions", "gib_per_1k_tokens")
DIGITS = {key: digits for key, _, digits, _ in COLUMNS}

# The field report compares these two states: the stock driver, then the
# candidate with tx_e2e=1, both with TP2 and NEXTN.
CONTROL, CANDIDATE = "tp2_stock", "tp2_e2e"


@dataclass(frozen=True)
class Reported:
    """One figure of the field report: its value where a ratio can use it, and its words."""

    value: float | None
    text: str


NOT_REPORTED = "not reported"
# Every model-workload figure the field report gives for (CONTROL, CANDIDATE), as
# shared/REFERENCE.md ("The field report's figures") lists them; None where it gives
# none, so a comparison says "not reported" only there.
FIELD_REPORT: dict[str, tuple[Reported | None, Reported | None]] = {
    "single_tok_s": (Reported(48.4, "48.4"), Reported(77.1, "77.1")),
    # Six concurrent requests: 1,536 tokens in 8.89 s; the candidate's "about 15%
    # above stock" is the report's 199.6, which it warns is not a per-request rate.
    "aggregate_tok_s": (Reported(172.9, "172.9"), Reported(199.6, "199.6")),
    "accept_length": (Reported(None, "about 2 to 3"), Reported(None, "3.83 to 4.00")),
    # One six-request sample: one receiver added 109 errors; under the candidate
    # both receivers kept zero.
    "receiver_errors": (Reported(109, "109 (one receiver)"), Reported(0, "0 (both)")),
    # Per host, asymmetric; the sum is what this table's host-wide column adds up.
    "retransmissions": (Reported(239 + 1787, "2,026 (239 + 1,787)"),
                        Reported(529 + 318, "847 (529 + 318)")),
    # 5.58 GiB each way for 1,536 output tokens; the candidate's window gives no token count.
    "gib_per_1k_tokens": (Reported(3.6, "about 3.6"), None),
}
# (headline key, what the row measures), in the order the report gives them.
SIDE_BY_SIDE = (
    ("single_tok_s", "single-stream tok/s"),
    ("aggregate_tok_s", "aggregate tok/s"),
    ("accept_length", "accept length"),
    ("receiver_errors", "receiver errors"),
    ("retransmissions", "host-wide retransmissions"),
    ("max_socket_retransmissions", "max retransmissions of one TP socket"),
    ("gib_per_1k_tokens", "GiB / 1k output tokens"),
)
SIDE_BY_SIDE_NOTE = (
    f"× : {CANDIDATE} / {CONTROL}. *Field*: the field report's figures (shared/REFERENCE.md), "
    "one hardware pair, controlled observations rather than a benchmark; 'not reported' only "
    "where it gives none. *Receiver errors*: `rx_errors` of the link on both workstations, "
    "over every window. *Host-wide retransmissions*: `RetransSegs` of both workstations. "
    "*Max retransmissions of one TP socket*: the most any one of the TP group's sockets "
    "retransmitted in one window."
)


def ratio(value: float | None, reference: float | None, digits: int) -> str:
    """
    ``value / reference``; none to a reference the table shows as zero (production
    moves a few bytes over a link it does not use: a ratio to that means nothing).
    """
    if value is None or reference is None or round(reference, digits) == 0:
        return "—"
    return f"{value / reference:.2f}×"


def figure(value: float | None, digits: int) -> str:
    """A cell: a counter (no digits) as a whole number, anything else to ``digits``."""
    return number(int(value) if digits == 0 and value is not None else value, digits)


def changed(previous: str, current: str) -> str:
    """The layers between two states, when both are declared ones."""
    if previous not in STATES or current not in STATES:
        return "?"
    return ", ".join(layers_changed(STATES[previous], STATES[current])) or "none"


def comparison_header() -> list[str]:
    """The comparison table's columns (the README quotes its header line)."""
    header = ["state", "changed"]
    for _, title, _, with_ratio in COLUMNS:
        header += [title, "×"] if with_ratio else [title]
    return [*header, "long prefill"]


def comparison(reports: list[dict[str, Any]], baseline: str | None = None) -> str:
    """The Markdown table; ratios against the row above, or against ``baseline``'s row."""
    rows = [headline(report) for report in reports]
    states = [row["state"] for row in rows]
    if baseline is not None and baseline not in states:
        raise ValueError(f"no report of the baseline state {baseline!r} (have {states})")
    header = comparison_header()
    body = []
    for index, row in enumerate(rows):
        reference = rows[states.index(baseline)] if baseline else rows[index - 1] if index else {}
        cells = [row["state"], changed(states[index - 1], row["state"]) if index else "—"]
        for key, _, digits, with_ratio in COLUMNS:
            value = row[key]
            cells.append(accept_length_cell(value, row["accept_length_cumulative"])
                         if key == "accept_length" else figure(value, digits))
            if with_ratio:
                cells.append(ratio(value, reference.get(key), digits))
        cells.append(f"{row['long_prefill'] or '—'} ({number(row['long_ttft_s'], 2)} s TTFT)"
                     if row["long_prefill"] else "—")
        body.append(cells)
    against = f"the {baseline} row" if baseline else "the row above"
    notes = [f"× : ratio to {against}."]
    if lagging := [row for row in rows if row["accept_length_cumulative"]]:
        notes.append(server_stats.caveat(max(row["decode_log_interval"] for row in lagging)))
    return "\n".join([*table(header, body), "", "\n\n".join(notes), "",
                      *side_by_side(reports)]) + "\n"


def latest(reports: list[dict[str, Any]], state: str) -> dict[str, Any] | None:
    """The last report of ``state``: a campaign's only one, or the last one ``compare`` got."""
    return next((report for report in reversed(reports) if report["state"] == state), None)


def side_by_side(reports: list[dict[str, Any]]) -> list[str]:
    """
    The control and the candidate next to the field report, measure by measure.
    Without a report of both, no ratio can be set beside the field report's: the
    section says which is missing rather than comparing something else.
    """
    lines = ["### The field report side by side", ""]
    found = {state: latest(reports, state) for state in (CONTROL, CANDIDATE)}
    missing = [state for state, report in found.items() if report is None]
    if missing:
        have = ", ".join(dict.fromkeys(report["state"] for report in reports))
        return [*lines, f"No report of {' or '.join(missing)} (have {have}): the field report "
                        f"compares {CONTROL} with {CANDIDATE}."]
    stock, e2e = (headline(found[state]) for state in (CONTROL, CANDIDATE))
    body = []
    for key, title in SIDE_BY_SIDE:
        digits = DIGITS[key]
        field_stock, field_e2e = FIELD_REPORT.get(key, (None, None))
        field_ratio = (ratio(field_e2e.value, field_stock.value, digits)
                       if field_stock and field_e2e else "—")
        body.append([title, figure(stock[key], digits), figure(e2e[key], digits),
                     ratio(e2e[key], stock[key], digits),
                     *(field.text if field else NOT_REPORTED for field in (field_stock, field_e2e)),
                     field_ratio])
    header = ["measure", CONTROL, CANDIDATE, "×", f"field {CONTROL}", f"field {CANDIDATE}",
              "field ×"]
    return [*lines, *table(header, body), "", SIDE_BY_SIDE_NOTE]


def chart(reports: list[dict[str, Any]], path: Path) -> Path:
    """A bar chart per figure, one bar per measurement, written as a PNG."""
    import matplotlib

    # No display: the harness runs over SSH and in CI.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [headline(report) for report in reports]
    labels = [row["state"] for row in rows]
    titles = {key: title for key, title, _, _ in COLUMNS}
    figure, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    for axis, key in zip(axes.flat, CHARTED, strict=True):
        values = [row[key] or 0 for row in rows]
        bars = axis.bar(range(len(values)), values, color="tab:blue")
        axis.bar_label(bars, labels=[number(row[key], 2) for row in rows], fontsize=8)
        axis.set_title(titles[key])
        axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    figure.suptitle("twinbolt: measurements compared")
    with replaced(path) as temporary:
        figure.savefig(temporary, dpi=100, format="png")
    plt.close(figure)
    return path
