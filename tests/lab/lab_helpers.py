"""The lab tests' tools: SSH into a lab host, poll a condition, move TCP across the link."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from lab.modules import CANDIDATE
from lab.ssh import CLIENT_CONFIG
from lab.topology import PYTHON, REPO, host_named

TRANSFER_PORT = 5201
TRANSFER_SCRIPT = """
import socket, sys
mode, address, port, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if mode == "server":
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, port)); listener.listen(1); listener.settimeout(30)
    peer, _ = listener.accept(); got = 0
    while chunk := peer.recv(1 << 20):
        got += len(chunk)
    print(got)
else:
    sender = socket.create_connection((address, port), timeout=10)
    # Connected: a stall is the caller's to bound, as TCP would ride it out.
    sender.settimeout(None)
    block = b"x" * (1 << 20)
    for _ in range(size >> 20):
        sender.sendall(block)
    sender.close()
"""


def lab(*arguments: str, checkout: Path = REPO) -> subprocess.CompletedProcess[str]:
    """``python -m lab ARGUMENTS`` in ``checkout``, as an operator types it there."""
    return subprocess.run([str(checkout / ".venv" / "bin" / "python"), "-m", "lab", *arguments],
                          cwd=checkout, capture_output=True, text=True, timeout=120)


def ssh(host: str, command: str, check: bool = True,
        config: Path = CLIENT_CONFIG) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ssh", "-F", str(config), host, command],
                            capture_output=True, text=True, timeout=60)
    if check and result.returncode != 0:
        raise AssertionError(f"{host}: {command!r} failed: {result.stderr}")
    return result


def read(host: str, path: str) -> str:
    return ssh(host, f"cat {path}").stdout.strip()


def wait_until(condition: Callable[[], bool], timeout: float = 10.0,
               what: str = "condition") -> float:
    """Poll until true; return how long it took, fail the test after the bound."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"{what} not met within {timeout}s")
        time.sleep(0.05)
    return time.monotonic() - started


def carrier(host: str) -> bool:
    """False too while the interface does not exist (the driver unloaded)."""
    return "LOWER_UP" in ssh(host, "ip -br link show thunderbolt0", check=False).stdout


def linked(host: str) -> bool:
    """Carrier, and the address that a load takes away and the network manager applies."""
    shown = ssh(host, "ip -br addr show thunderbolt0", check=False).stdout
    return carrier(host) and f"{host_named(host).link_address}/" in shown


def counters(host: str) -> dict[str, int]:
    """Receiver errors and TCP retransmissions as the host itself shows them."""
    out = ssh(host, "cd /sys/class/net/thunderbolt0/statistics && cat rx_errors rx_bytes; "
                    "awk '/^Tcp:/ {v=$13} END {print v}' /proc/net/snmp").stdout.split()
    return {"rx_errors": int(out[0]), "rx_bytes": int(out[1]), "retrans": int(out[2])}


def listening(namespace: str, address: str, port: int) -> bool:
    """Whether a TCP socket listens on ``address:port`` in the host's network namespace."""
    out = subprocess.run(["ip", "netns", "exec", namespace, "ss", "-Hltn", f"sport = :{port}"],
                         capture_output=True, text=True, timeout=10).stdout
    return any(f"{address}:{port}" in line.split() for line in out.splitlines())


def transfer(size: int = 1 << 30, timeout: float = 30, listen_timeout: float = 10) -> int:
    """
    Send ``size`` bytes from wsa to wsb over thunderbolt0; return bytes received.

    The client connects only once the server's socket listens (read with ``ss``
    in wsb's namespace), within ``listen_timeout`` seconds; a server that exits
    first, or never listens, fails the test saying so, never as 0 bytes moved.
    """
    address = "169.254.77.2"
    server = subprocess.Popen(
        ["ip", "netns", "exec", "wsb", str(PYTHON), "-c", TRANSFER_SCRIPT, "server",
         address, str(TRANSFER_PORT), str(size)], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: server.poll() is not None
                   or listening("wsb", address, TRANSFER_PORT),
                   timeout=listen_timeout,
                   what=f"the transfer server listening on wsb {address}:{TRANSFER_PORT}")
        if server.poll() is not None:
            raise AssertionError(
                f"the transfer server on wsb exited ({server.returncode}) before listening on "
                f"{address}:{TRANSFER_PORT}: {server.stderr.read().strip()}")
        try:
            subprocess.run(["ip", "netns", "exec", "wsa", str(PYTHON), "-c", TRANSFER_SCRIPT,
                            "client", address, str(TRANSFER_PORT), str(size)], timeout=timeout,
                           check=False, capture_output=True)
            out, _ = server.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            return 0
        return int(out.strip() or 0)
    finally:
        server.kill()
        server.wait()


def load(host: str, driver: str, *parameters: str) -> None:
    """Swap the driver on one host the way an operator would by hand."""
    if driver == "candidate":
        ssh(host, "mkdir -p /run/twinbolt")
        subprocess.run(["scp", "-q", "-F", str(CLIENT_CONFIG), str(CANDIDATE),
                        f"{host}:/run/twinbolt/thunderbolt_net.ko"], check=True)
        ssh(host, f"rmmod thunderbolt_net; insmod /run/twinbolt/thunderbolt_net.ko "
                  f"{' '.join(parameters)}")
    else:
        ssh(host, f"rmmod thunderbolt_net; modprobe thunderbolt_net {' '.join(parameters)}")
