"""Model specs: parameter counts against published sizes, the Hugging Face loader."""

from __future__ import annotations

import json

import pytest

from commflow.errors import CommflowError
from commflow.plan import MODELS, TransformerSpec, from_hf_config, get_model

# Megatron SC'21 Table 1 "number of parameters (billion)".
PUBLISHED_B = {
    "megatron-1.7b": 1.7,
    "megatron-3.6b": 3.6,
    "megatron-7.5b": 7.5,
    "megatron-18b": 18.4,
    "megatron-39b": 39.1,
    "megatron-76b": 76.1,
    "megatron-145b": 145.6,
    "megatron-310b": 310.1,
    "megatron-530b": 529.6,
    "megatron-1t": 1008.0,
    "gpt3-175b": 175.0,
    "llama2-7b": 6.7,
    "llama2-70b": 69.0,
    "llama3-8b": 8.0,
    "llama3-70b": 70.6,
    "llama3-405b": 405.0,
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_parameter_counts_match_published(name):
    assert MODELS[name].params / 1e9 == pytest.approx(PUBLISHED_B[name], rel=0.03)


def test_megatron_closed_form_params():
    # Narayanan et al.: P = 12lh²(1 + 13/(12h) + (V + s)/(12lh))
    m = MODELS["megatron-1t"]
    h, n_layers, v, s = m.hidden, m.layers, m.vocab, m.seq
    expected = 12 * n_layers * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * n_layers * h))
    assert m.params == pytest.approx(expected, rel=1e-15)


def test_hf_llama_and_mixtral_and_gpt2(tmp_path):
    llama = {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "intermediate_size": 14336,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
    }
    path = tmp_path / "llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(llama))
    spec = from_hf_config(path)
    assert spec == TransformerSpec(
        name="llama",
        hidden=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        ffn=14336,
        vocab=128256,
        seq=8192,
        gated_mlp=True,
        tied_embeddings=False,
        position_embeddings=False,
    )
    mixtral = {**llama, "model_type": "mixtral", "num_local_experts": 8, "num_experts_per_tok": 2}
    path.write_text(json.dumps(mixtral))
    moe = get_model(path, seq=4096)
    assert (moe.experts, moe.top_k, moe.seq) == (8, 2, 4096)
    assert moe.params - spec.params == 32 * (7 * 3 * 4096 * 14336 + 4096 * 8)
    gpt2 = {
        "model_type": "gpt2",
        "n_embd": 768,
        "n_layer": 12,
        "n_head": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
    }
    path.write_text(json.dumps(gpt2))
    small = from_hf_config(path)
    assert (small.ffn_size, small.gated_mlp, small.kv_count) == (3072, False, 12)


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(CommflowError, match="unknown model"):
        get_model("gpt-9")
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 64, "num_attention_heads": 4}')
    with pytest.raises(CommflowError, match="num_hidden_layers"):
        from_hf_config(bad)
    with pytest.raises(CommflowError, match="divisible by heads"):
        TransformerSpec(name="x", hidden=100, layers=1, heads=3, vocab=10)
