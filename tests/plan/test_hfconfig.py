"""Hugging Face config.json files of seven model families (tests/plan/data, the published
files' values): parameter counts against the published totals, MoE and latent-attention keys,
the default training sequence, and errors for bad values."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from commflow.errors import CommflowError
from commflow.plan import Plan, TransformerSpec, from_hf_config, get_model
from commflow.plan.compute import attention_flops, layer_gemm_flops
from commflow.plan.hfconfig import DEFAULT_SEQ

DATA = Path(__file__).parent / "data"

# (total, active) parameters in billions, as the model cards / papers state them.
PUBLISHED_B = {
    "llama-3.1-8b": (8.03, 8.03),  # Llama 3.1 model card
    "gemma-2-9b": (9.24, 9.24),  # Gemma 2 report, Table 1 / model card (9,241,705,984)
    "mixtral-8x7b": (46.7, 12.9),  # Mixtral of Experts (Jiang et al. 2024)
    "qwen1.5-moe-a2.7b": (14.3, 2.7),  # Qwen1.5-MoE model card
    "qwen2-7b": (7.6, 7.6),  # Qwen2 technical report, Table 1 (7.6 B)
    "deepseek-v3": (671.0, 37.0),  # DeepSeek-V3 report: 671 B total, 37 B activated
    "gpt2": (0.124439808, 0.124439808),  # GPT-2 small, exact count of the Hub checkpoint
}


@pytest.mark.parametrize("name", sorted(PUBLISHED_B))
def test_parameter_counts_match_published(name):
    spec = get_model(DATA / f"{name}.json")
    total, active = PUBLISHED_B[name]
    assert spec.params / 1e9 == pytest.approx(total, rel=0.01)
    # DeepSeek-V3 counts 37.56 B by its shapes (embeddings, 8 routed + 1 shared expert); its
    # report rounds to "37 B", hence 2% there.
    assert spec.active_params / 1e9 == pytest.approx(active, rel=0.02 if active == 37 else 0.01)


def test_gemma2_honours_head_dim():
    gemma = get_model(DATA / "gemma-2-9b.json")
    assert (gemma.head_size, gemma.tied_embeddings) == (256, True)
    assert gemma.attention_matrices == [(3584, 16 * 256 + 2 * 8 * 256), (16 * 256, 3584)]
    assert gemma.attention_width == 4096
    # without head_dim the file would read as 224-wide heads and untied: 9.93 B
    ignored = TransformerSpec(name="x", hidden=3584, layers=42, heads=16, kv_heads=8,
                              ffn=14336, vocab=256000, gated_mlp=True, tied_embeddings=False,
                              position_embeddings=False)  # fmt: skip
    assert ignored.params / 1e9 == pytest.approx(9.93, abs=0.005)


def test_moe_keys_of_mixtral_qwen_and_deepseek():
    mixtral = get_model(DATA / "mixtral-8x7b.json")
    assert (mixtral.experts, mixtral.top_k, mixtral.expert_ffn, mixtral.shared_ffn) == (
        8, 2, 14336, 0)
    qwen = get_model(DATA / "qwen1.5-moe-a2.7b.json")
    assert (qwen.experts, qwen.top_k, qwen.expert_ffn, qwen.shared_ffn, qwen.dense_layers) == (
        60, 4, 1408, 5632, 0)
    assert qwen.active_ffn == 4 * 1408 + 5632
    ds = get_model(DATA / "deepseek-v3.json")
    assert (ds.experts, ds.top_k, ds.expert_ffn, ds.shared_ffn, ds.dense_layers) == (
        256, 8, 2048, 2048, 3)
    assert ds.moe_layers == 58
    assert ds.active_ffn == pytest.approx((3 * 18432 + 58 * 9 * 2048) / 61)
    assert ds.expert_params == 58 * 256 * 3 * 7168 * 2048


def test_deepseek_latent_attention_shapes():
    ds = get_model(DATA / "deepseek-v3.json")
    mla = ds.mla
    assert (mla.q_lora_rank, mla.kv_lora_rank, mla.qk_rope_head_dim, mla.qk_nope_head_dim,
            mla.v_head_dim) == (1536, 512, 64, 128, 128)  # fmt: skip
    assert sum(i * o for i, o in ds.attention_matrices) == (
        7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 * 128 * 256 + 128 * 128 * 7168)
    assert ds.kv_width == 512 + 64
    plan = Plan(global_batch=1)
    # QK^T over 192-wide heads and AV over 128-wide heads, 128 heads, s = 4096
    assert attention_flops(ds, plan) == 2 * 4096**2 * 128 * (192 + 128)
    gemms = layer_gemm_flops(ds, plan)
    assert len(gemms) == 5 + 3 and gemms[-1] == pytest.approx(2 * 4096 * 7168 * ds.active_ffn)


def test_sequence_defaults_and_override():
    llama = get_model(DATA / "llama-3.1-8b.json")
    assert llama.seq == DEFAULT_SEQ == 4096
    assert "config.json allows 131072" in llama.note and "--seq" in llama.describe()
    given = get_model(DATA / "llama-3.1-8b.json", seq=16384)
    assert (given.seq, given.note) == (16384, "")
    gpt2 = get_model(DATA / "gpt2.json")
    assert (gpt2.seq, gpt2.positions_table, gpt2.gated_mlp, gpt2.ffn_size) == (1024, 1024, False,
                                                                                 3072)
    with pytest.raises(CommflowError, match="exceeds the 1024 learned positions"):
        get_model(DATA / "gpt2.json", seq=2048)


def test_name_is_the_folder_of_a_config_json(tmp_path):
    folder = tmp_path / "Meta-Llama-3.1-8B"
    folder.mkdir()
    (folder / "config.json").write_text((DATA / "llama-3.1-8b.json").read_text())
    assert from_hf_config(folder / "config.json").name == "Meta-Llama-3.1-8B"


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hidden_size", -4096, "hidden_size must be an integer >= 1, got -4096"),
        ("num_hidden_layers", 0, "num_hidden_layers must be an integer >= 1, got 0"),
        ("num_attention_heads", True, "num_attention_heads must be an integer >= 1, got True"),
        ("intermediate_size", 14336.5, "intermediate_size must be an integer >= 1"),
        ("vocab_size", "128256", "vocab_size must be an integer >= 1, got '128256'"),
        ("head_dim", 0, "head_dim must be an integer >= 1"),
        ("num_local_experts", -8, "num_local_experts must be an integer >= 1"),
        ("tie_word_embeddings", "no", "tie_word_embeddings must be true or false"),
        ("first_k_dense_replace", -1, "first_k_dense_replace must be an integer >= 0"),
    ],
)
def test_invalid_values_raise_naming_file_and_key(tmp_path, key, value, message):
    config = json.loads((DATA / "mixtral-8x7b.json").read_text())
    config[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(CommflowError, match=f"{path}: .*{message}".replace("(", r"\(")):
        from_hf_config(path)


def test_missing_keys_and_bad_files(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 64, "num_attention_heads": 4}')
    with pytest.raises(CommflowError, match="lacks num_hidden_layers / n_layer"):
        from_hf_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(CommflowError, match="must hold a JSON object"):
        from_hf_config(bad)
    bad.write_text("{")
    with pytest.raises(CommflowError, match="cannot read Hugging Face config"):
        from_hf_config(bad)
    with pytest.raises(CommflowError, match="seq must be an integer >= 1, got 0"):
        TransformerSpec(name="x", hidden=64, layers=1, heads=4, vocab=10, seq=0)
    for model in ("llama3-8b", DATA / "llama-3.1-8b.json"):
        with pytest.raises(CommflowError, match="seq must be an integer >= 1, got -1"):
            get_model(model, seq=-1)
