"""Packed output (tokenizer(texts, packed=True)): every sequence's real tokens back to back, with
position ids, cu_seqlens and max_seqlen. Checked row by row against the padded output of the same
call (itself checked against BertTokenizerFast here and in test_tokenizer.py) on the real
checkpoint's vocabulary, for single texts, pairs, truncation, overflow rows and every return type."""
import numpy as np
import pytest
import torch

from fastbert.benchmarks import corpus


TEXTS = corpus.english_lines()[:40] + corpus.multilingual_texts(20_000)[:25] + ["", "a", "UNwant\u00E9d,running"]
PAIRS = list(reversed(TEXTS))


def _rows_from_padded(padded, key):
    mask = np.asarray(padded["attention_mask"]).astype(bool)
    return [np.asarray(row)[m] for row, m in zip(np.asarray(padded[key]), mask)]


def _check(packed, padded, with_types=True):
    cu = packed["cu_seqlens"]
    rows = _rows_from_padded(padded, "input_ids")
    assert cu.dtype in (np.int32, torch.int32) and len(cu) == len(rows) + 1 and int(cu[0]) == 0
    assert packed["max_seqlen"] == max(len(r) for r in rows) and type(packed["max_seqlen"]) is int
    ids, pos = np.asarray(packed["input_ids"]), np.asarray(packed["position_ids"])
    assert ids.ndim == 1 and len(ids) == int(cu[-1]) == sum(len(r) for r in rows)
    types = _rows_from_padded(padded, "token_type_ids") if with_types else None
    for k, row in enumerate(rows):
        a, b = int(cu[k]), int(cu[k + 1])
        np.testing.assert_array_equal(ids[a:b], row)
        np.testing.assert_array_equal(pos[a:b], np.arange(b - a))
        if with_types:
            np.testing.assert_array_equal(np.asarray(packed["token_type_ids"])[a:b], types[k])
    assert "attention_mask" not in packed


@pytest.mark.parametrize("kind", ["pt", "np"])
@pytest.mark.parametrize("truncation,max_length", [(None, None), (True, 32), ("longest_first", 7)])
def test_packed_equals_padded_real_tokens(tok, hf, kind, truncation, max_length):
    packed = tok(TEXTS, packed=True, return_tensors=kind, truncation=truncation, max_length=max_length)
    padded = hf(TEXTS, padding=True, return_tensors="np", truncation=truncation, max_length=max_length)
    _check(packed, padded)
    array = torch.Tensor if kind == "pt" else np.ndarray
    for key in ("input_ids", "token_type_ids", "position_ids", "cu_seqlens"):
        assert isinstance(packed[key], array), key
    assert packed["input_ids"].dtype == (torch.int64 if kind == "pt" else np.int64)


@pytest.mark.parametrize("truncation", ["longest_first", "only_first", "only_second"])
def test_packed_pairs_with_truncation(tok, hf, truncation):
    # only_first / only_second need the other sequence to fit (else both tokenizers raise)
    first, second = {"longest_first": (TEXTS, PAIRS), "only_first": (TEXTS, ["My name is John"] * len(TEXTS)),
                     "only_second": (["pair"] * len(TEXTS), PAIRS)}[truncation]
    packed = tok(first, second, packed=True, return_tensors="np", truncation=truncation, max_length=24)
    padded = hf(first, second, padding=True, return_tensors="np", truncation=truncation, max_length=24)
    _check(packed, padded)
    assert set(np.asarray(packed["token_type_ids"]).tolist()) == {0, 1}


def test_packed_pairs_as_tuples_and_overflow(tok, hf):
    items = [("My name is John", p) for p in PAIRS]
    packed = tok(items, packed=True, return_tensors="pt", truncation="only_second", max_length=20, stride=3,
                 return_overflowing_tokens=True)
    padded = hf(items, padding=True, return_tensors="np", truncation="only_second", max_length=20, stride=3,
                return_overflowing_tokens=True)
    _check(packed, padded)
    assert packed["overflow_to_sample_mapping"].tolist() == padded["overflow_to_sample_mapping"].tolist()


def test_packed_lists_one_text_and_no_type_ids(tok, hf):
    packed = tok("UNwant\u00E9d,running", packed=True, return_token_type_ids=False)
    assert packed["input_ids"] == hf("UNwant\u00E9d,running")["input_ids"]
    assert packed["position_ids"] == list(range(len(packed["input_ids"])))
    assert packed["cu_seqlens"] == [0, len(packed["input_ids"])] and "token_type_ids" not in packed
    empty = tok([], packed=True, return_tensors="np")
    assert empty["cu_seqlens"].tolist() == [0] and empty["input_ids"].shape == (0,) and empty["max_seqlen"] == 0


def test_packed_offsets_and_special_mask(tok, hf):
    packed = tok(TEXTS[:10], packed=True, return_tensors="np", return_offsets_mapping=True,
                 return_special_tokens_mask=True)
    ref = hf(TEXTS[:10], return_offsets_mapping=True, return_special_tokens_mask=True)
    np.testing.assert_array_equal(packed["offset_mapping"], [o for row in ref["offset_mapping"] for o in row])
    np.testing.assert_array_equal(packed["special_tokens_mask"], sum(ref["special_tokens_mask"], []))


@pytest.mark.parametrize("padding", [True, "longest", "max_length"])
def test_packed_refuses_padding(tok, padding):
    with pytest.raises(ValueError, match="packed=True"):
        tok(TEXTS[:2], packed=True, padding=padding, max_length=16, return_tensors="pt")


def test_packed_refuses_attention_mask(tok):
    with pytest.raises(ValueError, match="attention_mask"):
        tok(TEXTS[:2], packed=True, return_attention_mask=True, return_tensors="pt")


def test_packed_word_ids_still_per_row(tok, hf):
    packed = tok(TEXTS[:5], packed=True, return_tensors="pt")
    ref = hf(TEXTS[:5])
    for k in range(5):
        assert packed.word_ids(k) == ref.word_ids(k)
