"""
What the user's route costs: ``small`` against ``large`` asked directly, through
the gateway's LiteLLM proxy, with the ``openai`` client a real user has.

    .venv-lab/bin/python bench/user_route.py [--requests 20] [--tokens 8]

Run it in any state. During an experiment ``small`` is served by ``large``
through the temporary fallback, so the difference is what the fallback costs
each request; in production it is the Qwen deployment's own speed. For each
role and mode (streaming or not) it prints p50 and p95 of the whole request and
which deployment answered (``x-litellm-model-id``), then the p95 difference.

It prints figures; it asserts nothing (timing belongs here, not in tests).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from openai import OpenAI

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness.hosts.remote import remote_command  # noqa: E402
from operations.site.hosts import in_group, inventory_entries, ssh_config  # noqa: E402
from operations.site.settings import GatewaySettings  # noqa: E402

PROMPT = "say something about the cable"


def gateway_client() -> OpenAI:
    """A client for the gateway's proxy, with the master key read from the gateway."""
    entries = inventory_entries()
    gateway = in_group(entries, "gateway")[0]
    settings = GatewaySettings.of(gateway)
    with tempfile.NamedTemporaryFile("w", suffix=".ssh_config") as config:
        config.write(ssh_config(entries))
        config.flush()
        # Mode 600, the proxy's own: read as root, through sudo where the site needs it.
        key = subprocess.run(
            ["ssh", "-F", config.name, "--", gateway.name,
             remote_command(f"cat {shlex.quote(settings.roles.master_key_file)}",
                            sudo=gateway.sudo)],
            capture_output=True, text=True, check=True, timeout=30).stdout.strip()
    return OpenAI(base_url=f"{settings.proxy_url}/v1", api_key=key, max_retries=0, timeout=60)


def one_request(client: OpenAI, role: str, tokens: int, stream: bool) -> tuple[float, str]:
    """Seconds for one whole answer, and the deployment that gave it."""
    messages = [{"role": "user", "content": PROMPT}]
    started = time.monotonic()
    raw = client.chat.completions.with_raw_response.create(
        model=role, messages=messages, max_tokens=tokens, stream=stream)
    answer = raw.parse()
    if stream:
        for _ in answer:
            pass
    return time.monotonic() - started, raw.headers.get("x-litellm-model-id", "?")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args()
    client = gateway_client()
    p95 = {}
    print(f"{'role':6} {'mode':10} {'p50 s':>7} {'p95 s':>7}  answered by")
    for stream in (False, True):
        mode = "streaming" if stream else "whole"
        for role in ("large", "small"):
            seconds, answered = [], Counter()
            for _ in range(args.requests):
                took, deployment = one_request(client, role, args.tokens, stream)
                seconds.append(took)
                answered[deployment] += 1
            p95[role, mode] = percentile(seconds, 0.95)
            print(f"{role:6} {mode:10} {statistics.median(seconds):7.3f} {p95[role, mode]:7.3f}"
                  f"  {dict(answered)}")
        print(f"{'':6} {mode:10} small - large at p95: "
              f"{p95['small', mode] - p95['large', mode]:+.3f} s")


if __name__ == "__main__":
    main()
