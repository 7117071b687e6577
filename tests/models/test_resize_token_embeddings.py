"""resize_token_embeddings, as after tokenizer.add_tokens(...): every family's bare model and masked-LM
head resizes to transformers' shapes (input embeddings, tied decoder, decoder biases, config.vocab_size),
keeps the old rows, and with transformers' resized weights gives transformers' outputs on the new ids."""
import pytest
import torch
import transformers as T

import fastbert
from tiny_families import CONFIGS, SMALL


@pytest.mark.parametrize("task", ["Model", "ForMaskedLM"])
@pytest.mark.parametrize("family", list(CONFIGS))
@pytest.mark.parametrize("size", [99 + 7, 99 - 3])
def test_resize_like_transformers(family, task, size, tmp_path):
    torch.manual_seed(0)
    auto = "AutoModel" if task == "Model" else "AutoModelForMaskedLM"
    getattr(T, auto).from_config(CONFIGS[family]()).save_pretrained(tmp_path)
    hf = getattr(T, auto).from_pretrained(tmp_path).eval()
    fast = getattr(fastbert, auto).from_pretrained(tmp_path)
    before = {k: v.clone() for k, v in fast.state_dict().items()}
    hf.resize_token_embeddings(size, mean_resizing=False)
    got = fast.resize_token_embeddings(size, mean_resizing=False)
    assert got is fast.get_input_embeddings() and got.num_embeddings == size
    assert fast.config.vocab_size == hf.config.vocab_size == size
    want_shapes = {k: tuple(v.shape) for k, v in hf.state_dict().items()}
    got_shapes = {k: tuple(v.shape) for k, v in fast.state_dict().items()}
    assert {k: got_shapes[k] for k in want_shapes if k in got_shapes} == \
        {k: v for k, v in want_shapes.items() if k in got_shapes}
    for k, v in fast.state_dict().items():  # the old rows stay
        keep = min(size, before[k].shape[0]) if v.dim() else None
        assert torch.equal(v[:keep], before[k][:keep]), k
    if task == "ForMaskedLM":
        tied = hf.get_output_embeddings().weight is hf.get_input_embeddings().weight
        assert (fast.get_output_embeddings().weight is fast.get_input_embeddings().weight) == tied
    fast.load_state_dict(hf.state_dict(), strict=False)  # transformers' new rows, then the same numbers
    ids = torch.tensor([[3, size - 1, 5, size - 2, 4]])
    with torch.no_grad():
        a, b = hf(input_ids=ids), fast(input_ids=ids)
    key = "last_hidden_state" if task == "Model" else "logits"
    assert a[key].shape == b[key].shape
    assert torch.allclose(a[key], b[key], atol=1e-4)


def test_mean_resizing_and_multiple(tmp_path):
    torch.manual_seed(0)
    T.BertForMaskedLM(T.BertConfig(**SMALL)).save_pretrained(tmp_path)
    fast = fastbert.AutoModelForMaskedLM.from_pretrained(tmp_path)
    old = fast.get_input_embeddings().weight.detach().clone()
    emb = fast.resize_token_embeddings(100, pad_to_multiple_of=64)
    assert emb.num_embeddings == 128 and fast.cls.predictions.bias.shape == (128,)
    new_rows = emb.weight[99:].detach()
    # transformers' mean resizing: new rows very near the old rows' mean
    assert torch.allclose(new_rows, old.mean(0).expand_as(new_rows), atol=1e-3)
    assert fastbert.AutoModelForMaskedLM.from_pretrained(tmp_path).resize_token_embeddings() .num_embeddings == 99
