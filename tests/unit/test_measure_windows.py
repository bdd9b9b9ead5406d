"""The measurement client and windows, against a local SGLang simulator."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from simulator import NEXTN, simulator

from harness.hosts.topology import Endpoint
from harness.measuring import windows
from harness.measuring.client import Sample, stream_chat, stream_generate
from harness.measuring.windows import WindowSettings
from harness.reporting import report
from lab.sglang_sim.api import FLUSHED

SHORT = WindowSettings(single_tokens=64, concurrent_requests=3, concurrent_tokens=32,
                       prefix_tokens=3000, prefix_output_tokens=4, long_tokens=200_000,
                       long_output_tokens=8, request_timeout_seconds=30)


async def no_links() -> dict:
    return {}


def quiet_machine() -> float:
    """This machine as a quiet one: nobody else used a CPU second (pytest's other workers do)."""
    return 0.0


def run(url: str, *names: str, settings: WindowSettings = SHORT, links=no_links,
        machine_cpu=quiet_machine) -> dict:
    endpoint = Endpoint(url, "qwen", (url,), "local simulator")
    info, results = asyncio.run(windows.run(endpoint, list(names), settings, links,
                                            machine_cpu=machine_cpu))
    return {"info": info, **{result["name"]: result for result in results}}


@pytest.fixture(scope="module")
def nextn(tmp_path_factory):
    # A context short enough that the long window is capped by it.
    with simulator(tmp_path_factory.mktemp("nextn"), *NEXTN, "--context-length", "6000") as url:
        yield url


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    with simulator(tmp_path_factory.mktemp("plain")) as url:
        yield url


def test_single_measures_ttft_total_and_tok_s_from_the_servers_usage(nextn):
    single = run(nextn, "single")["single"]
    summary, (sample,) = single["summary"], single["samples"]
    assert single["errors"] == []
    assert summary["completion_tokens"] == 64
    assert 0 < summary["ttft_seconds"] < summary["seconds"]
    # One definition: usage tokens over request-to-last-token seconds.
    assert summary["output_tok_s"] == pytest.approx(64 / summary["seconds"])
    # A speculative step streams several tokens in one chunk: chunks are not tokens.
    assert sample["chunks"] < 64


def test_window_accept_length_is_its_requests_own(nextn):
    run(nextn, "single")  # history before the window: the window must not include it
    single = run(nextn, "single")["single"]
    server, summary, (sample,) = single["server"], single["summary"], single["samples"]
    assert server["generated_tokens"] == 64
    assert server["accept_length_source"] == "requests"
    assert server["accept_length"] == 64 / sample["verify_steps"]
    # The simulator streams one event per verify step: tokens per chunk agrees.
    assert server["accept_length"] == pytest.approx(summary["tokens_per_chunk"])
    assert 1 < server["accept_length"] <= 4


def test_a_window_under_40_decode_batches_leaves_the_snapshot_unchanged(tmp_path):
    """
    SGLang folds the accept length into /server_info every 40 decode batches: a
    window shorter than that sees the history's average, not its own.
    """
    with simulator(tmp_path, *NEXTN) as url:
        def average() -> float | None:
            state = httpx.get(f"{url}/server_info").json()["internal_states"][0]
            return state.get("avg_spec_accept_length")

        # History: 40 one-token requests, one decode batch each at one token per step;
        # the 40th batch folds them in.
        for index in range(40):
            httpx.post(f"{url}/generate", json={"text": f"history {index}",
                                                "sampling_params": {"max_new_tokens": 1}}
                       ).raise_for_status()
        deadline = time.monotonic() + 5
        while average() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert average() == 1.0
        single = run(url, "single")["single"]
    server, (sample,) = single["server"], single["samples"]
    assert sample["verify_steps"] < 40
    assert [snap["avg_spec_accept_length"] for snap in (*server["before"], *server["after"])
            ] == [1.0, 1.0]
    assert server["cumulative_accept_length"] == pytest.approx(1.0)
    assert server["requests_accept_length"] == 64 / sample["verify_steps"] > 3
    assert (server["accept_length"], server["accept_length_source"]) == (
        server["requests_accept_length"], "requests")


def test_without_speculation_there_is_no_accept_length(plain):
    single = run(plain, "single")["single"]
    assert single["server"]["accept_length"] is None
    assert single["summary"]["tokens_per_chunk"] == 1


def test_concurrent_keeps_aggregate_and_per_request_apart(plain):
    concurrent = run(plain, "concurrent")["concurrent"]
    summary, samples = concurrent["summary"], concurrent["samples"]
    assert summary["requests"] == 3 and summary["completion_tokens"] == 96
    assert summary["aggregate_output_tok_s"] == pytest.approx(96 / summary["seconds"])
    rates = [sample["output_tok_s"] for sample in samples]
    assert summary["per_request_output_tok_s"]["mean"] == pytest.approx(sum(rates) / 3)
    # Batched together, the window moves more than any one of its requests.
    assert summary["aggregate_output_tok_s"] > max(rates)


def test_the_sweep_measures_each_level_as_a_window_of_its_own(nextn):
    settings = SHORT.model_copy(update={"concurrency": (1, 4), "sweep_tokens": 16})
    result = run(nextn, "single", "sweep", settings=settings)
    assert [name for name in result if name.startswith("sweep")] == ["sweep@1", "sweep@4"]
    for level in (1, 4):
        window = result[f"sweep@{level}"]
        summary = window["summary"]
        assert (summary["requests"], summary["completed"]) == (level, level)
        assert summary["completion_tokens"] == 16 * level and window["errors"] == []
        assert summary["aggregate_output_tok_s"] == pytest.approx(
            16 * level / summary["seconds"])
        assert 0 < summary["tpot_seconds"]["p50"] <= summary["tpot_seconds"]["p99"]
        assert summary["ttft_seconds"]["p50"] <= summary["ttft_seconds"]["p99"]
        # Each level is cold, and has its own counters and accept length.
        assert window["invalid"] is None and 1 < window["server"]["accept_length"] <= 4
    # Four requests batched together move more than one alone.
    assert (result["sweep@4"]["summary"]["aggregate_output_tok_s"]
            > result["sweep@1"]["summary"]["aggregate_output_tok_s"])
    assert windows.levels(["single", "sweep", "long"], (1, 2)) == [
        "single", "sweep@1", "sweep@2", "long"]


def test_long_is_capped_by_the_input_the_kv_cache_admits(tmp_path):
    """A small pool (0.11 of the GPU: 43,207 input tokens) binds before the context does."""
    with simulator(tmp_path, "--mem-fraction-static", "0.11") as url:
        result = run(url, "long", settings=SHORT.model_copy(update={"long_tokens": 60_000}))
    long = result["long"]["summary"]
    assert (long["max_req_input_len"], long["shortened"]) == (43207, True)
    assert result["long"]["errors"] == []
    assert 43207 - 300 < long["prompt_tokens"] < 43207
    row = report.window_row(result["long"])
    assert "the 43,207 input tokens the KV cache admits" in row[6]


def test_prefix_is_cold_then_warm_by_the_cached_tokens_the_server_reports(plain):
    result = run(plain, "prefix", "prefix_warm")
    cold, warm = result["prefix"]["summary"], result["prefix_warm"]["summary"]
    assert (cold["temperature"], cold["prefill"], cold["cached_tokens"]) == ("cold", "cold", 0)
    assert "hit_rate" not in cold
    assert (warm["temperature"], warm["prefill"]) == ("warm", "warm")
    assert warm["cached_tokens"] >= 3000 - 64
    # The primer was the prefix with another word, itself from an empty cache.
    assert warm["primed"]["prefill"] == "cold" and warm["primed"]["error"] is None


def test_long_is_capped_by_the_context_and_cold_even_after_the_prefix_window(nextn):
    result = run(nextn, "prefix", "long")
    long = result["long"]["summary"]
    assert long["context_length"] == 6000
    assert long["prompt_tokens"] <= 6000 - SHORT.long_output_tokens
    assert long["prompt_tokens"] > 5000
    # Every prompt starts with its own word: the prefix window left nothing to reuse.
    assert long["cached_tokens"] == 0 and long["prefill"] == "cold"


def test_the_prefix_window_fits_the_context_and_says_it_was_cut(nextn):
    settings = SHORT.model_copy(update={"prefix_tokens": 120_000})
    result = run(nextn, "prefix_warm", settings=settings)["prefix_warm"]
    prefix = result["summary"]
    # Refused by the server before; now sent, cut, and warm after priming.
    assert result["errors"] == []
    assert prefix["shortened"] and prefix["wanted_tokens"] == 120_000
    assert prefix["context_length"] == 6000
    assert 5000 < prefix["primed"]["prompt_tokens"] <= 6000 - SHORT.prefix_output_tokens
    assert prefix["prefill"] == "warm"
    row = report.window_row(result)
    assert "cut from 120,000 to fit the context of 6,000" in row[6]


def test_a_window_that_fits_is_not_called_cut(plain):
    prefix = run(plain, "prefix")["prefix"]["summary"]
    assert not prefix["shortened"] and prefix["prefix_tokens"] == SHORT.prefix_tokens


def test_a_warm_long_prompt_is_never_called_cold():
    warm = Sample("long", 8, cached_tokens=4096, prompt_tokens=5000)
    assert windows._prefill(warm, cache_report=True)["prefill"] == "warm"
    unreported = Sample("long", 8, cached_tokens=0, prompt_tokens=5000)
    assert windows._prefill(unreported, cache_report=False)["prefill"].startswith("unknown")


def test_a_refused_request_is_a_failed_sample_not_a_figure(nextn):
    settings = SHORT.model_copy(update={"single_tokens": 10_000})
    single = run(nextn, "single", settings=settings)["single"]
    assert single["errors"] and "HTTP 400" in single["errors"][0]
    assert single["summary"]["output_tok_s"] is None


def test_the_server_must_answer_before_a_window_starts():
    endpoint = Endpoint("http://127.0.0.1:9", "qwen", ("http://127.0.0.1:9",), "nothing")
    with pytest.raises(windows.EndpointDown, match="server_info"):
        asyncio.run(windows.run(endpoint, ["single"], SHORT, no_links))


def streamed(*events: object) -> httpx.MockTransport:
    body = "".join(f"data: {json.dumps(event) if not isinstance(event, str) else event}\n\n"
                   for event in events)
    return httpx.MockTransport(lambda request: httpx.Response(
        200, headers={"content-type": "text/event-stream"}, content=body.encode()))


def chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def stream(transport: httpx.MockTransport) -> Sample:
    async def go() -> Sample:
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_chat(client, "http://server", "qwen", "hi", Sample("t", 3))
    return asyncio.run(go())


def test_a_stream_without_usage_is_failed_rather_than_counted_by_chunks():
    sample = stream(streamed(chunk("a"), chunk(" b c"), "[DONE]"))
    assert sample.chunks == 2 and sample.completion_tokens is None
    assert "no usage" in sample.error and sample.output_rate is None


def test_usage_and_cached_tokens_come_from_the_final_event():
    usage = {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
             "prompt_tokens_details": {"cached_tokens": 8}}
    sample = stream(streamed(chunk("a"), chunk(" b c"), {"choices": [], "usage": usage},
                             "[DONE]"))
    assert sample.error is None
    assert (sample.completion_tokens, sample.cached_tokens, sample.chunks) == (3, 8, 2)
    assert sample.tokens_per_chunk == 1.5


def test_an_error_event_in_the_stream_fails_the_sample():
    sample = stream(streamed(chunk("a"), {"error": {"message": "scheduler died"}}))
    assert "scheduler died" in sample.error


def generated(text: str, tokens: int, **finished: object) -> dict:
    """A /generate event: the text and meta_info so far; ``finished`` ends the request."""
    meta = {"prompt_tokens": 9, "completion_tokens": tokens, "cached_tokens": 8,
            "finish_reason": None, **finished}
    return {"text": text, "meta_info": meta}


def stream_native(transport: httpx.MockTransport) -> Sample:
    async def go() -> Sample:
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_generate(client, "http://server", "hi", Sample("t", 5))
    return asyncio.run(go())


@pytest.mark.parametrize("texts", [("a", "a b c", "a b c d e", "a b c d e"),
                                   ("a", " b c", " d e", "")], ids=["whole", "stream-output"])
def test_generate_tokens_and_verify_steps_come_from_the_finished_meta_info(texts):
    # Whether each event carries the whole text (SGLang's default) or only its
    # piece (--stream-output), a chunk is an event whose completion tokens grew.
    end = {"type": "length", "length": 5}
    sample = stream_native(streamed(
        generated(texts[0], 1), generated(texts[1], 3), generated(texts[2], 5),
        generated(texts[3], 5, finish_reason=end, spec_verify_ct=3, spec_accept_length=5 / 3),
        "[DONE]"))
    assert sample.error is None
    assert (sample.prompt_tokens, sample.completion_tokens, sample.cached_tokens) == (9, 5, 8)
    assert (sample.chunks, sample.verify_steps) == (3, 3)


def test_a_generate_stream_that_never_finishes_is_failed():
    sample = stream_native(streamed(generated("a", 1), generated("a b", 2), "[DONE]"))
    assert sample.chunks == 2 and sample.completion_tokens is None
    assert "never reported the finished request" in sample.error
    plain = stream_native(streamed(generated("a b", 2, finish_reason={"type": "length"}),
                                   "[DONE]"))
    assert plain.error is None and plain.verify_steps is None


def test_the_simulator_flushes_its_cache_as_sglang_does(plain):
    text = "the same prompt " * 200

    def cached() -> int:
        response = httpx.post(f"{plain}/generate", json={
            "text": text, "sampling_params": {"max_new_tokens": 1}}, timeout=30)
        return response.json()["meta_info"]["cached_tokens"]

    cached()
    assert cached() > 0
    # SGLang 0.5.9 and 0.5.23 both answer GET and POST, 200 with this text once it is empty.
    for method in ("POST", "GET"):
        flushed = httpx.request(method, f"{plain}/flush_cache", timeout=10)
        assert (flushed.status_code, flushed.text) == (200, FLUSHED)
    assert cached() == 0


def fixed_prompt(tokens: int) -> str:
    """A prompt every window shares: what an unflushed cache would hand the next one warm."""
    return " ".join(["fixed", *["x"] * (tokens - 1)])


def test_a_cold_window_that_finds_cached_tokens_is_marked_invalid(plain, monkeypatch):
    monkeypatch.setattr(windows, "prompt", fixed_prompt)
    settings = SHORT.model_copy(update={"long_tokens": 3000})
    run(plain, "long", settings=settings)
    # Flushed first, the same prompt again is cold, and counts.
    flushed = run(plain, "long", settings=settings)["long"]
    assert flushed["flushed"] == {plain: "flushed"} and flushed["invalid"] is None
    assert flushed["summary"]["prefill"] == "cold"
    # A server that could not be flushed: the cold window finds the prompt cached.
    monkeypatch.setattr(windows, "flush_caches", lambda measurement: asyncio.sleep(0, {}))
    warm = run(plain, "long", settings=settings)["long"]
    assert warm["invalid"].startswith("a cold window found cached tokens in long (")
    built = report.build("tp2_e2e", None, None, Endpoint(plain, "qwen", (plain,), "sim"),
                         settings, {}, [warm])
    assert report.headline(built)["long_prefill"] is None
    assert f"- long: {warm['invalid']}" in report.markdown(built)


@pytest.mark.parametrize("name", ["prefix_warm", "long_warm"])
def test_a_warm_window_reports_its_hit_rate(plain, name):
    settings = SHORT.model_copy(update={"long_tokens": 3000})
    warm = run(plain, name, settings=settings)[name]
    summary = warm["summary"]
    assert warm["invalid"] is None and summary["temperature"] == "warm"
    assert summary["hit_rate"] == pytest.approx(
        summary["cached_tokens"] / summary["prompt_tokens"])
    assert 0.9 < summary["hit_rate"] <= 1
    assert "hit rate" in report.window_row(warm)[6]


def test_a_warm_window_primes_before_its_counters_and_measures_only_after(plain, monkeypatch):
    """The primer is sent once, before the window's counters are read: it is not measured."""
    happened = []

    async def counted(client, url, text, sample):
        happened.append(f"request {sample.label}")
        return await stream_generate(client, url, text, sample)

    async def links() -> dict:
        happened.append("counters")
        return {}

    monkeypatch.setattr(windows, "stream_generate", counted)
    settings = SHORT.model_copy(update={"long_tokens": 3000})
    warm = run(plain, "long_warm", settings=settings, links=links)["long_warm"]
    assert happened == ["request long-primer", "counters", "request long", "counters"]
    assert [sample["label"] for sample in warm["samples"]] == ["long"]
    # A cold window sends its one request between its counters, and primes nothing.
    happened.clear()
    run(plain, "long", settings=settings, links=links)
    assert happened == ["counters", "request long", "counters"]


def test_a_warm_window_whose_priming_did_not_hold_is_marked_invalid(plain, monkeypatch):
    async def flushed_after_priming(measurement, prefill):
        await windows.flush_caches(measurement)
        return {}

    monkeypatch.setattr(windows, "prime", flushed_after_priming)
    warm = run(plain, "long_warm", settings=SHORT.model_copy(update={"long_tokens": 3000}))
    assert warm["long_warm"]["invalid"].startswith(
        "a warm window found nothing cached in long after priming")


def test_a_campaign_plans_every_prefill_window_cold_and_warm():
    assert windows.both_temperatures(windows.names()) == windows.names()
    assert windows.both_temperatures(["single", "long_warm", "prefix", "concurrent"]) == [
        "single", "long", "long_warm", "prefix", "prefix_warm", "concurrent"]
    # The demo's windows stay as they are.
    assert windows.both_temperatures(["single", "concurrent"]) == ["single", "concurrent"]


def test_a_disturbed_window_is_named_and_measured_again_once_at_the_end(nextn):
    """Another process took this machine's CPU through the first window only."""
    readings = iter([0.0, 100.0, 100.0, 100.0, 100.0, 100.0])
    endpoint = Endpoint(nextn, "qwen", (nextn,), "local simulator")
    _, results = asyncio.run(windows.run(endpoint, ["single", "concurrent"], SHORT, no_links,
                                         machine_cpu=lambda: next(readings)))
    assert [(r["name"], bool(r["disturbed"]), r.get("again", False)) for r in results] == [
        ("single", True, False), ("concurrent", False, False), ("single", False, True)]
    assert results[0]["disturbed"].startswith("this machine: processes outside the "
                                              "measurement used")
    assert results[0]["beside"]["machine_cpu_seconds"] == 100.0
