"""
The field report's figures: the one place the harness and the docs take them from.

Source: the field report twinbolt was written to reproduce. Its setup: Qwen 27B
NVFP4 split across two RTX 5090 workstations (SGLang TP2, one GPU a
workstation; about 14.48 GiB of target weights and 2.65 GiB of MTP draft weights
per rank), with NEXTN 3/1/4 speculative decoding, NCCL over TCP on ThunderboltIP
across a direct 20 Gb/s Thunderbolt/USB4 link; the stock ``thunderbolt_net``
first, then the candidate loaded with ``tx_e2e=1``, same topology and request
shapes. One hardware pair, each figure one observation: controlled observations,
not a benchmark, so no figure has an interval.

``docs/field-report.md`` lists the same figures with their meaning, generated
from this module (``python -m harness.judging.field_report`` prints its tables;
``tests/unit/test_field_report.py`` checks that the page and the module agree).
Reports cite that page. Used by:

- :mod:`harness.reporting.compare`: the model-workload figures, beside ``tp2_stock`` and
  ``tp2_e2e`` ("The field report side by side");
- :mod:`harness.reporting.linktest_report`: the network-only figures, beside a linktest of
  the same driver;
- :mod:`harness.measuring.windows`: the request shapes, the windows' default sizes.

A figure the report words as a range or in words keeps its words (``text``);
``value`` is the number a ratio may use, ``None`` where none can. A figure the
report does not give is absent, and a comparison says :data:`NOT_REPORTED` there
and only there.
"""

from __future__ import annotations

from dataclasses import dataclass

# The page that lists these figures, as reports cite it.
PAGE = "docs/field-report.md"
NOT_REPORTED = "not reported"


@dataclass(frozen=True)
class Reported:
    """
    One figure of the field report: the number a ratio may use (``None`` for a
    range or words), the report's own words, and what was measured.
    """

    value: float | None
    text: str
    meaning: str


@dataclass(frozen=True)
class Shape:
    """One request shape of the report's model workload: a count, and what it counts."""

    value: int
    meaning: str


# The request shapes: what the report sent, so what the windows send by default.
SINGLE_OUTPUT_TOKENS = Shape(512, "output tokens of the single-stream request")
CONCURRENT_REQUESTS = Shape(6, "requests sent at once in the concurrent sample")
CONCURRENT_OUTPUT_TOKENS = Shape(256, "output tokens of each concurrent request (1,536 in all)")
PREFIX_TOKENS = Shape(120_000, "prompt tokens of the repeated prefix (all reported cached)")
LONG_OUTPUT_TOKENS = Shape(64, "output tokens of the long request (after 199,860 input tokens)")

# Model workload, stock thunderbolt_net (TP2 + NEXTN 3/1/4).
STOCK_SINGLE_TOK_S = Reported(
    48.4, "48.4",
    "stock, single stream: output tok/s of one 512-token request (10.73 s in all, TTFT 159 ms)")
STOCK_AGGREGATE_TOK_S = Reported(
    172.9, "172.9",
    "stock, six concurrent requests: 1,536 output tokens in 8.89 s, aggregate tok/s")
STOCK_ACCEPT_LENGTH = Reported(
    None, "about 2 to 3", "stock, NEXTN's acceptance length: a range, no ratio")
STOCK_RECEIVER_ERRORS = Reported(
    109, "109 (one receiver)",
    "stock, one repeated six-request sample: link errors one receiver added")
STOCK_RETRANSMISSIONS = Reported(
    239 + 1787, "2,026 (239 + 1,787)",
    "stock, the same sample: TCP retransmissions, 239 on one host and 1,787 on the other")
STOCK_GIB_PER_1K_TOKENS = Reported(
    3.6, "about 3.6",
    "stock, the same sample: GiB moved each way per 1,000 output tokens (5.58 GiB for 1,536)")

# Model workload, the candidate with tx_e2e=1 (same topology and request shapes).
# The report gives no GiB per 1,000 tokens for it: its window has no token count.
CANDIDATE_SINGLE_TOK_S = Reported(
    77.1, "77.1", "candidate, single stream: output tok/s (+59% on stock)")
CANDIDATE_AGGREGATE_TOK_S = Reported(
    199.6, "199.6",
    "candidate, six concurrent requests: aggregate tok/s, about 15% above stock; the report "
    "warns it is not a per-request rate")
CANDIDATE_ACCEPT_LENGTH = Reported(
    None, "3.83 to 4.00", "candidate, NEXTN's acceptance length: a range, no ratio")
CANDIDATE_RECEIVER_ERRORS = Reported(
    0, "0 (both)",
    "candidate: both receivers kept zero total, CRC, missed, length and overrun errors")
CANDIDATE_RETRANSMISSIONS = Reported(
    529 + 318, "847 (529 + 318)",
    "candidate: TCP retransmissions, 529 on one host and 318 on the other")

# Network only, no model ("integrity before model speed"), by the driver measured.
STOCK_LINK_GBIT_S = Reported(
    15.249, "15.249", "stock-direction control: Gbit/s delivered")
STOCK_LINK_RETRANSMISSIONS = Reported(
    25717, "25,717", "stock-direction control: TCP retransmissions")
STOCK_LINK_RECEIVER_ERRORS = Reported(
    4346, "4,346", "stock-direction control: receiver errors")
E2E_OFF_RECEIVER_ERRORS = Reported(
    None, "not removed (no count given)",
    "stock with receive-side E2E off (e2e=0): in words, it did not remove the errors and "
    "could make the path worse")
CANDIDATE_PROBE_LOSS = Reported(
    0.0, "0 (100 each way)", "candidate: loss of 100 low-rate probes in each direction")
CANDIDATE_PROBE_MEAN_MS = Reported(
    0.285, "about 0.28 to 0.29",
    "candidate: mean RTT of those probes, ms, idle link; a ratio uses the range's middle")
CANDIDATE_LOADED_PROBE_LOSS = Reported(
    0.0, "0", "candidate: probe loss in a concurrent load-and-ping sample")


def shapes() -> dict[str, Shape]:
    """Every request shape, by its constant's name, in the order above."""
    return {name: value for name, value in globals().items() if isinstance(value, Shape)}


def figures() -> dict[str, Reported]:
    """Every figure, by its constant's name, in the order above."""
    return {name: value for name, value in globals().items() if isinstance(value, Reported)}


def _as_number(figure: Reported) -> str:
    return "—" if figure.value is None else f"{figure.value:,g}"


def tables() -> str:
    """The two Markdown tables ``docs/field-report.md`` holds between its markers."""
    lines = ["| request shape | value | what it counts |", "|---|---|---|"]
    lines += [f"| `{name}` | {shape.value:,} | {shape.meaning} |"
              for name, shape in shapes().items()]
    lines += ["", "| figure | the report's words | as a number | what it is |",
              "|---|---|---|---|"]
    lines += [f"| `{name}` | {figure.text} | {_as_number(figure)} | {figure.meaning} |"
              for name, figure in figures().items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(tables(), end="")
