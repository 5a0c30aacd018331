"""Transformer specifications: the shapes the planner needs, presets, and a Hugging Face
``config.json`` loader (gpt2-, llama- and mixtral-style)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path

from commflow.errors import CommflowError

MEGATRON_VOCAB = 51200
"""Padded GPT-2 vocabulary used by Megatron-LM's SC'21 runs."""


@dataclass(frozen=True, kw_only=True)
class TransformerSpec:
    """A decoder-only transformer. Raises ``CommflowError`` for inconsistent shapes."""

    name: str
    """Preset or file name."""
    hidden: int
    """Model width ``h``."""
    layers: int
    """Transformer layers ``l``."""
    heads: int
    """Attention heads ``a``."""
    vocab: int
    """Vocabulary size ``V``."""
    seq: int = 2048
    """Sequence length ``s`` (tokens)."""
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention); ``None``: equal to ``heads``."""
    ffn: int | None = None
    """Feed-forward width; ``None``: ``4 * hidden``."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three weight matrices instead of two."""
    tied_embeddings: bool = True
    """The output layer reuses the word embedding (GPT-2, Megatron GPT); Llama does not."""
    position_embeddings: bool = True
    """Learned position embeddings (GPT-2); ``False`` for rotary (Llama)."""
    experts: int = 1
    """MoE experts per layer (1: dense)."""
    top_k: int = 1
    """Experts each token visits."""

    def __post_init__(self) -> None:
        for field_name in ("hidden", "layers", "heads", "vocab", "seq", "experts", "top_k"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CommflowError(f"model {self.name}: {field_name} must be an integer >= 1")
        if self.hidden % self.heads:
            raise CommflowError(f"model {self.name}: hidden {self.hidden} not divisible by heads")
        if self.heads % self.kv_count:
            raise CommflowError(f"model {self.name}: heads not divisible by kv_heads")
        if self.top_k > self.experts:
            raise CommflowError(f"model {self.name}: top_k {self.top_k} > experts {self.experts}")

    @property
    def kv_count(self) -> int:
        """Key/value heads actually used."""
        return self.kv_heads or self.heads

    @property
    def ffn_size(self) -> int:
        """Feed-forward width actually used."""
        return self.ffn or 4 * self.hidden

    @property
    def qkv_width(self) -> int:
        """Output width of the fused QKV projection."""
        return self.hidden + 2 * self.kv_count * (self.hidden // self.heads)

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one expert's MLP (2, or 3 when gated)."""
        return 3 if self.gated_mlp else 2

    @property
    def layer_params(self) -> int:
        """Parameters of one layer (weights; biases and norms as ``hidden`` multiples)."""
        attention = self.hidden * self.qkv_width + self.hidden * self.hidden
        mlp = self.experts * self.mlp_matrices * self.hidden * self.ffn_size
        router = self.hidden * self.experts if self.experts > 1 else 0
        return attention + mlp + router + 13 * self.hidden

    @property
    def embedding_params(self) -> int:
        """Parameters of the word embedding, the untied output layer and learned positions."""
        words = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return words + (self.seq * self.hidden if self.position_embeddings else 0)

    @property
    def params(self) -> int:
        """All parameters."""
        return self.layers * self.layer_params + self.embedding_params


def _gpt(name: str, hidden: int, layers: int, heads: int) -> TransformerSpec:
    return TransformerSpec(
        name=name, hidden=hidden, layers=layers, heads=heads, vocab=MEGATRON_VOCAB
    )


def _llama(
    name: str, hidden: int, layers: int, heads: int, kv: int, ffn: int, vocab: int, seq: int
) -> TransformerSpec:
    return TransformerSpec(
        name=name,
        hidden=hidden,
        layers=layers,
        heads=heads,
        kv_heads=kv,
        ffn=ffn,
        vocab=vocab,
        seq=seq,
        gated_mlp=True,
        tied_embeddings=False,
        position_embeddings=False,
    )


MODELS: dict[str, TransformerSpec] = {
    spec.name: spec
    for spec in (
        # GPT-3 family (Brown et al. 2020, Table 2.1), Megatron vocabulary.
        _gpt("gpt3-125m", 768, 12, 12),
        _gpt("gpt3-350m", 1024, 24, 16),
        _gpt("gpt3-1.3b", 2048, 24, 16),
        _gpt("gpt3-2.7b", 2560, 32, 32),
        _gpt("gpt3-6.7b", 4096, 32, 32),
        _gpt("gpt3-13b", 5120, 40, 40),  # the paper lists 5140; 40 heads of 128
        _gpt("gpt3-175b", 12288, 96, 96),
        # Megatron-LM SC'21 Table 1 (Narayanan et al. 2021; examples/sc21/run_table_1.sh).
        _gpt("megatron-1.7b", 2304, 24, 24),
        _gpt("megatron-3.6b", 3072, 30, 32),
        _gpt("megatron-7.5b", 4096, 36, 32),
        _gpt("megatron-18b", 6144, 40, 48),
        _gpt("megatron-39b", 8192, 48, 64),
        _gpt("megatron-76b", 10240, 60, 80),
        _gpt("megatron-145b", 12288, 80, 96),
        _gpt("megatron-310b", 16384, 96, 128),
        _gpt("megatron-530b", 20480, 105, 128),
        _gpt("megatron-1t", 25600, 128, 160),
        # Llama 2 (Touvron et al. 2023) and Llama 3 (Dubey et al. 2024).
        _llama("llama2-7b", 4096, 32, 32, 32, 11008, 32000, 4096),
        _llama("llama2-13b", 5120, 40, 40, 40, 13824, 32000, 4096),
        _llama("llama2-70b", 8192, 80, 64, 8, 28672, 32000, 4096),
        _llama("llama3-8b", 4096, 32, 32, 8, 14336, 128256, 8192),
        _llama("llama3-70b", 8192, 80, 64, 8, 28672, 128256, 8192),
        _llama("llama3-405b", 16384, 126, 128, 8, 53248, 128256, 8192),
    )
}
"""Model presets by name."""


def _hf_int(config: dict, source: str, *keys: str, default: int | None = None) -> int:
    for key in keys:
        if isinstance(config.get(key), int):
            return config[key]
    if default is not None:
        return default
    raise CommflowError(f"{source}: config.json lacks {' / '.join(keys)}")


def from_hf_config(path: str | os.PathLike, *, seq: int | None = None) -> TransformerSpec:
    """A spec from a Hugging Face ``config.json`` (gpt2, llama, mistral/mixtral keys).

    ``seq`` overrides the context length in the file. Raises ``CommflowError`` for an
    unreadable file or missing keys.
    """
    source = str(path)
    try:
        config = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CommflowError(f"cannot read Hugging Face config {source}: {e}") from None
    if not isinstance(config, dict):
        raise CommflowError(f"{source}: config.json must hold a JSON object")
    hidden = _hf_int(config, source, "hidden_size", "n_embd")
    heads = _hf_int(config, source, "num_attention_heads", "n_head")
    gpt2 = config.get("model_type") == "gpt2" or "n_embd" in config
    return TransformerSpec(
        name=Path(path).parent.name or Path(path).stem,
        hidden=hidden,
        layers=_hf_int(config, source, "num_hidden_layers", "n_layer"),
        heads=heads,
        kv_heads=_hf_int(config, source, "num_key_value_heads", default=heads),
        ffn=_hf_int(config, source, "intermediate_size", "n_inner", default=4 * hidden),
        vocab=_hf_int(config, source, "vocab_size"),
        seq=seq or _hf_int(config, source, "max_position_embeddings", "n_positions"),
        gated_mlp=not gpt2,
        tied_embeddings=bool(config.get("tie_word_embeddings", gpt2)),
        position_embeddings=gpt2,
        experts=_hf_int(config, source, "num_local_experts", default=1),
        top_k=_hf_int(config, source, "num_experts_per_tok", default=1),
    )


def get_model(name_or_path: str | os.PathLike, *, seq: int | None = None) -> TransformerSpec:
    """A preset by name (case-insensitive) or a ``config.json`` path; ``seq`` overrides the
    sequence length. Raises ``CommflowError`` for an unknown name."""
    key = str(name_or_path).lower()
    if key in MODELS:
        spec = MODELS[key]
        return replace(spec, seq=seq) if seq else spec
    if Path(name_or_path).is_file():
        return from_hf_config(name_or_path, seq=seq)
    raise CommflowError(
        f"unknown model {str(name_or_path)!r}: give a preset ({', '.join(MODELS)}) or the path "
        "of a Hugging Face config.json"
    )
