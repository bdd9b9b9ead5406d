"""
The experiment, from the operator's chair:

    python experiment.py status                  # which declared state the hosts are in
    python experiment.py diagnose [--json]       # every rung from the route to the cable
    python experiment.py matrix [--ledger PATH]  # the compatibility ledger as a table
    python experiment.py measure [--window NAME ...] [--out DIR]
    python experiment.py campaign [--states A,B,...] [--trials N] [--no-baseline] [--no-transport]
                                  [--out DIR]
    python experiment.py soak --minutes N [--interval S] [--out DIR]
                              [--events unplug@5,plug@6,suspend@10 [--allow-suspend]]
    python experiment.py linktest [--seconds S] [--out DIR]   # the link alone, no model
    python experiment.py compare A.json B.json ... [--baseline STATE]

Window sizes default to the field report's (512 tokens single, 6 x 256 concurrent, a
120K prefix; docs/field-report.md) and a 200K long input; ``--single-tokens`` and
friends shorten them.
``prefix`` and ``long`` are cold; ``prefix_warm`` and ``long_warm`` prime, then
measure; a campaign plans both temperatures of each prefill window named.
``sweep`` measures each level of ``--concurrency`` (default 1,2,4,8,16) as a window
of its own, ``--sweep-tokens`` output tokens per request; a campaign with
production and a TP state sets them side by side, level by level. ``profile`` runs one
request under SGLang's own profiler on every rank: where each rank's time goes, and
NCCL's own transport lines.
The logic lives in ``harness/``; this file only reads the command line.
Progress goes to stderr, results to stdout and the report files.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from harness.hosts.diagnose import Diagnosis, diagnose
from harness.hosts.status import Status, observe
from harness.hosts.topology import Topology
from harness.measuring import windows
from harness.measuring.windows import EndpointDown, WindowSettings
from harness.reporting import compare, linktest_report, report_schema
from harness.runs import campaign, events, linktest, matrix
from harness.runs.measure import NotMeasurable, failures, measure_state
from harness.runs.soak import Schedule, recorded, soak
from operations.safety import ledger
from operations.states import STATES

REPORTS = Path(__file__).resolve().parent / "reports"
# A day of the field report's windows at most; beyond, a typo.
MAX_TRIALS = 50


def window_options(parser: argparse.ArgumentParser) -> None:
    """``--window`` and one option per setting a window declares (``--prefix-tokens`` ...)."""
    names = windows.names()
    warm = [window.name for window in windows.DECLARED.values() if window.warm]
    parser.add_argument("--window", action="append", choices=names, dest="windows",
                        help="a window to run (repeatable; default: all, in this order: "
                             f"{', '.join(names)}; a campaign runs {' and '.join(warm)} both "
                             "cold and warm)")
    for setting in windows.settings():
        if isinstance(setting.default, tuple):
            parser.add_argument(f"--{setting.name.replace('_', '-')}", type=whole_numbers,
                                metavar="N,N,...",
                                help=f"default {','.join(map(str, setting.default))}")
        else:
            parser.add_argument(f"--{setting.name.replace('_', '-')}", type=type(setting.default),
                                metavar="N", help=f"default {setting.default}")


def whole_numbers(text: str) -> tuple[int, ...]:
    """``1,2,4``: the sweep's levels, as ``--concurrency`` takes them."""
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not whole numbers separated by commas (1,2,4)") from None


def window_settings(arguments: argparse.Namespace) -> WindowSettings:
    given = {setting.name: getattr(arguments, setting.name) for setting in windows.settings()
             if getattr(arguments, setting.name) is not None}
    return WindowSettings(**given)


def stamp() -> str:
    return datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")


def headed(topology: Topology, text: str) -> str:
    """A pair's part of a per-pair report: under the pair's name on a site of several."""
    return f"## {topology.named}\n\n{text}" if topology.pair else text


def print_per_pair(arguments: argparse.Namespace, topologies: list[Topology],
                   found: list[Status] | list[Diagnosis]) -> None:
    """Each pair's reading, as text or JSON (keyed by pair on a site of several)."""
    if arguments.json:
        print(json.dumps({topology.pair or "": each.to_json()
                          for topology, each in zip(topologies, found, strict=True)}
                         if len(topologies) > 1 else found[0].to_json(), indent=1))
    else:
        print("\n\n".join(headed(topology, each.render())
                           for topology, each in zip(topologies, found, strict=True)))


async def status(arguments: argparse.Namespace, topologies: list[Topology]) -> int:
    observed = [await observe(topology) for topology in topologies]
    print_per_pair(arguments, topologies, observed)
    return 0 if all(each.match for each in observed) else 1


async def run_diagnose(arguments: argparse.Namespace, topologies: list[Topology]) -> int:
    found = [await diagnose(topology) for topology in topologies]
    print_per_pair(arguments, topologies, found)
    return 1 if any(each.cause for each in found) else 0


async def measure(arguments: argparse.Namespace, topology: Topology) -> int:
    try:
        path, built = await measure_state(
            topology, arguments.windows or windows.names(), window_settings(arguments),
            arguments.out, expected=arguments.state, allow_drift=arguments.allow_drift)
    except (NotMeasurable, EndpointDown) as error:
        print(f"experiment: {error}", file=sys.stderr)
        return 1
    print(path.with_suffix(".md").read_text())
    return 1 if failures(built) else 0


async def run_campaigns(arguments: argparse.Namespace, topologies: list[Topology]) -> int:
    """
    The plan on each pair in turn, each in a directory of its own under one
    campaign's: a pair's runs take the gateway's lock, which a run on another
    pair would be refused at, so pairs do not run their plans at once.
    """
    directory = arguments.out / f"campaign-{stamp()}"
    failed = False
    parts = []
    for topology in topologies:
        where = directory / f"pair-{topology.pair}" if topology.pair else directory
        result = await campaign.Campaign(
            topology, arguments.plan, arguments.windows or windows.names(),
            window_settings(arguments), where, baseline=arguments.baseline,
            linktest_seconds=arguments.linktest_seconds, trials=arguments.trials).run()
        ended = (f"campaign{' on ' + topology.named if topology.pair else ''}: "
                 f"{campaign.outcome(result)}; files in {where}")
        parts.append(headed(topology, f"{(where / 'campaign.md').read_text()}\n{ended}\n"))
        print(parts[-1])
        if result["chart"]:
            print(f"chart: {where / result['chart']}")
        failed = failed or result["failed_step"] is not None
    if len(topologies) > 1:
        # One report for the whole campaign: each pair's, in the order they ran.
        (directory / "campaign.md").write_text(
            f"# Campaign on pairs {', '.join(str(each.pair) for each in topologies)}\n\n"
            + "\n".join(parts))
        print(f"campaign: one report for every pair in {directory / 'campaign.md'}")
    return 1 if failed else 0


async def run_soak(arguments: argparse.Namespace, topology: Topology) -> int:
    observed = await observe(topology)
    if not observed.match:
        print(f"experiment: soak refused: the hosts are in no declared state: "
              f"{observed.verdict()}", file=sys.stderr)
        return 2
    directory = arguments.out / f"soak-{stamp()}"
    schedule = Schedule(arguments.events, events.hands_for(topology, arguments.allow_suspend),
                        arguments.suspend_seconds)
    result = await soak(topology, STATES[observed.match], arguments.minutes, arguments.interval,
                        directory, schedule)
    samples = result["samples"]
    rates = [sample["tok_s"] for sample in samples if sample["tok_s"] is not None]
    print(f"soak: {observed.match}, {len(samples)} interval(s), "
          f"{(sum(rates) / len(rates)) if rates else 0:.1f} tok/s on average; "
          + (f"stopped: {result['stopped']}; {result['restored']}" if result["stopped"]
             else "nothing stopped it"))
    for outcome in result["events"]:
        print(f"event at {outcome['at_seconds']:.0f}s: {events.describe(outcome)}")
    if result["ledger"]:
        print(f"ledger: {len(recorded(result['events']))} event record(s) in {result['ledger']}")
    print(f"chart: {result['chart']}; files in {directory}")
    return 1 if result["stopped"] else 0


async def run_linktest(arguments: argparse.Namespace, topology: Topology) -> int:
    try:
        built = await linktest.linktest(topology, arguments.seconds)
    except linktest.NotTestable as error:
        print(f"experiment: linktest refused: {error}", file=sys.stderr)
        return 2
    path = linktest_report.write(built, arguments.out)
    print(path.with_suffix(".md").read_text())
    print(f"chart: {path.with_suffix('.png')}; report: {path}")
    return 0


async def run_matrix(arguments: argparse.Namespace, topology: Topology) -> int:
    return show_matrix(arguments.ledger or matrix.ledger_path(topology))


def show_matrix(path: Path) -> int:
    records, skipped = ledger.read_all(path)
    for warning in skipped:
        print(f"experiment: ledger: {warning}", file=sys.stderr)
    print(f"ledger: {path}, {len(records)} record(s)\n")
    print(matrix.render(records) if records else "(no runs recorded yet)")
    print("\nrecorded stalls (preflight refuses the candidate on these controllers):")
    print("\n".join(f"- {stall}" for stall in matrix.stalls(records)))
    return 0


def run_compare(arguments: argparse.Namespace) -> int:
    # Every file is checked before any is compared: a bad one is one line, and no table.
    loaded = [report_schema.load(path) for path in arguments.reports]
    if links := [built for built in loaded if linktest_report.is_linktest(built)]:
        print(linktest_report.comparison(links))
    paths = [path for path, built in zip(arguments.reports, loaded, strict=True)
             if not linktest_report.is_linktest(built)]
    if not paths:
        return 0
    reports = [built for built in loaded if not linktest_report.is_linktest(built)]
    print(compare.comparison(reports, arguments.baseline))
    chart = arguments.chart or paths[-1].parent / f"comparison-{stamp()}.png"
    print(f"chart: {compare.chart(reports, chart)}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="experiment.py", description=__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = top.add_subparsers(dest="command", required=True)

    status_parser = commands.add_parser("status", help="the state the hosts are observed in")
    status_parser.add_argument("--json", action="store_true", help="print JSON")

    diagnose_parser = commands.add_parser(
        "diagnose", help="read-only: every rung from the user's route down to the cable, "
                         "and the lowest one that fails")
    diagnose_parser.add_argument("--json", action="store_true", help="print JSON")

    matrix_parser = commands.add_parser(
        "matrix", help="the compatibility ledger: controllers x kernel x driver x E2E -> outcomes")
    matrix_parser.add_argument("--ledger", type=Path,
                               help="a ledger file (default: the inventory's ledger.path)")

    measure_parser = commands.add_parser("measure", help="measure the current state")
    measure_parser.add_argument("--state", choices=list(STATES),
                                help="the state the hosts must be in")
    measure_parser.add_argument("--allow-drift", action="store_true",
                                help="with --state: measure even if the hosts have drifted "
                                     "(the report records the observed verdict)")
    measure_parser.add_argument("--out", type=Path, default=REPORTS)
    window_options(measure_parser)

    campaign_parser = commands.add_parser("campaign", help="production, then one layer at a time")
    campaign_parser.add_argument("--states", help="the steps after production, comma-separated "
                                                  f"(default {','.join(campaign.PLAN)})")
    campaign_parser.add_argument(
        "--trials", type=int, default=campaign.TRIALS,
        help="passes over the plan's states, in the order ABBA (default %(default)s)")
    campaign_parser.add_argument("--no-baseline", dest="baseline", action="store_false",
                                 help="do not measure production; the move from it to the "
                                      "first state may then change several layers")
    campaign_parser.add_argument(
        "--linktest-seconds", type=int, default=linktest.FLOW_SECONDS,
        help="each iperf3 run of the transport stage's linktests, in whole seconds (default "
             f"{linktest.FLOW_SECONDS})")
    campaign_parser.add_argument(
        "--no-transport", dest="linktest_seconds", action="store_const", const=None,
        help="skip the transport stage (production under the candidate and under e2e=0, "
             "a linktest in each) before the model states")
    campaign_parser.add_argument("--out", type=Path, default=REPORTS)
    window_options(campaign_parser)

    soak_parser = commands.add_parser(
        "soak", help="steady traffic for N minutes, the counters sampled; under the candidate "
                     "the first receiver error or a stall restores production")
    soak_parser.add_argument("--minutes", type=float, required=True, help="how long (bounded)")
    soak_parser.add_argument("--interval", type=float, default=5.0,
                             help="seconds between samples (default 5)")
    soak_parser.add_argument("--out", type=Path, default=REPORTS)
    soak_parser.add_argument(
        "--events", default="",
        help="events on the second workstation at minutes into the soak, for example "
             "unplug@5,plug@6,suspend@10: in the lab the lab's commands, on a site a person "
             "is asked to move the cable")
    soak_parser.add_argument("--suspend-seconds", type=int, default=30,
                             help="how long a suspend sleeps (default %(default)s)")
    soak_parser.add_argument("--allow-suspend", action="store_true",
                             help="on a site, suspend the workstation (rtcwake, then "
                                  "systemctl suspend)")

    linktest_parser = commands.add_parser(
        "linktest", help="the network-only window in the current state: iperf3 flows and "
                         "probes each way, beside the receiver errors and retransmissions")
    linktest_parser.add_argument("--seconds", type=int, default=linktest.FLOW_SECONDS,
                                 help="each run of flows, whole seconds (default %(default)s)")
    linktest_parser.add_argument("--out", type=Path, default=REPORTS)

    # A site of several pairs: which one a command looks at or moves.
    for pair_parser, what in ((status_parser, "every pair"), (diagnose_parser, "every pair"),
                              (measure_parser, "the only one"), (soak_parser, "the only one"),
                              (linktest_parser, "the only one")):
        pair_parser.add_argument("--pair", help=f"the pair, by name (default: {what})")
    campaign_parser.add_argument(
        "--pairs", type=lambda text: text.split(","),
        help="the pairs to run the plan on, one after another, comma-separated (default: "
             "the only one)")

    compare_parser = commands.add_parser(
        "compare", help="a table and a chart across reports; several reports of one state are "
                        "its trials: medians, intervals and verdicts")
    compare_parser.add_argument("reports", nargs="+", type=Path, metavar="REPORT.json")
    compare_parser.add_argument("--baseline", help="ratios against this state's report "
                                                   "(default: the row above)")
    compare_parser.add_argument("--chart", type=Path, help="where to write the PNG")
    return top


async def with_topology(arguments: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="twinbolt-") as directory:
        if arguments.command in ("status", "diagnose"):
            # Every pair, each on its own, unless one is named.
            command = {"status": status, "diagnose": run_diagnose}[arguments.command]
            return await command(arguments, Topology.load_pairs(
                Path(directory), [arguments.pair] if arguments.pair else None))
        if arguments.command == "campaign":
            return await run_campaigns(arguments, Topology.load_pairs(
                Path(directory), arguments.pairs, one=arguments.pairs is None))
        if arguments.command == "matrix":
            # One ledger for the site, whichever pair reads it.
            return await run_matrix(arguments, Topology.load_pairs(Path(directory))[0])
        command = {"measure": measure, "soak": run_soak,
                   "linktest": run_linktest}[arguments.command]
        return await command(arguments, Topology.load(Path(directory),
                                                      getattr(arguments, "pair", None)))


def main(argv: list[str] | None = None) -> int:
    arguments = parser().parse_args(argv)
    try:
        if arguments.command == "compare":
            return run_compare(arguments)
        if arguments.command == "matrix" and arguments.ledger:
            return show_matrix(arguments.ledger)
        if arguments.command in ("measure", "campaign"):
            window_settings(arguments)
        if arguments.command == "linktest" and not 0 < arguments.seconds <= 600:
            raise ValueError("linktest: --seconds must be in (0, 600]")
        if (arguments.command == "campaign" and arguments.linktest_seconds is not None
                and not 0 < arguments.linktest_seconds <= 600):
            raise ValueError("campaign: --linktest-seconds must be in (0, 600]")
        if arguments.command == "campaign" and not 0 < arguments.trials <= MAX_TRIALS:
            raise ValueError(f"campaign: --trials must be in [1, {MAX_TRIALS}]")
        # An interval longer than the soak would take no sample; inf never ends, nan no test.
        if arguments.command == "soak" and not (
                0 < arguments.minutes <= 24 * 60
                and 0 < arguments.interval <= arguments.minutes * 60):
            raise ValueError("soak: --minutes must be in (0, 1440] and --interval in (0, the "
                             "soak's length in seconds]")
        if arguments.command == "soak":
            if not 0 < arguments.suspend_seconds <= 3600:
                raise ValueError("soak: --suspend-seconds must be in (0, 3600]")
            arguments.events = (events.parse(arguments.events, arguments.minutes)
                                if arguments.events else [])
        if arguments.command == "campaign":
            # Refused before the inventory is read, let alone a host touched.
            arguments.plan = campaign.check_plan(arguments.states.split(",") if arguments.states
                                                 else campaign.PLAN, arguments.baseline)
        return asyncio.run(with_topology(arguments))
    except campaign.CampaignRefused as error:
        print(f"experiment: campaign refused: {error}", file=sys.stderr)
        return 2
    except ValidationError as error:
        for problem in error.errors():
            option = "--" + str(problem["loc"][0]).replace("_", "-")
            print(f"experiment: {option}: {problem['msg']}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as error:
        print(f"experiment: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
