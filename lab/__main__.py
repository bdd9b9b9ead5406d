"""``python -m lab up|down|status``, ``fault NAME on|off`` and ``reboot HOST``."""

from __future__ import annotations

import argparse
import sys

from lab import control, faults
from lab.topology import HOSTS, INIT_SYSTEMS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="build or repair the lab (idempotent)")
    up.add_argument("--init", choices=INIT_SYSTEMS,
                    help="the hosts' init system (default: what they boot now, else systemd)")
    commands.add_parser("down", help="remove everything the lab made")
    commands.add_parser("status", help="each host, its address, sshd, link, driver, faults")
    fault = commands.add_parser("fault", help="switch a named fault on or off")
    fault.add_argument("name", choices=sorted(faults.FAULTS))
    fault.add_argument("switch", choices=("on", "off"))
    reboot = commands.add_parser("reboot", help="reboot one host, as a power cycle would")
    reboot.add_argument("host", choices=[host.name for host in HOSTS])
    args = parser.parse_args(argv)
    if args.command == "fault" and not control.healthy():
        print("lab: the lab is down; run `python -m lab up` first", file=sys.stderr)
        return 1
    try:
        if args.command == "up":
            control.up(args.init)
        elif args.command == "down":
            control.down()
        elif args.command == "status":
            return 0 if control.status() else 3
        elif args.command == "reboot":
            control.reboot(args.host)
        else:
            faults.switch(args.name, args.switch == "on")
            print(f"lab: fault {args.name} {args.switch}: {faults.FAULTS[args.name]}")
    except control.LabError as error:
        print(f"lab: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
