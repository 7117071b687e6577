"""ModernBERT's RoPE against transformers: inputs longer than max_position_embeddings (RoPE has no
table to run out of) and every rope_type transformers accepts on a layer type (linear, dynamic, yarn,
longrope, llama3), fastbert's model and an optimized transformers model alike."""
import copy

import pytest
import torch
from test_modernbert import batch, make_pair, max_diff

import fastbert

MAX_POSITIONS = 16
SCALINGS = {
    "default": {},
    "linear": {"factor": 4.0},
    "dynamic": {"factor": 4.0},
    "yarn": {"factor": 4.0},
    "longrope": {"short_factor": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.7],   # head_dim 16: 8 frequencies
                 "long_factor": [2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5], "original_max_position_embeddings": 8},
    "llama3": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8},
}


def scaled_pair(rope_type):
    rope = {"full_attention": {"rope_type": rope_type, "rope_theta": 500.0, **SCALINGS[rope_type]},
            "sliding_attention": {"rope_type": "default", "rope_theta": 50.0}}
    return make_pair(max_position_embeddings=MAX_POSITIONS, rope_parameters=rope)


@pytest.mark.parametrize("rope_type", SCALINGS)
def test_scaled_and_longer_inputs_match_transformers(rope_type):
    """Rows shorter and longer than max_position_embeddings (12 and 40 columns, a fully padded row),
    in that order: transformers' dynamic RoPE keeps the longest length seen, fastbert's is per call."""
    hf, fast = scaled_pair(rope_type)
    optimized = fastbert.optimize(copy.deepcopy(hf))
    for seq in (12, 40):
        ids, mask = batch(seq=seq)
        with torch.no_grad():
            want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
            for model in (fast, optimized):
                got = model(input_ids=ids, attention_mask=mask).last_hidden_state
                assert max_diff(want, got, mask) <= 1e-4, (rope_type, seq, type(model).__module__)


@pytest.mark.parametrize("rope_type", SCALINGS)
def test_rotary_embedding_module_is_transformers(rope_type):
    """rotary_emb(x, position_ids, layer_type) -> (cos, sin) as transformers' ModernBertRotaryEmbedding."""
    hf, fast = scaled_pair(rope_type)
    x = torch.zeros(1)
    for length in (5, 3 * MAX_POSITIONS):
        positions = torch.arange(length)[None]
        for kind in ("full_attention", "sliding_attention"):
            for a, b in zip(hf.rotary_emb(x, positions, kind), fast.rotary_emb(x, positions, kind), strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    fresh = type(hf.rotary_emb)(hf.config)                  # transformers' attributes, at the config's length
    for kind in ("full_attention", "sliding_attention"):
        for name in (f"{kind}_inv_freq", f"{kind}_original_inv_freq", f"{kind}_attention_scaling"):
            torch.testing.assert_close(getattr(fast.rotary_emb, name), getattr(fresh, name), rtol=0, atol=0)


def test_explicit_position_ids_beyond_the_config_length():
    hf, fast = scaled_pair("linear")
    ids, mask = batch(seq=12)
    position_ids = torch.arange(3 * MAX_POSITIONS, 3 * MAX_POSITIONS + 12)[None]
    with torch.no_grad():
        want = hf(input_ids=ids, attention_mask=mask, position_ids=position_ids).last_hidden_state
        got = fast(input_ids=ids, attention_mask=mask, position_ids=position_ids).last_hidden_state
    assert max_diff(want, got, mask) <= 1e-4
