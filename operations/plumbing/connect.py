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
path is the operator's to choose, and it may be no TCP socket at all. So every
connection, rerouted or not, is also bounded one level up, in SSH itself: its
paramiko ``Transport`` (:class:`ServerAliveTransport`, given to paramiko as
``transport_factory``) asks the server for an answer after
:data:`SERVER_ALIVE_INTERVAL_SECONDS` in which it sent nothing, as OpenSSH's
``ServerAliveInterval`` does, and ends the connection after
:data:`SERVER_ALIVE_COUNT_MAX` unanswered, as its ``ServerAliveCountMax``
does: a dead path ends within :data:`SERVER_ALIVE_DEAD_AFTER_SECONDS`. An
ssh_config's own ``ServerAliveInterval`` and ``ServerAliveCountMax`` for the
host are honoured (a positive value; ``0``, OpenSSH's "off", is not).

What that bounds, and what not, for a host behind a ``ProxyCommand``:

- bounded: a path that goes silent anywhere past the proxy (a jump host
  suspended, a cable pulled behind it, a proxy process stopped), and a proxy
  that exits (paramiko reads its closed pipe as "no data yet", forever; the
  next probe's write fails, or goes unanswered); a channel's open
  (``channel_timeout``) and each command (``_timeout``), as for every host;
- not bounded by the kernel: the proxy is a subprocess joined by pipes, which
  have no keepalive and no ``TCP_USER_TIMEOUT``, so the SSH-level probe is the
  only thing that detects a dead path; nor is the proxy's own connection (an
  ``ssh -W`` keeps whatever its own ssh_config gives it), nor a ``ProxyJump``
  hop's SSH connection, which pyinfra opens without these options: the
  target's probes, carried through the hop, are what end the target's
  connection when the hop dies;
- never: a server that answers its probes but not a command: that is the
  command's ``_timeout``.

However it dies, a connection must end the step that meets it as a failed
command, which the run records and rolls back from, not as a crash. paramiko
reports a dead transport as the exception its reader thread met: an ``OSError``
or an ``SSHException``, both of which pyinfra handles, or an ``EOFError`` (the
peer closed, as a rebooted host's kernel does), which pyinfra does not, and
which would end the run without a rollback, a conclusion or a ledger record.
:class:`ServerAliveTransport` reports that one as an ``SSHException`` too, and
:func:`lost` tells whether a host's connection has died. A command may also
fail at its own bound before the keepalives give a silent path up:
:func:`still_answers` asks the server then, and gives up on a connection that
does not answer.
"""

from __future__ import annotations

import errno
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko
from paramiko.common import cMSG_GLOBAL_REQUEST
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
# The SSH-level probe: after this much time sending nothing, then as often, this
# many unanswered; OpenSSH's defaults are off and 3. sshd answers it from its
# main loop, however long a command it runs.
SERVER_ALIVE_INTERVAL_SECONDS = 10
SERVER_ALIVE_COUNT_MAX = 3
SERVER_ALIVE_DEAD_AFTER_SECONDS = SERVER_ALIVE_INTERVAL_SECONDS * (SERVER_ALIVE_COUNT_MAX + 1)
# What OpenSSH's client asks; sshd knows no such request and answers that it
# failed, which is the answer.
SERVER_ALIVE_REQUEST = "keepalive@openssh.com"
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


class ServerAliveTransport(paramiko.Transport):
    """
    paramiko's ``Transport``, whose keepalive wants an answer and gives up.

    After ``interval`` seconds in which it has sent nothing, it sends a global
    request that wants a reply (:data:`SERVER_ALIVE_REQUEST`); when
    ``count_max`` have gone unanswered, it ends the connection with
    ``ETIMEDOUT``, as the kernel ends a TCP connection at ``TCP_USER_TIMEOUT``:
    its channels close, so every wait on them ends, and pyinfra's step fails.
    Any answer counts. paramiko's own keepalive (``keepalive@lag.net``) wants
    none, so over a pipe it never learns that nobody is there.

    The probe runs in the transport's own thread, which reads the connection:
    it is skipped during a key exchange, which that thread is carrying out, and
    until the user is authenticated (sshd accepts no other request before; the
    authentication has paramiko's own bound, ``auth_timeout``).
    """

    def __init__(self, sock: Any, interval: float, count_max: int, **options: Any) -> None:
        super().__init__(sock, **options)
        self.count_max = count_max
        self.unanswered = 0
        self.answer = threading.Event()
        self.set_keepalive(interval)

    def set_keepalive(self, interval: float) -> None:
        """
        Probe after ``interval`` seconds of sending nothing. pyinfra calls this
        with the host's ssh_config ``ServerAliveInterval``: its probes want an
        answer too.
        """
        self.keepalive_interval = interval
        self.packetizer.set_keepalive(interval, self._probe)

    def _probe(self) -> None:
        if self.in_kex or not self.is_authenticated():
            return
        if self.unanswered >= self.count_max:
            raise TimeoutError(
                errno.ETIMEDOUT,
                f"the server answered none of {self.unanswered} keepalives, one each "
                f"{self.keepalive_interval:g}s: the connection is given up on")
        self.unanswered += 1
        self._ask()

    def _ask(self) -> None:
        request = paramiko.Message()
        request.add_byte(cMSG_GLOBAL_REQUEST)
        request.add_string(SERVER_ALIVE_REQUEST)
        request.add_boolean(True)
        self._send_user_message(request)

    def answers(self, timeout: float) -> bool:
        """Whether the server answers a probe sent now within ``timeout`` seconds."""
        self.answer.clear()
        try:
            self._ask()
        except (OSError, EOFError, paramiko.SSHException):
            return False
        return self.answer.wait(timeout)

    def get_exception(self) -> Exception | None:
        """The error that ended the connection, a peer's close reported as an ``SSHException``."""
        error = super().get_exception()
        if isinstance(error, EOFError):
            return paramiko.SSHException("the connection was closed by the other end")
        return error

    def _parse_request_success(self, m: paramiko.Message) -> None:
        self.unanswered = 0
        self.answer.set()
        super()._parse_request_success(m)

    def _parse_request_failure(self, m: paramiko.Message) -> None:
        self.unanswered = 0
        self.answer.set()
        super()._parse_request_failure(m)


@dataclass(frozen=True)
class ServerAlive:
    """
    paramiko's ``transport_factory`` for a host: a :class:`ServerAliveTransport`
    probing every ``interval`` seconds, given up on after ``count_max``.
    """

    interval: float = SERVER_ALIVE_INTERVAL_SECONDS
    count_max: int = SERVER_ALIVE_COUNT_MAX

    def __call__(self, sock: Any, **options: Any) -> ServerAliveTransport:
        return ServerAliveTransport(sock, self.interval, self.count_max, **options)

    def to_json(self) -> str:
        """What ``pyinfra inventory.py debug-inventory --json`` shows for it."""
        return (f"SSH keepalive each {self.interval:g}s, "
                f"given up after {self.count_max} unanswered")


def lost(host: Host) -> bool:
    """Whether ``host``'s SSH connection was made and has since died (never, off SSH)."""
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    return transport is not None and not transport.is_active()


def still_answers(host: Host, timeout: float = SERVER_ALIVE_INTERVAL_SECONDS) -> bool:
    """
    Whether ``host``'s connection, not yet :func:`lost`, still answers: its
    server replies to a probe sent now within ``timeout`` seconds. On a path
    gone silent a command may fail at its own bound just before the connection
    is given up: a session's open at :data:`CHANNEL_TIMEOUT_SECONDS`, the same
    30 s after which ``TCP_USER_TIMEOUT`` ends the connection, whichever
    comes first (a CI run's cut path failed the open first). The run must not count that
    host as one its rollback can reach. A connection that does not answer is
    closed, so that it is lost from then on.
    """
    client = getattr(host.connector, "client", None)
    transport = client.get_transport() if client is not None else None
    if transport is None:
        return True
    if not isinstance(transport, ServerAliveTransport):
        return transport.is_active()
    if transport.is_active() and transport.answers(timeout):
        return True
    transport.close()
    return False


def operator_config(address: str, ssh_config: Path = SSH_CONFIG) -> dict[str, Any]:
    """What the operator's ssh_config says of ``address``: nothing, without one."""
    path = ssh_config.expanduser()
    if not path.is_file():
        return {}
    return dict(paramiko.SSHConfig.from_path(str(path)).lookup(address))


def rerouted(address: str, ssh_config: Path = SSH_CONFIG) -> bool:
    """Whether the operator's ssh_config decides where a connection to ``address`` goes."""
    found = operator_config(address, ssh_config)
    return any(key in found for key in REROUTING if not (key == "hostname"
                                                         and found.get(key) == address))


def server_alive(address: str, ssh_config: Path = SSH_CONFIG) -> ServerAlive:
    """The probe for ``address``: its ssh_config's ``ServerAlive*`` where positive, else ours."""
    found = operator_config(address, ssh_config)

    def positive(key: str, default: int) -> int:
        value = found.get(key, "")
        return int(value) if value.isdigit() and int(value) > 0 else default

    return ServerAlive(positive("serveraliveinterval", SERVER_ALIVE_INTERVAL_SECONDS),
                       positive("serveralivecountmax", SERVER_ALIVE_COUNT_MAX))


def connection_data(address: str, port: int, ssh_config: Path = SSH_CONFIG) -> dict[str, Any]:
    """
    The host data that has pyinfra connect to ``address:port`` over a
    :class:`NoDelaySocket`, its channels opened within
    :data:`CHANNEL_TIMEOUT_SECONDS`, its SSH connection probed
    (:class:`ServerAlive`); where the operator's ssh_config reroutes the host,
    over pyinfra's own connection, with the same bounds of the channels and the
    connection.
    """
    bounded: dict[str, Any] = {"channel_timeout": CHANNEL_TIMEOUT_SECONDS,
                               "transport_factory": server_alive(address, ssh_config)}
    if not rerouted(address, ssh_config):
        bounded["sock"] = NoDelaySocket(address, port)
    return {"ssh_paramiko_connect_kwargs": bounded}
