"""
Measurements side by side: a Markdown table with ratios, and a PNG chart.

Each ratio is taken against a reference row: by default the row above, so that
in a campaign (one layer changed per step) every ratio is the effect of the one
layer the "changed" column names; or against a named baseline state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.report import headline, number, table
from operations.states import STATES, layers_changed

# (headline key, column title, digits, whether a ratio column follows)
COLUMNS = (
    ("single_tok_s", "single tok/s", 1, True),
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


def ratio(value: float | None, reference: float | None, digits: int) -> str:
    """
    ``value / reference``; none to a reference the table shows as zero (production
    moves a few bytes over a link it does not use: a ratio to that means nothing).
    """
    if value is None or reference is None or round(reference, digits) == 0:
        return "—"
    return f"{value / reference:.2f}×"


def changed(previous: str, current: str) -> str:
    """The layers between two states, when both are declared ones."""
    if previous not in STATES or current not in STATES:
        return "?"
    return ", ".join(layers_changed(STATES[previous], STATES[current])) or "none"


def comparison(reports: list[dict[str, Any]], baseline: str | None = None) -> str:
    """The Markdown table; ratios against the row above, or against ``baseline``'s row."""
    rows = [headline(report) for report in reports]
    states = [row["state"] for row in rows]
    if baseline is not None and baseline not in states:
        raise ValueError(f"no report of the baseline state {baseline!r} (have {states})")
    header = ["state", "changed"]
    for _, title, _, with_ratio in COLUMNS:
        header += [title, "×"] if with_ratio else [title]
    header.append("long prefill")
    body = []
    for index, row in enumerate(rows):
        reference = rows[states.index(baseline)] if baseline else rows[index - 1] if index else {}
        cells = [row["state"], changed(states[index - 1], row["state"]) if index else "—"]
        for key, _, digits, with_ratio in COLUMNS:
            value = row[key]
            cells.append(number(int(value) if digits == 0 and value is not None else value,
                                digits))
            if with_ratio:
                cells.append(ratio(value, reference.get(key), digits))
        cells.append(f"{row['long_prefill'] or '—'} ({number(row['long_ttft_s'], 2)} s TTFT)"
                     if row["long_prefill"] else "—")
        body.append(cells)
    against = f"the {baseline} row" if baseline else "the row above"
    return "\n".join([*table(header, body), "", f"× : ratio to {against}."]) + "\n"


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
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
