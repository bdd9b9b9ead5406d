"""
Each window of a measurement as a line of SGLang's ``bench_serving
--output-file``: the same field names and units (seconds for the duration,
milliseconds for latencies, tokens or requests per second for throughputs), so
that an operator can set twinbolt's windows beside their own ``bench_serving``
runs, and read both with one tool.

The fields are those of the result ``benchmark()`` appends to the output file
in sglang 0.5.9 (``sglang/bench_serving.py``) and 0.5.23
(``sglang/benchmark/serving.py``); 0.5.23's are 0.5.9's with p90 and p95 added,
so a line here carries 0.5.23's, and ``tests/conformance/test_bench_serving.py``
reads both lists from the installed source. The figures follow
``calculate_metrics``: over the successful requests, latencies from sending to
the last token, TPOT as (latency - TTFT) / (output tokens - 1) for requests of
more than one token, NumPy's population standard deviation and linear
percentiles, throughputs over the window's duration, concurrency as the
requests' summed latency over it.

A figure twinbolt does not take is null, never a guess:

- the inter-token latencies (``*_itl_ms``) and ``max_output_tokens_per_s``,
  its per-second token buckets, need every chunk's arrival time, which a
  window does not keep;
- ``total_output_tokens_retokenized`` needs the model's tokenizer;
- the dataset's own arguments (``random_input_len`` ...): a window's prompts
  are its own, named in ``dataset_name`` and ``tag``.
"""

from __future__ import annotations

import json
import math
from statistics import fmean, pstdev
from typing import Any

from harness.measuring.client import time_per_output_token
from harness.measuring.sweep import percentile

# benchmark()'s result in sglang 0.5.23, in its order.
FIELDS = (
    "tag", "backend", "dataset_name", "request_rate", "max_concurrency", "sharegpt_output_len",
    "random_input_len", "random_output_len", "random_range_ratio", "server_info", "duration",
    "completed", "total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens",
    "total_output_tokens", "total_output_tokens_retokenized", "request_throughput",
    "input_throughput", "output_throughput", "total_throughput", "mean_e2e_latency_ms",
    "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms", "p95_e2e_latency_ms",
    "p99_e2e_latency_ms", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms",
    "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms",
    "p90_tpot_ms", "p95_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "std_itl_ms",
    "p90_itl_ms", "p95_itl_ms", "p99_itl_ms", "concurrency", "accept_length",
    "max_output_tokens_per_s", "max_concurrent_requests",
)
# The windows stream SGLang's native /generate, bench_serving's "sglang" backend.
BACKEND = "sglang"
DATASET = "twinbolt"
# Every request of a window is sent at once: bench_serving's default rate.
REQUEST_RATE = math.inf


def latencies(name: str, seconds: list[float]) -> dict[str, float | None]:
    """``mean_<name>_ms`` ... ``p99_<name>_ms`` of ``seconds``, as bench_serving gives them."""
    if not seconds:
        return dict.fromkeys([f"{kind}_{name}_ms" for kind in
                              ("mean", "median", "std", "p90", "p95", "p99")])
    shares = {"median": 50, "p90": 90, "p95": 95, "p99": 99}
    return {f"mean_{name}_ms": fmean(seconds) * 1000, f"std_{name}_ms": pstdev(seconds) * 1000,
            **{f"{kind}_{name}_ms": percentile(seconds, share) * 1000
               for kind, share in shares.items()}}


def most_at_once(samples: list[dict[str, Any]]) -> int:
    """
    bench_serving's ``max_concurrent_requests``: the most requests running in
    any whole second of the window, counted per second from the first start.
    """
    if not samples:
        return 0
    start = min(sample["sent_at"] for sample in samples)
    busy: dict[int, int] = {}
    for sample in samples:
        first = int(sample["sent_at"] - start)
        last = int(sample["sent_at"] + sample["seconds"] - start)
        for second in range(first, last + 1):
            busy[second] = busy.get(second, 0) + 1
    return max(busy.values())


def line(report: dict[str, Any], window: dict[str, Any]) -> dict[str, Any]:
    """One window as bench_serving's result line, in its fields' order."""
    done = [sample for sample in window["samples"]
            if sample["error"] is None and sample["completion_tokens"] is not None]
    duration = window["seconds"]
    inputs = sum(sample["prompt_tokens"] or 0 for sample in done)
    outputs = sum(sample["completion_tokens"] for sample in done)
    e2e = [sample["seconds"] for sample in done]
    tpots = [tpot for sample in done if (tpot := time_per_output_token(
        sample["seconds"], sample["ttft_seconds"], sample["completion_tokens"])) is not None]
    figures = {
        "tag": f"twinbolt {report['state']} {window['name']}",
        "backend": BACKEND,
        "dataset_name": DATASET,
        "request_rate": REQUEST_RATE,
        "max_concurrency": len(window["samples"]),
        "server_info": report["config"]["server_info"],
        "duration": duration,
        "completed": len(done),
        "total_input_tokens": inputs,
        "total_input_text_tokens": inputs,
        "total_input_vision_tokens": 0,
        "total_output_tokens": outputs,
        "request_throughput": len(done) / duration,
        "input_throughput": inputs / duration,
        "output_throughput": outputs / duration,
        "total_throughput": (inputs + outputs) / duration,
        **latencies("e2e_latency", e2e),
        **latencies("ttft", [sample["ttft_seconds"] for sample in done]),
        **latencies("tpot", tpots),
        "concurrency": sum(e2e) / duration,
        "accept_length": window["server"]["accept_length"],
        "max_concurrent_requests": most_at_once(done),
    }
    return {field: figures.get(field) for field in FIELDS}


def lines(report: dict[str, Any]) -> str:
    """Every window of a report, one JSON line each, as ``--output-file`` appends them."""
    return "".join(json.dumps(line(report, window)) + "\n" for window in report["windows"])
