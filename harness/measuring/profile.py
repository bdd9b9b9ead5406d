"""
The workstations' side of the ``profile`` window: SGLang's own profiler on
every server, the TP sockets' retransmissions sampled while it records, the
traces fetched from both ranks, and NCCL's own account of its transport.

SGLang's ``/start_profile`` takes the trace directory (``output_dir``) and
reaches every TP rank's scheduler; ``/stop_profile`` answers once each rank
has written ``<profile_id>-TP-<rank>.trace.json.gz`` there, on its own host
(``scheduler_profiler_mixin.py``, 0.5.9 and 0.5.23). The window names a new
directory under ``/tmp`` (SGLang's own default, and no unit of twinbolt's has
``PrivateTmp=``), fetches every trace in it from each workstation over SSH,
and removes it.

A stall is matched with the retransmissions that caused it by time: each
workstation's TP sockets (``ss -tin`` to the peer's link address, the serving
layer's reading of them) are read every :data:`SAMPLE_SECONDS` with the host's
wall clock, the clock its ranks' traces count from.
"""

from __future__ import annotations

import asyncio
import base64
import re
import shlex
import uuid
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from harness.hosts import remote
from harness.hosts.topology import Topology
from harness.judging.disturbance import counted
from harness.measuring import traces
from operations.serving import reading as serving_reading
from operations.serving.transport import PeerSockets
from operations.states import State

PROFILE = "profile"
SAMPLE_SECONDS = 0.05
# How long a stopped sampler's last output may take to arrive.
DRAIN_SECONDS = 1.0
SAMPLE_MARK = "@ "
# Ends each sample: one cut short by the stop is left out, never read as fewer sockets.
SAMPLE_END = "."
TRACE_SUFFIX = ".trace.json.gz"
TRACE_MARK = "== "
# Where each window's traces go, one new directory each, removed once fetched.
TRACE_ROOT = "/tmp/twinbolt-profile-"


def trace_directory() -> str:
    return f"{TRACE_ROOT}{uuid.uuid4().hex}"


def start_body(directory: str) -> dict[str, Any]:
    """
    ``/start_profile``'s body: the GPU's kernels alone, into ``directory``. No
    CPU activity, stacks or shapes (on by default): the reader needs none, and
    each costs the profiled request time and the trace size.
    """
    return {"output_dir": directory, "activities": ["GPU"], "with_stack": False,
            "record_shapes": False}


def sampler_script(sockets: list[remote.Query], seconds: float) -> str:
    """
    Every :data:`SAMPLE_SECONDS`, for at most ``seconds``: the time, then the TP
    sockets (the serving layer's reading of them, :func:`serving_reading.sockets`).
    """
    rounds = int(seconds / SAMPLE_SECONDS) + 1
    sockets = "; ".join(query.command() for query in sockets)
    return (f"i=0; while [ $i -lt {rounds} ]; do echo \"{SAMPLE_MARK}$(date +%s%N)\"; "
            f"{sockets}; echo {SAMPLE_END}; sleep {SAMPLE_SECONDS}; i=$((i + 1)); done")


def parse_samples(output: str) -> list[tuple[int, int]]:
    """``(wall-clock ns, the TP sockets' total retransmissions)`` per whole sample."""
    samples, at, lines = [], None, []
    for line in output.splitlines():
        if line.startswith(SAMPLE_MARK):
            at, lines = int(line.removeprefix(SAMPLE_MARK)), []
        elif line == SAMPLE_END and at is not None:
            samples.append((at, sum(counters["retrans"]
                                    for counters in PeerSockets().process(lines).values())))
            at = None
        elif at is not None:
            lines.append(line)
    return samples


def fetch_script(directory: str) -> str:
    """Every trace in ``directory``, base64 after its name, then the directory removed."""
    quoted = shlex.quote(directory)
    return (f"for f in {quoted}/*{TRACE_SUFFIX}; do [ -e \"$f\" ] || continue; "
            f"echo \"{TRACE_MARK}${{f##*/}}\"; base64 -w0 \"$f\"; echo; done; rm -rf {quoted}")


def parse_fetched(output: str) -> dict[str, bytes]:
    """The fetched traces by file name."""
    found, name = {}, None
    for line in output.splitlines():
        if line.startswith(TRACE_MARK):
            name = line.removeprefix(TRACE_MARK)
        elif name:
            found[name] = base64.b64decode(line)
            name = None
    return found


@dataclass
class Sampler:
    """
    One workstation's TP sockets (the serving layer's reading of them), sampled
    from :meth:`start` until :meth:`stop`, for ``seconds`` at the most.
    """

    host: str
    sudo: bool
    sockets: list[remote.Query]
    ssh_config: Path
    seconds: float
    _process: asyncio.subprocess.Process | None = None
    _reader: asyncio.Task[None] | None = None
    _output: bytearray = field(default_factory=bytearray)

    async def start(self) -> None:
        """Start sampling; return once the first sample's time has come (SSH is connected)."""
        command = remote.remote_command(sampler_script(self.sockets, self.seconds), self.sudo)
        self._process = await asyncio.create_subprocess_exec(
            *remote.ssh_argv(self.host, command, self.ssh_config),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL)
        try:
            self._output += await asyncio.wait_for(self._process.stdout.readline(),
                                                   remote.SSH_TIMEOUT_SECONDS)
        except TimeoutError:
            pass
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while chunk := await self._process.stdout.read(1 << 16):
            self._output += chunk

    async def stop(self) -> list[tuple[int, int]]:
        """
        The samples so far. Ending ``ssh`` closes the channel: the remote loop
        ends at its next write. What is still on its way is read for
        :data:`DRAIN_SECONDS` at the most.
        """
        if self._process is None:
            return []
        if self._process.returncode is None:
            self._process.terminate()
        await self._process.wait()
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, DRAIN_SECONDS)
            except TimeoutError:
                pass
        return parse_samples(self._output.decode(errors="replace"))


@dataclass(frozen=True)
class ProfileHosts:
    """The workstations of the state being profiled."""

    topology: Topology
    state: State

    def samplers(self, seconds: float) -> list[Sampler]:
        return [Sampler(entry.name, entry.sudo, serving_reading.sockets(entry.settings),
                        self.topology.ssh_config, seconds)
                for entry in self.topology.workstations]

    async def fetch(self, directory: str) -> dict[str, dict[str, bytes] | str]:
        """Each workstation's traces by file name, or why they could not be fetched."""
        ran = await asyncio.gather(*(
            remote.run(entry.name, remote.remote_command(fetch_script(directory), entry.sudo),
                       self.topology.ssh_config)
            for entry in self.topology.workstations))
        return {each.host: each.error() or parse_fetched(each.stdout) for each in ran}

    async def nccl_lines(self) -> dict[str, list[str]]:
        """NCCL's INFO lines of each workstation's server, as its log kept them."""
        readings = await remote.read_all({
            entry: serving_reading.nccl(entry.settings, self.state.serving)
            for entry in self.topology.workstations}, self.topology.ssh_config)
        return {host: reading.values.get("nccl") or [] for host, reading in readings.items()}


def analyse(fetched: dict[str, dict[str, bytes] | str],
            samples: list[list[tuple[int, int]]]) -> dict[str, Any]:
    """Each trace's breakdown, its stalls matched with any workstation's retransmissions."""
    retransmitting = [span for each in samples
                      for span in traces.retransmission_intervals(each)]
    ranks: dict[str, Any] = {}
    for host, found in fetched.items():
        if isinstance(found, str):
            ranks[host] = {"error": found}
            continue
        if not found:
            ranks[host] = {"error": "no trace in the profile's directory"}
        for name, data in sorted(found.items()):
            try:
                kernels = traces.kernels(traces.load(data))
            except ValueError as error:
                ranks[f"{host}/{name}"] = {"error": f"{name}: {error}"}
                continue
            ranks[f"{host}/{name}"] = {"host": host, "trace": name,
                                       **traces.breakdown(kernels, retransmitting)}
    return {"ranks": ranks, "samples_taken": [len(each) for each in samples],
            "retransmissions_sampled": sum(max(after[1] - before[1], 0) for each in samples
                                           for before, after in pairwise(each))}


USING = re.compile(r"NET/Socket : Using \[0\]([^:\s]+):([^<\s]+)<0>")
VIA = re.compile(r"Channel (\d+)/\d+ : .*\[(send|receive)\] via (NET/[A-Za-z]+)")
COLL_CHANNELS = re.compile(r"(\d+) coll channels")


@dataclass(frozen=True)
class NcclTransport:
    """What NCCL said it chose, from its INFO lines: the proof of where the TP traffic went."""

    interface: str | None
    address: str | None
    transports: tuple[str, ...]
    channels: int | None
    lines: tuple[str, ...]

    def words(self) -> str:
        if not self.lines:
            return "NCCL logged nothing (is NCCL_DEBUG=INFO in the server's environment?)"
        via = " and ".join(self.transports) or "no transport line"
        where = f"{self.interface} ({self.address})" if self.interface else "no interface line"
        channels = f"{self.channels} channels" if self.channels is not None else "channels unsaid"
        return f"{via} on {where}, {channels}"


def transport(lines: list[str]) -> NcclTransport:
    """
    NCCL's interface, transports and channels from a server's NCCL INFO lines,
    of its last start only (the lines after the last interface line); the
    lines that say so, quoted.
    """
    starts = [index for index, line in enumerate(lines) if USING.search(line)]
    quoted = [line for line in (lines[starts[-1]:] if starts else lines)
              if any(pattern.search(line) for pattern in (USING, VIA, COLL_CHANNELS))]
    using = next((found for line in quoted if (found := USING.search(line))), None)
    vias = [found for line in quoted if (found := VIA.search(line))]
    coll = next((found for line in quoted if (found := COLL_CHANNELS.search(line))), None)
    channels = (int(coll[1]) if coll else len({found[1] for found in vias}) if vias else None)
    return NcclTransport(using[1] if using else None, using[2] if using else None,
                         tuple(sorted({found[3] for found in vias})), channels, tuple(quoted))


def rank_of(trace_name: str) -> int | None:
    """The TP rank a trace's name holds (``<profile_id>-TP-<rank>...``)."""
    found = re.search(r"-TP-(\d+)", trace_name)
    return int(found[1]) if found else None


def figures(report: dict[str, Any]) -> dict[str, Any]:
    """
    The profile window's figures for a comparison: per server (``wsa, TP-0``:
    its workstation and TP rank, as production's replicas are each a rank 0),
    the shares of its span, one all-reduce's latency and the stalls' time
    lost; and NCCL's transport per workstation. Empty without a valid profile
    window.
    """
    window = next((each for each in report["windows"]
                   if each["name"] == PROFILE and counted(each)), None)
    if window is None:
        return {}
    ranks = {}
    for rank in window["summary"].get("ranks", {}).values():
        if "error" in rank or (number := rank_of(rank["trace"])) is None:
            continue
        ranks[f"{rank['host']}, TP-{number}"] = {
            "host": rank["host"],
            **{f"{name}_share": share for name, share in rank["shares"].items()},
            "allreduce_p50_ms": rank["allreduce"]["p50_ms"],
            "allreduce_p99_ms": rank["allreduce"]["p99_ms"],
            "stall_seconds": rank["stalls"]["seconds_lost"],
            "stall_seconds_with_retransmissions":
                rank["stalls"]["seconds_lost_with_retransmissions"],
        }
    return {"ranks": ranks,
            "transport": {host: transport(lines).words()
                          for host, lines in window["summary"].get("nccl", {}).items()}}
