"""What a tensor is for, guessed from its name, and its shape class.

These are the strata of the prior: tensors of one role tend to share
structure (norm weights near 1, biases near 0, embeddings with rows that
repeat), so statistics learned on some of them carry over to the rest.
"""

from __future__ import annotations

import re

ROLES = [
    ("header", r"^__(header|gap|trailer)__$"),
    ("norm", r"norm|(^|[._])ln[._0-9]|layer_?norm|\bbn\d*\b|batch_?norm|running_(mean|var)|num_batches"),
    ("bias", r"bias$"),
    ("embedding", r"embed|wte|wpe|tok_emb|token_emb|word_emb|shared\.weight"),
    ("position", r"position|pos_emb|rotary|inv_freq"),
    ("attention", r"attn|attention|q_proj|k_proj|v_proj|o_proj|query|key|value|qkv"),
    ("mlp", r"mlp|ffn|fc\d|intermediate|up_proj|down_proj|gate_proj|dense"),
    ("conv", r"conv"),
    ("head", r"lm_head|classifier|head\."),
]
_COMPILED = [(role, re.compile(pattern, re.IGNORECASE)) for role, pattern in ROLES]


def role_of(name: str, is_tensor: bool) -> str:
    if not is_tensor and not name.startswith("__"):
        return "bytes"
    for role, pattern in _COMPILED:
        if pattern.search(name):
            return role
    return "other"


def shape_class(shape: tuple[int, ...] | None, length: int) -> str:
    if shape is None:
        dims = "bytes"
    else:
        dims = {0: "scalar", 1: "vector", 2: "matrix"}.get(len(shape), "tensor")
    size = "small" if length < 4096 else "medium" if length < 1 << 20 else "large"
    return f"{dims}/{size}"


def leaf_name(name: str) -> str:
    """The last part of a tensor's name, digits left out: `weight`, `bias`,
    `exp_avg_sq` (`encoder.layer.3.attention.self.query.weight` -> `weight`)."""
    return re.sub(r"\d+", "", re.split(r"[./:]", name)[-1])
