"""Model specs: parameter counts against published sizes, the Hugging Face loader."""

from __future__ import annotations

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


def test_errors_name_the_problem(tmp_path):
    with pytest.raises(CommflowError, match="unknown model"):
        get_model("gpt-9")
    bad = tmp_path / "config.json"
    bad.write_text('{"hidden_size": 64, "num_attention_heads": 4}')
    with pytest.raises(CommflowError, match="num_hidden_layers"):
        from_hf_config(bad)
    with pytest.raises(CommflowError, match="divisible by heads"):
        TransformerSpec(name="x", hidden=100, layers=1, heads=3, vocab=10)
