"""
Measurements side by side: a Markdown table of every state over its trials,
with the ratios' intervals and verdicts, and a PNG chart.

A state measured in several trials (a campaign's ``--trials``, or several
reports of it given to ``experiment.py compare``) is one row: each figure's
median and 95% interval, each count's total and its trials
(:mod:`harness.judging.intervals`). Each ratio is taken against a reference row: by
default the row above, so that in a campaign (one layer changed per step) every
ratio is the effect of the one layer the "changed" column names; or against a
named baseline state. A ratio is never printed without its interval and its
verdict; from one trial there is none, and the table says so.

Each window's columns are those its declaration gives (:mod:`harness.measuring.windows`).
Cold and warm prefills have a table of their own, a column for each: a warm
window's figure is keyed by its own name, so it never lands in a cold column.

Below them, the stock driver and the candidate are set beside the field report's
own figures, each of them one observation, so a reader sees which of its claims
the measurements reproduce, and which it never made.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.hosts.counters import combined
from harness.judging import field_report, intervals
from harness.judging.field_report import NOT_REPORTED, Reported
from harness.measuring import server_stats, sweep
from harness.measuring.profile import PROFILE
from harness.measuring.windows import DECLARED, LONGER, RATE, Figure, Label
from harness.reporting.report import headline, number, percent, replaced, table
from operations.states import STATES, layers_changed

# (headline key, column title, digits, the verdict's words, or None for no ratio)
Column = tuple[str, str, int, tuple[str, str] | None]
# The state's own figures, after its windows': the accept length (the single
# window's), and the link's bytes per output token of the decoding windows.
STATE_FIGURES: tuple[Column, ...] = (
    ("accept_length", "accept length", 2, None),
    ("gib_per_1k_tokens", "GiB / 1k output tokens", 3, ("more", "less")),
)
# The sweep's figures at each level (harness.measuring.sweep), and its counts.
SWEEP_FIGURES = (
    ("aggregate_tok_s", "aggregate tok/s", 1, RATE),
    ("per_request_tok_s", "per-request tok/s p50", 1, RATE),
    ("ttft_p50_s", "TTFT s p50", 3, LONGER),
    ("ttft_p99_s", "TTFT s p99", 3, None),
    ("tpot_p50_ms", "TPOT ms p50", 2, LONGER),
    ("tpot_p99_ms", "TPOT ms p99", 2, None),
    ("accept_length", "accept length", 2, None),
)
SWEEP_COUNTS = (("receiver_errors", "receiver errors"),
                ("socket_retransmissions", "TP-socket retransmissions"))
NOT_MEASURED_AT_LEVEL = (dict.fromkeys([key for key, *_ in (*SWEEP_FIGURES, *SWEEP_COUNTS)])
                         | {"accept_length_cumulative": False})
# TP against the replicas, level by level: which architecture serves more, and
# which serves each request faster.
ARCHITECTURES = (
    ("aggregate_tok_s", "aggregate tok/s", ("serves more", "serves less")),
    ("per_request_tok_s", "per-request tok/s p50", ("faster per request", "slower per request")),
)
SWEEP_CHARTED = ("aggregate_tok_s", "per_request_tok_s")
# The profile window's figures per rank (harness.measuring.profile): (key, title, as a share?).
PROFILED = (
    ("allreduce_share", "all-reduce", True),
    ("compute_share", "compute", True),
    ("idle_share", "idle", True),
    ("allreduce_p50_ms", "one all-reduce ms p50", False),
    ("allreduce_p99_ms", "p99", False),
    ("stall_seconds", "stalls: s lost", False),
    ("stall_seconds_with_retransmissions", "of them with retransmissions", False),
)
# The memory side, from the servers' own answers: (headline key, title).
MEMORY = {"kv_cache_tokens": "KV cache tokens", "largest_input_tokens": "longest input admitted"}
# Counts: totalled over the trials, each trial's beside it; never averaged or divided.
COUNTS = (
    ("receiver_errors", "receiver errors"),
    ("socket_retransmissions", "TP-socket retransmissions"),
    ("retransmissions", "host-wide retransmissions"),
)
MAX_PER_SOCKET = ("max_socket_retransmissions", "max per socket")
# Charted after the windows' own charted figures.
STATE_CHARTED = ("accept_length", "receiver_errors", "socket_retransmissions",
                 "gib_per_1k_tokens")

# The field report compares these two states: the stock driver, then the
# candidate with tx_e2e=1, both with TP2 and NEXTN.
CONTROL, CANDIDATE = "tp2_stock", "tp2_e2e"

# Every model-workload figure the field report gives for (CONTROL, CANDIDATE), by
# headline key (harness/judging/field_report.py, listed in docs/field-report.md); None
# where it gives none, so a comparison says "not reported" only there.
FIELD_REPORT: dict[str, tuple[Reported | None, Reported | None]] = {
    "single_tok_s": (field_report.STOCK_SINGLE_TOK_S, field_report.CANDIDATE_SINGLE_TOK_S),
    "aggregate_tok_s": (field_report.STOCK_AGGREGATE_TOK_S,
                        field_report.CANDIDATE_AGGREGATE_TOK_S),
    "accept_length": (field_report.STOCK_ACCEPT_LENGTH, field_report.CANDIDATE_ACCEPT_LENGTH),
    "receiver_errors": (field_report.STOCK_RECEIVER_ERRORS,
                        field_report.CANDIDATE_RECEIVER_ERRORS),
    # Per host, asymmetric; the sum is what this table's host-wide column adds up.
    "retransmissions": (field_report.STOCK_RETRANSMISSIONS,
                        field_report.CANDIDATE_RETRANSMISSIONS),
    # The candidate's window gives no token count.
    "gib_per_1k_tokens": (field_report.STOCK_GIB_PER_1K_TOKENS, None),
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
    f"× : {CANDIDATE} / {CONTROL}, the ratio of their geometric means, its 95% interval and the "
    f"verdict. *Field*: the field report's figures ({field_report.PAGE}), one hardware pair, "
    "each of them one observation: controlled observations rather than a benchmark, with no "
    "interval; 'not reported' only where it gives none. *Receiver errors*: `rx_errors` of "
    "the link on both workstations, over every window, totalled over the trials with each "
    "trial's count in brackets. *Host-wide retransmissions*: `RetransSegs` of both "
    "workstations. *Max retransmissions of one TP socket*: the most any one of the TP group's "
    "sockets retransmitted in one window of any trial."
)


def columns(figures: Iterable[Figure]) -> tuple[Column, ...]:
    """The comparison's columns of window figures: those with a title."""
    return tuple((figure.key, figure.title, figure.digits, figure.words)
                 for figure in figures if figure.title)


def table_figures() -> tuple[Column, ...]:
    """The comparison table's figures: each window's, in order, then the state's."""
    return (*columns(figure for window in DECLARED.values() if not window.warm
                     for figure in window.figures), *STATE_FIGURES)


def prefill_figures() -> tuple[Column, ...]:
    """
    The figures of the windows measured cold and warm, in a table of their own:
    a warm window's figure is keyed by its own name, so it never lands in a cold column.
    """
    return columns(figure for window in DECLARED.values() if window.warm
                   for figure in window.figures)


def charted_figures() -> list[str]:
    """The figures of the comparison's chart: the windows' charted ones, then the state's."""
    return [*(figure.key for window in DECLARED.values() for figure in window.figures
              if figure.charted), *STATE_CHARTED]


def formats() -> dict[str, tuple[str, int]]:
    """Every figure's and count's title and digits (a count's are none), by headline key."""
    return ({key: (title, digits) for key, title, digits, _ in
             (*table_figures(), *prefill_figures())}
            | {key: (title, 0) for key, title in (*COUNTS, MAX_PER_SOCKET)})


def ratio(value: float | None, reference: float | None, digits: int) -> str:
    """
    ``value / reference``, for the field report's single observations; none to a
    reference shown as zero (a ratio to nothing means nothing).
    """
    if value is None or reference is None or round(reference, digits) == 0:
        return "—"
    return f"{value / reference:.2f}×"


def figure(value: float | None, digits: int) -> str:
    """A cell: a counter (no digits) as a whole number, anything else to ``digits``."""
    if value is None:
        return number(None)
    return number(int(value) if digits == 0 else float(value), digits)


def changed(previous: str, current: str) -> str:
    """The layers between two states, when both are declared ones."""
    if previous not in STATES or current not in STATES:
        return "?"
    return ", ".join(layers_changed(STATES[previous], STATES[current])) or "none"


def by_state(reports: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each state's headlines, one per trial, the states in the order first measured."""
    states: dict[str, list[dict[str, Any]]] = {}
    for report in reports:
        states.setdefault(report["state"], []).append(headline(report))
    return states


def trials(rows: list[dict[str, Any]], key: str) -> list[Any]:
    return [row[key] for row in rows]


def spread_cell(values: list[float | None], digits: int) -> str:
    """A figure over its trials: median [95% interval]; from one trial, its value, so marked."""
    shown = intervals.spread(values)
    if shown.n == 0:
        return "—"
    if shown.interval is None:
        return f"{figure(shown.median, digits)} (n={shown.n})"
    low, high = shown.interval
    return f"{figure(shown.median, digits)} [{figure(low, digits)}–{figure(high, digits)}]"


def verdict_cell(said: intervals.Verdict, asked: tuple[int, int]) -> str:
    """
    A ratio only with its interval and the verdict; without an interval, why
    there is none. A verdict that rests on fewer trials than ``asked`` (a
    window left out as disturbed or invalid) says on how many.
    """
    if min(said.n) == 0:
        return "—"
    (here, there), (asked_here, asked_there) = said.n, asked
    fewer = [*([f"{here} of {asked_here} trials here"] if here < asked_here else []),
             *([f"{there} of {asked_there} in the reference"] if there < asked_there else [])]
    rests = f" (rests on {', '.join(fewer)})" if fewer else ""
    if said.interval is None:
        return said.words + rests
    low, high = said.interval
    return f"{said.ratio:.2f}× [{low:.2f}–{high:.2f}] {said.words}{rests}"


def count_cell(values: list[int | None]) -> str:
    """A count over the trials: the total, and each trial's."""
    counted = intervals.counts(values)
    return f"{number(counted.total)} ({', '.join(number(value) for value in values)})"


def accept_cell(rows: list[dict[str, Any]]) -> str:
    """The accept length over the trials, marked ``*`` when a trial's is cumulative."""
    cumulative = any(row["accept_length_cumulative"] for row in rows)
    return spread_cell(trials(rows, "accept_length"), 2) + (" *" if cumulative else "")


def labels() -> list[Label]:
    """The labels windows give their results, each a column at the end of the comparison's table."""
    return [window.label for window in DECLARED.values() if window.label is not None]


def label_cell(rows: list[dict[str, Any]], label: Label) -> str:
    """The labels of a state's trials, each once, and the figure they qualify over the trials."""
    said = [row[label.key] for row in rows if row[label.key]]
    if not said:
        return "—"
    return (f"{', '.join(dict.fromkeys(said))} "
            f"({spread_cell(trials(rows, label.beside), label.digits)} {label.unit})")


def figure_titles(figures: tuple[Column, ...]) -> list[str]:
    """Each figure's column, and its ratio's beside it where it has one."""
    header = []
    for _, title, _, words in figures:
        header += [title, "×"] if words else [title]
    return header


def figure_cells(figures: tuple[Column, ...], rows: list[dict[str, Any]],
                 reference: list[dict[str, Any]] | None) -> list[str]:
    """A state's figures over its trials, each ratio to ``reference`` with its verdict."""
    cells = []
    for key, _, digits, words in figures:
        values = trials(rows, key)
        cells.append(accept_cell(rows) if key == "accept_length"
                     else spread_cell(values, digits))
        if words:
            cells.append(verdict_cell(intervals.verdict(values, trials(reference, key), words),
                                      (len(rows), len(reference)))
                         if reference is not None and reference is not rows else "—")
    return cells


def comparison_header() -> list[str]:
    """The comparison table's columns (the README quotes its header line)."""
    return ["state", "changed", "trials", *figure_titles(table_figures()),
            *(title for _, title in COUNTS), MAX_PER_SOCKET[1],
            *(label.title for label in labels())]


def comparison(reports: list[dict[str, Any]], baseline: str | None = None) -> str:
    """
    The Markdown table, one row per state over its trials; ratios against the
    row above, or against ``baseline``'s row. Then each state's figures over its
    trials, each count's verdict, and the field report beside the control and
    the candidate.
    """
    states = by_state(reports)
    names = list(states)
    if baseline is not None and baseline not in states:
        raise ValueError(f"no report of the baseline state {baseline!r} (have {names})")
    body, prefills = [], []
    references = {}
    for index, (state, rows) in enumerate(states.items()):
        reference = (states[baseline] if baseline
                     else states[names[index - 1]] if index else None)
        references[state] = reference if reference is not rows else None
        first = [state, changed(names[index - 1], state) if index else "—", str(len(rows))]
        body.append([*first, *figure_cells(table_figures(), rows, reference),
                     *(count_cell(trials(rows, key)) for key, _ in COUNTS),
                     figure(combined(trials(rows, MAX_PER_SOCKET[0]), max), 0),
                     *(label_cell(rows, label) for label in labels())])
        prefills.append([*first, *figure_cells(prefill_figures(), rows, reference)])
    against = f"the {baseline} row" if baseline else "the row above"
    notes = [f"Figures: the median of the trials [its 95% interval]; × : ratio to {against}, "
             f"[its 95% interval] and the verdict. Method: {intervals.METHOD}. Counts: the "
             "total over the trials (each trial's)."]
    lagging = [row for rows in states.values() for row in rows if row["accept_length_cumulative"]]
    if lagging:
        notes.append(server_stats.caveat(max(row["decode_log_interval"] for row in lagging)))
    return "\n".join([*table(comparison_header(), body), "", "\n\n".join(notes), "",
                      *cold_and_warm(states, prefills),
                      *concurrency_sweep(states, references, against),
                      *against_replicas(states), *memory_side(states), *token_time(states),
                      *each_state(states),
                      "",
                      *integrity(states), "", *side_by_side(reports)]) + "\n"


def cold_and_warm(states: dict[str, list[dict[str, Any]]], body: list[list[str]]) -> list[str]:
    """
    The prefill windows' table, when any state has one: cold and warm in
    columns of their own, each TTFT with its ratio and verdict (a longer TTFT
    is slower), each warm window's hit rate.
    """
    if not any(row[key] is not None for rows in states.values() for row in rows
               for key, *_ in prefill_figures()):
        return []
    return ["### Cold and warm prefills, kept apart", "",
            *table(["state", "changed", "trials", *figure_titles(prefill_figures())], body), "",
            "Cold: measured from an empty cache (`/flush_cache`), and 0 cached tokens reported. "
            "Warm: the cache primed once, unmeasured, then measured; hit rate: the share of "
            "the measured prompt the server found cached. A window that broke its "
            "temperature is left out. × as above.", ""]


def levels_of(states: dict[str, list[dict[str, Any]]]) -> list[int]:
    """The sweep's levels any trial of any state measured, lowest first."""
    return sorted({level for rows in states.values() for row in rows
                   for level in row.get(sweep.NAME, {})})


def at_level(rows: list[dict[str, Any]], level: int) -> list[dict[str, Any]]:
    """Each trial's figures at one level of the sweep; a trial without the level, none."""
    return [row.get(sweep.NAME, {}).get(level) or NOT_MEASURED_AT_LEVEL for row in rows]


def concurrency_sweep(states: dict[str, list[dict[str, Any]]],
                      references: dict[str, list[dict[str, Any]] | None],
                      against: str) -> list[str]:
    """
    The sweep's table, when any state has one: a row per state and level, its
    figures over the trials, each ratio to the reference state at the same level.
    """
    levels = levels_of(states)
    if not levels:
        return []
    body = []
    for state, rows in states.items():
        reference = references[state]
        for level in levels:
            mine = at_level(rows, level)
            theirs = at_level(reference, level) if reference is not None else None
            body.append([state, str(level), str(len(rows)),
                         *figure_cells(SWEEP_FIGURES, mine, theirs),
                         *(count_cell(trials(mine, key)) for key, _ in SWEEP_COUNTS)])
    return ["### Concurrency sweep", "",
            *table(["state", "requests at once", "trials", *figure_titles(SWEEP_FIGURES),
                    *(title for _, title in SWEEP_COUNTS)], body), "",
            "Each level is a window of its own: that many requests sent at once, each of "
            "the same output length, with the link's counters of that level alone. "
            "Aggregate: the level's completion tokens over its span; per request: the "
            "median of the requests' own tok/s; TPOT: (latency - TTFT) / (output tokens - 1), "
            f"as SGLang's bench_serving has it. × : ratio to {against} at the same level, "
            "[its 95% interval] and the verdict.", ""]


def against_replicas(states: dict[str, list[dict[str, Any]]]) -> list[str]:
    """
    Each TP state against the replicas (production, where measured) at every
    level of the sweep: which architecture serves more, which serves each
    request faster, and the crossover, with the levels it lies between.
    """
    base, grouped = replicas_and_groups(states)
    levels = levels_of(states)
    if base is None or not levels:
        return []
    body, said = [], []
    for state in grouped:
        verdicts: dict[str, list[tuple[int, str]]] = {key: [] for key, *_ in ARCHITECTURES}
        for level in levels:
            cells = []
            here, there = at_level(states[state], level), at_level(states[base], level)
            for key, _, words in ARCHITECTURES:
                found = intervals.verdict(trials(here, key), trials(there, key), words)
                verdicts[key].append((level, found.words))
                cells.append(verdict_cell(found, (len(here), len(there))))
            body.append([state, changed(base, state), str(level), *cells])
        for key, title, words in ARCHITECTURES:
            turn = sweep.crossover(verdicts[key], words)
            said.append(f"- {state} against {base}, {title}: "
                        + (turn.words() if turn else sweep.no_crossover(verdicts[key], words)))
    return [f"### TP2 against two replicas ({base}), level by level", "",
            *table(["state", f"changed from {base}", "requests at once",
                    *(f"{title}: state / {base}" for _, title, _ in ARCHITECTURES)], body), "",
            *said, "",
            "The same windows through the route users take: the router in front of the "
            "replicas, TP rank 0 for a TP state. A crossover lies between the last level "
            "that decided one way and the first that decided the other; a level with no "
            "difference detected decides nothing. A state that differs from the replicas in "
            "more than the serving layer (the `changed` column) gives each verdict more than one "
            "cause: only a state one layer away answers for the architecture alone.", ""]


def replicas_and_groups(states: dict[str, list[dict[str, Any]]]) -> tuple[str | None, list[str]]:
    """
    The replicas' state a TP state is set against (production, where measured)
    and the TP states; (None, []) unless both were measured.
    """
    replicas = [state for state in states
                if state in STATES and not STATES[state].tensor_parallel]
    grouped = [state for state in states if state in STATES and STATES[state].tensor_parallel]
    if not (replicas and grouped):
        return None, []
    return ("production" if "production" in replicas else replicas[0]), grouped


def memory_side(states: dict[str, list[dict[str, Any]]]) -> list[str]:
    """
    The field's reason to try TP2: how much context each architecture holds,
    from the servers' own ``/server_info`` (``max_total_num_tokens``, the KV
    cache pool, and ``max_req_input_len``, the longest input admitted).
    """
    base, grouped = replicas_and_groups(states)
    if base is None:
        return []
    references = {key: combined(trials(states[base], key), max) for key in MEMORY}
    body = []
    for state in (base, *grouped):
        cells = [state]
        for key in MEMORY:
            value = combined(trials(states[state], key), max)
            cells += [figure(value, 0),
                      ratio(value, references[key], 0) if state != base else "—"]
        body.append(cells)
    return ["### The memory side: the context each architecture holds", "",
            *table(["state", *(f"{title}{suffix}" for title in MEMORY.values()
                               for suffix in ("", f" × {base}"))], body), "",
            "From each state's first server's own `/server_info`: `max_total_num_tokens`, the "
            "KV cache pool one server holds, and `max_req_input_len`, the longest input it "
            "admits (under the context length and the pool). A replica holds the whole model "
            "and every KV head on one GPU; a TP rank half of each.", ""]


def token_time(states: dict[str, list[dict[str, Any]]]) -> list[str]:
    """
    Where a token's time goes, per state and server (its workstation and TP
    rank): the median over the
    trials of each profile figure (its min–max beside it), and what NCCL said
    of its transport in the last trial.
    """
    body = []
    for state, rows in states.items():
        profiled = [row[PROFILE] for row in rows if row.get(PROFILE, {}).get("ranks")]
        for rank in sorted({rank for each in profiled for rank in each["ranks"]}):
            per_trial = [each["ranks"][rank] for each in profiled if rank in each["ranks"]]
            cells = [state, rank, str(len(per_trial))]
            for key, _, share in PROFILED:
                shown = intervals.spread([each[key] for each in per_trial])
                cells.append(f"{percent_or_figure(shown.median, share)} "
                             f"({percent_or_figure(shown.low, share)}–"
                             f"{percent_or_figure(shown.high, share)})")
            host = per_trial[-1]["host"]
            cells.append(f"{host}: {profiled[-1]['transport'].get(host, 'not read')}")
            body.append(cells)
    if not body:
        return []
    return ["### Where a token's time goes: SGLang's profiler on every rank", "",
            *table(["state", "server", "trials", *(title for _, title, _ in PROFILED),
                    "NCCL's transport, in its own words"], body), "",
            "Each rank's profiled span (one request's decode, first kernel to last) split into "
            "NCCL's all-reduce kernels, every other kernel, and no kernel at all: the median "
            "over the trials (min–max). A stall is an all-reduce of five times its kernel's "
            "median or more; its time lost is the excess, and it counts as with "
            "retransmissions when it overlaps a sample in which a TP socket retransmitted.", ""]


def percent_or_figure(value: float | None, share: bool) -> str:
    return percent(value) if share else figure(value, 3)


def each_state(states: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Per state and figure: the median, the min–max, the 95% interval and every trial."""
    body = []
    for state, rows in states.items():
        for key, title, digits, _ in (*table_figures(), *prefill_figures()):
            values = trials(rows, key)
            shown = intervals.spread(values)
            if shown.n == 0:
                continue
            interval = ("none from one trial" if shown.interval is None else
                        f"{figure(shown.interval[0], digits)}–{figure(shown.interval[1], digits)}")
            body.append([state, title, str(shown.n), figure(shown.median, digits),
                         f"{figure(shown.low, digits)}–{figure(shown.high, digits)}", interval,
                         ", ".join(figure(value, digits) for value in values)])
    return ["### Each state over its trials", "",
            *table(["state", "figure", "n", "median", "min–max", "95% interval", "trials"], body)]


def integrity(states: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Each count per trial and in total, and whether it was zero in every trial."""
    body = []
    for state, rows in states.items():
        for key, title in COUNTS:
            counted = intervals.counts(trials(rows, key))
            body.append([state, title, ", ".join(number(value) for value in counted.per_trial),
                         number(counted.total), counted.words])
    return ["### Counts: zero in every trial?", "",
            *table(["state", "count", "per trial", "total", "verdict"], body)]


def side_by_side(reports: list[dict[str, Any]]) -> list[str]:
    """
    The control and the candidate over their trials next to the field report's
    single observations, measure by measure. Without a report of both, no ratio
    can be set beside the field report's: the section says which is missing
    rather than comparing something else.
    """
    lines = ["### The field report side by side", ""]
    states = by_state(reports)
    missing = [state for state in (CONTROL, CANDIDATE) if state not in states]
    if missing:
        return [*lines, f"No report of {' or '.join(missing)} (have {', '.join(states)}): the "
                        f"field report compares {CONTROL} with {CANDIDATE}."]
    stock, e2e = states[CONTROL], states[CANDIDATE]
    words = {key: words for key, _, _, words in table_figures()}
    digits_of = {key: digits for key, (_, digits) in formats().items()}
    body = []
    for key, title in SIDE_BY_SIDE:
        digits = digits_of[key]
        field_stock, field_e2e = FIELD_REPORT.get(key, (None, None))
        field_ratio = (ratio(field_e2e.value, field_stock.value, digits)
                       if field_stock and field_e2e else "—")
        if key in dict(COUNTS):
            ours = [count_cell(trials(stock, key)), count_cell(trials(e2e, key)), "—"]
        elif key == MAX_PER_SOCKET[0]:
            ours = [figure(combined(trials(rows, key), max), 0) for rows in (stock, e2e)] + ["—"]
        else:
            ours = [spread_cell(trials(stock, key), digits), spread_cell(trials(e2e, key), digits),
                    verdict_cell(intervals.verdict(trials(e2e, key), trials(stock, key),
                                                   words[key] or ("higher", "lower")),
                                 (len(e2e), len(stock)))]
        body.append([title, *ours,
                     *(field.text if field else NOT_REPORTED for field in (field_stock, field_e2e)),
                     field_ratio])
    header = ["measure", f"{CONTROL} (n={len(stock)})", f"{CANDIDATE} (n={len(e2e)})", "×",
              f"field {CONTROL} (one observation)", f"field {CANDIDATE} (one observation)",
              "field × (one observation each)"]
    return [*lines, *table(header, body), "", SIDE_BY_SIDE_NOTE]


def axis_top(values: list[float]) -> float | None:
    """
    The top of an axis from zero: matplotlib's own unless every value is zero,
    when it would centre the zeros on a +-0.04 axis; then 1, so zero shows as zero.
    """
    return None if any(values) else 1.0


def draw_intervals(axis: Any, spans: list[intervals.Interval | None]) -> None:
    """
    Each bar's 95% interval as a capped line between its own bounds. The bar is
    a median, the interval a geometric mean's: the median may lie outside it, and
    trials that are all equal give an interval a rounding away from their median
    (exp(log(5.0)) < 5.0), neither of which an error bar, drawn from its bar's
    top, can show.
    """
    for place, span in enumerate(spans):
        if span is not None:
            axis.vlines(place, *span, color="black", linewidth=1)
            axis.hlines(span, place - 0.1, place + 0.1, color="black", linewidth=1)


def draw_sweep(axis: Any, states: dict[str, list[dict[str, Any]]], key: str) -> None:
    """
    One figure of the sweep against the level: a curve per state through its
    medians, each level's 95% interval as a line, the levels on a log axis.
    """
    levels = levels_of(states)
    for state, rows in states.items():
        shown = [intervals.spread(trials(at_level(rows, level), key)) for level in levels]
        points = [(level, spread) for level, spread in zip(levels, shown, strict=True)
                  if spread.median is not None]
        if not points:
            continue
        line, = axis.plot([level for level, _ in points], [spread.median for _, spread in points],
                          marker="o", label=f"{state} (n={len(rows)})")
        for level, spread in points:
            if spread.interval is not None:
                axis.vlines(level, *spread.interval, color=line.get_color(), linewidth=1)
    axis.set_xscale("log", base=2)
    axis.set_xticks(levels, [str(level) for level in levels])
    axis.set_ylim(bottom=0)
    axis.set_xlabel("requests at once")
    axis.set_title(f"sweep: {dict((k, t) for k, t, *_ in SWEEP_FIGURES)[key]}")
    axis.legend(fontsize=8)


def chart(reports: list[dict[str, Any]], path: Path) -> Path:
    """
    A bar chart per figure, one bar per state: a figure's median with its 95%
    interval as the error bar, a count's total; every axis from zero, so that
    counts of zero show as zero. The prefill windows' TTFTs, cold and warm in
    panels of their own, and the sweep's curves, when any report has them.
    """
    import matplotlib

    # No display: the harness runs over SSH and in CI.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    states = by_state(reports)
    labels = [f"{state} (n={len(rows)})" for state, rows in states.items()]
    prefills = [key for key, _, _, words in prefill_figures() if words and any(
        row[key] is not None for rows in states.values() for row in rows)]
    charted = [*charted_figures(), *prefills]
    titles = formats()
    curves = SWEEP_CHARTED if levels_of(states) else ()
    panels = len(charted) + len(curves)
    lines = -(-panels // 3)
    drawn, axes = plt.subplots(lines, 3, figsize=(15, 4 * lines), constrained_layout=True)
    for axis in axes.flat[panels:]:
        axis.set_axis_off()
    for axis, key in zip(axes.flat[len(charted):], curves, strict=False):
        draw_sweep(axis, states, key)
    for axis, key in zip(axes.flat, charted, strict=False):
        heights, spans, texts = [], [], []
        for rows in states.values():
            values = trials(rows, key)
            if key in dict(COUNTS):
                counted = intervals.counts(values)
                height, interval, text = counted.total or 0, None, number(counted.total)
            else:
                shown = intervals.spread(values)
                height, interval = shown.median or 0, shown.interval
                text = spread_cell(values, titles[key][1])
            heights.append(height)
            spans.append(interval)
            texts.append(text)
        bars = axis.bar(range(len(heights)), heights, color="tab:blue")
        draw_intervals(axis, spans)
        axis.bar_label(bars, labels=texts, fontsize=8)
        axis.set_ylim(bottom=0, top=axis_top(heights))
        axis.set_title(titles[key][0])
        axis.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
    drawn.suptitle("twinbolt: states over their trials, medians with 95% intervals")
    with replaced(path) as temporary:
        drawn.savefig(temporary, dpi=100, format="png")
    plt.close(drawn)
    return path
