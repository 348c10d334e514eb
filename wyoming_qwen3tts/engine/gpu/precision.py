"""Which weights the batched CUDA engine stores: the model's dtype, or int8 (``--weight-quant``).

``auto`` keeps the model's dtype (bfloat16) when every enabled model fits in the memory the
card reports free with ``USEFUL_STREAMS`` streams each, and takes int8 weights
(``batched.quant``: 43 % less weight memory on the 1.7B models) when it does not. Pure
functions (bytes in, a choice and its reason out), unit-tested without a GPU; ``startup``
feeds them ``torch.cuda.mem_get_info`` and the checkpoints' sizes.
"""

from __future__ import annotations

import json
from pathlib import Path

from .sizing import GB, ModelNeed

#: ``--weight-quant`` choices: "none" keeps ``--dtype``'s weights, "int8" quantizes
#: (``batched.quant``), "auto" decides from the free memory (``pick_weight_quant``).
WEIGHT_QUANTS = ("auto", "none", "int8")
#: Streams each model must get at full precision for ``auto`` to keep it: the requests a
#: household makes at once (the memory benchmark's 4 clients), with room to spare.
USEFUL_STREAMS = 4
#: Bytes a weight takes when quantized (int8), plus its row's float32 scale (negligible).
INT8_BYTES = 1


def quantized_params(checkpoint: Path) -> int:
    """Parameters of a checkpoint that ``batched.quant.quantize_talker`` stores as int8 (the
    linears of the talker's and the code predictor's decoder layers, the text embedding),
    counted from its config.json (1.8 G of a 1.7B model's 1.93 G).

    Raises:
        OSError: no readable config.json. KeyError: a config without the talker's sizes.
    """
    talker = json.loads((checkpoint / "config.json").read_text())["talker_config"]
    total = int(talker["text_vocab_size"]) * int(talker["text_hidden_size"])
    for cfg in (talker, talker["code_predictor_config"]):
        hidden, heads, kv = int(cfg["hidden_size"]), int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
        head_dim = int(cfg.get("head_dim") or hidden // heads)
        per_layer = hidden * (heads + 2 * kv) * head_dim + heads * head_dim * hidden + 3 * hidden * int(cfg["intermediate_size"])
        total += per_layer * int(cfg["num_hidden_layers"])
    return total


def int8_weights(weights: int, quantized: int, element: int) -> int:
    """Bytes of a model's weights with ``quantized`` of its parameters in int8.

    Args:
        weights: bytes at the model's dtype (parameters x ``element``).
        quantized: parameters stored as int8 (``quantized_params``).
        element: bytes of the model's dtype (2 for bfloat16).
    """
    return max(0, weights - quantized * (element - INT8_BYTES))


def pick_weight_quant(
    choice: str, budget: int, needs: list[ModelNeed], int8_needs: list[ModelNeed], streams: int = USEFUL_STREAMS,
    dtype: str = "bfloat16",
) -> tuple[str, str]:
    """The weights to load, and why, in one log line.

    Args:
        choice: ``--weight-quant`` ("auto", "none" or "int8").
        budget: bytes this process may allocate on the card (``sizing.memory_budget`` of what
            ``torch.cuda.mem_get_info`` reports free, or less under ``--gpu-memory``).
        needs: the enabled models at the model's dtype; ``int8_needs``: the same with int8
            weights (``int8_weights``).
        streams: streams each model must get at full precision (``USEFUL_STREAMS``).
        dtype: the full-precision dtype's name (``cuda_env.pick_dtype``).

    Returns:
        ("none" or "int8", the weights' precision (``dtype`` or int8) then why, with the
        figures in GB: the log line's text after "Weight precision: ").

    Raises:
        ValueError: an unknown choice.
    """
    if choice not in WEIGHT_QUANTS:
        raise ValueError(f"unknown --weight-quant {choice!r}; one of {', '.join(WEIGHT_QUANTS)}")
    full = sum(n.footprint(streams) for n in needs)
    small = sum(n.footprint(streams) for n in int8_needs)
    figures = (
        f"{budget / GB:.1f} GB free; every model with {streams} streams needs {full / GB:.1f} GB in {dtype}, "
        f"{small / GB:.1f} GB with int8 weights"
    )
    name = {"none": dtype, "int8": "int8 (weight-only, per-channel scales)"}
    if choice != "auto":
        return choice, f"{name[choice]} (--weight-quant {choice}; {figures})"
    if full <= budget:
        return "none", f"{dtype}, because the models fit ({figures})"
    return "int8", f"{name['int8']}, because the models do not fit in {dtype} ({figures})"
