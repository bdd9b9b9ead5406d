"""``python -m lab up [--pairs N]|down|status``, ``fault NAME on|off [--pair P]``, ``reboot
HOST``, and the cables' ``unplug HOST``, ``plug HOST [--rate GBPS]`` and ``suspend HOST
--seconds N``."""

from __future__ import annotations

import argparse
import sys

from lab import cable, control, faults
from lab.topology import (
    INIT_SYSTEMS,
    PAIRS,
    LabError,
    hosts,
    lab_pairs,
    pair_named,
    workstations,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="build or repair the lab (idempotent)")
    up.add_argument("--init", choices=INIT_SYSTEMS,
                    help="the hosts' init system (default: what they boot now, else systemd)")
    up.add_argument("--pairs", type=int, default=1, choices=range(1, len(PAIRS) + 1),
                    help="pairs of workstations behind the gateway (default: 1); another "
                         "count than the running lab's rebuilds it")
    commands.add_parser("down", help="remove everything the lab made")
    commands.add_parser("status", help="each host, its address, sshd, link, driver, faults")
    fault = commands.add_parser("fault", help="switch a named fault on or off")
    fault.add_argument("name", choices=sorted(faults.FAULTS))
    fault.add_argument("switch", choices=("on", "off"))
    fault.add_argument("--pair", choices=[pair.name for pair in lab_pairs()],
                       help="switch it for this pair's workstations only (default: every host)")
    reboot = commands.add_parser("reboot", help="reboot one host, as a power cycle would")
    reboot.add_argument("host", choices=[host.name for host in hosts()])
    linked = [host.name for host in workstations()]
    unplug = commands.add_parser("unplug", help="pull its pair's cable out of a workstation")
    unplug.add_argument("host", choices=linked)
    plug = commands.add_parser("plug", help="put the cable back; the link trains anew")
    plug.add_argument("host", choices=linked)
    plug.add_argument("--rate", type=float, default=cable.RATES_GBPS[0],
                      choices=cable.RATES_GBPS, help="Gb/s the lane trains at (default: 20)")
    suspend = commands.add_parser("suspend", help="sleep a workstation, then wake it (rtcwake)")
    suspend.add_argument("host", choices=linked)
    suspend.add_argument("--seconds", type=float, required=True)
    args = parser.parse_args(argv)
    if args.command == "fault" and not control.healthy():
        print("lab: the lab is down; run `python -m lab up` first", file=sys.stderr)
        return 1
    try:
        if args.command == "up":
            control.up(args.init, args.pairs)
        elif args.command == "down":
            control.down()
        elif args.command == "status":
            return 0 if control.status() else 3
        elif args.command == "reboot":
            control.reboot(args.host)
        elif args.command == "unplug":
            control.unplug(args.host)
        elif args.command == "plug":
            control.plug(args.host, args.rate)
        elif args.command == "suspend":
            control.suspend(args.host, args.seconds)
        else:
            only = pair_named(args.pair).workstations if args.pair else None
            faults.switch(args.name, args.switch == "on", only)
            where = f" for pair {args.pair}" if args.pair else ""
            print(f"lab: fault {args.name} {args.switch}{where}: {faults.FAULTS[args.name]}")
    except LabError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
