"""Batches with nothing to encode, as a server can send them: every row padding, or no rows at all.
Every family returns what transformers returns in shape (values at padding positions are not
compared: fastbert computes nothing there), and no error."""
import pytest
import torch
import transformers as T

import fastbert
from tiny_families import CONFIGS

@pytest.fixture(scope="module", params=list(CONFIGS))
def pair(request, tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp(request.param)
    T.AutoModel.from_config(CONFIGS[request.param]()).save_pretrained(path)
    return T.AutoModel.from_pretrained(path).eval(), fastbert.AutoModel.from_pretrained(path)


def test_every_row_padding(pair):
    hf, fast = pair
    ids, mask = torch.randint(5, 99, (2, 8)), torch.zeros(2, 8, dtype=torch.long)
    with torch.no_grad():
        got = fast(input_ids=ids, attention_mask=mask).last_hidden_state
        try:
            want = hf(input_ids=ids, attention_mask=mask).last_hidden_state
        except RuntimeError as e:  # transformers' own reshape of no tokens
            pytest.skip(f"transformers fails here too: {e}")
    assert got.shape == want.shape and got.dtype == want.dtype and torch.isfinite(got).all()


def test_no_rows(pair):
    """An empty batch gives empty outputs (transformers raises from a reshape inside its attention in
    most families)."""
    _, fast = pair
    with torch.no_grad():
        out = fast(input_ids=torch.zeros(0, 8, dtype=torch.long), attention_mask=torch.zeros(0, 8, dtype=torch.long))
    assert out.last_hidden_state.shape == (0, 8, fast.config.hidden_size)
