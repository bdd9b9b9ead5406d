"""
The proxy's front (gateway/front.py): its config, its service, and haproxy
sending again what a retiring worker closed unread.
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from operation_harness import run_operation
from test_gateway import PROXY, converged_gateway, with_older_file

from operations.gateway import proxy as gateway
from operations.gateway.front import BINARY, Front, front_service, render_config
from operations.gateway.proxy import wanted_routing

FRONT = PROXY.front


def test_the_front_is_named_and_placed_after_the_proxy_it_fronts() -> None:
    assert FRONT == Front(service="litellm-front", config_file="/etc/twinbolt/litellm-front.cfg",
                          listen_address="0.0.0.0", port=4000, backend_port=4100,
                          user="litellm", init_system="runit")
    assert front_service(FRONT).command == [BINARY, "-db", "-f", FRONT.config_file]
    assert front_service(FRONT).user == "litellm"


def test_the_front_listens_where_users_connect_and_sends_to_litellms_loopback() -> None:
    config = render_config(FRONT)
    assert "Rendered by twinbolt from templates/front.cfg.j2" in config
    assert "    bind 0.0.0.0:4000\n" in config
    assert "    server litellm 127.0.0.1:4100\n" in config
    # Only what never reached LiteLLM's router is sent again: never a timeout,
    # which may be a completion under way.
    assert "    retry-on conn-failure empty-response\n" in config


def test_a_changed_front_config_restarts_the_front_alone_and_is_waited_for() -> None:
    older_front = with_older_file(converged_gateway(True, wanted_routing(PROXY, True)),
                                  FRONT.config_file)
    commands = run_operation(gateway.proxy, older_front, proxy=PROXY, fallback=True)
    assert commands[0].startswith("upload ") and commands[0].endswith(f" {FRONT.config_file}")
    assert commands[-2:] == ["SVDIR=/etc/service sv restart litellm-front", "call wait_until"]
    # LiteLLM keeps its workers: its routing did not change.
    assert not any(command.endswith(" litellm") for command in commands)


# haproxy itself, on this machine's loopback


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class RetiringBackend:
    """
    A backend whose first connection is closed unread with a reset, as a
    worker retired by a reload closes one it accepted; every later one is
    answered 200 with the body it got.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            with connection:
                if self.connections == 1:
                    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                          struct.pack("ii", 1, 0))
                    continue
                request = connection.recv(65536)
                body = request.partition(b"\r\n\r\n")[2]
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
                                   b"Connection: close\r\n\r\n%s" % (len(body), body))

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def front_before(tmp_path: Path) -> Iterator[tuple[str, RetiringBackend]]:
    if not shutil.which(BINARY):
        pytest.skip(f"{BINARY} is not installed on this machine (make setup installs haproxy)")
    backend = RetiringBackend()
    front = dataclasses.replace(FRONT, listen_address="127.0.0.1", port=free_port(),
                                backend_port=backend.port,
                                config_file=str(tmp_path / "front.cfg"))
    Path(front.config_file).write_text(render_config(front))
    checked = subprocess.run([BINARY, "-c", "-f", front.config_file], capture_output=True,
                             text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    haproxy = subprocess.Popen(front_service(front).command, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{front.port}"
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", front.port), timeout=0.1).close()
                break
            except OSError:
                assert haproxy.poll() is None, haproxy.stderr.read()
                threading.Event().wait(0.05)
        yield url, backend
    finally:
        haproxy.terminate()
        haproxy.wait(timeout=10)
        backend.close()


def test_a_request_closed_unread_by_a_retiring_worker_is_answered_by_the_next(
        front_before: tuple[str, RetiringBackend]) -> None:
    url, backend = front_before
    answer = httpx.post(f"{url}/v1/chat/completions", content=b'{"model": "small"}', timeout=10)
    assert (answer.status_code, answer.content) == (200, b'{"model": "small"}')
    assert backend.connections == 2
