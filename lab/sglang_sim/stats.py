"""Counters since start, and their Prometheus text under SGLang's metric names.

The scheduler thread writes them; HTTP threads read them, under one lock.

The speculative accept length is kept as SGLang 0.5.9 keeps it
(``scheduler_metrics_mixin.py``): each decode batch adds to counters of the
current interval, and only ``log_decode_stats``, every ``decode_log_interval``
batches, folds them into the totals behind ``/server_info``'s
``avg_spec_accept_length`` and sets the ``sglang:spec_accept_length`` gauge to
the interval's own figure. Both therefore lag the batches since the last fold,
and ``avg_spec_accept_length`` is absent until the first one.
"""

import threading
from bisect import bisect_left

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0, 20.0, 40.0, 60.0,
                80.0, 120.0, 160.0)


class Stats:
    """What the server has done since it started."""

    def __init__(self, decode_log_interval: int = 40) -> None:
        self._lock = threading.Lock()
        self.decode_log_interval = decode_log_interval
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        # Tokens and verify steps (one per request per batch) of the batches since
        # the last fold, and of every folded batch: SGLang's spec_num_* and spec_total_num_*.
        self._interval_tokens = self._interval_steps = self._batches = 0
        self._total_tokens = self._total_steps = 0
        self._interval_accept_length = 0.0
        self.allreduce_bytes = 0
        self.ttft_buckets = [0] * len(TTFT_BUCKETS)
        self.ttft_sum = 0.0
        self.ttft_count = 0

    def record_prefill(self, prompt_tokens: int, cached_tokens: int) -> None:
        with self._lock:
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached_tokens

    def record_decode(self, tokens: int) -> None:
        """One request's verify step of ``tokens`` tokens."""
        with self._lock:
            self.generation_tokens += tokens
            self._interval_tokens += tokens
            self._interval_steps += 1

    def end_decode_batch(self) -> float | None:
        """
        Count one decode batch; every ``decode_log_interval``-th folds the
        interval into the totals, as ``log_decode_stats`` does, and returns the
        interval's accept length (``None`` between folds).
        """
        with self._lock:
            self._batches += 1
            if self._batches % self.decode_log_interval:
                return None
            length = self._interval_tokens / self._interval_steps if self._interval_steps else 0.0
            self._total_tokens += self._interval_tokens
            self._total_steps += self._interval_steps
            self._interval_tokens = self._interval_steps = 0
            self._interval_accept_length = length
            return length

    def record_allreduce(self, nbytes: int) -> None:
        with self._lock:
            self.allreduce_bytes += nbytes

    def record_ttft(self, seconds: float) -> None:
        with self._lock:
            index = bisect_left(TTFT_BUCKETS, seconds)
            if index < len(TTFT_BUCKETS):
                self.ttft_buckets[index] += 1
            self.ttft_sum += seconds
            self.ttft_count += 1

    def avg_accept_length(self) -> float | None:
        """
        Tokens per verify step over the folded batches (``avg_spec_accept_length``);
        ``None`` before the first fold, when SGLang leaves the key out.
        """
        with self._lock:
            return self._total_tokens / self._total_steps if self._total_steps else None

    def prometheus(self, model_name: str, speculative: bool) -> str:
        """The ``/metrics`` page, labelled with the served model name."""
        label = 'model_name="{}"'.format(model_name.replace("\\", "\\\\").replace('"', '\\"'))
        with self._lock:
            accept_length = self._interval_accept_length if speculative else 0.0
            lines = [
                *_metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.",
                         label, self.prompt_tokens),
                *_metric("generation_tokens_total", "counter",
                         "Number of generation tokens processed.", label, self.generation_tokens),
                *_metric("cached_tokens_total", "counter",
                         "Number of cached prompt tokens.", label, self.cached_tokens),
                *self._ttft_histogram(label),
                *_metric("spec_accept_length", "gauge",
                         "The average acceptance length of speculative decoding.",
                         label, accept_length),
            ]
        return "\n".join(lines) + "\n"

    def _ttft_histogram(self, label: str) -> list[str]:
        name = "sglang:time_to_first_token_seconds"
        lines = [f"# HELP {name} Histogram of time to first token in seconds.",
                 f"# TYPE {name} histogram"]
        cumulative = 0
        for bound, count in zip(TTFT_BUCKETS, self.ttft_buckets, strict=True):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{bound}",{label}}} {float(cumulative)}')
        lines.append(f'{name}_bucket{{le="+Inf",{label}}} {float(self.ttft_count)}')
        lines.append(f"{name}_sum{{{label}}} {self.ttft_sum}")
        lines.append(f"{name}_count{{{label}}} {float(self.ttft_count)}")
        return lines


def _metric(name: str, kind: str, help_text: str, label: str, value: float) -> list[str]:
    return [f"# HELP sglang:{name} {help_text}", f"# TYPE sglang:{name} {kind}",
            f"sglang:{name}{{{label}}} {float(value)}"]
