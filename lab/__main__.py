"""``python -m lab up|down|status`` and ``python -m lab fault NAME on|off``."""

from __future__ import annotations

import argparse
import sys

from lab import control, faults


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="build or repair the lab (idempotent)")
    commands.add_parser("down", help="remove everything the lab made")
    commands.add_parser("status", help="each host, its address, sshd, link, driver, faults")
    fault = commands.add_parser("fault", help="switch a named fault on or off")
    fault.add_argument("name", choices=sorted(faults.FAULTS))
    fault.add_argument("switch", choices=("on", "off"))
    args = parser.parse_args(argv)
    if args.command == "fault" and not control.healthy():
        print("lab: the lab is down; run `python -m lab up` first", file=sys.stderr)
        return 1
    try:
        if args.command == "up":
            control.up()
        elif args.command == "down":
            control.down()
        elif args.command == "status":
            return 0 if control.status() else 3
        else:
            faults.switch(args.name, args.switch == "on")
            print(f"lab: fault {args.name} {args.switch}: {faults.FAULTS[args.name]}")
    except control.LabError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
