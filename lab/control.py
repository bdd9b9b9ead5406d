"""Bring the lab up, take it down, and say how it is.

``up`` is idempotent: a healthy lab is left alone; a stale one (namespaces that
survived while their processes did not, as after a session ends) is torn down
and rebuilt. ``down`` removes every namespace, link, process and rule the lab
made, by pid and by name, and succeeds on a half-built lab.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from lab import cable, cgroups, faults, hostfs, hostinit, listing, modules, network, ssh
from lab.network import in_host
from lab.topology import (
    BRIDGE,
    CABLE,
    EVERY_HOST,
    GATEWAY,
    INIT_FILE,
    LINK_INTERFACE,
    MODULE_NAME,
    OWNER_FILE,
    PAIRS,
    PAIRS_FILE,
    PYTHON,
    REPO,
    STATE,
    LabError,
    LabHost,
    alive,
    host_named,
    hosts,
    init_system,
    lab_pairs,
    owner,
    pair_count,
    pair_of,
    pid_file,
    read_pid,
    workstations,
)

REQUIRED_TOOLS = ("ip", "nsenter", "unshare", "iptables", "tc", "/usr/sbin/sshd", "ssh",
                  "ssh-keygen", "/lib/systemd/systemd", "runsvdir", "sv", "modinfo", "depmod",
                  "readelf", "objcopy", "gcc", "ld", "zstd")
LOGS = STATE / "logs"
# The lab kernel's own output (lab/kernel.py), not a host's /var/log/kern.log.
LAB_KERNEL_LOG = LOGS / "kernel.log"
# How much of a host's log a boot failure quotes.
BOOT_LOG_LINES = 8
KERNEL_MODULE = ["-m", "lab.kernel"]


def say(message: str) -> None:
    print(f"lab: {message}", flush=True)


def wait_for(what: str, condition: Callable[[], bool], timeout: float) -> None:
    """Poll a condition with a bound; no fixed sleeps anywhere in the lab."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise LabError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


def missing_tools() -> list[str]:
    return [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]


def processes(of: tuple[LabHost, ...] | None = None) -> list[str]:
    """The pid files' names: each host's first process (the lab's, or ``of`` these), the kernel."""
    return [f"host-{host.name}" for host in (of or hosts())] + ["kernel"]


def healthy() -> bool:
    return (all(read_pid(name) for name in processes()) and network.netns_exists(CABLE)
            and all(network.netns_exists(host.name) and private_mounts_in_place(host)
                    for host in hosts()))


def private_mounts_in_place(host: LabHost) -> bool:
    """
    Whether the host still sees its own accounts over the machine's. A package
    installed on the machine may add a system user (``adduser`` renames a new
    ``/etc/passwd`` over the old), and the kernel then detaches every mount on
    the old file in the hosts' namespaces: the lab's operator account is gone,
    and SSH as it fails. Such a lab is not up, whatever its processes say.
    """
    pid = read_pid(f"host-{host.name}")
    try:
        mountinfo = Path(f"/proc/{pid}/mountinfo").read_text() if pid else ""
    except FileNotFoundError:
        return False
    points = {line.split()[4] for line in mountinfo.splitlines()}
    return all(f"/etc/{name}" in points for name in hostfs.OPERATOR_ACCOUNT)


def has_remnants() -> bool:
    """Anything any lab makes, whatever pairs it had: its record of them may be gone."""
    return (
        any(network.netns_exists(host.name) for host in EVERY_HOST)
        or network.netns_exists(CABLE)
        or any(network.netns_exists(network.parking(host))
               for host in EVERY_HOST if host.workstation)
        or network.link_exists(BRIDGE)
        or any(pid_file(name).exists() for name in processes(EVERY_HOST))
    )


def spawn(name: str, command: list[str]) -> int:
    LOGS.mkdir(parents=True, exist_ok=True)
    with (LOGS / f"{name}.log").open("ab") as log:
        process = subprocess.Popen(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": str(REPO)}, start_new_session=True,
        )
    pid_file(name).parent.mkdir(parents=True, exist_ok=True)
    pid_file(name).write_text(str(process.pid))
    return process.pid


def boot_log(host: LabHost) -> Path:
    return LOGS / f"host-{host.name}.log"


def last_boot(host: LabHost) -> list[str]:
    """The lines the host's latest boot wrote to its log (the log spans every boot)."""
    try:
        lines = boot_log(host).read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return []
    starts = [index for index, line in enumerate(lines) if line.startswith(hostinit.BOOTING)]
    return lines[starts[-1]:] if starts else lines


def boot_failure(host: LabHost, what: str) -> LabError:
    """One message for a host that did not boot: the step, the log's end, the log's path."""
    lines = last_boot(host)
    failed = [line for line in lines if line.startswith(hostinit.BOOT_FAILED)]
    step = failed[-1].removeprefix(hostinit.BOOT_FAILED).strip() if failed else what
    tail = "\n".join(f"    {line}" for line in lines[-BOOT_LOG_LINES:]) or "    (empty)"
    return LabError(f"{host.name} did not boot: {step}\n  the end of its log:\n{tail}\n"
                    f"  the whole log: {boot_log(host)}\n"
                    "  once that is mended, `python -m lab up` rebuilds the lab")


def wait_for_boot(host: LabHost, timeout: float = 10) -> None:
    """
    Wait for the host's sshd; fail as soon as the host's first process has died,
    with what its log says, rather than when the timeout runs out.
    """
    deadline = time.monotonic() + timeout
    while not sshd_answers(host):
        if read_pid(f"host-{host.name}") is None:
            raise boot_failure(host, "its init exited")
        if time.monotonic() > deadline:
            raise boot_failure(host, f"sshd did not answer on {host.management_address}:22 "
                                     f"within {timeout:g}s")
        time.sleep(0.05)


def sshd_answers(host: LabHost) -> bool:
    try:
        with socket.create_connection((host.management_address, 22), timeout=0.5) as sock:
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def carrier(host: LabHost) -> bool:
    out = network.in_netns(host.name, "ip", "-br", "link", "show", LINK_INTERFACE,
                           check=False).stdout
    return "LOWER_UP" in out or " UP " in out


def addressed(host: LabHost) -> bool:
    """Whether the network manager has given ``thunderbolt0`` its address since it came up."""
    out = network.in_netns(host.name, "ip", "-br", "addr", "show", LINK_INTERFACE,
                           check=False).stdout
    return f"{host.link_address}/" in out


def boot_host(host: LabHost) -> None:
    # systemd is PID 1 of the host's own PID namespace, which dies with it: the
    # recorded pid is unshare's, and --kill-child takes the host down with it.
    pid_namespace = (["--pid", "--fork", "--mount-proc", "--kill-child"]
                     if init_system() == "systemd" else [])
    spawn(f"host-{host.name}", [
        "ip", "netns", "exec", host.name, "unshare", "--mount", "--uts", *pid_namespace,
        "--propagation", "private", str(PYTHON), "-m", "lab.hostinit", host.name,
    ])


def up(init: str | None = None, pairs: int = 1) -> None:
    """
    Bring the lab up with ``pairs`` pairs behind one gateway, its hosts booting
    ``init`` (by default what they boot now, or systemd).
    """
    missing = missing_tools()
    if missing:
        raise LabError(f"missing tools: {', '.join(missing)}; run `make setup`")
    if not 1 <= pairs <= len(PAIRS):
        raise LabError(f"the lab builds 1 to {len(PAIRS)} pairs, not {pairs}")
    # The operator's side: a lab brought up before the servers had keys gets them too.
    ssh.sglang_keys()
    if healthy() and init in (None, init_system()) and pairs == pair_count():
        # A lab brought up before the inventory read its listing gets one.
        listing.write()
        say(f"already up ({described()}); nothing changed")
        return
    started = time.monotonic()
    if has_remnants():
        say("found a stale lab (namespaces without their processes, or hosts whose private "
            "files were unmounted) or one booting another init system or pair count: "
            "rebuilding")
        down(quiet=True)
    INIT_FILE.parent.mkdir(parents=True, exist_ok=True)
    INIT_FILE.write_text(f"{init or init_system()}\n")
    PAIRS_FILE.write_text(f"{pairs}\n")
    modules.build_all()
    # The inventory's hosts: the pairs recorded above, the candidate's checksum just built.
    listing.write()
    ssh.prepare()
    for host in hosts():
        hostfs.prepare(host)
    network.create(lab_pairs(), GATEWAY)
    for host in hosts():
        boot_host(host)
    for host in hosts():
        wait_for_boot(host)
    for host in workstations():
        boot_workstation_driver(host)
    spawn("kernel", [str(PYTHON), *KERNEL_MODULE])
    OWNER_FILE.parent.mkdir(parents=True, exist_ok=True)
    OWNER_FILE.write_text(f"{STATE}\n")
    wait_until_linked("after the boot", workstations())
    say(f"up ({described()}) in {time.monotonic() - started:.1f}s; "
        f"ssh -F {shlex.quote(str(ssh.CLIENT_CONFIG))} wsa")


def described() -> str:
    """The lab's init system and pairs, as ``up`` and ``status`` name them."""
    count = pair_count()
    return f"{init_system()}, {count} pair{'s' if count > 1 else ''}"


def boot_workstation_driver(host: LabHost) -> None:
    """What a workstation's boot does: load the distribution's driver."""
    loaded = in_host(host, "/usr/local/sbin/modprobe", MODULE_NAME)
    if loaded.returncode != 0:
        raise LabError(f"{host.name}: modprobe {MODULE_NAME} failed: {loaded.stderr}")


def reboot(name: str) -> None:
    """
    What a reboot does to one host: every process of it gone, ``/run`` empty (a
    staged candidate, the lock, the GPU's holders), the module state lost and
    the distribution's driver loaded at boot, then the enabled services started
    by its init system. Its files on disk (units, run scripts, configs) stay.
    """
    if not healthy():
        raise LabError("the lab is not up; run `python -m lab up`")
    host = host_named(name)
    started = time.monotonic()
    cut_power(host)
    stop_pids(network.netns_pids(host.name))
    pid_file(f"host-{host.name}").unlink(missing_ok=True)
    if host.workstation:
        shutil.rmtree(host.root / "sys-module" / MODULE_NAME, ignore_errors=True)
    boot_host(host)
    wait_for_boot(host)
    if host.workstation:
        boot_workstation_driver(host)
    say(f"{host.name} rebooted in {time.monotonic() - started:.1f}s")


def workstation(name: str) -> LabHost:
    """A workstation of a lab that is up: the cable's ends, the hosts that sleep."""
    if not healthy():
        raise LabError("the lab is not up; run `python -m lab up`")
    host = host_named(name)
    if host not in workstations():
        raise LabError(f"{name} has no Thunderbolt link in this lab; name a workstation: "
                       f"{', '.join(ws.name for ws in workstations())}")
    return host


def unplug(name: str) -> None:
    """
    Pull its pair's cable out of a workstation (``lab/cable.py``): the link goes
    on both of the pair's sides, and the other pairs' stay.
    """
    host = workstation(name)
    pair = pair_of(host)
    if not cable.read(pair.name).plugged:
        raise LabError(f"pair {pair.name}'s cable is already unplugged "
                       f"(from {cable.read(pair.name).unplugged_from})")
    started = time.monotonic()
    cable.unplug(host)
    wait_on_link(f"{LINK_INTERFACE} gone on both of pair {pair.name}'s workstations",
                 lambda: not any(LINK_INTERFACE in kernel_devices(ws)
                                 for ws in pair.workstations))
    say(f"cable unplugged from {host.name}: {LINK_INTERFACE} gone on both sides in "
        f"{time.monotonic() - started:.1f}s")


def plug(name: str, rate_gbps: float) -> None:
    """Put its pair's cable back: the link trains at ``rate_gbps``, a new device on each side."""
    host = workstation(name)
    pair = pair_of(host)
    if cable.read(pair.name).plugged:
        raise LabError(f"pair {pair.name}'s cable is already plugged in; "
                       "`python -m lab unplug` it first")
    started = time.monotonic()
    try:
        cable.plug(host, rate_gbps)
    except ValueError as error:
        raise LabError(str(error)) from None
    wait_until_linked("after the plug", pair.workstations)
    say(f"cable plugged into {host.name}: the link trained at {rate_gbps:g} Gb/s, "
        f"{LINK_INTERFACE} up on both sides in {time.monotonic() - started:.1f}s")


def suspend(name: str, seconds: float) -> None:
    """Sleep a workstation for ``seconds``, as ``rtcwake -m mem -s N``; return once it woke."""
    host = workstation(name)
    if seconds <= 0:
        raise LabError(f"--seconds must be positive, not {seconds:g}")
    slept = cable.suspend(host, seconds)
    started = time.monotonic()
    wait_until_linked("after the wake", pair_of(host).workstations)
    say(f"{host.name} slept {slept:.1f}s and woke; the link retrained in "
        f"{time.monotonic() - started:.1f}s")


def kernel_devices(host: LabHost) -> list[str]:
    """The network devices a host sees."""
    out = network.in_netns(host.name, "ip", "-br", "link", "show", check=False).stdout
    return [line.split("@")[0].split()[0] for line in out.splitlines() if line.strip()]


def wait_on_link(what: str, condition: Callable[[], bool]) -> None:
    """
    Wait for the link to change, which only the lab kernel makes it do: the wait
    ends at once, saying so, when the kernel is gone, instead of timing out on a
    carrier nothing will raise, or passing on the devices a dead kernel left.
    """
    def kernel_moved_it() -> bool:
        if read_pid("kernel") is None:
            raise LabError(f"the lab kernel is not running (its log: {LAB_KERNEL_LOG}); "
                           "run `python -m lab up`")
        return condition()

    wait_for(what, kernel_moved_it, timeout=10)


def wait_until_linked(when: str, linked: tuple[LabHost, ...]) -> None:
    """Carrier on each of ``linked``, and the address where a network manager applies it."""
    for host in linked:
        if faults.is_on("no_network_manager", host.name):
            wait_on_link(f"{LINK_INTERFACE} carrier on {host.name} {when}",
                         lambda host=host: carrier(host))
        else:
            wait_on_link(f"{LINK_INTERFACE} carrier and address on {host.name} {when}",
                         lambda host=host: carrier(host) and addressed(host))


def cut_power(host: LabHost) -> None:
    """
    What pulling the plug does to a systemd host: its PID 1 ignores SIGTERM, and
    so does unshare, waiting on it. KILL unshare, and --kill-child takes PID 1
    and with it every process of the host's PID namespace.
    """
    pid = read_pid(f"host-{host.name}")
    if pid is not None and init_system() == "systemd":
        os.kill(pid, signal.SIGKILL)


def stop_pids(pids: list[int], timeout: float = 3.0) -> None:
    """TERM, then KILL what is left: only the pids given, never by name."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while pids and time.monotonic() < deadline:
        pids = [pid for pid in pids if alive(pid)]
        time.sleep(0.05)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def another_checkouts_kernel() -> int | None:
    """
    The lab kernel another checkout started, by its pid file, if it still runs
    as one: a pid alone may since name another process. A host's processes are
    found by its namespace whoever started them; the kernel runs outside.
    """
    state = owner()
    if state is None or state == STATE:
        return None
    pid = read_pid("kernel", state)
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1] if pid else []
    except FileNotFoundError:
        return None
    return pid if [arg.decode() for arg in argv[1:]] == KERNEL_MODULE else None


def down(quiet: bool = False) -> None:
    """
    Remove everything any lab makes, whatever pairs its record says it has: a
    session's processes die before CI, its namespaces survive, and the record
    may be gone or name fewer pairs than the namespaces left.
    """
    started = time.monotonic()
    removed = []
    pids = [pid for pid in (read_pid(name) for name in processes(EVERY_HOST)) if pid]
    if (foreign := another_checkouts_kernel()) is not None:
        pids.append(foreign)
    for host in EVERY_HOST:
        pids += network.netns_pids(host.name)
        cut_power(host)
    stop_pids(sorted(set(pids)))
    if pids:
        removed.append(f"{len(set(pids))} processes")
    removed += cgroups.remove([cgroups.cgroup_name(host) for host in EVERY_HOST])
    removed += network.destroy()
    for name in processes(EVERY_HOST):
        pid_file(name).unlink(missing_ok=True)
    # A lab brought up again boots systemd, one pair, unless asked otherwise.
    INIT_FILE.unlink(missing_ok=True)
    PAIRS_FILE.unlink(missing_ok=True)
    # The inventory lists the lab `up` would build again: one pair.
    listing.write()
    OWNER_FILE.unlink(missing_ok=True)
    faults.clear()
    cable.forget()
    if not quiet:
        what = ", ".join(removed) if removed else "nothing to remove"
        say(f"down in {time.monotonic() - started:.1f}s ({what})")


def loaded_driver(host: LabHost) -> str:
    """Which of the lab's builds is loaded, by build-id, as twinbolt itself checks it."""
    note = host.root / "sys-module" / MODULE_NAME / "notes" / ".note.gnu.build-id"
    if not note.exists():
        return "none"
    loaded = note.read_bytes()[16:].hex()
    for name, path in (("stock", modules.STOCK), ("candidate", modules.CANDIDATE)):
        if modules.build_id(path) == loaded:
            parameters = host.root / "sys-module" / MODULE_NAME / "parameters"
            flags = ",".join(
                f"{p.name}={p.read_text().strip()}" for p in sorted(parameters.iterdir())
            )
            return f"{name} ({flags})"
    return f"unknown build-id {loaded}"


def status() -> bool:
    """Print each pair (its cable, its hosts), then the gateway; return whether the lab is up."""
    is_up = healthy()
    say(f"{'up' if is_up else 'down'} ({described()}); state in {STATE}")
    if (state := owner()) not in (None, STATE):
        say(f"  the lab was last brought up from {state}; `up` here rebuilds it as this "
            "checkout's")
    for pair in lab_pairs():
        wire = cable.read(pair.name)
        say(f"  pair {pair.name}: cable plugged, trains at {wire.rate_gbps:g} Gb/s"
            if wire.plugged else f"  pair {pair.name}: cable unplugged from {wire.unplugged_from}")
        for host in pair.workstations:
            say(f"  {host_line(host)}")
    say(host_line(GATEWAY))
    kernel = read_pid("kernel")
    say(f"  kernel: ticking (pid {kernel})" if kernel
        else f"  kernel: not running (its log: {LAB_KERNEL_LOG})")
    asleep = cable.suspended()
    if asleep:
        say(f"  asleep: {', '.join(asleep)}")
    say(f"  faults: {', '.join(faults.described()) or 'none'}")
    return is_up


def host_line(host: LabHost) -> str:
    """One host's line of ``status``: its address, its sshd, a workstation's link and driver."""
    running = read_pid(f"host-{host.name}") is not None
    sshd = "up" if running and sshd_answers(host) else "down"
    line = f"  {host.name:4} {host.management_address:11}  sshd {sshd}"
    if host.workstation and running:
        link = "carrier" if carrier(host) else "no carrier"
        line += f"  {LINK_INTERFACE} {host.link_address} {link}  driver {loaded_driver(host)}"
    return line
