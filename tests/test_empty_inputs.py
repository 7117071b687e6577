"""Batches with nothing to encode, as a server can send them: every row padding, or no rows at all.
Every family returns what transformers returns in shape (values at padding positions are not
compared: fastbert computes nothing there), and no error."""
import pytest
import torch
import transformers as T

import fastbert

SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64)
ROPE = dict(vocab_size=99, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=4,
            max_position_embeddings=64)
CONFIGS = {
    "bert": lambda: T.BertConfig(**SMALL),
    "roberta": lambda: T.RobertaConfig(**dict(SMALL, pad_token_id=1, max_position_embeddings=66)),
    "distilbert": lambda: T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                             max_position_embeddings=64),
    "electra": lambda: T.ElectraConfig(**dict(SMALL, embedding_size=16)),
    "albert": lambda: T.AlbertConfig(**dict(SMALL, embedding_size=16)),
    "deberta-v2": lambda: T.DebertaV2Config(**SMALL, relative_attention=True, pos_att_type=["p2c", "c2p"],
                                            position_buckets=8, max_relative_positions=20,
                                            position_biased_input=False),
    "mpnet": lambda: T.MPNetConfig(**SMALL),
    "modernbert": lambda: T.ModernBertConfig(**ROPE, local_attention=8, pad_token_id=0, bos_token_id=1,
                                             eos_token_id=2, cls_token_id=1, sep_token_id=2,
                                             global_attn_every_n_layers=3),
    "nomic_bert": lambda: T.NomicBertConfig(**ROPE, type_vocab_size=2,
                                            rope_parameters={"rope_type": "default", "rope_theta": 1000.0}),
}


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
