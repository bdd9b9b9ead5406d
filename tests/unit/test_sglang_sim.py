"""The SGLang simulator, run as real processes on 127.0.0.1 and asked over HTTP."""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from simulator import SHAPE, WEIGHT_BYTES, model_dir

from harness.measuring import profile, traces
from lab.sglang_sim import link
from lab.sglang_sim.engine import Speculation
from lab.sglang_sim.link import socket_ifname
from lab.sglang_sim.model import ModelShape
from operations.serving.transport import (
    UBUNTU_CONGESTION_CONTROL,
    Connections,
    connections_of,
    endpoint,
)

REPO = Path(__file__).resolve().parents[2]
NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@dataclass
class Sim:
    proc: subprocess.Popen
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        return self.log_path.read_text()

    def get(self, path: str, **kwargs) -> httpx.Response:
        return httpx.get(self.url + path, timeout=kwargs.pop("timeout", 10), **kwargs)

    def post(self, path: str, payload: dict, **kwargs) -> httpx.Response:
        return httpx.post(self.url + path, json=payload, timeout=kwargs.pop("timeout", 10),
                          **kwargs)

    def health(self) -> int | None:
        """The status of /health, or None while nothing listens; fails if the process died."""
        if self.proc.poll() is not None:
            raise AssertionError(f"exited {self.proc.returncode}:\n{self.log()}")
        try:
            return self.get("/health", timeout=2).status_code
        except httpx.TransportError:
            return None

    def wait_ready(self, timeout: float = 10) -> "Sim":
        wait_for(lambda: self.health() == 200, timeout, f"{self.url}/health == 200")
        return self

    def wait_exit(self, timeout: float = 10) -> int:
        return self.proc.wait(timeout)


@pytest.fixture
def lab_dirs(tmp_path):
    return {"model": model_dir(tmp_path / "models" / "qwen"), "gpu": tmp_path / "gpu",
            "faults": tmp_path / "faults", "logs": tmp_path}


@pytest.fixture
def launch(lab_dirs):
    """Start simulators; every one still running is killed at teardown."""
    launched: list[Sim] = []
    base_env = {name: value for name, value in os.environ.items()
                if not name.startswith(("LAB_", "NCCL_"))}
    base_env.update({
        "PYTHONPATH": str(REPO),
        "LAB_SGLANG_LOAD_SECONDS": "0.2",
        # NCCL's own pick would be this machine's LAN port, Gloo's its name's address.
        "NCCL_SOCKET_IFNAME": "lo",
        "GLOO_SOCKET_IFNAME": "lo",
        "LAB_SGLANG_GPU_DIR": str(lab_dirs["gpu"]),
        "LAB_FAULTS_DIR": str(lab_dirs["faults"]),
    })

    def start(*flags: str, env: dict | None = None, port: int | None = None) -> Sim:
        port = port or free_port()
        log_path = lab_dirs["logs"] / f"sim-{len(launched)}.log"
        command = [sys.executable, "-m", "lab.sglang_sim", "--model-path",
                   str(lab_dirs["model"]), "--served-model-name", "qwen", "--port", str(port),
                   *flags]
        with log_path.open("w") as log:
            proc = subprocess.Popen(command, cwd=REPO, env={**base_env, **(env or {})},
                                    stdout=log, stderr=subprocess.STDOUT)
        sim = Sim(proc, port, log_path)
        launched.append(sim)
        return sim

    yield start
    for sim in launched:
        if sim.proc.poll() is None:
            sim.proc.kill()
            sim.proc.wait(5)


def run_sim(*flags: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "lab.sglang_sim", *flags], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=20)


def switch_fault(lab_dirs: dict, name: str) -> None:
    lab_dirs["faults"].mkdir(exist_ok=True)
    (lab_dirs["faults"] / name).touch()


def chat(sim: Sim, content: str, max_tokens: int, timeout: float = 10, headers=None,
         **fields) -> httpx.Response:
    payload = {"model": "qwen", "messages": [{"role": "user", "content": content}],
               "max_tokens": max_tokens, **fields}
    return sim.post("/v1/chat/completions", payload, timeout=timeout, headers=headers)


def stream_events(response: httpx.Response) -> list:
    lines = [line.removeprefix("data: ") for line in response.text.splitlines() if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# Command line


def test_unknown_flag_exits_2(lab_dirs):
    result = run_sim("--model-path", str(lab_dirs["model"]), "--speculative-algo-typo", "x")
    assert result.returncode == 2
    assert "unrecognized arguments" in result.stderr


def test_nvfp4_is_not_a_quantization(lab_dirs):
    result = run_sim("--model-path", str(lab_dirs["model"]), "--quantization", "nvfp4")
    assert result.returncode == 2
    assert "invalid choice: 'nvfp4'" in result.stderr


def test_missing_model_path_exits_1_naming_it(lab_dirs, tmp_path):
    missing = tmp_path / "models" / "absent"
    result = run_sim("--model-path", str(missing), "--port", str(free_port()))
    assert result.returncode == 1
    assert str(missing) in result.stderr


def test_the_model_shape_comes_from_config_json_as_the_loader_reads_it(tmp_path):
    model_dir(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(
        {"text_config": {**SHAPE, "torch_dtype": "float32", "num_attention_heads": 8,
                         "num_key_value_heads": 2}, "vision_config": {}}))
    shape = ModelShape.read(str(tmp_path))
    assert (shape.layers, shape.hidden_size, shape.activation_bytes) == (4, 256, 4)
    assert shape.weight_bytes == WEIGHT_BYTES
    # K and V, per layer, per KV head of 256 / 8 values.
    assert shape.kv_bytes_per_position == 2 * 4 * 2 * 32 * 4
    # One layer's output, three positions wide.
    assert shape.allreduce_bytes(3) == 256 * 4 * 3
    (tmp_path / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
    with pytest.raises(OSError, match="no usable model shape"):
        ModelShape.read(str(tmp_path))


def test_the_weights_size_comes_from_the_index_else_the_safetensors_files(tmp_path):
    model_dir(tmp_path)
    (tmp_path / "model.safetensors.index.json").unlink()
    with pytest.raises(OSError, match="no safetensors weights"):
        ModelShape.read(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(bytes(1000))
    assert ModelShape.read(str(tmp_path)).weight_bytes == 1000


def test_a_decode_pass_reads_the_ranks_share_of_weights_and_kv_cache(tmp_path):
    shape = ModelShape.read(str(model_dir(tmp_path)))
    bandwidth = 1792e9
    assert shape.pass_seconds(0, 4, 1, bandwidth) == pytest.approx(0.002)
    assert shape.pass_seconds(0, 4, 2, bandwidth) == pytest.approx(0.001)
    # The one-layer draft reads a quarter of a four-layer model.
    assert shape.pass_seconds(0, 1, 2, bandwidth) == pytest.approx(0.00025)
    cached = 1000 * shape.kv_bytes_per_position / 2 / bandwidth
    assert shape.pass_seconds(1000, 4, 2, bandwidth) == pytest.approx(0.001 + cached)


def test_nccl_socket_ifname_accepts_one_exact_name():
    assert socket_ifname("=thunderbolt0") == "thunderbolt0"
    assert socket_ifname("thunderbolt0") == "thunderbolt0"
    assert socket_ifname(None) is None
    with pytest.raises(ValueError, match="not lists or exclusions"):
        socket_ifname("^lo,docker")


# Serving


def test_health_is_503_while_loading_then_200(launch):
    sim = launch(env={"LAB_SGLANG_LOAD_SECONDS": "1.5"})
    wait_for(lambda: sim.health() is not None, 5, "the HTTP server")
    assert sim.health() == 503
    assert chat(sim, "hi", 4).status_code == 503
    sim.wait_ready()
    assert "The server is fired up and ready to roll!" in sim.log()


def test_chat_completion_generates_exactly_max_tokens(launch):
    sim = launch().wait_ready()
    body = chat(sim, "tell me about the link", 37).json()
    assert len(body["choices"][0]["message"]["content"].split()) == 37
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 37
    assert body["usage"]["prompt_tokens"] == 6  # five words and the role
    assert body["usage"]["total_tokens"] == 43

    response = chat(sim, "tell me about the link", 37, stream=True,
                    stream_options={"include_usage": True})
    assert response.headers["content-type"] == "text/event-stream"
    events = stream_events(response)
    text = "".join(event["choices"][0]["delta"].get("content", "")
                   for event in events if event["choices"])
    assert len(text.split()) == 37
    assert events[-1]["choices"] == []
    assert events[-1]["usage"]["completion_tokens"] == 37

    completion = sim.post("/v1/completions", {"prompt": "x y z", "max_tokens": 5}).json()
    assert len(completion["choices"][0]["text"].split()) == 5


def test_cache_report_shows_cached_tokens_on_a_repeated_prompt(launch):
    reporting = launch("--enable-cache-report")
    silent = launch()
    long_prompt = "x " * 1000  # 1001 tokens with the role
    for sim in (reporting.wait_ready(), silent.wait_ready()):
        first = chat(sim, long_prompt, 4).json()["usage"]
        assert first["prompt_tokens"] == 1001
        assert first["prompt_tokens_details"] is None
    second = chat(reporting, long_prompt, 4).json()["usage"]
    assert second["prompt_tokens_details"] == {"cached_tokens": 960}
    assert chat(silent, long_prompt, 4).json()["usage"]["prompt_tokens_details"] is None
    meta = silent.post("/generate", {"text": "user: " + long_prompt,
                                     "sampling_params": {"max_new_tokens": 1}}).json()
    assert meta["meta_info"]["cached_tokens"] == 960


def test_context_overflow_is_400_with_sglang_message(launch):
    sim = launch("--context-length", "1000").wait_ready()
    response = chat(sim, "x " * 900, 200)
    assert response.status_code == 400
    assert response.json() == {
        "object": "error",
        "message": "Requested token count exceeds the model's maximum context length of 1000 "
                   "tokens. You requested a total of 1101 tokens: 901 tokens from the input "
                   "messages and 200 tokens for the completion. Please reduce the number of "
                   "tokens in the input messages or the completion to fit within the limit.",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    assert chat(sim, "x " * 900, 50).status_code == 200


def test_the_kv_cache_pool_is_what_the_gpu_holds_beside_the_weights_and_bounds_the_input(
        launch):
    """
    SGLang's profile: the memory within --mem-fraction-static less the rank's
    weights, over one position's KV cache. 0.11 of a 5090 (32,607 MiB) less
    3.584 GB of weights leaves 177 MB: 43,213 positions of 4 KiB.
    """
    sim = launch("--mem-fraction-static", "0.11").wait_ready()
    info = sim.get("/server_info").json()
    assert info["max_total_num_tokens"] == (
        int(0.11 * (32607 << 20) - WEIGHT_BYTES) // (2 * 4 * 256 * 2)) == 43213
    # Under the context length (262,144) and the pool, less 5, as 0.5.9's worker sets it.
    assert info["max_req_input_len"] == 43212 - 5
    refused = generate(sim, "x " * 43300, 4)
    assert refused.status_code == 400
    assert "exceeds the maximum allowed length (43207 tokens)" in refused.text
    assert generate(sim, "x " * 1000, 4).status_code == 200


def test_tp2_holds_more_than_twice_a_replicas_kv_cache():
    """Half the weights and half of each position's KV heads on each rank."""
    shape = ModelShape(layers=64, hidden_size=5120, activation_bytes=2, draft_layers=1,
                       kv_bytes_per_position=2 * 64 * 8 * 128 * 2, weight_bytes=15_187_500_000)
    gpu = 32607 << 20
    replica, rank = shape.kv_cache_tokens(gpu, 0.85, 1), shape.kv_cache_tokens(gpu, 0.80, 2)
    assert (replica, rank) == (52_928, 150_749)
    assert rank > 2 * replica


def test_server_info_reports_nextn_as_eagle(launch):
    sim = launch(*NEXTN, "--quantization", "modelopt_fp4").wait_ready()
    info = sim.get("/server_info").json()
    assert info["speculative_algorithm"] == "EAGLE"
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == (3, 1, 4)
    assert info["quantization"] == "modelopt_fp4"
    assert info["tp_size"] == 1
    assert info["version"] == "0.5.9"
    assert sim.get("/get_server_info").json()["served_model_name"] == "qwen"
    assert sim.get("/model_info").json()["is_generation"] is True
    assert sim.get("/v1/models").json()["data"][0]["id"] == "qwen"


def test_api_key_is_required_except_for_health(launch):
    sim = launch("--api-key", "sekret").wait_ready()
    assert chat(sim, "hi", 2).status_code == 401
    assert chat(sim, "hi", 2, headers={"Authorization": "Bearer sekret"}).status_code == 200
    assert sim.get("/health").status_code == 200


def test_nextn_accepts_about_four_tokens_per_step(launch):
    spec = launch(*NEXTN)
    plain = launch()
    request = {"text": "explain the thunderbolt link", "sampling_params": {"max_new_tokens": 256}}
    spec_meta = spec.wait_ready().post("/generate", request).json()["meta_info"]
    plain_meta = plain.wait_ready().post("/generate", request).json()["meta_info"]
    assert spec_meta["completion_tokens"] == plain_meta["completion_tokens"] == 256
    assert 3.3 <= spec_meta["spec_accept_length"] <= 4.0
    assert spec_meta["spec_verify_ct"] < 256 / 3
    assert "spec_verify_ct" not in plain_meta
    assert spec_meta["e2e_latency"] < plain_meta["e2e_latency"]
    state = spec.get("/server_info").json()["internal_states"][0]
    assert 3.3 <= state["avg_spec_accept_length"] <= 4.0


def generate(sim: Sim, text: str, tokens: int, **fields) -> httpx.Response:
    return sim.post("/generate", {"text": text, "sampling_params": {"max_new_tokens": tokens},
                                  **fields})


def test_avg_spec_accept_length_is_folded_in_every_decode_log_interval_batches(launch):
    sim = launch(*NEXTN, "--decode-log-interval", "3").wait_ready()
    assert sim.get("/server_info").json()["decode_log_interval"] == 3

    def state() -> dict:
        return sim.get("/server_info").json()["internal_states"][0]

    # One-token requests, one decode batch each, one token per verify step.
    for index in range(2):
        generate(sim, f"batch {index}", 1)
    # Two batches: nothing folded in yet, and SGLang leaves the key out until then.
    assert "avg_spec_accept_length" not in state()
    generate(sim, "batch 2", 1)
    wait_for(lambda: state().get("avg_spec_accept_length") == 1.0, 5, "the third batch's fold")
    wait_for(lambda: sim.log().count("accept len: 1.00") == 1, 5, "the fold's decode log line")
    # A longer request: its own meta_info is right at once; the average holds only
    # the batches up to the last fold, three of them at one token per step.
    meta = generate(sim, "a longer one", 64).json()["meta_info"]
    assert meta["spec_accept_length"] == 64 / meta["spec_verify_ct"] > 2
    folds = (3 + meta["spec_verify_ct"]) // 3
    wait_for(lambda: sim.log().count("Decode batch.") == folds, 5, f"{folds} decode log lines")
    assert 1.0 < state()["avg_spec_accept_length"] < meta["spec_accept_length"]


def test_generate_streams_its_meta_info_and_the_verify_steps_once_finished(launch):
    sim = launch(*NEXTN).wait_ready()
    events = stream_events(generate(sim, "stream it", 32, stream=True))
    metas = [event["meta_info"] for event in events]
    assert all(meta["finish_reason"] is None and "spec_verify_ct" not in meta
               for meta in metas[:-1])
    last = metas[-1]
    assert last["finish_reason"] == {"type": "length", "length": 32}
    assert last["completion_tokens"] == 32 and len(events[-1]["text"].split()) == 32
    # A verify step is an event whose completion tokens grew.
    counts = [0] + [meta["completion_tokens"] for meta in metas]
    steps = sum(1 for earlier, later in zip(counts, counts[1:], strict=False) if later > earlier)
    assert last["spec_verify_ct"] == steps < 32
    assert last["spec_accept_length"] == 32 / steps
    # NEXTN 3/1/4 guesses 3 drafts per step; each step adds the target's own token.
    assert (last["spec_accept_token_num"], last["spec_draft_token_num"]) == (32 - steps, 3 * steps)
    assert last["spec_accept_rate"] == (32 - steps) / (3 * steps)
    histogram = last["spec_accept_histogram"]
    assert sum(histogram) == steps
    assert sum(drafts * count for drafts, count in enumerate(histogram)) == 32 - steps


def test_metrics_use_sglang_names(launch):
    sim = launch("--enable-metrics").wait_ready()
    chat(sim, "hello", 3)
    text = sim.get("/metrics").text
    for name in ("sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                 "sglang:cached_tokens_total", "sglang:time_to_first_token_seconds_bucket",
                 "sglang:time_to_first_token_seconds_sum",
                 "sglang:time_to_first_token_seconds_count", "sglang:spec_accept_length"):
        assert f'{name}{{' in text, name
    assert 'sglang:generation_tokens_total{model_name="qwen"} 3.0' in text
    assert launch().wait_ready().get("/metrics").status_code == 404


def test_loads_count_the_requests_in_flight_as_sglangs_v1_loads_does(launch):
    """What a drain waits on: a request being decoded counts until it is answered."""
    sim = launch().wait_ready()
    idle = sim.get("/v1/loads").json()
    assert idle["aggregate"] == {"total_running_reqs": 0, "total_waiting_reqs": 0,
                                 "total_reqs": 0}
    assert idle["dp_rank_count"] == 1 and idle["loads"][0]["num_total_reqs"] == 0
    answered = threading.Thread(target=chat, args=(sim, "a long answer", 400))
    answered.start()
    try:
        wait_for(lambda: sim.get("/v1/loads").json()["aggregate"]["total_reqs"] == 1, 5,
                 "the request counted")
    finally:
        answered.join()
    assert sim.get("/v1/loads").json()["aggregate"]["total_reqs"] == 0


def test_gpu_memory_file_is_written_and_removed_on_sigterm(launch, lab_dirs):
    sim = launch().wait_ready()
    gpu_file = lab_dirs["gpu"] / str(sim.proc.pid)
    assert gpu_file.read_text().strip() == str(round(0.85 * 32607))
    sim.proc.send_signal(signal.SIGTERM)
    assert sim.wait_exit() == 0
    assert not gpu_file.exists()


# TP2 over loopback


def test_a_decode_step_takes_at_least_the_rooflines_time(launch):
    """The knob sets the physics: a slower GPU decodes the same request more slowly."""
    fast = launch().wait_ready()
    slow = launch(env={"LAB_SGLANG_GPU_BANDWIDTH_GB_S": "358.4"}).wait_ready()
    for sim, pass_seconds in ((fast, 0.002), (slow, 0.010)):
        meta = sim.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 40}}
                        ).json()["meta_info"]
        # One pass per token, each reading the model's weights once; never less.
        assert meta["e2e_latency"] >= 40 * pass_seconds


def test_tp2_ranks_exchange_payloads_profile_together_and_fail_together(launch, tmp_path):
    dist = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{free_port()}",
            *NEXTN]
    # Rank 1 with NCCL's INFO lines, rank 0 without.
    rank1 = launch(*dist, "--node-rank", "1", env={"LAB_SGLANG_LOAD_SECONDS": "1.0",
                                                   "NCCL_DEBUG": "INFO"})
    wait_for(lambda: rank1.health() == 200, 5, "rank 1's dummy /health")
    assert rank1.get("/v1/models").status_code == 404
    rank0 = launch(*dist, "--node-rank", "0")
    wait_for(lambda: rank0.health() == 503, 5, "rank 0 loading")
    rank0.wait_ready()
    said = profile.transport([line for line in rank1.log().splitlines()
                              if "NCCL INFO" in line])
    assert (said.interface, said.address, said.transports, said.channels) == (
        "lo", "127.0.0.1", ("NET/Socket",), 2)
    assert "NCCL INFO" not in rank0.log()

    assert len(chat(rank0, "hello", 16).json()["choices"][0]["message"]["content"].split()) == 16
    info = rank0.get("/server_info").json()
    assert (info["tp_size"], info["nnodes"], info["speculative_algorithm"]) == (2, 2, "EAGLE")
    before = info["internal_states"][0]["allreduce_bytes"]
    meta = rank0.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 64}}
                      ).json()["meta_info"]
    after = rank0.get("/server_info").json()["internal_states"][0]["allreduce_bytes"]
    # Its prefill: the uncached prompt through all 4 layers. Each step: the draft's 3
    # one-position passes over its one layer, then 4 positions verified over all 4
    # layers. Two all-reduces per layer, each rank sending its size: as much comes back.
    per_position = 2 * 256 * 2
    prefill = (meta["prompt_tokens"] - meta["cached_tokens"]) * 4 * per_position
    step = 3 * 1 * per_position + 4 * 4 * per_position
    assert after - before == 2 * (prefill + meta["spec_verify_ct"] * step)

    # SGLang's profiler, on both ranks at once: each writes its own trace.
    assert rank0.post("/stop_profile", {}).status_code == 500
    output_dir = tmp_path / "profiles"
    started = rank0.post("/start_profile", {"output_dir": str(output_dir)})
    assert (started.status_code, started.text) == (200, "Start profiling.\n")
    assert rank0.post("/start_profile", {"output_dir": str(output_dir)}).status_code == 500
    meta = generate(rank0, "profiled", 32).json()["meta_info"]
    assert rank0.post("/stop_profile", {}).text == "Stop profiling. This will take some time.\n"
    written = sorted(path.name for path in output_dir.iterdir())
    assert [name.split("-", 1)[1] for name in written] == ["TP-0.trace.json.gz",
                                                           "TP-1.trace.json.gz"]
    for name in written:
        found = traces.kernels(traces.load((output_dir / name).read_bytes()))
        allreduces = [kernel for kernel in found if kernel.allreduce]
        # Every verify and draft pass of the request: its two all-reduces per layer.
        passes = meta["spec_verify_ct"] * (1 + 3)
        assert len(found) - len(allreduces) >= passes
        assert len(allreduces) >= passes * 2 * 1
        assert {kernel.name for kernel in allreduces} == {
            "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"}

    rank1.proc.kill()
    assert rank0.wait_exit() != 0
    assert "connection closed by peer rank" in rank0.log()


def connections_now() -> dict:
    """This machine's processes, connections and addresses, as the transport fact reads them."""
    done = subprocess.run(["sh", "-c", Connections().command()], capture_output=True, text=True,
                          check=True)
    return Connections().process(done.stdout.splitlines())


def kinds_of_connections(reading: dict, sim: Sim, dist_port: int) -> dict[str, int]:
    """A rank's connections by kind; each socket of the group must be its scheduler's."""
    held = connections_of(reading, sim.proc.pid)
    # ss writes a socket bound to a device as addr%dev:port, on its own side only.
    holders = {endpoint(connection["local"]): connection["pids"]
               for connection in reading["connections"]}
    children = {pid for pid, parent in reading["parents"].items() if parent == sim.proc.pid}
    kinds = {"store": 0, "nccl proxy": 0, "to the peer": 0, "http": 0}
    for connection in held:
        (_, port), (_, peer_port) = endpoint(connection["local"]), endpoint(connection["peer"])
        if port == sim.port:
            assert connection["pids"] == [sim.proc.pid], connection
            kinds["http"] += 1
            continue
        # The server's process holds none of the group's sockets: its scheduler does.
        assert len(connection["pids"]) == 1 and connection["pids"][0] in children, connection
        if dist_port in (port, peer_port):
            kinds["store"] += 1
        elif holders.get(endpoint(connection["peer"])) == connection["pids"]:
            kinds["nccl proxy"] += 1
        else:
            kinds["to the peer"] += 1
    return kinds


def test_tp2_ranks_hold_a_real_groups_sockets_in_their_scheduler_processes(launch):
    """
    Rank 0's scheduler hosts the store and is its client (both ends), rank 1's
    joins it; each has its NCCL proxy connection (both ends), the bootstrap
    ring, two channels each way and Gloo's pair; the server's process holds
    only HTTP.
    """
    dist_port = free_port()
    dist = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{dist_port}"]
    rank1 = launch(*dist, "--node-rank", "1")
    rank0 = launch(*dist, "--node-rank", "0").wait_ready()
    with socket.create_connection(("127.0.0.1", rank0.port)):
        reading = connections_now()
        # To the peer: NCCL's bootstrap ring (2), its two channels each way (4), Gloo's pair.
        assert kinds_of_connections(reading, rank0, dist_port) == {
            "store": 3, "nccl proxy": 2, "to the peer": 7, "http": 1}
        assert kinds_of_connections(reading, rank1, dist_port) == {
            "store": 1, "nccl proxy": 2, "to the peer": 7, "http": 0}
    store_self = [c for c in connections_of(reading, rank0.proc.pid)
                  if endpoint(c["local"])[1] == dist_port and
                  any(endpoint(o["local"]) == endpoint(c["peer"]) and o["pids"] == c["pids"]
                      for o in reading["connections"])]
    assert len(store_self) == 1, "rank 0 is not its own store's client"
    scheduler = next(pid for pid, parent in reading["parents"].items()
                     if parent == rank0.proc.pid and pid in store_self[0]["pids"])
    assert chat(rank0, "hello", 8).status_code == 200

    # A scheduler never outlives its server, even one killed outright.
    rank0.proc.kill()
    rank0.proc.wait(5)
    wait_for(lambda: not Path(f"/proc/{scheduler}").exists(), 5, "rank 0's scheduler to exit")
    assert rank1.wait_exit() == 1
    assert "connection closed by peer rank" in rank1.log()


def test_nccl_over_ipv6_stops_both_ranks_naming_the_variable(launch):
    dist = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{free_port()}"]
    rank1 = launch(*dist, "--node-rank", "1")
    rank0 = launch(*dist, "--node-rank", "0", env={"NCCL_SOCKET_FAMILY": "AF_INET6"})
    assert rank0.wait_exit(20) == 1
    assert "NCCL_SOCKET_FAMILY='AF_INET6'" in rank0.log()
    # Its store gone, rank 1 cannot form the group either.
    assert rank1.wait_exit(20) == 1
    assert "fired up" not in rank0.log()


def test_rank1s_dummy_health_stays_green_while_rank0_hangs(launch, lab_dirs):
    dist = ["--tp-size", "2", "--nnodes", "2", "--dist-init-addr", f"127.0.0.1:{free_port()}"]
    env = {"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}
    rank1 = launch(*dist, "--node-rank", "1", env=env)
    rank0 = launch(*dist, "--node-rank", "0", env=env).wait_ready()
    switch_fault(lab_dirs, "rank_hang")
    with pytest.raises(httpx.ReadTimeout):
        chat(rank0, "hello", 4, timeout=1.0)
    assert rank0.get("/health").status_code == 503
    assert rank1.get("/health").status_code == 200


# Faults


def test_draft_init_crash_stops_speculative_ranks_only(launch, lab_dirs):
    switch_fault(lab_dirs, "draft_init_crash")
    speculative = launch(*NEXTN)
    plain = launch()
    assert speculative.wait_exit() == 1
    assert "Initializing draft model" in speculative.log()
    assert "Traceback" in speculative.log()
    assert "fired up" not in speculative.log()
    plain.wait_ready()


def test_rank_hang_stops_generation_and_0_5_9s_health_says_so(launch, lab_dirs):
    """0.5.9's /health is a one-token generation: 503 once the health check times out."""
    sim = launch(env={"SGLANG_HEALTH_CHECK_TIMEOUT": "1"}).wait_ready()
    switch_fault(lab_dirs, "rank_hang")
    with pytest.raises(httpx.ReadTimeout):
        chat(sim, "hello", 4, timeout=1.0)
    started = time.monotonic()
    assert sim.get("/health").status_code == 503
    assert time.monotonic() - started >= 1.0
    assert sim.get("/health_generate").status_code == 503


def test_rank_hang_green_health_is_an_older_releases_health(launch, lab_dirs):
    sim = launch().wait_ready()
    switch_fault(lab_dirs, "rank_hang_green_health")
    with pytest.raises(httpx.ReadTimeout):
        chat(sim, "hello", 4, timeout=1.0)
    assert sim.get("/health").status_code == 200
    with pytest.raises(httpx.ReadTimeout):
        sim.get("/health_generate", timeout=1.0)


# Pure parts


def test_speculation_mean_accept_length_is_about_3_8():
    rng = random.Random(0)
    nextn = Speculation(num_steps=3, num_draft_tokens=4, accept_rate=0.966)
    lengths = [nextn.accept_length(rng) for _ in range(20000)]
    assert max(lengths) == 4
    assert 3.75 <= sum(lengths) / len(lengths) <= 3.85


def test_the_tp_groups_sockets_ask_for_ubuntus_congestion_control() -> None:
    """CUBIC on both ends, a listener's connections inheriting it, as ``ss -ti`` then shows."""
    def congestion(sock: socket.socket) -> str:
        chosen = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16)
        return chosen.rstrip(b"\0").decode()

    with link.listener("127.0.0.1") as listening, link.tcp_socket() as client:
        client.connect(listening.getsockname())
        accepted, _ = listening.accept()
        with accepted:
            assert {congestion(client), congestion(accepted)} == {UBUNTU_CONGESTION_CONTROL}
