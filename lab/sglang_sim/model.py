"""The model's shape, from its ``config.json``, as the real loader reads it.

What crosses the link in TP2 follows from the shape alone. Each layer ends in
two row-parallel projections (attention's output, the MLP's down projection),
and each is followed by an all-reduce of the layer's output: ``hidden_size``
activations per token position, in the model's dtype (NVFP4 quantizes the
weights; activations stay bf16). So one forward pass over ``positions`` token
positions all-reduces ``2 x layers x hidden_size x bytes x positions`` bytes;
the NEXTN draft is ``num_nextn_predict_layers`` such layers of its own.
"""

import json
from dataclasses import dataclass
from pathlib import Path

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden_size: int
    activation_bytes: int
    draft_layers: int

    @classmethod
    def read(cls, model_path: str) -> "ModelShape":
        """The shape in ``model_path/config.json``; fails like the real loader without one."""
        path = Path(model_path) / "config.json"
        try:
            config = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            raise OSError(
                f"Can't load the configuration of '{model_path}'. Make sure '{model_path}' "
                f"is the correct path to a directory containing a config.json file ({error})"
            ) from None
        # Multimodal checkpoints keep the language model's shape in text_config.
        config = config.get("text_config", config)
        try:
            return cls(layers=int(config["num_hidden_layers"]),
                       hidden_size=int(config["hidden_size"]),
                       activation_bytes=DTYPE_BYTES[config.get("torch_dtype", "bfloat16")],
                       draft_layers=int(config.get("num_nextn_predict_layers", 1)))
        except (KeyError, TypeError, ValueError) as error:
            raise OSError(f"{path}: no usable model shape ({error!r})") from None

    def allreduce_bytes(self, positions: int, layers: int | None = None) -> int:
        """What one forward pass over ``positions`` token positions all-reduces."""
        return 2 * (self.layers if layers is None else layers) * self.hidden_size \
            * self.activation_bytes * positions
