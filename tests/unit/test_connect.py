"""
pyinfra's SSH connection with Nagle's algorithm off, opened only when paramiko
uses it, and bounded when it drops silently.
"""

from __future__ import annotations

import copy
import socket
import threading
from pathlib import Path
from types import SimpleNamespace

import paramiko
import pytest

from operations.connect import (
    CHANNEL_TIMEOUT_SECONDS,
    DEAD_AFTER_SECONDS,
    KEEPALIVE_IDLE_SECONDS,
    NoDelaySocket,
    connection_data,
    loss_aware_transport,
    lost,
    rerouted,
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
        # Only the channels' bound and the transport: the path and its socket are the
        # operator's.
        assert connection_data(address, 22, config) == {
            "ssh_paramiko_connect_kwargs": {"channel_timeout": CHANNEL_TIMEOUT_SECONDS,
                                            "transport_factory": loss_aware_transport}}
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
    transport = loss_aware_transport(ours)
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
