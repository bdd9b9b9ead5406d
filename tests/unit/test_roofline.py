"""The single-stream roofline: bandwidth terms only, every input read, none guessed."""

import pytest

from harness.judging import roofline
from harness.reporting import report

# The lab's model: Qwen3-32B's shape, 27e9 NVFP4 weights (4.5 bits each).
SHAPE = {"layers": 64, "hidden_size": 5120, "activation_bytes": 2, "draft_layers": 1,
         "kv_bytes_per_position": 2 * 64 * 8 * 128 * 2, "weight_bytes": 15_187_500_000}
RTX_5090 = 1792.0
NEXTN = {"tp_size": 2, "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
         "speculative_num_draft_tokens": 4}


def test_a_replica_reads_all_its_weights_every_token() -> None:
    bound = roofline.single_stream(SHAPE, RTX_5090, {"tp_size": 1}, None, 0, None)
    # 15.19 GB at 1792 GB/s: 8.48 ms a token.
    assert bound["target_ms"] == pytest.approx(8.475, abs=1e-3)
    assert bound["tok_s"] == pytest.approx(118.0, abs=0.1)
    assert (bound["draft_ms"], bound["link_ms"]) == (0.0, 0.0)


def test_tp2_halves_the_weights_and_adds_the_links_bytes() -> None:
    bound = roofline.single_stream(SHAPE, RTX_5090, {"tp_size": 2}, None, 0, 40.0)
    assert bound["target_ms"] == pytest.approx(8.475 / 2, abs=1e-3)
    # 2 all-reduces x 64 layers x 5120 x 2 bytes = 1.31 MB one way, at 40 Gb/s.
    assert bound["link_ms"] == pytest.approx(1_310_720 * 8 / 40e9 * 1e3)
    assert bound["tok_s"] == pytest.approx(1e3 / bound["step_ms"])


def test_nextn_pays_its_draft_and_wider_messages_for_its_accept_length() -> None:
    bound = roofline.single_stream(SHAPE, RTX_5090, NEXTN, 3.5, 1000, 40.0)
    per_layer = (15_187_500_000 + 1000 * SHAPE["kv_bytes_per_position"]) / 64 / 2 / 1792e9
    assert bound["target_ms"] == pytest.approx(per_layer * 64 * 1e3)
    assert bound["draft_ms"] == pytest.approx(3 * per_layer * 1e3)
    # The target verifies 4 positions through 64 layers; the draft runs 3 through its one.
    assert bound["link_ms"] == pytest.approx(2 * 5120 * 2 * (64 * 4 + 3) * 8 / 40e9 * 1e3)
    assert bound["tok_s"] == pytest.approx(3.5 / bound["step_ms"] * 1e3)
    assert bound["inputs"]["context_positions"] == 1000


def test_no_bound_with_a_term_unknown() -> None:
    assert roofline.single_stream({**SHAPE, "weight_bytes": None}, RTX_5090, {"tp_size": 1},
                                  None, 0, None) is None
    assert roofline.single_stream(SHAPE, RTX_5090, {"tp_size": 2}, None, 0, None) is None
    assert roofline.single_stream(SHAPE, RTX_5090, NEXTN, None, 0, 40.0) is None


def single_window(tok_s: float) -> dict:
    return {"name": "single", "summary": {"output_tok_s": tok_s},
            "samples": [{"prompt_tokens": 17, "completion_tokens": 256}],
            "server": {"accept_length": 3.5}}


def test_the_measurement_is_set_beside_its_bound_in_the_report() -> None:
    beside = roofline.beside_measurement(SHAPE, RTX_5090, NEXTN, single_window(200.0), 40.0)
    assert beside["bound"]["inputs"]["context_positions"] == 17 + 128
    assert beside["fraction"] == pytest.approx(200.0 / beside["bound"]["tok_s"])
    lines = "\n".join(report.roofline_lines(beside))
    assert "| measured | 200.0 |" in lines
    assert f"Measured: {beside['fraction'] * 100:.1f}% of the roofline" in lines
    assert roofline.beside_measurement(SHAPE, RTX_5090, NEXTN, None, 40.0) is None
    unknown = roofline.beside_measurement(None, RTX_5090, NEXTN, single_window(200.0), 40.0)
    assert unknown["bound"] is None
    assert "No roofline" in "\n".join(report.roofline_lines(unknown))


def test_a_replicas_roofline_names_neither_draft_nor_link() -> None:
    beside = roofline.beside_measurement(SHAPE, RTX_5090, {"tp_size": 1},
                                         single_window(110.0), 20.0)
    text = "\n".join(report.roofline_lines(beside))
    assert "over TP 1 at 1,792 GB/s, 145 positions of context. The roofline" in text
    assert "draft passes" not in text and "the link at" not in text
