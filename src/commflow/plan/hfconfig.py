"""Read a Hugging Face ``config.json`` into a :class:`~commflow.plan.models.TransformerSpec`.

Understands the keys of GPT-2, OPT, Falcon, Llama/Mistral, Gemma/Gemma-2 (``head_dim``),
Qwen2, Mixtral (``num_local_experts``), Qwen2-MoE (``num_experts``,
``moe_intermediate_size``, ``shared_expert_intermediate_size``, ``decoder_sparse_step``) and
DeepSeek-V2/V3 (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``,
``moe_layer_freq`` and the latent-attention ranks). The training sequence is the one given,
else :data:`DEFAULT_SEQ` (capped by the model's context window): a context window of 128 K
is what the model can read, not what it is trained on step by step.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from commflow.errors import CommflowError
from commflow.plan.models import LatentAttention, TransformerSpec

DEFAULT_SEQ = 4096
"""Training sequence length of a config file read without one."""

_FAMILIES: dict[str, tuple[bool, bool, bool]] = {
    "gpt2": (False, True, True),
    "opt": (False, True, True),
    "falcon": (False, True, False),
    "gemma": (True, True, False),
    "gemma2": (True, True, False),
}
"""``model_type``: (gated MLP, tied embeddings by default, learned positions); any other
type is read as Llama-style (gated, untied unless the file says so, rotary)."""


class _Reader:
    """Typed look-ups in one config file; every error names the file and the key."""

    def __init__(self, config: dict, source: str) -> None:
        self.config, self.source = config, source

    def int(self, *keys: str, default: int | None = None, minimum: int = 1) -> int | None:
        """The first of ``keys`` present (and not null) as an integer >= ``minimum``;
        ``default`` when none is; ``CommflowError`` when a value is not such an integer."""
        for key in keys:
            value = self.config.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise CommflowError(
                    f"{self.source}: {key} must be an integer >= {minimum}, got {value!r}"
                )
            return value
        return default

    def need(self, *keys: str) -> int:
        """Like :meth:`int` without a default: ``CommflowError`` when every key is missing."""
        value = self.int(*keys)
        if value is None:
            raise CommflowError(f"{self.source}: config.json lacks {' / '.join(keys)}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A boolean key; ``CommflowError`` when present and not ``true``/``false``."""
        value = self.config.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise CommflowError(f"{self.source}: {key} must be true or false, got {value!r}")
        return value


def _dense_layers(r: _Reader, layers: int, experts: int) -> int:
    """Layers of a MoE model whose MLP is dense (DeepSeek ``first_k_dense_replace`` /
    ``moe_layer_freq``; Qwen2-MoE ``decoder_sparse_step`` / ``mlp_only_layers``)."""
    if experts == 1:
        return 0
    first = r.int("first_k_dense_replace", default=0, minimum=0)
    freq = r.int("moe_layer_freq", default=1)
    step = r.int("decoder_sparse_step", default=1)
    only = r.config.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in only
    ):
        raise CommflowError(f"{r.source}: mlp_only_layers must be a list of layer numbers")
    sparse = sum(
        1 for i in range(layers)
        if i >= first and i % freq == 0 and (i + 1) % step == 0 and i not in only
    )
    return layers - sparse


def _latent(r: _Reader) -> LatentAttention | None:
    if r.config.get("kv_lora_rank") is None:
        return None
    return LatentAttention(
        q_lora_rank=r.int("q_lora_rank"),
        kv_lora_rank=r.need("kv_lora_rank"),
        qk_rope_head_dim=r.need("qk_rope_head_dim"),
        qk_nope_head_dim=r.need("qk_nope_head_dim"),
        v_head_dim=r.need("v_head_dim"),
    )


def _sequence(seq: int | None, window: int | None) -> tuple[int, str]:
    """The training sequence and, when it was not given, a note saying where it came from."""
    if seq is not None:
        return seq, ""
    if window is not None and window < DEFAULT_SEQ:
        return window, f"the model's {window}-token context; set --seq to change"
    allows = f"; config.json allows {window}" if window else ""
    return DEFAULT_SEQ, f"default{allows}; set --seq to change"


def from_hf_config(path: str | os.PathLike, *, seq: int | None = None) -> TransformerSpec:
    """A spec from a Hugging Face ``config.json``.

    ``seq`` is the training sequence length; without it :data:`DEFAULT_SEQ` (or the model's
    context window when shorter), recorded in the spec's ``note``. Raises ``CommflowError``
    for an unreadable file, missing keys and values that are not positive integers.
    """
    source = str(path)
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CommflowError(f"cannot read Hugging Face config {source}: {e}") from None
    if not isinstance(config, dict):
        raise CommflowError(f"{source}: config.json must hold a JSON object")
    r = _Reader(config, source)
    kind = config.get("model_type") or ("gpt2" if "n_embd" in config else "llama")
    gated, tied, learned = _FAMILIES.get(kind, (True, False, False))
    hidden = r.need("hidden_size", "n_embd")
    heads = r.need("num_attention_heads", "n_head")
    layers = r.need("num_hidden_layers", "n_layer")
    kv = r.int("num_key_value_heads", "num_kv_heads", default=heads)
    if kind == "falcon" and r.flag("multi_query", True) and not r.flag(
        "new_decoder_architecture", False
    ):
        kv = 1
    experts = r.int("num_local_experts", "num_experts", "n_routed_experts", default=1)
    moe_ffn = r.int("moe_intermediate_size") if experts > 1 else None
    shared = r.int("shared_expert_intermediate_size", default=0, minimum=0)
    if "n_shared_experts" in config and experts > 1:
        shared = r.int("n_shared_experts", default=0, minimum=0) * (moe_ffn or 0)
    window = r.int("max_position_embeddings", "n_positions")
    train_seq, note = _sequence(seq, window)
    name = Path(path).parent.name if Path(path).name == "config.json" else Path(path).stem
    return TransformerSpec(
        name=name or Path(path).stem,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv,
        head_dim=r.int("head_dim"),
        ffn=r.int("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
        vocab=r.need("vocab_size"),
        seq=train_seq,
        gated_mlp=gated,
        tied_embeddings=r.flag("tie_word_embeddings", tied),
        position_embeddings=learned,
        positions=window if learned else None,
        experts=experts,
        top_k=r.int("num_experts_per_tok", default=1) if experts > 1 else 1,
        moe_ffn=moe_ffn,
        shared_ffn=shared,
        dense_layers=_dense_layers(r, layers, experts),
        mla=_latent(r),
        note=note,
    )
