"""
The link layer: the Thunderbolt cable as ``thunderbolt0`` sees it.

A driver reload takes the interface down; the link is back only when the
XDomain reports the expected rate (speed × lanes), ``thunderbolt0`` has carrier
and its address, and the peer answers across it. A link that trains at another
rate is an error, not something to wait out: it will not retrain by itself.

Only the TP states need the link. Production's replicas serve without it, so a
run to production (a rollback above all) waits for the link after restoring the
stock driver and warns, naming the evidence, if it does not come back; it does
not fail production for a cable. Leaving production refuses such a link; a
run on hosts that serve no replica (a TP group on this very link, or what the
guard left) fails on it instead: a refusal would keep the broken group, while
the failure's rollback ends in a verified production.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyinfra import host, logger
from pyinfra.api import FactBase, FunctionCommand, QuoteString, StringCommand
from pyinfra.api.command import PyinfraCommand

from operations.plumbing import probes
from operations.plumbing.facts import EmptyMeansSomething, shell_script
from operations.plumbing.phase import executing, run_now
from operations.site.settings import WorkstationSettings, derived
from operations.step import Layer, failing, failure, operation, refuse

LAYER = Layer.LINK
SPEED = re.compile(r"([0-9.]+)\s*Gb/s")


@dataclass(frozen=True)
class ExpectedLink:
    """
    The link as one workstation expects it: the interface, this host's address on
    it and the peer's, the rate (speed × lanes) and the lanes it must train at,
    who applies the address (``twinbolt``, with ``prefix_length``, or ``system``,
    the host's network manager) and how long a retraining may take. Each is the
    host's setting of its name (:func:`~operations.site.settings.derived`): the
    addresses the host's, the rest the site's ``[link]``.
    """

    interface: str
    link_address: str
    peer_link_address: str
    expected_rate_gbps: float
    expected_lanes: int
    address_owner: str
    prefix_length: int
    wait_seconds: float

    @classmethod
    def of(cls, settings: WorkstationSettings) -> ExpectedLink:
        """The link as this workstation's settings describe it."""
        return derived(cls, settings, settings.link)


# Facts


# The evidence of a stall: the link trained, yet nothing crosses it. The
# compatibility ledger records a candidate's run that failed so as a stall.
NO_TRAFFIC = "no traffic moves"

# The peer host is the Thunderbolt device whose uevent names it an XDomain. Its
# name depends on domain and port (0-1, 0-3, 1-1, ...), and device routers beside
# it (the host router, a dock) have a link speed too. Opens a loop over the
# peers, "$d" each one's sysfs directory; the caller closes it.
XDOMAIN_PEERS = ("for d in /sys/bus/thunderbolt/devices/*; do "
                 'grep -qsx DEVTYPE=thunderbolt_xdomain "$d/uevent" || continue; ')


class XDomainLink(FactBase):
    """
    The XDomain connection to the peer host, or ``None`` when no peer is connected;
    ``others`` names any further XDomain peer (twinbolt drives exactly one).

    .. code:: python

        {"device": "0-3", "peer": "wsb", "rx_speed_gbps": 20.0, "tx_speed_gbps": 20.0,
         "rx_lanes": 1, "tx_lanes": 1, "others": []}
    """

    def command(self) -> str:
        return (
            XDOMAIN_PEERS + 'echo "${d##*/}|$(cat "$d/device_name")|$(cat "$d/rx_speed")'
            '|$(cat "$d/tx_speed")|$(cat "$d/rx_lanes")|$(cat "$d/tx_lanes")"; done; true'
        )

    def process(self, output: list[str]) -> dict | None:
        peers = []
        for line in output:
            device, peer, rx_speed, tx_speed, rx_lanes, tx_lanes = line.split("|")
            peers.append({
                "device": device,
                "peer": peer,
                "rx_speed_gbps": float(SPEED.match(rx_speed).group(1)),
                "tx_speed_gbps": float(SPEED.match(tx_speed).group(1)),
                "rx_lanes": int(rx_lanes),
                "tx_lanes": int(tx_lanes),
            })
        if not peers:
            return None
        return {**peers[0], "others": [peer["device"] for peer in peers[1:]]}


class InterfaceState(EmptyMeansSomething):
    """
    Carrier and IPv4 addresses of a network interface; ``exists`` is false without it.

    .. code:: python

        {"exists": True, "carrier": True, "addresses": ["169.254.77.1"]}
    """

    def command(self, interface: str) -> StringCommand:
        script = (
            '[ -e "/sys/class/net/$1" ] || exit 0; '
            'echo "carrier $(cat "/sys/class/net/$1/carrier" 2>/dev/null || echo 0)"; '
            'ip -o -4 addr show dev "$1" | awk \'{print "address " $4}\''
        )
        return shell_script(script, interface)

    def process(self, output: list[str]) -> dict:
        state: dict = {"exists": bool(output), "carrier": False, "addresses": []}
        for line in output:
            kind, _, value = line.partition(" ")
            if kind == "carrier":
                state["carrier"] = value.strip() == "1"
            elif kind == "address":
                state["addresses"].append(value.strip().split("/")[0])
        return state


class PeerAnswers(EmptyMeansSomething):
    """
    Whether ``address`` answers a ping sent out of ``interface`` within two seconds.

    An echo every 0.2 s until one is answered: the stock driver really loses frames,
    and one lost echo is not a dead peer.
    """

    def command(self, address: str, interface: str) -> StringCommand:
        return StringCommand(
            "ping", "-c", "1", "-i", "0.2", "-w", "2", "-I", QuoteString(interface),
            QuoteString(address),
            ">/dev/null", "2>&1", "&&", "echo", "yes", "||", "echo", "no",
        )

    def process(self, output: list[str]) -> bool:
        return output == ["yes"]


# The address RouteInterface takes for the machine this SSH session comes from.
SSH_CLIENT = "ssh-client"


class RouteInterface(FactBase):
    """
    The interface this host would send to ``address`` through (``ip route get``),
    or ``None`` without a route; ``address`` ``ssh-client`` means the machine this
    SSH session comes from (``SSH_CONNECTION``), and ``None`` then means the
    session cannot tell. sudo resets the environment, and ``SSH_CONNECTION``
    with it: read this fact with ``_sudo=False`` (``ip route get`` needs no root).
    """

    def command(self, address: str) -> StringCommand:
        script = (
            f'a="$1"; [ "$a" = {SSH_CLIENT} ] && set -- $SSH_CONNECTION && a="$1"; '
            '[ -n "$a" ] && ip route get "$a" | sed -n "s/.* dev \\([^ ]*\\).*/\\1/p"; true'
        )
        return shell_script(script, address)

    def process(self, output: list[str]) -> str | None:
        return output[0].strip() if output else None


# Evidence


def trained_rate(xdomain: dict) -> tuple[float, int]:
    """
    The link's rate (Gb/s, all lanes) and width: the slower direction's, the narrower's.

    The one link rate: the link layer, the ledger, the harness's status and the
    measurement's roofline all read it here (a TP all-reduce crosses the cable both ways).
    """
    lanes = min(xdomain["rx_lanes"], xdomain["tx_lanes"])
    return min(xdomain["rx_speed_gbps"], xdomain["tx_speed_gbps"]) * lanes, lanes


def cable_problems(xdomain: dict | None, expected_rate_gbps: float,
                   expected_lanes: int) -> tuple[list[str], bool]:
    """
    Why the cable and the peer are not as the site declares (exactly one XDomain
    peer, trained at the expected rate and width), and whether waiting can help:
    a peer may still be coming up, but a second peer or a wrong rate stays.
    """
    if xdomain is None:
        return ["no XDomain peer is connected"], True
    if xdomain["others"]:
        return [f"{1 + len(xdomain['others'])} XDomain peers are connected "
                f"({', '.join([xdomain['device'], *xdomain['others']])}): twinbolt drives "
                "exactly one host-to-host link; disconnect the others"], False
    rate, lanes = trained_rate(xdomain)
    if rate != expected_rate_gbps or lanes != expected_lanes:
        return [f"the link to {xdomain['peer']} trained at {rate:g} Gb/s over {lanes} lane(s), "
                f"expected {expected_rate_gbps:g} Gb/s over {expected_lanes} "
                "(check the cable and the ports)"], False
    return [], True


def interface_problems(seen: dict, interface: str, address: str,
                       address_owner: str = "twinbolt") -> list[str]:
    """
    Why ``interface`` cannot carry traffic yet: it is missing, has no carrier, or
    lacks its address. A driver load makes all three, so each is worth waiting for.
    """
    if not seen["exists"]:
        return [f"{interface} does not exist (is the driver loaded?)"]
    if not seen["carrier"]:
        return [f"{interface} has no carrier"]
    if address not in seen["addresses"]:
        # A load creates the interface without one: it is applied (or, with
        # address_owner = system, the host's network manager applies it) soon.
        return [f"{interface} lacks its address {address} "
                f"(has {', '.join(seen['addresses']) or 'none'})"
                + ("; the host's network manager (link.address_owner = system) has not "
                   "applied it" if address_owner == "system" else "")]
    return []


def silent_peer(interface: str, peer_address: str) -> str:
    """
    The evidence that nothing crosses a link with carrier at the right rate: what
    a controller that never returns TX credits does under tx_e2e=1.
    """
    return (f"the peer {peer_address} does not answer across {interface} although it has "
            f"carrier: {NO_TRAFFIC} (a TX credit stall under tx_e2e=1?)")


def link_problems(link: ExpectedLink, traffic: bool = True) -> tuple[list[str], bool]:
    """
    Read the link and judge it: what keeps it from being trained and usable, and
    whether waiting can help.

    Without ``traffic`` only the cable and the peer are judged (the XDomain
    device, which the Thunderbolt core shows whatever ``thunderbolt_net`` does),
    not the interface, its carrier, its address and the traffic: a driver load
    creates the interface, which has carrier once both ends' drivers have logged
    in, and those are the driver and link steps' own work, which a run cut
    around a reload leaves undone on either host.
    """
    found, worth_waiting = cable_problems(host.get_fact(XDomainLink), link.expected_rate_gbps,
                                          link.expected_lanes)
    if found or not traffic:
        return found, worth_waiting
    found = interface_problems(host.get_fact(InterfaceState, interface=link.interface),
                               link.interface, link.link_address, link.address_owner)
    if not found and not host.get_fact(PeerAnswers, address=link.peer_link_address,
                                       interface=link.interface):
        found = [silent_peer(link.interface, link.peer_link_address)]
    return found, True


def apply_address(interface: str, address: str, prefix_length: int) -> None:
    """
    Give a freshly created interface its declared address, if it exists and lacks
    it: loading thunderbolt_net makes a new ``thunderbolt0`` with none.

    Called by :func:`trained`'s wait, which runs as the step's own command, at
    execute time: the interface may appear (or come back after a retraining) at
    any moment of it, and a running callback cannot yield a command of its own.
    """
    state = host.get_fact(InterfaceState, interface=interface)
    if state["exists"] and address not in state["addresses"]:
        run_now(StringCommand("ip", "addr", "add", f"{address}/{prefix_length}", "dev",
                              QuoteString(interface)))


def warn(state: Any, host: Any, found: list[str]) -> bool:
    # pyinfra passes the state and the host to a FunctionCommand by these names.
    host.log_styled(
        failure(host.name, LAYER, found)
        + " (the target state does not use the link; fix it before the next experiment)",
        fg="yellow", log_func=logger.warning)
    return True


def shortfall(found: list[str], needed: bool) -> FunctionCommand:
    """A link the target needs fails the operation; one it does not need is a warning."""
    return failing(LAYER, found) if needed else FunctionCommand(warn, (found,), {})


# Operations


@operation(LAYER, is_idempotent=True)
def management_path(interface: str, addresses: dict[str, str]) -> Iterator[PyinfraCommand]:
    """
    Refuse, before any change, when the operator's SSH session or the route to
    another host would cross the link: a driver reload cuts ``interface``, and
    with it whatever runs over it.

    A session whose client cannot be told is refused too: a silent pass could
    be the very session a reload cuts.

    + interface: the ThunderboltIP interface, ``thunderbolt0``
    + addresses: what must stay reachable, by role (``ssh-client`` is this SSH
      session's client)

    **Example:**

    .. code:: python

        link.management_path(
            name="Preflight: management traffic stays off the link",
            interface="thunderbolt0",
            addresses={"operator": "ssh-client", "gateway": "10.66.0.13"},
        )
    """
    found = []
    for role, address in addresses.items():
        # Outside sudo, whose reset environment has no SSH_CONNECTION.
        route = host.get_fact(RouteInterface, address=address, _sudo=False)
        if route is None and address == SSH_CLIENT:
            found.append(f"cannot tell where this SSH session comes from (SSH_CONNECTION is "
                         f"not set on the host), so not whether the {role}'s traffic would "
                         f"leave through {interface}, which a driver reload takes down: reach "
                         "the host over SSH, without su or an environment that drops it")
        elif route == interface:
            found.append(f"traffic to the {role} ({address}) would leave through {interface}, "
                         "which a driver reload takes down: give management its own network")
    if found:
        refuse(LAYER, found)
    host.noop(f"management traffic does not cross {interface}")
    yield from ()


def _cable_problems(link: ExpectedLink) -> list[str]:
    """
    What keeps the cable from being trained at the expected rate to one peer,
    judged at once, without waiting; the interface, its address and the
    traffic are the driver and link steps' to make (a run cut around a reload
    leaves them undone), and :func:`trained`'s to prove.
    """
    found, _ = link_problems(link, traffic=False)
    if not found:
        host.noop(f"the link is trained at {link.expected_rate_gbps:g} Gb/s to one peer; "
                  f"{link.interface}, its address and the peer's answer are the driver and "
                  "link steps' to make and prove")
    return found


@operation(LAYER, is_idempotent=True)
def admissible(link: ExpectedLink) -> Iterator[PyinfraCommand]:
    """
    Refuse the run, before any change, unless the cable is trained at the
    expected rate to one peer: nothing has changed yet, and what serves is kept.

    Only the cable and the peer are judged, at once, without waiting: the
    interface, its address and the traffic are the driver and link steps' to
    make (a run cut around a reload leaves them undone), :func:`trained` proves
    them.

    + link: the link as this host expects it (:class:`ExpectedLink`)

    **Example:**

    .. code:: python

        link.admissible(
            name="Preflight: the link is up at the expected rate",
            link=ExpectedLink("thunderbolt0", "169.254.77.1", "169.254.77.2",
                              20.0, 1, "twinbolt", 16, 30),
        )
    """
    if found := _cable_problems(link):
        refuse(LAYER, found)
    yield from ()


@operation(LAYER, is_idempotent=True)
def cable_holds(link: ExpectedLink) -> Iterator[PyinfraCommand]:
    """
    Fail the attempt, before anything moves, unless the cable is trained at the
    expected rate to one peer: for hosts where no replica of production serves,
    which a refusal would not keep (a TP group on this very link, or what the
    guard left), so that the attempt's rollback ends in a verified production.

    Judged as :func:`admissible` judges, at once, without waiting.

    + link: the link as this host expects it (:class:`ExpectedLink`)

    **Example:**

    .. code:: python

        link.cable_holds(
            name="Link: the cable holds, or the run ends in production",
            link=expected,  # an ExpectedLink, as link.admissible takes
        )
    """
    if found := _cable_problems(link):
        yield failing(LAYER, [*found, "no replica of production serves here for a refusal "
                              "to keep, so the attempt fails instead, and its rollback "
                              "converges production"])


@operation(LAYER, is_idempotent=True)
def trained(link: ExpectedLink, needed: bool = True) -> Iterator[PyinfraCommand]:
    """
    Ensure the link is trained at the expected rate, with its address, the peer
    answering across it (after a driver change).

    A link that is still coming up is waited for, with progress, up to the
    link's ``wait_seconds``. While waiting, the link layer owns the interface's
    address: a load creates the interface without one, and the declared address
    is applied as soon as it appears, unless the host's own network manager
    owns it (then a missing address is waited for, and named when the wait ends).

    + link: the link as this host expects it (:class:`ExpectedLink`)
    + needed: whether the target state uses the link; if not, a link that does
      not come back is a warning

    **Example:**

    .. code:: python

        link.trained(
            name="Link: retrained at 20 Gb/s, peer answers",
            link=ExpectedLink("thunderbolt0", "169.254.77.1", "169.254.77.2",
                              20.0, 1, "twinbolt", 16, 30),
        )
    """
    found, worth_waiting = link_problems(link)
    if not found:
        host.noop(f"{link.interface} is up at {link.expected_rate_gbps:g} Gb/s and the peer "
                  "answers")
        return
    # While pyinfra only predicts, an earlier driver change has not happened yet:
    # predict the wait rather than judge a link that is about to retrain.
    if not worth_waiting and executing():
        yield shortfall(found, needed)
        return
    def check(seconds_left: float) -> tuple[list[str], bool]:
        if link.address_owner == "twinbolt":
            apply_address(link.interface, link.link_address, link.prefix_length)
        return link_problems(link)

    outcome: dict = {}
    yield FunctionCommand(
        probes.wait_until,
        (f"{link.interface} trained at {link.expected_rate_gbps:g} Gb/s with its address, the "
         "peer answering", check, link.wait_seconds, outcome),
        {},
    )
    if outcome.get("found"):
        yield shortfall(outcome["found"], needed)
