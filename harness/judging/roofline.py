"""
What single-stream decoding could reach if only bandwidth counted: a roofline,
set beside the measured rate so a reader sees how much the rest costs.

Decoding one request is memory-bound: every step reads this rank's share of the
weights and the request's KV cache from GPU memory, so a forward pass takes at
least ``(weights + context x KV bytes per position) / TP size / GPU bandwidth``.
In TP2 each layer also all-reduces its output twice, ``hidden_size`` values per
token position one way, which takes at least its bytes over the link's rate.
With NEXTN a step first runs the draft's ``num_steps`` passes (its own layers,
one position each), then verifies ``num_draft_tokens`` positions through the
target, and yields the accept length in tokens.

Every input is read, none fitted: the model's shape and size from its files
(:class:`operations.serving.transport.ModelShape`), the GPU's memory bandwidth from the
site (``serving.gpu_memory_bandwidth_gb_s``), TP size and the speculative
settings from the server's ``/server_info``, the accept length measured in the
same window, and the link's rate from its XDomain. The bound leaves out every
latency: each all-reduce's round trip, kernel launches, the scheduler, and
retransmissions; the measured rate falls short of it by what they cost.
"""

from __future__ import annotations

from typing import Any

from operations.serving.transport import one_way_bytes


def single_stream(shape: dict[str, Any], bandwidth_gb_s: float, server_info: dict[str, Any],
                  accept_length: float | None, context_positions: int,
                  link_gbps: float | None) -> dict[str, Any] | None:
    """
    The roofline of one request's decoding, term by term, in tok/s; ``None``
    when an input is unknown (the model's size, the link's rate in TP, the
    accept length with speculation), since a bound with a term left out would
    not bound anything.
    """
    tp_size = int(server_info.get("tp_size") or 1)
    speculative = bool(server_info.get("speculative_algorithm"))
    if (not shape or not shape.get("weight_bytes") or (tp_size > 1 and not link_gbps)
            or (speculative and not accept_length)):
        return None
    read_per_layer = ((shape["weight_bytes"] + context_positions
                       * shape["kv_bytes_per_position"]) / shape["layers"] / tp_size)
    bandwidth = bandwidth_gb_s * 1e9
    draft_passes = int(server_info.get("speculative_num_steps") or 0) if speculative else 0
    verified = int(server_info.get("speculative_num_draft_tokens") or 1) if speculative else 1
    target_seconds = read_per_layer * shape["layers"] / bandwidth
    draft_seconds = draft_passes * read_per_layer * shape["draft_layers"] / bandwidth
    link_bytes = (one_way_bytes(shape, verified)
                  + one_way_bytes(shape, draft_passes, layers=shape["draft_layers"]))
    link_seconds = link_bytes * 8 / (link_gbps * 1e9) if tp_size > 1 else 0.0
    tokens_per_step = accept_length if speculative else 1.0
    step_seconds = target_seconds + draft_seconds + link_seconds
    return {
        "tok_s": tokens_per_step / step_seconds,
        "step_ms": step_seconds * 1e3,
        "target_ms": target_seconds * 1e3,
        "draft_ms": draft_seconds * 1e3,
        "link_ms": link_seconds * 1e3,
        "tokens_per_step": tokens_per_step,
        "inputs": {"weight_bytes": shape["weight_bytes"], "tp_size": tp_size,
                   "gpu_bandwidth_gb_s": bandwidth_gb_s, "link_gbps": link_gbps,
                   "context_positions": context_positions, "draft_passes": draft_passes,
                   "verified_positions": verified},
    }


def beside_measurement(shape: dict[str, Any] | None, bandwidth_gb_s: float,
                       server_info: dict[str, Any], single: dict[str, Any] | None,
                       link_gbps: float | None) -> dict[str, Any] | None:
    """
    The roofline of a measurement's single window, from its own request (the
    context it decoded over: the prompt and half the completion) and accept
    length, next to the rate it measured; ``None`` without that window.
    """
    if single is None or not single["samples"]:
        return None
    sample = single["samples"][0]
    context = (sample["prompt_tokens"] or 0) + (sample["completion_tokens"] or 0) // 2
    bound = single_stream(shape or {}, bandwidth_gb_s, server_info,
                          single["server"]["accept_length"], context, link_gbps)
    measured = single["summary"]["output_tok_s"]
    return {"bound": bound, "measured_tok_s": measured,
            "fraction": measured / bound["tok_s"] if bound and measured else None}
