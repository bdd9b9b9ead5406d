"""A window as SGLang's bench_serving result line: its fields, its arithmetic and its units."""

from __future__ import annotations

import json
import math

import pytest
from test_measure_reports import measurement

from harness.reporting import bench_serving, report


def sample(sent: float, ttft: float, seconds: float | None, prompt: int, tokens: int | None,
           error: str | None = None) -> dict:
    return {"label": "x", "sent_at": sent, "ttft_seconds": ttft, "seconds": seconds,
            "prompt_tokens": prompt, "completion_tokens": tokens, "error": error}


def window_of_three() -> dict:
    """Two requests answered (1.1 s and 2.3 s), one refused, in a window of 2.5 s."""
    return {"name": "sweep@3", "seconds": 2.5, "server": {"accept_length": 3.2},
            "samples": [sample(0.0, 0.1, 1.1, 10, 11), sample(0.0, 0.3, 2.3, 20, 21),
                        sample(0.0, 0.0, None, 10, None, error="HTTP 503")]}


def test_a_window_is_a_line_of_bench_servings_fields_in_their_units():
    built = measurement("tp2_e2e", 50.0, 200.0, 0, 0, 3.8)
    found = bench_serving.line(built, window_of_three())
    assert tuple(found) == bench_serving.FIELDS
    expected = {
        "tag": "twinbolt tp2_e2e sweep@3", "backend": "sglang", "max_concurrency": 3,
        "duration": 2.5, "completed": 2, "total_input_tokens": 30, "total_output_tokens": 32,
        "total_input_vision_tokens": 0,
        "request_throughput": 0.8, "output_throughput": 12.8, "total_throughput": 24.8,
        # Milliseconds, over the answered requests; NumPy's population deviation.
        "mean_e2e_latency_ms": 1700.0, "median_e2e_latency_ms": 1700.0,
        "std_e2e_latency_ms": 600.0, "p90_e2e_latency_ms": 2180.0,
        "p99_e2e_latency_ms": 2288.0,
        "mean_ttft_ms": 200.0, "std_ttft_ms": 100.0,
        # (latency - TTFT) / (tokens - 1): 1.0 s / 10 and 2.0 s / 20.
        "mean_tpot_ms": 100.0, "p99_tpot_ms": 100.0,
        # The summed latency over the duration; the most running in a whole second.
        "concurrency": 3.4 / 2.5, "max_concurrent_requests": 2,
        "accept_length": 3.2,
    }
    assert {key: found[key] for key in expected} == {
        key: value if isinstance(value, str | int) else pytest.approx(value)
        for key, value in expected.items()}
    assert math.isinf(found["request_rate"])
    assert found["server_info"] == built["config"]["server_info"]
    # Never a guess: what a window does not keep is null.
    for key in ("mean_itl_ms", "p99_itl_ms", "max_output_tokens_per_s",
                "total_output_tokens_retokenized", "random_input_len"):
        assert found[key] is None, key


def test_a_window_with_no_answer_has_no_latency():
    built = measurement("tp2_e2e", 50.0, 200.0, 0, 0, 3.8)
    window = window_of_three() | {"samples": [sample(0.0, 0.0, None, 10, None, error="refused")]}
    found = bench_serving.line(built, window)
    assert (found["completed"], found["output_throughput"], found["median_ttft_ms"],
            found["max_concurrent_requests"]) == (0, 0.0, None, 0)


def test_a_report_is_written_with_a_line_per_window(tmp_path):
    built = measurement("tp2_stock", 48.4, 172.9, 109, 2026, 2.5)
    path = report.write(built, tmp_path)
    written = [json.loads(text) for text in path.with_suffix(".jsonl").read_text().splitlines()]
    assert [entry["tag"] for entry in written] == ["twinbolt tp2_stock single",
                                                   "twinbolt tp2_stock concurrent"]
    assert all(tuple(entry) == bench_serving.FIELDS for entry in written)
