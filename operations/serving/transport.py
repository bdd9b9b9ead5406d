"""
The TP group's transport: proof that its bytes cross the Thunderbolt link.

Environment variables say where NCCL, Gloo and SGLang should send; they do not
say where the bytes went. Users of comparable tools keep finding their traffic
elsewhere: SGLang's own sockets take the host's default address unless
``SGLANG_HOST_IP`` is set, NCCL picks the first interface that is neither
loopback nor docker when ``NCCL_SOCKET_IFNAME`` does not reach it (and a
network plugin can fall back to sockets silently), and ``thunderbolt0``,
created at hotplug, is rarely first. A TP group on the management network
passes every other check. So a TP state is accepted only when

- every connection of the rank's process tree to another host runs to the
  peer's Thunderbolt address, and at least one runs between the two
  Thunderbolt addresses; its HTTP clients aside, and the group talking to
  itself (both ends this host's own addresses: torch's store, which rank 0
  hosts at ``--dist-init-addr`` and joins as a client too, and each rank's
  socket to its own NCCL proxy thread);
- during a completion of N tokens, ``thunderbolt0`` carries at least what N
  tokens' all-reduces must.

That volume follows from the model's own ``config.json``: every layer ends in
two row-parallel projections (attention's output, the MLP's down projection),
each followed by an all-reduce of ``hidden_size`` activations per token, in the
model's dtype (NVFP4 quantizes the weights; activations stay bf16). A ring
all-reduce across two ranks sends about as much as it receives, so rank 0's
``rx_bytes + tx_bytes`` rises by about twice the one-way volume; the bound asks
for the one-way volume only, which leaves room for counters that lag.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from ipaddress import ip_address
from typing import Any

from pyinfra.api import FactBase, QuoteString, StringCommand

from operations.plumbing.facts import EmptyMeansSomething, shell_script

INTERFACE_COUNTERS = (
    "rx_bytes", "tx_bytes", "rx_packets", "tx_packets", "rx_crc_errors", "rx_missed_errors",
    "rx_length_errors", "rx_over_errors", "rx_errors",
)
RETRANSMISSIONS = "retrans_segs"
# What ``ss -tin`` says of each TP socket (:class:`PeerSockets`).
SOCKET_COUNTERS = ("retrans", "bytes_retrans", "lost", "bytes_sent", "bytes_received",
                   "segs_out", "segs_in")
# The congestion control an Ubuntu workstation's TCP runs by default, which backs
# off on loss where BBR does not: the lab's sockets and the linktest's flows ask
# for it per socket where the kernel has it, so that their losses are an Ubuntu
# host's (a network namespace may not change the machine's own default).
UBUNTU_CONGESTION_CONTROL = "cubic"
AVAILABLE_CONGESTION_CONTROL = "/proc/sys/net/ipv4/tcp_available_congestion_control"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
MIB = 1 << 20
WEIGHTS_MARKER = "@@weights"


class LinkCounters(FactBase):
    """
    An interface's statistics and the TCP retransmissions of the host's network
    stack (``/proc/net/snmp`` ``Tcp: RetransSegs``, per network namespace). The
    interface counters are absent while the interface is (a driver reload).

    .. code:: python

        {"rx_bytes": 91234, "tx_bytes": 88123, ..., "rx_errors": 12, "retrans_segs": 40}
    """

    default = dict

    def command(self, interface: str) -> StringCommand:
        script = (
            'cd "/sys/class/net/$1/statistics" 2>/dev/null && '
            f'for c in {" ".join(INTERFACE_COUNTERS)}; do echo "$c $(cat "$c")"; done; '
            "grep '^Tcp:' /proc/net/snmp"
        )
        return shell_script(script, interface)

    def process(self, output: list[str]) -> dict[str, int]:
        counters: dict[str, int] = {}
        tcp: list[list[str]] = []
        for line in output:
            if line.startswith("Tcp:"):
                tcp.append(line.split()[1:])
            else:
                name, _, value = line.partition(" ")
                counters[name] = int(value)
        # Two rows: the field names, then the values.
        if len(tcp) == 2:
            counters[RETRANSMISSIONS] = int(dict(zip(*tcp, strict=True))["RetransSegs"])
        return counters


class ModelShape(FactBase):
    """
    The model's shape and size from its directory, as SGLang's loader reads
    them: ``config.json`` (a multimodal checkpoint keeps the shape under
    ``text_config``), and the weights' size from
    ``model.safetensors.index.json``'s ``total_size``, else the safetensors
    files' (``None`` without either). The whole fact is ``None`` without a
    usable ``config.json``.

    .. code:: python

        {"layers": 64, "hidden_size": 5120, "activation_bytes": 2, "draft_layers": 1,
         "kv_bytes_per_position": 262144, "weight_bytes": 15187500000}
    """

    def command(self, model_path: str) -> StringCommand:
        # The bare echo ends a config.json that lacks its final newline.
        script = ('cd "$1" && cat config.json && echo && echo "$2" && '
                  "{ cat model.safetensors.index.json || stat -c %s -- *.safetensors || true; } "
                  "2>/dev/null")
        return shell_script(script, model_path, WEIGHTS_MARKER)

    def process(self, output: list[str]) -> dict[str, Any] | None:
        config_lines, weights = output, []
        if WEIGHTS_MARKER in output:
            at = output.index(WEIGHTS_MARKER)
            config_lines, weights = output[:at], output[at + 1:]
        try:
            config = json.loads("\n".join(config_lines))
            config = config.get("text_config", config)
            layers, hidden_size = int(config["num_hidden_layers"]), int(config["hidden_size"])
            activation_bytes = DTYPE_BYTES[config.get("torch_dtype", "bfloat16")]
            heads = int(config.get("num_attention_heads", 1))
            head_dim = int(config.get("head_dim", hidden_size // heads))
            kv_heads = int(config.get("num_key_value_heads", heads))
            return {"layers": layers, "hidden_size": hidden_size,
                    "activation_bytes": activation_bytes,
                    "draft_layers": int(config.get("num_nextn_predict_layers", 1)),
                    "kv_bytes_per_position": 2 * layers * kv_heads * head_dim * activation_bytes,
                    "weight_bytes": weight_bytes(weights)}
        except (ValueError, KeyError, TypeError, AttributeError, ZeroDivisionError):
            return None


def weight_bytes(lines: list[str]) -> int | None:
    """The index's ``total_size``, or the sum of the files' sizes; ``None`` when neither."""
    if not lines:
        return None
    if lines[0].lstrip().startswith("{"):
        try:
            return int(json.loads("\n".join(lines))["metadata"]["total_size"])
        except (ValueError, KeyError, TypeError):
            return None
    try:
        return sum(int(line) for line in lines) or None
    except ValueError:
        return None


class Connections(EmptyMeansSomething):
    """
    The host's established TCP connections with the processes holding them, the
    process tree, and the host's own addresses (``ps``, ``ss -tnp`` and ``ip -o
    addr``): enough to find every connection of a service, whichever of its
    processes holds it (SGLang's scheduler, a child of the server's process,
    holds NCCL's and the store's sockets), and to tell the host talking to
    itself from a connection to another host. The addresses are read, not
    taken from the inventory: a connection between this host's LAN address and
    its link address is the host's own, whatever the site file says.

    .. code:: python

        {"parents": {4242: 1, 4250: 4242},
         "connections": [{"local": "169.254.77.1:5757", "peer": "169.254.77.2:40112",
                          "pids": [4250]}],
         "addresses": ["127.0.0.1", "::1", "10.66.0.11", "169.254.77.1"]}
    """

    def requires_command(self) -> str:
        return "ss"

    def command(self) -> str:
        return ("ps -e -o pid=,ppid= && echo @@ && ss -tnpH state established && echo @@ && "
                "ip -o addr show")

    def process(self, output: list[str]) -> dict[str, Any]:
        parents: dict[int, int] = {}
        connections: list[dict[str, Any]] = []
        addresses: list[str] = []
        lines = iter(output)
        for line in lines:
            if line == "@@":
                break
            pid, ppid = line.split()
            parents[int(pid)] = int(ppid)
        for line in lines:
            if line == "@@":
                break
            # Recv-Q Send-Q Local Peer Process
            fields = line.split()
            if len(fields) >= 4:
                connections.append({"local": fields[2], "peer": fields[3],
                                    "pids": sorted(map(int, re.findall(r"pid=(\d+)", line)))})
        for line in lines:
            # 2: eth0    inet 10.66.0.11/24 brd 10.66.0.255 scope global eth0\ ...
            fields = line.split()
            if len(fields) >= 4 and fields[2] in ("inet", "inet6"):
                addresses.append(fields[3].partition("/")[0])
        return {"parents": parents, "connections": connections, "addresses": addresses}


def ipv4_endpoint(text: str) -> str:
    """
    ``ss``'s endpoint with an IPv4-mapped address (``[::ffff:a.b.c.d]:port``) written
    as the IPv4 endpoint it is (``a.b.c.d:port``): a dual-stack listener's
    connections, torch's store among them, show so.
    """
    address, _, port = text.rpartition(":")
    if address.startswith("[::ffff:") and address.endswith("]") and "." in address:
        return f"{address[len('[::ffff:'):-1]}:{port}"
    return text


class PeerSockets(FactBase):
    """
    The TCP connections to ``peer`` (the peer's Thunderbolt address: the TP
    group's NCCL, Gloo and SGLang sockets), each with its own retransmission
    counters from ``ss -tin``: unlike ``RetransSegs`` they count nothing of SSH,
    the desktop or a download sharing the host.

    ``retrans`` is the socket's lifetime total (the second figure of ss's
    ``retrans:unacked/total``); ss leaves a zero counter out. The bytes and
    segments each way say what the socket put on the wire.

    .. code:: python

        {"169.254.77.1:5757>169.254.77.2:42304": {"retrans": 9, "bytes_retrans": 426129,
                                                   "lost": 0, "bytes_sent": 91553, ...}}
    """

    default = dict

    def requires_command(self, peer: str) -> str:
        return "ss"

    def command(self, peer: str) -> StringCommand:
        return StringCommand("ss", "-tinH", "state", "established", "dst", QuoteString(peer))

    def process(self, output: list[str]) -> dict[str, dict[str, int]]:
        sockets: dict[str, dict[str, int]] = {}
        counters: dict[str, int] = {}
        for line in output:
            if not line[:1].isspace():
                # "Recv-Q Send-Q Local Peer": the connection; its counters follow.
                *_, local, peer = line.split()
                key = f"{ipv4_endpoint(local).replace('%', '@')}>{ipv4_endpoint(peer)}"
                counters = sockets.setdefault(key,
                                              dict.fromkeys(SOCKET_COUNTERS, 0))
                continue
            for word in line.split():
                name, _, value = word.partition(":")
                if name == "retrans":
                    counters["retrans"] = int(value.partition("/")[2])
                elif name in SOCKET_COUNTERS:
                    counters[name] = int(value)
        return sockets


def endpoint(text: str) -> tuple[str, int]:
    """``ss``'s ``addr:port``, ``addr%dev:port`` or ``[v6]:port`` as an address and a port."""
    address, _, port = text.rpartition(":")
    address = address.removeprefix("[").removesuffix("]").partition("%")[0]
    return address.removeprefix("::ffff:"), int(port)


def connections_of(reading: dict[str, Any], pid: int) -> list[dict[str, Any]]:
    """The connections held by ``pid`` or any of its descendants."""
    tree = {pid}
    grew = True
    while grew:
        children = {child for child, parent in reading["parents"].items() if parent in tree}
        grew = not children <= tree
        tree |= children
    return [connection for connection in reading["connections"]
            if tree.intersection(connection["pids"])]


def own_address(address: str, addresses: Collection[str]) -> bool:
    """
    Whether ``address`` is this host's: one of its interfaces' addresses, or
    loopback (the kernel answers all of 127.0.0.0/8 locally, though ``ip addr``
    lists only 127.0.0.1).
    """
    return address in addresses or ip_address(address).is_loopback


def connection_problems(connections: list[dict[str, Any]], addresses: Collection[str],
                        address: str, peer_address: str, http_port: int,
                        interface: str) -> list[str]:
    """
    What is wrong with a TP rank's connections: any to another host that does
    not run to the peer's link address (off the link), or none between the two
    link addresses. ``addresses`` are this host's own (:class:`Connections`):
    a connection with both ends among them is the group talking to itself
    (the store's self-connection on rank 0, NCCL's proxy sockets), on whichever
    interface, and proves nothing either way. A connection from this host's
    link address counts only when it reaches the peer's: the link is a cable
    to one peer, and anything else from that address left by another route.
    """
    group, off_link = [], []
    for connection in connections:
        (local, port), (peer, peer_port) = (endpoint(connection["local"]),
                                            endpoint(connection["peer"]))
        if port == http_port:
            continue  # its HTTP clients
        if own_address(local, addresses) and own_address(peer, addresses):
            continue  # the group's own processes and threads, talking among themselves
        if (local, peer) == (address, peer_address):
            group.append(connection)
        elif peer != peer_address:
            off_link.append(f"{local}:{port} -> {peer}:{peer_port}")
    found = []
    if off_link:
        found.append(f"the TP group's transport is not {interface}: its connections "
                     f"{', '.join(off_link)} run outside {address} <-> {peer_address} "
                     f"(NCCL, Gloo or SGLang took another interface: check NCCL_SOCKET_IFNAME, "
                     "GLOO_SOCKET_IFNAME and SGLANG_HOST_IP in the rank's environment, and "
                     "NCCL's 'NET/Socket : Using' line with NCCL_DEBUG=INFO)")
    if not group:
        found.append(f"the TP group has no connection between {address} and {peer_address} "
                     f"on {interface}")
    return found


def one_way_bytes(shape: dict[str, int], tokens: int, layers: int | None = None) -> int:
    """
    What ``tokens`` token positions' all-reduces carry one way, at the least,
    through the model's layers (or ``layers`` of them: a draft's).
    """
    return (2 * (shape["layers"] if layers is None else layers) * shape["hidden_size"]
            * shape["activation_bytes"] * tokens)


def volume_carried(carried: int, shape: dict[str, int], tokens: int, interface: str) -> str:
    """What the link carried during a completion, against what its all-reduces need."""
    return (f"{interface} carried {carried / MIB:.1f} MiB during a {tokens}-token completion; "
            f"its all-reduces need at least {one_way_bytes(shape, tokens) / MIB:.1f} MiB "
            f"(2 per layer x {shape['layers']} layers x {shape['hidden_size']} x "
            f"{shape['activation_bytes']} bytes per token)")


def volume_problems(carried: int, shape: dict[str, int], tokens: int,
                    interface: str) -> list[str]:
    if carried >= one_way_bytes(shape, tokens):
        return []
    return [f"the TP group's transport is not {interface}: "
            + volume_carried(carried, shape, tokens, interface)]
