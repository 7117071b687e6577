"""BertTokenizer.pad against BertTokenizerFast.pad, and under transformers' collators
(DataCollatorWithPadding; DataCollatorForLanguageModeling, which also reads get_special_tokens_mask)."""
import numpy as np
import pytest
import torch
import transformers

import fastbert
from corpora import english_lines


@pytest.fixture(scope="module")
def pair(model_dir):
    return (fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=1),
            transformers.BertTokenizerFast.from_pretrained(model_dir))


def _same(a, b):
    assert set(a) == set(b), (sorted(a), sorted(b))
    for k in a:
        x, y = a[k], b[k]
        if isinstance(y, torch.Tensor):
            assert isinstance(x, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), k
        elif isinstance(y, np.ndarray):
            assert isinstance(x, np.ndarray) and x.dtype == y.dtype and np.array_equal(x, y), k
        else:
            assert x == y, k


LINES = english_lines()[:7]


@pytest.mark.parametrize("kwargs", [
    {}, {"padding": "longest"}, {"padding": "max_length", "max_length": 90}, {"padding": False},
    {"pad_to_multiple_of": 8}, {"padding": "max_length", "max_length": 60, "pad_to_multiple_of": 16},
    {"padding_side": "left"}, {"return_attention_mask": False}, {"return_tensors": "pt"},
    {"return_tensors": "np", "padding_side": "left", "pad_to_multiple_of": 4},
])
def test_pad_list_of_rows_matches_hf(pair, kwargs):
    fast, hf = pair
    rows_f = [dict(fast(t, truncation=True, max_length=50, return_special_tokens_mask=True)) for t in LINES]
    rows_h = [dict(hf(t, truncation=True, max_length=50, return_special_tokens_mask=True)) for t in LINES]
    assert rows_f == rows_h
    _same(fast.pad(rows_f, **kwargs), hf.pad(rows_h, **kwargs))


def test_pad_dict_of_lists_single_and_tensors(pair):
    fast, hf = pair
    batch = {"input_ids": [[101, 7592, 102], [101, 102]], "token_type_ids": [[0, 0, 0], [0, 0]]}
    _same(fast.pad(batch, return_tensors="pt"), hf.pad(batch, return_tensors="pt"))
    one = {"input_ids": [101, 7592, 102]}
    _same(fast.pad(one, padding="max_length", max_length=6), hf.pad(one, padding="max_length", max_length=6))
    rows = [{"input_ids": torch.tensor([101, 7592, 2088, 102])}, {"input_ids": torch.tensor([101, 102])}]
    _same(fast.pad(rows), hf.pad(rows))                               # tensors in: tensors out
    assert batch == {"input_ids": [[101, 7592, 102], [101, 102]], "token_type_ids": [[0, 0, 0], [0, 0]]}


def test_data_collator_with_padding(pair):
    """Trainer's default collator for classification, with int and float labels."""
    fast, hf = pair
    for label in (3, 0.25):
        feats_f = [{**fast(t, truncation=True, max_length=40), "label": label} for t in LINES]
        feats_h = [{**hf(t, truncation=True, max_length=40), "label": label} for t in LINES]
        got = transformers.DataCollatorWithPadding(fast, pad_to_multiple_of=8)(feats_f)
        want = transformers.DataCollatorWithPadding(hf, pad_to_multiple_of=8)(feats_h)
        _same(dict(got), dict(want))


def test_pad_errors_name_the_problem(pair):
    fast, _ = pair
    with pytest.raises(ValueError, match="includes input_ids"):
        fast.pad([{"attention_mask": [1]}])
    with pytest.raises(ValueError, match="encoding 1 has no 'token_type_ids'"):
        fast.pad([{"input_ids": [1], "token_type_ids": [0]}, {"input_ids": [1, 2]}])
    with pytest.raises(TypeError, match="list of encodings"):
        fast.pad([[101, 102]])
    with pytest.raises(ValueError, match="Unable to create tensor"):
        fast.pad([{"input_ids": [1]}, {"input_ids": [1, 2]}], padding=False, return_tensors="pt")


def test_masked_lm_collator_and_special_tokens_mask(pair):
    """DataCollatorForLanguageModeling on features without a special_tokens_mask asks the tokenizer
    for one (already_has_special_tokens=True): same batch as with BertTokenizerFast, same seed."""
    fast, hf = pair
    feats_f = [{"input_ids": ids} for ids in fast(LINES[:4])["input_ids"]]
    feats_h = [{"input_ids": ids} for ids in hf(LINES[:4])["input_ids"]]
    batches = []
    for tok, feats in ((fast, feats_f), (hf, feats_h)):
        torch.manual_seed(0)
        batches.append(transformers.DataCollatorForLanguageModeling(tok, mlm=True, mlm_probability=0.5)(feats))
    _same(*batches)
    assert (batches[0]["labels"] != -100).any()
    ids = fast(LINES[0], LINES[1])["input_ids"] + [fast.pad_token_id]
    assert fast.get_special_tokens_mask(ids, already_has_special_tokens=True) == \
        hf.get_special_tokens_mask(ids, already_has_special_tokens=True)
    with pytest.raises(ValueError, match="already formatted"):
        fast.get_special_tokens_mask(ids, [1], already_has_special_tokens=True)
    # unformatted ids: where the template puts [CLS] / [SEP] (transformers 5's fast tokenizer raises here)
    a, b = fast(LINES[0], add_special_tokens=False)["input_ids"], fast(LINES[1], add_special_tokens=False)["input_ids"]
    assert fast.get_special_tokens_mask(a, b) == fast(LINES[0], LINES[1], return_special_tokens_mask=True)[
        "special_tokens_mask"]
    assert fast.get_special_tokens_mask(a) == [1] + [0] * len(a) + [1]


@pytest.mark.parametrize("key", ["offset_mapping", "labels"])
def test_ragged_extra_key_names_the_key(pair, key):
    """A key pad() does not pad (offsets, token labels) with rows of different lengths cannot become one
    tensor: the error names the key, as transformers' does, not torch's bare sequence-length message."""
    fb, hf = pair
    for tok in (fb, hf):
        rows = [dict(tok(x, return_offsets_mapping=True)) for x in ["a fairly long first sentence", "b"]]
        for row in rows:
            row["labels"] = list(range(len(row["input_ids"])))
            if key == "labels":
                del row["offset_mapping"]
        with pytest.raises(ValueError, match=f"Unable to create tensor.*`{key}` in this case"):
            tok.pad(rows, return_tensors="pt")
