"""
A local SGLang simulator for the harness's unit tests: one process on
127.0.0.1 per use, started with the real server flags, stopped by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
NEXTN = ("--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4")
START_SECONDS = 15.0
# A small model keeps the loopback exchanges quick: 2 x 4 x 256 x 2 = 4 KiB per position.
SHAPE = {"num_hidden_layers": 4, "hidden_size": 256, "torch_dtype": "bfloat16"}
# Weights that one RTX 5090 (1792 GB/s) reads in 2 ms: a quick decode pass.
WEIGHT_BYTES = 3_584_000_000


def model_dir(directory: Path) -> Path:
    """A model directory as the simulator reads it: its config.json and weight index."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(SHAPE))
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": WEIGHT_BYTES}, "weight_map": {}}))
    return directory


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def simulator(directory: Path, *flags: str, **knobs: str) -> Iterator[str]:
    """A ready simulator serving ``qwen`` with metrics and cache report; yields its URL."""
    model = model_dir(directory / "model")
    port = free_port()
    environment = {name: value for name, value in os.environ.items()
                   if not name.startswith(("LAB_", "NCCL_"))}
    environment.update({
        "PYTHONPATH": str(REPO),
        "LAB_SGLANG_LOAD_SECONDS": "0.2",
        "LAB_SGLANG_GPU_DIR": str(directory / "gpu"),
        "LAB_FAULTS_DIR": str(directory / "faults"),
        **knobs,
    })
    log = (directory / f"sim-{port}.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "lab.sglang_sim", "--model-path", str(model),
         "--served-model-name", "qwen", "--host", "127.0.0.1", "--port", str(port),
         "--enable-metrics", "--enable-cache-report", *flags],
        cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_SECONDS
        while True:
            assert process.poll() is None, (directory / f"sim-{port}.log").read_text()
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"the simulator at {url} never got ready"
            time.sleep(0.05)
        yield url
    finally:
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(5)
        log.close()
