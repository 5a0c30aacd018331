"""Transformer specifications: the shapes the planner needs (dense, grouped-query, explicit
head size, mixture-of-experts with shared experts and leading dense layers, DeepSeek's
multi-head latent attention), presets, and :func:`get_model` (a preset or a Hugging Face
``config.json``, read by :mod:`commflow.plan.hfconfig`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path

from commflow.errors import CommflowError

MEGATRON_VOCAB = 51200
"""Padded GPT-2 vocabulary used by Megatron-LM's SC'21 runs."""


def _check_positive(owner: str, **values: int | None) -> None:
    for name, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CommflowError(f"model {owner}: {name} must be an integer >= 1, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class LatentAttention:
    """DeepSeek-V2/V3 multi-head latent attention: queries and keys/values pass through
    low-rank latents; each head has a ``qk_nope + qk_rope`` query/key and a ``v`` value."""

    q_lora_rank: int | None
    """Query latent width (``None``: queries projected directly from the hidden state)."""
    kv_lora_rank: int
    """Key/value latent width (what the KV cache and a CP all-gather hold)."""
    qk_rope_head_dim: int
    """Rotary part of each query/key head (one shared rotary key)."""
    qk_nope_head_dim: int
    """Non-rotary part of each query/key head."""
    v_head_dim: int
    """Value head size."""

    def __post_init__(self) -> None:
        _check_positive(
            "latent attention", q_lora_rank=self.q_lora_rank, kv_lora_rank=self.kv_lora_rank,
            qk_rope_head_dim=self.qk_rope_head_dim, qk_nope_head_dim=self.qk_nope_head_dim,
            v_head_dim=self.v_head_dim,
        )


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
    """Sequence length ``s`` (tokens) trained on."""
    kv_heads: int | None = None
    """Key/value heads (grouped-query attention); ``None``: equal to ``heads``."""
    head_dim: int | None = None
    """Size of one attention head; ``None``: ``hidden / heads`` (Gemma-2 sets 256 with 3584
    / 16 = 224)."""
    ffn: int | None = None
    """Feed-forward width of a dense layer; ``None``: ``4 * hidden``."""
    gated_mlp: bool = False
    """SwiGLU-style MLP with three weight matrices instead of two."""
    tied_embeddings: bool = True
    """The output layer reuses the word embedding (GPT-2, Megatron GPT); Llama does not."""
    position_embeddings: bool = True
    """Learned position embeddings (GPT-2); ``False`` for rotary (Llama)."""
    positions: int | None = None
    """Rows of the learned position table; ``None``: ``seq``."""
    experts: int = 1
    """Routed MoE experts per MoE layer (1: dense)."""
    top_k: int = 1
    """Routed experts each token visits."""
    moe_ffn: int | None = None
    """Width of one routed expert; ``None``: ``ffn``."""
    shared_ffn: int = 0
    """Summed width of the shared experts every token visits (Qwen2-MoE, DeepSeek)."""
    dense_layers: int = 0
    """Layers of a MoE model whose MLP is dense (DeepSeek's ``first_k_dense_replace``)."""
    mla: LatentAttention | None = None
    """Multi-head latent attention (DeepSeek-V2/V3) instead of (grouped-)query attention."""
    note: str = field(default="", compare=False)
    """Where ``seq`` came from when it was not given (shown by :meth:`describe`); pass
    ``note=""`` with a new ``seq`` to ``dataclasses.replace``."""

    def __post_init__(self) -> None:
        _check_positive(
            self.name, hidden=self.hidden, layers=self.layers, heads=self.heads,
            vocab=self.vocab, seq=self.seq, experts=self.experts, top_k=self.top_k,
            kv_heads=self.kv_heads, head_dim=self.head_dim, ffn=self.ffn,
            moe_ffn=self.moe_ffn, positions=self.positions,
        )
        for name in ("shared_ffn", "dense_layers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise CommflowError(f"model {self.name}: {name} must be an integer >= 0")
        if self.head_dim is None and self.mla is None and self.hidden % self.heads:
            raise CommflowError(f"model {self.name}: hidden {self.hidden} not divisible by heads")
        if self.heads % self.kv_count:
            raise CommflowError(f"model {self.name}: heads not divisible by kv_heads")
        if self.top_k > self.experts:
            raise CommflowError(f"model {self.name}: top_k {self.top_k} > experts {self.experts}")
        if self.dense_layers > self.layers:
            raise CommflowError(f"model {self.name}: dense_layers {self.dense_layers} > layers")
        if self.position_embeddings and self.seq > self.positions_table:
            raise CommflowError(
                f"model {self.name}: seq {self.seq} exceeds the {self.positions_table} learned "
                "positions; train with a shorter --seq"
            )

    @property
    def kv_count(self) -> int:
        """Key/value heads actually used."""
        return self.kv_heads or self.heads

    @property
    def head_size(self) -> int:
        """Size of one query/key/value head (not used by latent attention)."""
        return self.head_dim or self.hidden // self.heads

    @property
    def ffn_size(self) -> int:
        """Dense feed-forward width actually used."""
        return self.ffn or 4 * self.hidden

    @property
    def expert_ffn(self) -> int:
        """Width of one routed expert."""
        return self.moe_ffn or self.ffn_size

    @property
    def qkv_width(self) -> int:
        """Output width of the fused QKV projection."""
        return self.heads * self.head_size + 2 * self.kv_count * self.head_size

    @property
    def attention_matrices(self) -> list[tuple[int, int]]:
        """``(in, out)`` of each attention weight matrix of one layer."""
        h, a = self.hidden, self.heads
        if self.mla is None:
            return [(h, self.qkv_width), (a * self.head_size, h)]
        m = self.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        query = [(h, m.q_lora_rank), (m.q_lora_rank, a * qk)] if m.q_lora_rank else [(h, a * qk)]
        return query + [
            (h, m.kv_lora_rank + m.qk_rope_head_dim),
            (m.kv_lora_rank, a * (m.qk_nope_head_dim + m.v_head_dim)),
            (a * m.v_head_dim, h),
        ]

    @property
    def attention_width(self) -> float:
        """Mean of the summed query/key and value head widths: ``QK^T`` and ``AV`` cost
        ``2·s²·width`` FLOPs each per sequence (``hidden`` for plain attention)."""
        if self.mla is None:
            return self.heads * self.head_size
        m = self.mla
        return self.heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim) / 2

    @property
    def kv_width(self) -> int:
        """Key and value elements stored per token and layer (what context parallelism
        all-gathers): ``2·kv_heads·head`` or, with latent attention, the latent and rotary key."""
        if self.mla is None:
            return 2 * self.kv_count * self.head_size
        return self.mla.kv_lora_rank + self.mla.qk_rope_head_dim

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices of one expert's MLP (2, or 3 when gated)."""
        return 3 if self.gated_mlp else 2

    @property
    def moe_layers(self) -> int:
        """Layers with routed experts."""
        return self.layers - self.dense_layers if self.experts > 1 else 0

    @property
    def expert_params(self) -> int:
        """Routed-expert parameters of all layers (what expert parallelism splits)."""
        return self.moe_layers * self.experts * self.mlp_matrices * self.hidden * self.expert_ffn

    @property
    def active_ffn(self) -> float:
        """MLP width one token passes through, averaged over layers (``ffn`` when dense)."""
        moe = self.top_k * self.expert_ffn + self.shared_ffn
        dense = self.layers - self.moe_layers
        return (dense * self.ffn_size + self.moe_layers * moe) / self.layers

    def _layers_params(self, active: bool) -> int:
        h, m = self.hidden, self.mlp_matrices
        routed = self.top_k if active else self.experts
        moe = m * h * (routed * self.expert_ffn + self.shared_ffn) + h * self.experts
        attention = sum(i * o for i, o in self.attention_matrices)
        dense = self.layers - self.moe_layers
        return (
            self.layers * (attention + 13 * h) + dense * m * h * self.ffn_size
            + self.moe_layers * moe
        )

    @property
    def layer_params(self) -> float:
        """Parameters of one layer, averaged over layers (weights; biases and norms as
        ``13 * hidden``)."""
        return self._layers_params(active=False) / self.layers

    @property
    def positions_table(self) -> int:
        """Rows of the learned position table."""
        return self.positions or self.seq

    @property
    def embedding_params(self) -> int:
        """Parameters of the word embedding, the untied output layer and learned positions."""
        words = self.vocab * self.hidden * (1 if self.tied_embeddings else 2)
        return words + (self.positions_table * self.hidden if self.position_embeddings else 0)

    @property
    def params(self) -> int:
        """All parameters."""
        return self._layers_params(active=False) + self.embedding_params

    @property
    def active_params(self) -> int:
        """Parameters one token uses (routed experts: ``top_k`` of them); ``params`` when
        dense."""
        return self._layers_params(active=True) + self.embedding_params

    def describe(self) -> str:
        """One line: name, parameter counts, shape, MoE and sequence length (with its
        source when it was not given)."""
        size = f"{self.params / 1e9:.2f} B parameters"
        if self.experts > 1:
            size += f" ({self.active_params / 1e9:.2f} B active)"
        shape = f"{self.layers} layers, hidden {self.hidden}, {self.heads} heads"
        if self.mla is not None:
            shape += " (latent attention)"
        elif self.kv_count != self.heads:
            shape += f" ({self.kv_count} KV)"
        if self.experts > 1:
            shape += f", {self.experts} experts top-{self.top_k}"
        seq = f"seq {self.seq}" + (f" ({self.note})" if self.note else "")
        return f"{self.name}: {size}, {shape}, {seq}"


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


def get_model(name_or_path: str | os.PathLike, *, seq: int | None = None) -> TransformerSpec:
    """A preset by name (case-insensitive) or a Hugging Face ``config.json`` path; ``seq``
    overrides the sequence length (a file's default is :data:`~commflow.plan.hfconfig.DEFAULT_SEQ`,
    not its context window). Raises ``CommflowError`` for an unknown name."""
    from commflow.plan.hfconfig import from_hf_config  # reads specs: imports this module

    key = str(name_or_path).lower()
    if key in MODELS:
        spec = MODELS[key]
        return replace(spec, seq=seq) if seq is not None else spec
    if Path(name_or_path).is_file():
        return from_hf_config(name_or_path, seq=seq)
    raise CommflowError(
        f"unknown model {str(name_or_path)!r}: give a preset ({', '.join(MODELS)}) or the path "
        "of a Hugging Face config.json"
    )
