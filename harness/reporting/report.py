"""
One measurement as a JSON file (everything, raw samples included) and a
Markdown summary (the figures a reader compares), side by side.

The JSON holds the state, the hosts with their inventory groups (the embedded
lab's are in ``lab``) and driver build-ids, the configuration (window sizes,
the throughput definition, the server's ``/server_info`` with credentials
redacted), every raw sample, and the link and server counters before, after and
as deltas, per window. No secret is ever read by the harness, so none can be
written.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from harness.hosts.counters import INTERFACE_COUNTERS, RETRANSMISSIONS, combined
from harness.hosts.topology import Endpoint, Topology
from harness.judging import disturbance
from harness.judging.disturbance import counted
from harness.measuring import profile, server_stats, traces
from harness.measuring.client import THROUGHPUT
from harness.measuring.profile import PROFILE
from harness.measuring.windows import DECLARED, Cells, WindowSettings, window_of
from harness.reporting import bench_serving

FORMAT = "twinbolt-measurement/1"
GIB = 1 << 30
MIB = 1 << 20
RETRANSMISSIONS_NOTE = (
    "Retransmissions: *TP-socket* counts only the TP group's connections to the peer's "
    "Thunderbolt address, socket by socket (`ss -tin`); *host-wide* is the network "
    "stack's `RetransSegs`, which also counts SSH and anything else the host sends."
)


def build(state: str, observed: dict[str, Any] | None, topology: Topology | None,
          endpoint: Endpoint, settings: WindowSettings, server_info: dict[str, Any],
          windows: list[dict[str, Any]], roofline: dict[str, Any] | None = None
          ) -> dict[str, Any]:
    """The report of one measurement of ``state``, with its single window's roofline."""
    return {
        "format": FORMAT,
        "state": state,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "observed": observed,
        "endpoint": {"url": endpoint.url, "route": endpoint.route, "model": endpoint.model,
                     "servers": list(endpoint.servers)},
        "hosts": hosts(topology, windows),
        "config": {
            "windows": settings.model_dump(mode="json"),
            "throughput": THROUGHPUT,
            "server_info": server_info,
        },
        "windows": windows,
        "roofline": roofline,
    }


def hosts(topology: Topology | None, windows: list[dict[str, Any]]) -> dict[str, Any]:
    """
    Each workstation's rank, address, inventory groups (which say whether it is
    the embedded lab's, so a reader of the figures knows whose they are), and
    driver and link as the first window found them.
    """
    if topology is None:
        return {}
    first = windows[0]["link"]["before"] if windows else {}
    settings = {entry.name: entry.settings for entry in topology.workstations}
    return {
        entry.name: {
            "rank": settings[entry.name].rank,
            "groups": list(entry.groups),
            "address": settings[entry.name].address,
            "driver_build_id": first.get(entry.name, {}).get("driver_build_id"),
            "driver_parameters": first.get(entry.name, {}).get("driver_parameters"),
            "rx_rate_gbps": first.get(entry.name, {}).get("rx_rate_gbps"),
        }
        for entry in topology.workstations
    }



def headline(report: dict[str, Any]) -> dict[str, Any]:
    """
    The figures a comparison puts side by side: each window's, as its
    declaration reads them (:mod:`harness.measuring.windows`), and the state's
    own. Link figures total every window of the measurement; "GiB per 1,000
    output tokens" divides the bytes put on the link by the completion tokens of
    the same windows, the decoding ones only: a prefill window moves its whole
    prompt's activations for a handful of output tokens, and the field's figure
    is a decode one (six requests). A window marked invalid (a cold one that
    found cached tokens) gives no figure; a disturbed one gives none, and its
    link counts, someone else's traffic among them, count nowhere
    (:mod:`harness.judging.disturbance`). Each prefill window's TTFT is keyed by
    the window's own name, cold (``long``) or warm (``long_warm``, with its hit
    rate), so one never stands for the other.
    """
    results = {window["name"]: window for window in report["windows"] if counted(window)}
    undisturbed = [window for window in report["windows"] if not window.get("disturbed")]
    totals = [window["link"]["totals"] for window in undisturbed]
    server_info = report.get("config", {}).get("server_info") or {}
    decoding = [window for window in undisturbed
                if (declared := window_of(window["name"])) is None or declared.decoding]
    tokens = sum(sample["completion_tokens"] or 0
                 for window in decoding for sample in window["samples"])
    moved = combined([window["link"]["totals"]["bytes_moved"] for window in decoding])
    return {
        "state": report["state"],
        # Each window's own figures, as its declaration reads them.
        **{figure.key: figure.read(results.get(window.read_from(figure), {}), report)
           for window in DECLARED.values() for figure in window.figures},
        "decode_log_interval": server_stats.decode_log_interval(server_info),
        "receiver_errors": combined([total["receiver_errors"] for total in totals]),
        "socket_retransmissions": combined([total.get("socket_retransmissions")
                                            for total in totals]),
        "max_socket_retransmissions": combined([total.get("max_socket_retransmissions")
                                                for total in totals], max),
        "retransmissions": combined([total["retransmissions"] for total in totals]),
        "gib_per_1k_tokens": moved / GIB / tokens * 1000 if moved is not None and tokens
        else None,
        "output_tokens": tokens,
        # The memory side, from the first server's own answer.
        "kv_cache_tokens": server_info.get("max_total_num_tokens"),
        "largest_input_tokens": server_info.get("max_req_input_len"),
    }


def accept_length_cell(value: float | None, is_cumulative: bool) -> str:
    """An accept length, marked ``*`` when cumulative (see :func:`server_stats.caveat`)."""
    return number(value, 2) + (" *" if is_cumulative else "")


def number(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "—"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def window_row(window: dict[str, Any]) -> list[str]:
    """
    A window's row: the cells its declaration makes of its summary
    (:mod:`harness.measuring.windows`), then what every window has, its accept
    length and its link's counts.
    """
    summary, totals = window["summary"], window["link"]["totals"]
    name = window["name"]
    declared = window_of(name)
    cells = declared.cells(summary, number) if declared is not None else Cells()
    dash = number(None)
    moved = totals["bytes_moved"]
    marks = [mark for key, mark in (("disturbed", "disturbed"), ("again", "again"))
             if window.get(key)]
    return [
        f"{name} ({', '.join(marks)})" if marks else name,
        str(len(window["samples"])), cells.rate or dash, cells.aggregate or dash,
        cells.ttft or dash,
        accept_length_cell(window["server"]["accept_length"], server_stats.cumulative(window)),
        cells.tokens or dash,
        number(totals["receiver_errors"]),
        f"{number(totals.get('socket_retransmissions'))} "
        f"(max {number(totals.get('max_socket_retransmissions'))})",
        number(totals["retransmissions"]),
        number(moved / MIB if moved is not None else None), number(window["seconds"]),
    ]


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def markdown(report: dict[str, Any]) -> str:
    """The summary a reader compares: application figures next to the link's, per window."""
    endpoint = report["endpoint"]
    lines = [
        f"# twinbolt measurement: {report['state']}",
        "",
        f"- measured {report['measured_at']} at {endpoint['url']} ({endpoint['route']}), "
        f"model `{endpoint['model']}`",
    ]
    if report["observed"]:
        lines.append(f"- hosts observed: {report['observed']['verdict']}")
    lines += [f"- {disturbance.quiet_line(report['windows'])}",
              f"- {report['config']['throughput']}", "", "## Windows", ""]
    lines += table(
        ["window", "requests", "output tok/s", "aggregate tok/s", "TTFT s", "accept length",
         "prompt tokens: cached", "receiver errors", "TP-socket retrans (max per socket)",
         "host-wide retrans", "MiB on link", "seconds"],
        [window_row(window) for window in report["windows"]],
    )
    lines += ["", RETRANSMISSIONS_NOTE]
    if any(server_stats.cumulative(window) for window in report["windows"]):
        interval = server_stats.decode_log_interval(
            report.get("config", {}).get("server_info") or {})
        lines += ["", server_stats.caveat(interval)]
    lines += roofline_lines(report.get("roofline"))
    lines += profile_lines(report)
    errors = [error for window in report["windows"] for error in window["errors"]]
    if errors:
        lines += ["", "Failed requests:", "", *(f"- {error}" for error in errors)]
    if invalid := [window for window in report["windows"] if window.get("invalid")]:
        lines += ["", "Invalid windows, left out of every comparison:", "",
                  *(f"- {window['name']}: {window['invalid']}" for window in invalid)]
    if disturbed := [window for window in report["windows"] if window.get("disturbed")]:
        lines += ["", "Disturbed windows, left out of every comparison (each measured again "
                  "once, at the end):", "",
                  *(f"- {window['name']}: {window['disturbed']}" for window in disturbed),
                  "", "What makes a window disturbed:", "", *disturbance.threshold_lines()]
    names = [*INTERFACE_COUNTERS, RETRANSMISSIONS]
    rows = []
    for window in report["windows"]:
        for host, delta in window["link"]["delta"].items():
            if delta["reset"]:
                rows.append([window["name"], host, "; ".join(delta["problems"]),
                             *[""] * (len(names) - 1)])
            else:
                rows.append([window["name"], host,
                             *(number(delta["counters"].get(name)) for name in names)])
    if rows:
        lines += ["", "## Link counters, per window and workstation (deltas)", ""]
        lines += table(["window", "host", *names], rows)
    if report["hosts"]:
        lines += ["", "## Workstations", ""]
        lines += table(
            ["host", "rank", "address", "driver build-id", "parameters", "rx rate Gb/s"],
            [[name, str(host["rank"]), str(host["address"]), str(host["driver_build_id"]),
              " ".join(f"{k}={v}" for k, v in sorted((host["driver_parameters"] or {}).items())),
              number(host["rx_rate_gbps"], 0)] for name, host in report["hosts"].items()],
        )
    return "\n".join(lines) + "\n"


def profile_lines(report: dict[str, Any]) -> list[str]:
    """The profile window: where each rank's time went, and NCCL's own transport lines."""
    window = next((each for each in report["windows"] if each["name"] == PROFILE), None)
    if window is None:
        return []
    rows = []
    for key, rank in window["summary"]["ranks"].items():
        if "error" in rank:
            rows.append([key, rank["error"], *[""] * 7])
            continue
        shares, allreduce, stalls = rank["shares"], rank["allreduce"], rank["stalls"]
        rows.append([key, *(percent(shares[name]) for name in ("allreduce", "compute", "idle")),
                     number(allreduce["count"]), number(allreduce["p50_ms"], 3),
                     number(allreduce["p99_ms"], 3),
                     f"{number(stalls['count'])}: {number(stalls['seconds_lost'], 3)} s",
                     f"{number(stalls['with_retransmissions'])}: "
                     f"{number(stalls['seconds_lost_with_retransmissions'], 3)} s"])
    lines = ["", "## Where a token's time goes (SGLang's profiler, every rank)", ""]
    lines += table(["trace", "all-reduce", "compute", "idle", "all-reduces", "one all-reduce "
                    "ms p50", "p99", "stalls: time lost", "of them with retransmissions"], rows)
    lines += ["", f"Shares of each rank's profiled span, first kernel to last, over one "
              f"request's decode. A stall: an all-reduce of at least "
              f"{traces.STALL_FACTOR:g}x its kernel's median; with retransmissions: one that "
              f"overlaps a {profile.SAMPLE_SECONDS * 1000:g} ms sample in which a TP socket's "
              f"retransmission count grew ({number(window['summary']['retransmissions_sampled'])}"
              " in this window).", "", "NCCL's own lines (`NCCL_DEBUG=INFO`), per workstation:",
              ""]
    for host, found in window["summary"]["nccl"].items():
        said = profile.transport(found)
        lines += [f"- {host}: {said.words()}", *(f"  - `{line}`" for line in said.lines)]
    return lines


def percent(share: float | None) -> str:
    return "—" if share is None else f"{share:.1%}"


def roofline_lines(roofline: dict[str, Any] | None) -> list[str]:
    """The single window's roofline beside its measured rate (``harness/judging/roofline.py``)."""
    if roofline is None:
        return []
    lines = ["", "## Single stream against its roofline", ""]
    bound = roofline["bound"]
    if bound is None:
        return [*lines, "No roofline: the model's size, the link's rate or the accept length "
                        "is unknown."]
    inputs = bound["inputs"]
    lines += table(
        ["", "tok/s", "step ms", "target ms", "draft ms", "link ms", "tokens per step"],
        [["roofline (bandwidth only)", number(bound["tok_s"]), number(bound["step_ms"], 2),
          number(bound["target_ms"], 2), number(bound["draft_ms"], 2),
          number(bound["link_ms"], 2), number(bound["tokens_per_step"], 2)],
         ["measured", number(roofline["measured_tok_s"]), "", "", "", "", ""]])
    fraction = roofline["fraction"]
    read = [f"{number(inputs['weight_bytes'] / GIB, 2)} GiB of weights over TP "
            f"{inputs['tp_size']} at {number(inputs['gpu_bandwidth_gb_s'], 0)} GB/s",
            f"{number(inputs['context_positions'])} positions of context"]
    if inputs["draft_passes"]:
        read.append(f"{inputs['verified_positions']} positions verified per step after "
                    f"{inputs['draft_passes']} draft passes")
    if inputs["tp_size"] > 1:
        read.append(f"the link at {number(inputs['link_gbps'], 0)} Gb/s")
    lines += ["", f"Measured: {number(fraction * 100 if fraction else None)}% of the roofline. "
              f"Inputs: {', '.join(read)}. The roofline counts bandwidth only; the measured "
              "rate also pays the scheduler and the prefill, and in TP each all-reduce's "
              "round trip and any retransmission."]
    return lines


@contextmanager
def replaced(path: Path) -> Iterator[Path]:
    """
    A temporary file beside ``path`` to write, renamed over ``path`` once the
    writing is done (and fsynced): a reader, a comparison or a campaign resumed
    after a crash sees the old file or the whole new one, never half of one.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.",
                                        suffix=path.suffix)
    os.close(descriptor)
    temporary = Path(name)
    try:
        yield temporary
        with temporary.open("rb") as written:
            os.fsync(written.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> Path:
    """``path`` holds ``text``, written as :func:`replaced` writes."""
    with replaced(path) as temporary:
        temporary.write_text(text)
    return path


def write(report: dict[str, Any], directory: Path) -> Path:
    """
    Write ``<state>-<time>.json``, its ``.md``, and its windows as SGLang's
    ``bench_serving`` lines (``.jsonl``); returns the JSON's path.
    """
    stamp = report["measured_at"].replace(":", "").replace("+0000", "Z")
    path = directory / f"{report['state']}-{stamp}.json"
    write_text(path, json.dumps(report, indent=1) + "\n")
    write_text(path.with_suffix(".md"), markdown(report))
    write_text(path.with_suffix(".jsonl"), bench_serving.lines(report))
    return path


def load(path: Path) -> dict[str, Any]:
    report = json.loads(path.read_text())
    if report.get("format") != FORMAT:
        raise ValueError(f"{path} is not a twinbolt measurement ({FORMAT})")
    return report
