"""
What a campaign does not prove, said next to what it measured.

A ratio beside the field report's invites the reading "the candidate driver is
confirmed". The embedded lab simulates the GPUs, the SGLang server and the
stock driver's corruption, and every window is short: each bullet names one
reading the figures do not support. Where the reports say where they ran (their
workstations' inventory groups), the bullets say it; where they do not, the
caveats are stated for either case, claiming neither.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from harness.judging import field_report
from harness.reporting import linktest_report
from harness.reporting.compare import CANDIDATE, CONTROL

# inventory.py puts the embedded lab's hosts in this group; a site's never are.
LAB_GROUP = "lab"

WHERE = {
    "lab": [
        "These reports ran on the embedded lab (every workstation is in the inventory's "
        f"`{LAB_GROUP}` group): its GPUs and SGLang servers are simulated, so every tok/s here "
        "is the simulator's, not a GPU's.",
        f"A {CANDIDATE} / {CONTROL} ratio here says the harness sees the difference the lab "
        "builds in between the two drivers, not that the candidate driver helps real hardware.",
        "The lab's link never corrupts a frame: its losses are a simulated receive ring "
        "overrunning (thunderbolt_net's 256 frames of 4 KiB, drained at 16.384 Gbit/s), not "
        "this hardware's receive path. Fewer retransmissions and receiver errors with the "
        "candidate show that the harness counts them and that credits stop an overrun, not "
        "that the driver is right.",
        "The lab's simulated GPU takes exactly the roofline's compute time, so a measured rate's "
        "share of its roofline here is what the lab's real link and the simulator cost, not what "
        "a GPU's kernels would.",
    ],
    "site": [
        f"These reports ran on a site's workstations (none is in the `{LAB_GROUP}` group): the "
        "figures are this pair's, with its cable, kernel and firmware; another pair may differ.",
        "Retransmissions and receiver errors count only what TCP and the interface noticed: "
        "low counts do not show that the candidate driver delivers every frame intact.",
    ],
    None: [
        "These reports do not record where they ran. If on the embedded lab, its GPUs and "
        "SGLang servers are simulated, so tok/s are the simulator's, not a GPU's; a ratio says "
        "the harness sees the difference, not that the candidate driver helps real hardware; "
        "and its losses there are a simulated receive ring overrunning, so fewer "
        "retransmissions with the candidate do not validate the driver.",
    ],
}
ONCE = ("A state was measured in one trial only, and its single-stream window is one request: "
        "no run-to-run spread is known, so no ratio to it gets a verdict.")
REPEATED = ("Each state was measured in {n} trials or more, in one campaign on one machine: the "
            "intervals hold the spread between those trials, not between machines, days or "
            "cables, and take the trials' logarithms as normal; 'no difference detected at "
            "n={n}' is not 'no difference'.")


def ran_on(reports: list[dict[str, Any]]) -> str | None:
    """
    ``"lab"`` when every workstation of every report is in the lab's group,
    ``"site"`` when none is; ``None`` when a report does not say (it predates
    the record, or was built without an inventory) or the reports disagree.
    """
    groups = [host.get("groups") for report in reports for host in report["hosts"].values()]
    if not groups or None in groups:
        return None
    if all(LAB_GROUP in each for each in groups):
        return "lab"
    if not any(LAB_GROUP in each for each in groups):
        return "site"
    return None


def window_bound(reports: list[dict[str, Any]]) -> str:
    """
    A counter read over a short window bounds a rare fault's rate; it does not
    measure it. With the candidate's windows at hand, say how short they were.
    """
    claim = "A short window bounds a rare fault's rate; it does not measure it"
    candidates = [report for report in reports if report["state"] == CANDIDATE]
    if not candidates:
        return f"{claim}: a fault rarer than the windows are long may not have come at all."
    spent = sum(window["seconds"] for report in candidates for window in report["windows"])
    seconds = f"{spent:.0f} s"
    return (f"{claim}: {CANDIDATE}'s windows lasted {seconds} in all. A fault rarer than that "
            f"may not have come at all; seeing none puts its rate below about 3 per {seconds} "
            "(95%), not at zero.")


def link_latency(links: list[dict[str, Any]]) -> str:
    """
    The lab's link answers an idle probe far sooner than a real one: say by how
    much (its linktests' probes, where the campaign ran any) and what that
    means for decode, whose every step waits on the TP group's all-reduces.
    """
    field = field_report.CANDIDATE_PROBE_MEAN_MS
    measured = [headline["probe_mean_ms"] for headline in map(linktest_report.headline, links)
                if headline["probe_mean_ms"] is not None]
    seen = (f"about {min(measured):.3f} to {max(measured):.3f} ms in this campaign's "
            "linktests" if measured else "a few hundredths of a ms (no linktest ran here)")
    return (f"The lab's link answers an idle probe in {seen}, a real Thunderbolt link in "
            f"{field.text} ms (docs/field-report.md): this kernel has no qdisc that can hold "
            "a frame until a poll, and two cores leave none for a cable in user space. Each "
            "decode step here waits on two all-reduces per layer over that faster link, so "
            "the lab's decode figures, and a TP state's single stream most, are not "
            "comparable to a GPU pair's.")


def does_not_prove(reports: list[dict[str, Any]],
                   links: list[dict[str, Any]] | None = None) -> list[str]:
    """
    The bullets of a campaign report's "What this does not prove", from its
    reports and its linktests (``links``).
    """
    latency = [link_latency(links or [])] if ran_on(reports) == "lab" else []
    return [*WHERE[ran_on(reports)], *latency, window_bound(reports), repeated(reports)]


def repeated(reports: list[dict[str, Any]]) -> str:
    """What the trials' number leaves open: everything, from one; the spread beyond them, else."""
    fewest = min(Counter(report["state"] for report in reports).values())
    return ONCE if fewest == 1 else REPEATED.format(n=fewest)
