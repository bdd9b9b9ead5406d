"""The scheduler: SGLang's loop reduced to where it spends time.

New requests are prefilled together, in SGLang's chunks
(``--chunked-prefill-size`` uncached tokens a forward pass): each chunk's
compute takes time proportional to its tokens, and in TP2 each of its layers'
two all-reduces carries the chunk's activations across the link. Then every
running request advances by one decode step at a time. A step is the target
model's forward pass, layer by layer as the GPU and the link would run it
(:mod:`lab.sglang_sim.model`): its compute is the time to read this rank's
share of the weights and the running requests' KV caches at the GPU's memory
bandwidth, and in TP2 each layer's two all-reduces are real NCCL ring
all-reduces with the peer rank (:mod:`lab.sglang_sim.nccl`), one after the
other, each as wide as the step's token positions. With speculative decoding
the draft first runs its own passes (``num_steps`` of them, one position per
request), then the target verifies ``num_draft_tokens`` positions per request;
a step yields one token plus the drafts accepted before the first rejection,
so more tokens per step for wider messages. Between two batches the loop
also starts and stops the profiler (:mod:`lab.sglang_sim.profiler`).
"""

import logging
import queue
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from lab.sglang_sim.knobs import Knobs
from lab.sglang_sim.link import NcclLink
from lab.sglang_sim.model import ModelShape
from lab.sglang_sim.profiler import Profiler
from lab.sglang_sim.stats import Stats
from lab.sglang_sim.tokens import PrefixCache

logger = logging.getLogger(__name__)

# An idle rank 0 still exchanges with rank 1, as SGLang's ranks keep talking.
HEARTBEAT_SECONDS = 1.0
# The longest a profile request waits for the loop: a batch, or a hung rank.
PROFILE_WAIT_SECONDS = 60.0
VOCABULARY = (
    "the", "link", "rank", "token", "model", "cable", "frame", "credit", "lane", "route",
    "answer", "draft", "verify", "prefix", "cache", "batch", "state", "layer", "proof", "run",
)


def prefill_chunks(tokens: int, chunked_prefill_size: int) -> list[int]:
    """
    The forward passes that prefill ``tokens`` uncached tokens: SGLang's
    chunks of ``chunked_prefill_size`` tokens, the last one short; one pass
    for all of them when chunking is off (-1).
    """
    if chunked_prefill_size <= 0:
        return [tokens] if tokens else []
    whole, rest = divmod(tokens, chunked_prefill_size)
    return [chunked_prefill_size] * whole + ([rest] if rest else [])


@dataclass(frozen=True)
class Speculation:
    """EAGLE-style drafting: how many drafts a step may verify, and how often they hold."""

    num_steps: int
    num_draft_tokens: int
    accept_rate: float

    def accept_length(self, rng: random.Random) -> int:
        """One verified token plus the drafts accepted before the first rejection."""
        longest = min(self.num_draft_tokens, self.num_steps + 1)
        length = 1
        while length < longest and rng.random() < self.accept_rate:
            length += 1
        return length


@dataclass(eq=False)
class ProfileRequest:
    """
    ``/start_profile`` (``start``) or ``/stop_profile``, run by the scheduler
    loop between two batches, as SGLang's scheduler takes a ``ProfileReq``
    from its input queue; ``answer`` is filled, then ``done`` set.
    """

    start: bool
    output_dir: str | None = None
    profile_id: str = ""
    activities: list[str] | None = None
    answer: object = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class Sequence:
    """One generation request as the scheduler sees it.

    Outputs are seeded by the prompt, so the same request gets the same words
    and the same accept lengths every time.
    """

    prompt: str
    prompt_tokens: int
    block_hashes: list[bytes]
    max_new_tokens: int
    # SGLang's health check asks with log_metrics=False: /metrics never counts it.
    log_metrics: bool = True
    cached_tokens: int = 0
    completion_tokens: int = 0
    verify_ct: int = 0
    # Verify steps by the drafts they accepted: SGLang's spec_accept_histogram.
    accept_histogram: list[int] = field(default_factory=list)
    created: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    rng: random.Random = field(init=False)
    _outputs: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.prompt)

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - self.completion_tokens

    def emit(self, count: int) -> None:
        """Produce this step's ``count`` tokens for the waiting client."""
        words = [self.rng.choice(VOCABULARY) for _ in range(count)]
        self.completion_tokens += count
        self.verify_ct += 1
        drafts = count - 1
        self.accept_histogram.extend([0] * (drafts + 1 - len(self.accept_histogram)))
        self.accept_histogram[drafts] += 1
        self.first_token_at = self.first_token_at or time.monotonic()
        self._outputs.put(words)

    def finish(self) -> None:
        self.finished_at = time.monotonic()
        self._outputs.put(None)
        self.done.set()

    def abort(self) -> None:
        """The client went away: stop spending steps on it."""
        self.aborted = True

    def stream(self) -> Iterator[list[str]]:
        """Each step's words as the scheduler produces them, until the request finishes."""
        while (words := self._outputs.get()) is not None:
            yield words

    def e2e_latency(self) -> float:
        return self.finished_at - self.created


class DecodeLog:
    """
    SGLang's periodic decode line, every ``decode_log_interval`` batches: the
    interval's throughput and accept length. The same moment folds the accept
    length into ``/server_info`` (:meth:`Stats.end_decode_batch`).
    """

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._started: float | None = None
        self._tokens = 0

    def step(self, started: float, running: int, tokens: int) -> None:
        """Count one batch; an interval starts with its first batch, not at the idle wait before."""
        if self._started is None:
            self._started = started
        self._tokens += tokens
        accept_length = self._stats.end_decode_batch()
        if accept_length is None:
            return
        logger.info("Decode batch. #running-req: %d, accept len: %.2f, "
                    "gen throughput (token/s): %.2f", running, accept_length,
                    self._tokens / (time.monotonic() - self._started))
        self._started, self._tokens = None, 0


class Scheduler:
    """Runs requests in batches, step by step, on its own thread."""

    def __init__(self, knobs: Knobs, shape: ModelShape, tp_size: int, stats: Stats,
                 speculation: Speculation | None, chunked_prefill_size: int) -> None:
        self._knobs = knobs
        self._shape = shape
        self._tp_size = tp_size
        self._chunked_prefill_size = chunked_prefill_size
        self._stats = stats
        self._speculation = speculation
        self._waiting: queue.SimpleQueue[Sequence | ProfileRequest] = queue.SimpleQueue()
        # A single GPU's kernels; in TP2 each rank's scheduler process records its own.
        self._profiler = Profiler(rank=0)
        self._cache = PrefixCache()
        self._decode_log = DecodeLog(stats)
        # The requests being prefilled or decoded, as the loop last saw them.
        self._running = 0

    def submit(self, sequence: Sequence) -> None:
        self._waiting.put(sequence)

    def profile(self, request: ProfileRequest) -> object:
        """
        Start or stop profiling between two batches: for a start, why it was
        refused (``None`` if it was not); for a stop, the traces written
        (``None`` if nothing was profiling).
        """
        self._waiting.put(request)
        if not request.done.wait(PROFILE_WAIT_SECONDS):
            raise TimeoutError(f"the scheduler did not take the profile request within "
                               f"{PROFILE_WAIT_SECONDS:g} s")
        return request.answer

    def load(self) -> tuple[int, int]:
        """The requests being prefilled or decoded, and those waiting to be admitted."""
        return self._running, self._waiting.qsize()

    def flush_cache(self) -> bool:
        """
        Forget every cached prefix, as SGLang's ``/flush_cache`` does; refused
        (False) while a request runs or waits, as SGLang refuses it.
        """
        if self._running or not self._waiting.empty():
            return False
        self._cache = PrefixCache()
        logger.info("Cache flushed successfully!")
        return True

    def run(self, link: NcclLink | None) -> None:
        """The scheduler loop; it returns only by raising (a lost peer)."""
        running: list[Sequence] = []
        while True:
            new = self._admit(wait=not running, link=link)
            self._running = len(running) + len(new)
            if not new and not running:
                if link:
                    link.heartbeat()
                continue
            self._hang_if_faulted()
            running += self._prefill(new, link)
            if running:
                self._decode(running, link)
            running = self._still_running(running)
            self._running = len(running)

    def _still_running(self, running: list[Sequence]) -> list[Sequence]:
        """Drop finished requests, and those whose client went away."""
        for seq in running:
            if seq.aborted and seq.remaining:
                logger.info("Abort request: the client went away after %d tokens",
                            seq.completion_tokens)
        return [seq for seq in running if seq.remaining and not seq.aborted]

    def _admit(self, wait: bool, link: NcclLink | None) -> list[Sequence]:
        """
        Every request waiting, each profile request run as it comes; when idle,
        wait a heartbeat for the first.
        """
        admitted = []
        try:
            if wait:
                admitted.append(self._waiting.get(timeout=HEARTBEAT_SECONDS))
            while True:
                admitted.append(self._waiting.get_nowait())
        except queue.Empty:
            pass
        for request in admitted:
            if isinstance(request, ProfileRequest):
                self._run_profile(request, link)
        return [request for request in admitted if isinstance(request, Sequence)]

    def _run_profile(self, request: ProfileRequest, link: NcclLink | None) -> None:
        """On this GPU alone, or in TP2 on every rank of the group."""
        target = link or self._profiler
        request.answer = (target.start_profile(request.output_dir, request.profile_id,
                                               request.activities)
                          if request.start else target.stop_profile())
        request.done.set()

    def _hang_if_faulted(self) -> None:
        """Stop here for good, as a hung rank does; HTTP threads still answer."""
        if self._knobs.fault_on("rank_hang") or self._knobs.fault_on("rank_hang_green_health"):
            logger.warning("Lab fault rank_hang: this rank stops making progress")
            threading.Event().wait()

    def _prefill(self, new: list[Sequence], link: NcclLink | None) -> list[Sequence]:
        """Prefill the new prompts' uncached tokens chunk by chunk; return those still to decode."""
        if not new:
            return []
        for seq in new:
            seq.cached_tokens = self._cache.match_and_insert(seq.block_hashes)
            if seq.log_metrics:
                self._stats.record_prefill(seq.prompt_tokens, seq.cached_tokens)
        uncached = sum(seq.prompt_tokens - seq.cached_tokens for seq in new)
        for chunk in prefill_chunks(uncached, self._chunked_prefill_size):
            self._pass(chunk / self._knobs.prefill_tokens_per_second, chunk,
                       self._shape.layers, link)
        logger.info("Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d",
                    len(new), uncached, sum(seq.cached_tokens for seq in new))
        for seq in new:
            if not seq.remaining:
                self._finish(seq)
        return [seq for seq in new if seq.remaining]

    def _decode(self, running: list[Sequence], link: NcclLink | None) -> None:
        """One step for every running request."""
        started = time.monotonic()
        context = sum(seq.prompt_tokens + seq.completion_tokens for seq in running)
        if self._speculation:
            for _ in range(self._speculation.num_steps):
                self._forward(len(running), context, self._shape.draft_layers, link)
            self._forward(len(running) * self._speculation.num_draft_tokens, context,
                          self._shape.layers, link)
        else:
            self._forward(len(running), context, self._shape.layers, link)
        tokens = 0
        for seq in running:
            first = seq.first_token_at is None
            count = min(seq.remaining, self._accept_length(seq))
            seq.emit(count)
            if seq.log_metrics:
                self._stats.record_decode(count)
                tokens += count
            if first and seq.log_metrics:
                self._stats.record_ttft(seq.first_token_at - seq.created)
            if not seq.remaining:
                self._finish(seq)
        # A batch of health checks alone is no decode batch of SGLang's: its
        # one-token generation ends at prefill there, so it never reaches the log.
        if any(seq.log_metrics for seq in running):
            self._decode_log.step(started, len(running), tokens)

    def _forward(self, positions: int, context: int, layers: int, link: NcclLink | None) -> None:
        """
        One forward pass over ``positions`` token positions through ``layers``
        layers: the GPU's time, then in TP2 two all-reduces per layer, in order.
        """
        self._pass(self._shape.pass_seconds(context, layers, self._tp_size,
                                            self._knobs.gpu_bandwidth_gb_s * 1e9),
                   positions, layers, link)

    def _pass(self, seconds: float, positions: int, layers: int, link: NcclLink | None) -> None:
        """
        A pass's GPU time; in TP2 on both ranks at once, then its two
        all-reduces per layer, one after the other.
        """
        if link:
            message = self._shape.allreduce_bytes(positions)
            self._stats.record_allreduce(
                link.forward(seconds, message, 2 * layers, self._shape.activation_bytes))
            return
        self._profiler.compute(seconds)

    def _accept_length(self, seq: Sequence) -> int:
        return self._speculation.accept_length(seq.rng) if self._speculation else 1

    def _finish(self, seq: Sequence) -> None:
        seq.finish()
        logger.info("Finish request. #prompt-token: %d, #cached-token: %d, "
                    "#completion-token: %d, #verify-step: %d, e2e latency: %.3f s",
                    seq.prompt_tokens, seq.cached_tokens, seq.completion_tokens,
                    seq.verify_ct, seq.e2e_latency())
