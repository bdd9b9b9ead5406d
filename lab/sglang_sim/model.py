"""The model's shape and size, from its files, as the real loader reads them.

What crosses the link in TP2 follows from the shape alone. Each layer ends in
two row-parallel projections (attention's output, the MLP's down projection),
and each is followed by an all-reduce of the layer's output: ``hidden_size``
activations per token position, in the model's dtype (NVFP4 quantizes the
weights; activations stay bf16). The NEXTN draft is
``num_nextn_predict_layers`` such layers of its own.

What a decode step costs on the GPU follows from the size: decoding a few
positions is memory-bound, so a forward pass takes as long as the GPU needs to
read its share of the weights (``model.safetensors.index.json``'s
``total_size``, split over the TP ranks) and each request's KV cache
(``2 x layers x num_key_value_heads x head_dim`` values per cached position).
The GPU's memory bandwidth is a lab knob (:mod:`lab.sglang_sim.knobs`).
"""

import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
WEIGHT_INDEX = "model.safetensors.index.json"


def _loader_error(model_path: str, error: object) -> OSError:
    return OSError(
        f"Can't load the configuration of '{model_path}'. Make sure '{model_path}' "
        f"is the correct path to a directory containing a config.json file ({error})"
    )


def _weight_bytes(directory: Path) -> int:
    """The checkpoint's size: its index's ``total_size``, else its safetensors files'."""
    try:
        return int(json.loads((directory / WEIGHT_INDEX).read_text())["metadata"]["total_size"])
    except FileNotFoundError:
        files = sorted(directory.glob("*.safetensors"))
        if not files:
            raise OSError(f"{directory}: no safetensors weights (neither {WEIGHT_INDEX} "
                          "nor *.safetensors)") from None
        return sum(path.stat().st_size for path in files)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise OSError(f"{directory / WEIGHT_INDEX}: no usable total_size ({error!r})") from None


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden_size: int
    activation_bytes: int
    draft_layers: int
    kv_bytes_per_position: int
    weight_bytes: int

    @classmethod
    def read(cls, model_path: str) -> "ModelShape":
        """The shape in ``model_path``; fails like the real loader without config or weights."""
        directory = Path(model_path)
        try:
            config = json.loads((directory / "config.json").read_text())
        except (OSError, ValueError) as error:
            raise _loader_error(model_path, error) from None
        # Multimodal checkpoints keep the language model's shape in text_config.
        config = config.get("text_config", config)
        try:
            layers = int(config["num_hidden_layers"])
            hidden_size = int(config["hidden_size"])
            activation_bytes = DTYPE_BYTES[config.get("torch_dtype", "bfloat16")]
            heads = int(config.get("num_attention_heads", 1))
            head_dim = int(config.get("head_dim", hidden_size // heads))
            kv_heads = int(config.get("num_key_value_heads", heads))
            draft_layers = int(config.get("num_nextn_predict_layers", 1))
        except (KeyError, TypeError, ValueError) as error:
            raise OSError(f"{directory / 'config.json'}: no usable model shape "
                          f"({error!r})") from None
        return cls(layers=layers, hidden_size=hidden_size, activation_bytes=activation_bytes,
                   draft_layers=draft_layers,
                   kv_bytes_per_position=2 * layers * kv_heads * head_dim * activation_bytes,
                   weight_bytes=_weight_bytes(directory))

    def kv_cache_tokens(self, gpu_bytes: int, mem_fraction: float, tp_size: int) -> int:
        """
        ``max_total_num_tokens``, as SGLang 0.5.9 profiles it
        (``model_runner_kv_cache_mixin.py``, ``profile_max_num_token``): the
        memory left on one rank within ``--mem-fraction-static`` once its share
        of the weights is loaded, over one position's KV cache on that rank,
        whose share of the KV heads is one ``tp_size``-th. So TP2 holds more
        than twice a replica's tokens: half the weights, half of each position.
        """
        rest = gpu_bytes * mem_fraction - self.weight_bytes / tp_size
        return max(0, int(rest) // (self.kv_bytes_per_position // tp_size))

    def allreduce_bytes(self, positions: int) -> int:
        """One all-reduce of one layer's output over ``positions`` token positions."""
        return self.hidden_size * self.activation_bytes * positions

    def pass_seconds(self, context_positions: int, layers: int, tp_size: int,
                     bandwidth_bytes_per_second: float) -> float:
        """
        One memory-bound forward pass through ``layers`` of the model's layers on
        one of ``tp_size`` GPUs: their share of the weights, and the KV cache of
        ``context_positions`` cached positions (all requests together), read once.
        A draft layer is taken to weigh what a target layer does.
        """
        share = layers / self.layers / tp_size
        read = (self.weight_bytes + context_positions * self.kv_bytes_per_position) * share
        return read / bandwidth_bytes_per_second
