"""
What repeated trials let a campaign say: a figure's median, range and 95%
interval; a ratio's interval and a verdict in words; a count's total and
whether it was zero in every trial.

One measurement of each state gives no spread: four campaigns of the same code
on one machine gave tp2_e2e / tp2_stock single-stream ratios from 0.92x to
1.25x, each printed as a result. A ratio here always comes with its interval,
and a verdict ("faster", "slower", "no difference detected at n=N") only from
at least two trials on each side.

The method is Student's t on the logarithms of the trials. Throughput varies by
a factor rather than by an amount, so the logs are taken as normal: a state's
interval is its geometric mean's, a ratio's that of the difference of two mean
logs, with the variance pooled over both states. It holds its 95% at the 3 or
5 trials a campaign can afford, where a bootstrap over so few trials resamples
little more than their range and covers far less.

Pure functions: the unit tests are tables of trials and verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import NormalDist, fmean, median, stdev

LEVEL = 0.95
METHOD = ("Student's t on the logarithms of the trials, 95%: a state's interval is its "
          "geometric mean's; a ratio's is that of the two states' geometric means, the "
          "variance of the logs pooled over both")
NO_VERDICT = "no verdict: one trial"
# Student's t at 0.975 for 1 to 30 degrees of freedom; beyond, Cornish-Fisher from the normal.
T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
         2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
         2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)

Trials = Sequence[float | None]
Interval = tuple[float, float]


def t_quantile(degrees: int) -> float:
    """Student's t at 0.975 (a two-sided 95% interval) for ``degrees`` of freedom."""
    if degrees < 1:
        raise ValueError(f"no t quantile for {degrees} degrees of freedom")
    if degrees <= len(T_975):
        return T_975[degrees - 1]
    z = NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4 * degrees) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * degrees**2)


def known(values: Trials) -> list[float]:
    """The trials that gave the figure (a window that failed gives none)."""
    return [value for value in values if value is not None]


def logs(values: list[float]) -> list[float] | None:
    """The values' logarithms; None if one is not positive (no factor to speak of)."""
    return [math.log(value) for value in values] if all(value > 0 for value in values) else None


@dataclass(frozen=True)
class Spread:
    """One figure of one state over its trials."""

    n: int
    median: float | None
    low: float | None
    high: float | None
    interval: Interval | None


def spread(values: Trials) -> Spread:
    """
    The median, min–max and 95% interval of a figure's trials; no interval from
    a single trial, or when a trial is not positive.
    """
    values = known(values)
    if not values:
        return Spread(0, None, None, None, None)
    interval = None
    logged = logs(values)
    if len(values) > 1 and logged is not None:
        centre = fmean(logged)
        half = t_quantile(len(values) - 1) * stdev(logged) / math.sqrt(len(values))
        interval = (math.exp(centre - half), math.exp(centre + half))
    return Spread(len(values), median(values), min(values), max(values), interval)


@dataclass(frozen=True)
class Verdict:
    """One state against another: the ratio of their geometric means, its interval, in words."""

    n: tuple[int, int]
    ratio: float | None
    interval: Interval | None
    words: str


def sample_size(n: tuple[int, int]) -> str:
    return f"n={n[0]}" if n[0] == n[1] else f"n={n[0]} against {n[1]}"


def verdict(values: Trials, reference: Trials,
            words: tuple[str, str] = ("faster", "slower")) -> Verdict:
    """
    ``values`` against ``reference``: ``words[0]`` when the whole interval of
    the ratio lies above 1, ``words[1]`` when below, else no difference
    detected; no verdict unless each side has two trials or more.
    """
    mine, theirs = known(values), known(reference)
    n = (len(mine), len(theirs))
    mine_logs, their_logs = logs(mine), logs(theirs)
    if min(n) == 0 or mine_logs is None or their_logs is None:
        return Verdict(n, None, None, "no verdict: a figure missing or not positive")
    ratio = math.exp(fmean(mine_logs) - fmean(their_logs))
    if min(n) < 2:
        return Verdict(n, ratio, None, NO_VERDICT)
    squares = sum((x - fmean(mine_logs)) ** 2 for x in mine_logs) + sum(
        (x - fmean(their_logs)) ** 2 for x in their_logs)
    degrees = n[0] + n[1] - 2
    half = t_quantile(degrees) * math.sqrt(squares / degrees * (1 / n[0] + 1 / n[1]))
    interval = (ratio * math.exp(-half), ratio * math.exp(half))
    if interval[0] > 1:
        said = words[0]
    elif interval[1] < 1:
        said = words[1]
    else:
        said = f"no difference detected at {sample_size(n)}"
    return Verdict(n, ratio, interval, said)


@dataclass(frozen=True)
class Counts:
    """A counter (receiver errors, retransmissions) over the trials: counted, never averaged."""

    per_trial: list[int | None]
    total: int | None
    words: str


def counts(values: Sequence[int | None]) -> Counts:
    """
    Each trial's count, their total, and the verdict on "zero in every trial",
    as the field report words its integrity claim; a trial whose counter could
    not be read leaves the claim open.
    """
    per_trial = list(values)
    read = known(per_trial)
    unread = len(per_trial) - len(read)
    total = sum(read) if not unread else None
    counted = sum(1 for value in read if value)
    if counted:
        words = f"not zero in every trial: {counted} of {len(per_trial)} counted some"
    elif unread:
        words = f"unknown: {unread} of {len(per_trial)} trial(s) could not be read"
    else:
        words = f"zero in every trial (n={len(per_trial)})"
    return Counts(per_trial, total, words)
