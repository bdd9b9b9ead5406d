"""
pyinfra's SSH connection with Nagle's algorithm off, opened only when paramiko
uses it, and bounded when it drops silently.
"""

from __future__ import annotations

import copy
import errno
import shlex
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import paramiko
import pytest
from pyinfra.connectors.sshuserclient import SSHClient

from operations.plumbing.connect import (
    CHANNEL_TIMEOUT_SECONDS,
    DEAD_AFTER_SECONDS,
    KEEPALIVE_IDLE_SECONDS,
    SERVER_ALIVE_COUNT_MAX,
    SERVER_ALIVE_DEAD_AFTER_SECONDS,
    SERVER_ALIVE_INTERVAL_SECONDS,
    NoDelaySocket,
    ServerAlive,
    ServerAliveTransport,
    connection_data,
    lost,
    rerouted,
    still_answers,
)


@pytest.fixture
def listener():
    """A loopback TCP listener that accepts connections and counts them."""
    server = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    yield server.getsockname()[1], accepted
    server.close()
    for connection in accepted:
        connection.close()


def test_nothing_connects_until_the_socket_is_used(listener) -> None:
    port, accepted = listener
    lazy = NoDelaySocket("127.0.0.1", port)
    copy.deepcopy(lazy)  # pyinfra may copy host data: special names must not connect
    repr(lazy)
    assert lazy.to_json() == f"tcp://127.0.0.1:{port} with TCP_NODELAY"
    assert lazy._socket is None
    assert accepted == []


def test_first_use_connects_once_with_nagle_off(listener) -> None:
    port, _ = listener
    lazy = NoDelaySocket("127.0.0.1", port)
    lazy.settimeout(0.1)  # paramiko's first call on a socket it is given
    assert lazy.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 1
    assert lazy.getpeername() == ("127.0.0.1", port)
    first = lazy._socket
    lazy.sendall(b"SSH-2.0-test\r\n")
    assert lazy._socket is first
    lazy.close()


def test_a_refused_connection_raises_and_the_next_use_tries_again() -> None:
    closed = socket.create_server(("127.0.0.1", 0))
    refused_port = closed.getsockname()[1]
    closed.close()
    lazy = NoDelaySocket("127.0.0.1", refused_port, timeout=1)
    with pytest.raises(OSError):
        lazy.settimeout(0.1)
    assert lazy._socket is None  # pyinfra's ssh_connect_retries get a fresh attempt


def test_a_host_the_operators_ssh_config_reroutes_keeps_pyinfras_connection(
        tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host jumped\n    ProxyJump bastion\nHost renamed\n    HostName 10.0.0.9\n"
                      "Host moved\n    Port 2222\nHost *\n    ServerAliveInterval 30\n")
    for address in ("jumped", "renamed", "moved"):
        assert rerouted(address, config)
        # The channels' and the connection's bounds: the path and its socket are the
        # operator's, and so is the probe's interval (Host *: ServerAliveInterval 30).
        assert connection_data(address, 22, config) == {
            "ssh_paramiko_connect_kwargs": {"channel_timeout": CHANNEL_TIMEOUT_SECONDS,
                                            "transport_factory": ServerAlive(30, 3)}}
    assert not rerouted("10.66.0.11", config)
    plain = connection_data("10.66.0.11", 22, config)["ssh_paramiko_connect_kwargs"]["sock"]
    assert (plain.address, plain.port) == ("10.66.0.11", 22)
    assert not rerouted("10.66.0.11", tmp_path / "absent")


def test_a_connection_that_drops_silently_is_given_up_on_by_the_kernel(listener) -> None:
    port, _ = listener
    lazy = NoDelaySocket("127.0.0.1", port)
    assert lazy.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
    assert lazy.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == KEEPALIVE_IDLE_SECONDS
    assert (lazy.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT)
            == DEAD_AFTER_SECONDS * 1000)
    lazy.close()


def test_pyinfras_channels_open_within_a_bound_not_paramikos_hour() -> None:
    kwargs = connection_data("10.66.0.11", 22, Path("/nonexistent"))["ssh_paramiko_connect_kwargs"]
    assert kwargs["channel_timeout"] == CHANNEL_TIMEOUT_SECONDS


def test_a_connection_closed_under_the_transport_fails_a_command_as_pyinfra_handles_it() -> None:
    """
    A rebooted host's kernel closes the connection: paramiko's reader thread
    meets an EOFError, which pyinfra does not catch; the transport reports it
    as the SSHException pyinfra fails the command with.
    """
    ours, theirs = socket.socketpair()
    transport = ServerAlive()(ours)
    transport.saved_exception = EOFError()
    error = transport.get_exception()
    assert isinstance(error, paramiko.SSHException)
    assert "closed by the other end" in str(error)
    # Any other error is reported as paramiko met it.
    transport.saved_exception = TimeoutError("timed out")
    assert isinstance(transport.get_exception(), TimeoutError)
    transport.close()
    theirs.close()


def test_a_host_is_lost_once_its_transport_has_died_and_never_before_it_connects() -> None:
    def host_with(transport: object) -> SimpleNamespace:
        client = SimpleNamespace(get_transport=lambda: transport)
        return SimpleNamespace(connector=SimpleNamespace(client=client))

    assert not lost(SimpleNamespace(connector=None))
    assert not lost(host_with(None))
    assert not lost(host_with(SimpleNamespace(is_active=lambda: True)))
    assert lost(host_with(SimpleNamespace(is_active=lambda: False)))


def test_every_connection_is_probed_by_default_and_the_probe_shows_in_the_inventory() -> None:
    kwargs = connection_data("10.66.0.11", 22, Path("/nonexistent"))["ssh_paramiko_connect_kwargs"]
    probe = kwargs["transport_factory"]
    assert probe == ServerAlive(SERVER_ALIVE_INTERVAL_SECONDS, SERVER_ALIVE_COUNT_MAX)
    assert copy.deepcopy(probe) == probe
    assert probe.to_json() == "SSH keepalive each 10s, given up after 3 unanswered"
    # A dead path: three probes unanswered, then the fourth interval ends it.
    assert SERVER_ALIVE_DEAD_AFTER_SECONDS == 40


def test_an_ssh_configs_server_alive_is_honoured_but_not_turned_off(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("Host tuned\n    ServerAliveInterval 4\n    ServerAliveCountMax 6\n"
                      "Host off\n    ServerAliveInterval 0\n    ServerAliveCountMax 0\n")
    probe = connection_data("tuned", 22, config)["ssh_paramiko_connect_kwargs"]
    assert probe["transport_factory"] == ServerAlive(4, 6)
    assert "sock" in probe  # no rerouting keyword: twinbolt's own socket as well
    assert (connection_data("off", 22, config)["ssh_paramiko_connect_kwargs"]["transport_factory"]
            == ServerAlive())


class Accepting(paramiko.ServerInterface):
    """An sshd that lets anyone in and starts any command, which then never ends."""

    def get_allowed_auths(self, username: str) -> str:
        return "password"

    def check_auth_password(self, username: str, password: str) -> int:
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel: paramiko.Channel, command: bytes) -> bool:
        return True


# The operator's ProxyCommand: a process that relays its stdin and stdout to the
# server, joined to paramiko by pipes, as `ssh -W` or `nc` is.
RELAY = """
import os, socket, sys, threading
server = socket.create_connection((sys.argv[1], int(sys.argv[2])))
def up():
    while data := os.read(0, 65536):
        server.sendall(data)
threading.Thread(target=up, daemon=True).start()
while data := server.recv(65536):
    os.write(1, data)
"""


@pytest.fixture
def sshd():
    """An SSH server on loopback (paramiko's, in this process); yields its port."""
    listening = socket.create_server(("127.0.0.1", 0))
    key = paramiko.ECDSAKey.generate()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        while True:
            try:
                connection, _ = listening.accept()
            except OSError:
                return
            transport = paramiko.Transport(connection)
            transport.add_server_key(key)
            transport.start_server(server=Accepting())
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    yield listening.getsockname()[1]
    listening.close()
    for transport in transports:
        transport.close()


def connect_through_a_proxy_command(tmp_path: Path, port: int,
                                    interval: int = 1) -> paramiko.SSHClient:
    """
    Connect as pyinfra does to a host the operator's ssh_config reaches through a
    ProxyCommand, probed each ``interval`` seconds and given up on after one
    unanswered probe.
    """
    relay = tmp_path / "relay.py"
    relay.write_text(RELAY)
    config = tmp_path / "ssh_config"
    proxy = shlex.join([sys.executable, str(relay), "127.0.0.1", str(port)])
    config.write_text(
        f"Host behind-a-proxy\n    HostName 127.0.0.1\n    Port {port}\n"
        f"    ProxyCommand {proxy}\n    ServerAliveInterval {interval}\n"
        "    ServerAliveCountMax 1\n")
    assert rerouted("behind-a-proxy", config)
    (tmp_path / "known_hosts").touch()
    client = SSHClient()
    client.connect(
        "behind-a-proxy", username="operator", password="secret", allow_agent=False,
        look_for_keys=False, _pyinfra_ssh_config_file=str(config),
        _pyinfra_ssh_known_hosts_file=str(tmp_path / "known_hosts"),
        _pyinfra_ssh_strict_host_key_checking="no",
        _pyinfra_ssh_paramiko_connect_kwargs=connection_data(
            "behind-a-proxy", 22, config)["ssh_paramiko_connect_kwargs"])
    return client


def given_up_within(transport: paramiko.Transport, seconds: float) -> float:
    started = time.monotonic()
    while transport.is_active() and time.monotonic() - started < seconds:
        time.sleep(0.05)
    return time.monotonic() - started


def test_a_proxy_command_path_that_goes_silent_is_given_up_on_by_the_ssh_keepalive(
        tmp_path: Path, sshd: int) -> None:
    client = connect_through_a_proxy_command(tmp_path, sshd)
    transport = client.get_transport()
    # pyinfra's own socket for the host, the operator's proxy; twinbolt's transport on it.
    assert isinstance(transport.sock, paramiko.ProxyCommand)
    assert isinstance(transport, ServerAliveTransport)
    assert (transport.keepalive_interval, transport.count_max) == (1, 1)
    proxy = transport.sock.process
    try:
        # A live path answers its probes: idle past the bound, it is still up.
        time.sleep(2.5)
        assert transport.is_active() and transport.unanswered <= 1
        command = transport.open_session()
        command.exec_command("sleep 3600")
        # The path goes silent (a jump host suspended): the pipes stay open, and no
        # TCP timeout can apply to them.
        proxy.send_signal(signal.SIGSTOP)
        assert given_up_within(transport, 10) < 3.5
        assert isinstance(transport.saved_exception, TimeoutError)
        assert transport.saved_exception.errno == errno.ETIMEDOUT
        assert "answered none of 1 keepalives" in str(transport.saved_exception)
        # The command's wait ends, with no exit status: pyinfra's step fails.
        assert command.status_event.wait(1) and command.exit_status == -1
    finally:
        proxy.send_signal(signal.SIGCONT)
        proxy.kill()
        proxy.wait()
        client.close()


def test_a_proxy_command_that_exits_is_given_up_on(tmp_path: Path, sshd: int) -> None:
    # paramiko reads a proxy's closed pipe as "no data yet"; the probe finds it gone.
    client = connect_through_a_proxy_command(tmp_path, sshd)
    transport = client.get_transport()
    transport.sock.process.kill()
    try:
        assert given_up_within(transport, 10) < 3.5
    finally:
        transport.sock.process.wait()
        client.close()


def test_a_failed_command_on_a_path_gone_silent_finds_the_host_lost_before_the_keepalives_do(
        tmp_path: Path, sshd: int) -> None:
    """
    A command's own bound may end it before the keepalives give a silent path
    up: asked then, a live host answers at once, and one behind a path gone
    silent does not, within the bound asked; its connection is closed, so the
    run counts it as lost, never as a host its rollback can reach.
    """
    client = connect_through_a_proxy_command(tmp_path, sshd, interval=600)
    host = SimpleNamespace(connector=SimpleNamespace(client=client))
    proxy = client.get_transport().sock.process
    try:
        started = time.monotonic()
        assert still_answers(host, timeout=5) and not lost(host)
        assert time.monotonic() - started < 1
        proxy.send_signal(signal.SIGSTOP)
        started = time.monotonic()
        assert not still_answers(host, timeout=1)
        assert 1 <= time.monotonic() - started < 2
        assert lost(host)
    finally:
        proxy.send_signal(signal.SIGCONT)
        proxy.kill()
        proxy.wait()
        client.close()
