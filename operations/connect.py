"""
The TCP connection pyinfra speaks SSH over, with Nagle's algorithm off.

paramiko, pyinfra's SSH client, sets no socket options. Each remote command is a
handful of small SSH messages, and with Nagle on, the next one waits for the
server's delayed ACK: about 40 ms per command on Linux, measured here as 48 ms
per command against 5.6 ms with ``TCP_NODELAY`` (paramiko, one ``exec`` at a
time, the lab's loopback). A converge runs some forty commands per host, most of
them fact reads, so that stall was most of a no-op converge's time, on a real
LAN as in the lab.

pyinfra passes ``ssh_paramiko_connect_kwargs`` to paramiko's
``SSHClient.connect``, whose ``sock`` may be any socket-like object. A
:class:`NoDelaySocket` is one: it opens the connection when paramiko first uses
it, so loading the inventory connects nothing, and a failed attempt leaves it
ready to try again (pyinfra's ``ssh_connect_retries``).

The same socket bounds a connection that drops silently (a cable pulled, a
host suspended, a firewall that forgets the flow): TCP keepalive probes it while
it is idle, and ``TCP_USER_TIMEOUT`` aborts it when what was sent stays
unacknowledged, so every wait on it ends in an error within
:data:`DEAD_AFTER_SECONDS`, instead of the kernel's retransmissions' quarter of
an hour. pyinfra 3.10 offers no keepalive of its own (only an ssh_config's
``ServerAliveInterval``, which sends but never gives up), and bounds a
command's output with ``_timeout`` but not the channel it opens first:
paramiko's ``channel_timeout``, an hour by default, is bounded here too.

A host that the operator's ``~/.ssh/config`` sends elsewhere (``HostName``,
``Port``, ``ProxyJump``, ``ProxyCommand``) keeps pyinfra's own connection: that
path is the operator's to choose; only the channel's bound applies to it.

However it dies, a connection must end the step that meets it as a failed
command, which the run records and rolls back from, not as a crash. paramiko
reports a dead transport as the exception its reader thread met: an ``OSError``
or an ``SSHException``, both of which pyinfra handles, or an ``EOFError`` (the
peer closed, as a rebooted host's kernel does), which pyinfra does not, and
which would end the run without a rollback, a conclusion or a ledger record.
:class:`LossAwareTransport` reports that one as an ``SSHException`` too, and
:func:`lost` tells whether a host's connection has died.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import paramiko
from pyinfra.api import Host

SSH_CONFIG = Path("~/.ssh/config")
# ssh_config keywords that change where, or through what, the connection goes.
REROUTING = ("hostname", "port", "proxyjump", "proxycommand")
CONNECT_TIMEOUT_SECONDS = 10.0
# Probes after this much silence, then this often, this many times unanswered;
# data unacknowledged for as long is given up on too. Half a minute: a live host
# answers a probe from its kernel, however busy its sshd or its GPU.
KEEPALIVE_IDLE_SECONDS = 15
KEEPALIVE_INTERVAL_SECONDS = 5
KEEPALIVE_PROBES = 3
DEAD_AFTER_SECONDS = KEEPALIVE_IDLE_SECONDS + KEEPALIVE_INTERVAL_SECONDS * KEEPALIVE_PROBES
# Opening a session on a live connection takes milliseconds.
CHANNEL_TIMEOUT_SECONDS = 30.0
# The TCP options that bound a dead connection, where the platform has them
# (TCP_USER_TIMEOUT and TCP_KEEPIDLE are Linux's; SO_KEEPALIVE is everywhere).
KEEPALIVE_OPTIONS = (
    (socket.SOL_SOCKET, "SO_KEEPALIVE", 1),
    (socket.IPPROTO_TCP, "TCP_KEEPIDLE", KEEPALIVE_IDLE_SECONDS),
    (socket.IPPROTO_TCP, "TCP_KEEPINTVL", KEEPALIVE_INTERVAL_SECONDS),
    (socket.IPPROTO_TCP, "TCP_KEEPCNT", KEEPALIVE_PROBES),
    (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT", DEAD_AFTER_SECONDS * 1000),
)


class NoDelaySocket:
    """
    A TCP connection to ``address:port`` with ``TCP_NODELAY`` and the
    :data:`KEEPALIVE_OPTIONS` set, opened on first use.

    Everything paramiko asks of a socket is delegated to the real one. Special
    names are not: ``copy`` and ``pickle`` probing for ``__deepcopy__`` must not
    open a connection.
    """

    def __init__(self, address: str, port: int,
                 timeout: float = CONNECT_TIMEOUT_SECONDS) -> None:
        self.address = address
        self.port = port
        self.timeout = timeout
        self._socket: socket.socket | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if self._socket is None:
            self._socket = self._open()
        return getattr(self._socket, name)

    def _open(self) -> socket.socket:
        opened = socket.create_connection((self.address, self.port), timeout=self.timeout)
        opened.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for level, option, value in KEEPALIVE_OPTIONS:
            if hasattr(socket, option):
                opened.setsockopt(level, getattr(socket, option), value)
        return opened

    def __repr__(self) -> str:
        return f"NoDelaySocket({self.address}:{self.port})"

    def to_json(self) -> str:
        """What ``pyinfra inventory.py debug-inventory --json`` shows for it."""
        return f"tcp://{self.address}:{self.port} with TCP_NODELAY"


class LossAwareTransport(paramiko.Transport):
    """paramiko's transport, reporting a connection closed under it as an ``SSHException``."""

    def get_exception(self) -> Exception | None:
        error = super().get_exception()
        if isinstance(error, EOFError):
            return paramiko.SSHException("the connection was closed by the other end")
        return error


def loss_aware_transport(sock: Any, **options: Any) -> LossAwareTransport:
    """paramiko's ``transport_factory``: a function, which host data can show as JSON."""
    return LossAwareTransport(sock, **options)


def lost(host: Host) -> bool:
    """Whether ``host``'s SSH connection was made and has since died (never, off SSH)."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is not None and not transport.is_active()


def rerouted(address: str, ssh_config: Path = SSH_CONFIG) -> bool:
    """Whether the operator's ssh_config decides where a connection to ``address`` goes."""
    path = ssh_config.expanduser()
    if not path.is_file():
        return False
    found = paramiko.SSHConfig.from_path(str(path)).lookup(address)
    return any(key in found for key in REROUTING if not (key == "hostname"
                                                         and found[key] == address))


def connection_data(address: str, port: int, ssh_config: Path = SSH_CONFIG) -> dict[str, Any]:
    """
    The host data that has pyinfra connect to ``address:port`` over a
    :class:`NoDelaySocket` and a :class:`LossAwareTransport`, its channels
    opened within :data:`CHANNEL_TIMEOUT_SECONDS`; only the transport and the
    channels' bound where the operator's ssh_config reroutes the host.
    """
    bounded: dict[str, Any] = {"channel_timeout": CHANNEL_TIMEOUT_SECONDS,
                               "transport_factory": loss_aware_transport}
    if not rerouted(address, ssh_config):
        bounded["sock"] = NoDelaySocket(address, port)
    return {"ssh_paramiko_connect_kwargs": bounded}
