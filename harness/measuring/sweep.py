"""
The concurrency sweep: one window per level of simultaneous requests, and what
the levels say together.

The field report's aggregate of six requests (199.6 tok/s) is not what each of
them got, and one level cannot say where tensor parallelism stops paying for
itself against two replicas. A sweep measures every level apart, each with its
own counters, so that a level's figures and its link's errors come from the
same window:

- per level, the aggregate tok/s (all requests' completion tokens over the
  level's span) and, per request, its tok/s, its TTFT and its time per output
  token, each as a median and a 99th percentile;
- across levels, the crossover: where one state's verdict against another
  turns from one word to the other (faster to slower, more to less).

Time per output token is SGLang's ``bench_serving`` definition, so that a
reader can set these figures beside their own: (latency - TTFT) / (output
tokens - 1). Percentiles interpolate linearly between the nearest samples, as
``numpy.percentile`` does there.

Pure functions: the unit tests are tables of samples and verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import fmean
from typing import Any

from harness.judging.disturbance import counted
from harness.measuring.client import Sample, rate, span, time_per_output_token
from harness.measuring.server_stats import cumulative

NAME = "sweep"
PREFIX = f"{NAME}@"


def level_name(level: int) -> str:
    """The window of one level: ``sweep@4`` sends four requests at once."""
    return f"{PREFIX}{level}"


def level_of(name: str) -> int | None:
    """The level a window's name holds; None for a window that is not the sweep's."""
    digits = name.removeprefix(PREFIX)
    if digits == name or not digits.isdecimal():
        return None
    return int(digits)


def percentile(values: Sequence[float], share: float) -> float | None:
    """
    The ``share`` (0-100) percentile, interpolated linearly between the two
    nearest values (``numpy.percentile``'s default); None of no values.
    """
    ordered = sorted(values)
    if not ordered:
        return None
    place = (len(ordered) - 1) * share / 100
    below, above = math.floor(place), math.ceil(place)
    return ordered[below] + (ordered[above] - ordered[below]) * (place - below)


def distribution(values: list[float | None]) -> dict[str, float | None]:
    """The median, the 99th percentile and the mean of the known values."""
    known = [value for value in values if value is not None]
    return {"p50": percentile(known, 50), "p99": percentile(known, 99),
            "mean": fmean(known) if known else None}


def level_summary(level: int, samples: list[Sample]) -> dict[str, Any]:
    """
    One level's figures. The aggregate counts only a level whose requests all
    finished: with one failed, the span would time fewer requests than the
    level names.
    """
    finished = [sample for sample in samples if sample.error is None]
    seconds = span(finished)
    tokens = sum(sample.completion_tokens for sample in finished)
    return {
        "level": level,
        "requests": len(samples),
        "completed": len(finished),
        "completion_tokens": tokens,
        "seconds": seconds,
        "aggregate_output_tok_s": (rate(tokens, seconds) if len(finished) == len(samples)
                                   else None),
        "per_request_output_tok_s": distribution([s.output_rate for s in finished]),
        "ttft_seconds": distribution([s.ttft for s in finished]),
        "tpot_seconds": distribution([time_per_output_token(s.seconds, s.ttft,
                                                            s.completion_tokens)
                                      for s in finished]),
    }


def milliseconds(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def figures(report: dict[str, Any]) -> dict[int, dict[str, float | int | None]]:
    """
    Each level's figures of one report, by level; a window marked invalid (a
    cold one that found cached tokens) or disturbed gives none, a figure its summary lacks
    (a report from elsewhere, or edited) is unknown.
    """
    levels = {}
    for window in report["windows"]:
        level = level_of(window["name"])
        if level is None or not counted(window):
            continue
        summary, totals = window["summary"], window["link"]["totals"]
        rates, ttft, tpot = (summary.get(key) or {} for key in
                             ("per_request_output_tok_s", "ttft_seconds", "tpot_seconds"))
        levels[level] = {
            "aggregate_tok_s": summary.get("aggregate_output_tok_s"),
            "per_request_tok_s": rates.get("p50"),
            "ttft_p50_s": ttft.get("p50"),
            "ttft_p99_s": ttft.get("p99"),
            "tpot_p50_ms": milliseconds(tpot.get("p50")),
            "tpot_p99_ms": milliseconds(tpot.get("p99")),
            "accept_length": window["server"]["accept_length"],
            "accept_length_cumulative": cumulative(window),
            "receiver_errors": totals["receiver_errors"],
            "socket_retransmissions": totals.get("socket_retransmissions"),
        }
    return levels


@dataclass(frozen=True)
class Crossover:
    """Where a verdict turns: ``before`` up to level ``low``, ``after`` from level ``high``."""

    low: int
    high: int
    before: str
    after: str

    def words(self) -> str:
        """The crossover and its interval: it lies between the two levels that decided."""
        return (f"crossover between {self.low} and {self.high} requests: {self.before} up to "
                f"{self.low}, {self.after} from {self.high}")


def crossover(verdicts: Sequence[tuple[int, str]], words: tuple[str, str]) -> Crossover | None:
    """
    The first level where the verdict turns from one of ``words`` to the other,
    over the levels that decided (a level with no difference detected decides
    nothing, and widens the interval the crossover lies in); None if it never
    turns.
    """
    decided = [(level, said) for level, said in verdicts if said in words]
    for (low, before), (high, after) in pairwise(decided):
        if before != after:
            return Crossover(low, high, before, after)
    return None


def no_crossover(verdicts: Sequence[tuple[int, str]], words: tuple[str, str]) -> str:
    """What a sweep without a crossover says: the verdict it kept, or that none was decided."""
    decided = {said for _, said in verdicts if said in words}
    levels = f"{verdicts[0][0]}–{verdicts[-1][0]}" if verdicts else "no level"
    if not decided:
        return f"no crossover: no level of {levels} decided"
    return f"no crossover in {levels}: {decided.pop()} wherever a level decided"
