"""Every input form of transformers.BertTokenizerFast.__call__, and its keyword arguments beyond the
named ones, against BertTokenizerFast itself (transformers 5: it ignores unknown keyword arguments
without a word; fastbert ignores them with a warning, never silently)."""
import warnings

import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast

import fastbert
from fastbert.benchmarks import corpus


LINES = corpus.english_lines()[:6] + ["UNwant\u00E9d,running", "野口里佳 Noguchi Rika", ""]
WORDS = [line.split() for line in LINES]
FIELDS = dict(return_offsets_mapping=True, return_special_tokens_mask=True, return_length=True)


def _same(a, b):
    assert set(a) == set(b), (sorted(a), sorted(b))
    for k in b:
        x, y = a[k], b[k]
        if isinstance(y, torch.Tensor):
            assert isinstance(x, torch.Tensor) and x.dtype == y.dtype and torch.equal(x, y), k
        elif isinstance(y, np.ndarray):
            assert np.array_equal(x, y), k
        else:
            assert x == y, k


def _both(tok, hf, *args, **kwargs):
    a, b = tok(*args, **kwargs), hf(*args, **kwargs)
    _same(a, b)
    return a, b


@pytest.mark.parametrize("container", [list, tuple])
def test_batch_of_pairs(tok, hf, container):
    # transformers' zero-shot pipeline sends [[premise, hypothesis], ...]
    items = [container((a, b)) for a, b in zip(LINES, reversed(LINES))]
    a, b = _both(tok, hf, items, **FIELDS)
    assert a.word_ids(1) == b.word_ids(1) and a.sequence_ids(2) == b.sequence_ids(2)
    _both(tok, hf, items, padding=True, truncation=True, max_length=12, return_tensors="pt")
    _both(tok, hf, tuple(items), padding="max_length", max_length=40, truncation=True, return_tensors="np")


def test_text_and_text_pair_lists(tok, hf):
    a, b = _both(tok, hf, LINES, list(reversed(LINES)), **FIELDS)
    assert a.n_sequences == b.n_sequences == 2
    _both(tok, hf, tuple(LINES), tuple(LINES), padding=True, return_tensors="pt")


def test_single_pair(tok, hf):
    a, b = _both(tok, hf, "My name is John", "pair", **FIELDS)
    assert a.sequence_ids() == b.sequence_ids()
    _both(tok, hf, "My name is John", "", **FIELDS)  # an empty pair is no pair, as in transformers


def test_pre_split_words(tok, hf):
    _both(tok, hf, WORDS[0], is_split_into_words=True, **FIELDS)                  # one sequence of words
    a, b = _both(tok, hf, WORDS[0], WORDS[1], is_split_into_words=True, **FIELDS)  # one pair
    assert a.word_ids() == b.word_ids()
    a, b = _both(tok, hf, WORDS, is_split_into_words=True, **FIELDS)               # a batch
    assert [a.word_ids(k) for k in range(len(WORDS))] == [b.word_ids(k) for k in range(len(WORDS))]
    _both(tok, hf, WORDS, WORDS[::-1], is_split_into_words=True, **FIELDS)         # a batch of pairs
    pairs = [(w, v) for w, v in zip(WORDS, WORDS[::-1])]
    a, b = _both(tok, hf, pairs, is_split_into_words=True, **FIELDS)               # pairs as tuples
    assert a.word_ids(3) == b.word_ids(3)
    _both(tok, hf, [list(p) for p in pairs], is_split_into_words=True, padding=True, return_tensors="pt")
    _both(tok, hf, [], is_split_into_words=True)  # no words: one empty sequence


def test_bad_pairs_raise_like_transformers(tok, hf):
    for items in ([["only one"]], [["a", "b", "c"]], ["a", ("b", "c", "d")]):
        with pytest.raises(TypeError):
            hf(items)
        with pytest.raises(TypeError, match="pair"):
            tok(items)
    with pytest.raises(TypeError):
        hf([("a", "b")], ["c"])
    with pytest.raises(TypeError):
        tok([("a", "b")], ["c"])


def test_batch_mixing_texts_and_pairs(tok, hf):
    items = [LINES[0], (LINES[1], LINES[2]), [LINES[3], LINES[4]], LINES[5]]
    for batch in (items, items[1:] + items[:1]):  # a pair first, and a text first
        a, b = _both(tok, hf, batch, **FIELDS)
        for k in range(len(batch)):
            assert a.sequence_ids(k) == b.sequence_ids(k) and a.word_ids(k) == b.word_ids(k)
        _both(tok, hf, batch, padding=True, truncation=True, max_length=10, return_tensors="pt")
    words = [WORDS[0], (WORDS[1], WORDS[2]), WORDS[3]]
    _both(tok, hf, words, is_split_into_words=True, **FIELDS)


@pytest.mark.parametrize("call", ["__call__", "encode"])
def test_unknown_keyword_arguments_warn(tok, hf, call):
    for kwargs in ({"foo": 1}, {"return_tensor": "pt"}, {"pad_to_max_length": True}):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            expected = getattr(hf, call)(LINES[:2], **kwargs)  # transformers: accepted, no warning
        with pytest.warns(UserWarning, match=next(iter(kwargs))):
            got = getattr(tok, call)(LINES[:2], **kwargs)
        assert (dict(got) if call == "__call__" else got) == (dict(expected) if call == "__call__" else expected)


def test_transformers_extra_keywords(tok, hf):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _both(tok, hf, LINES[:3], split_special_tokens=False)
        _both(tok, hf, LINES[:3], tokenizer_kwargs={"max_length": 5, "truncation": True})
    _both(tok, hf, LINES[:3], split_special_tokens=True)


SPECIAL_TEXTS = ["Hello [CLS] there [MASK] newword <special1> x[SEP]y", "[PAD][UNK] ok [cls] <sp2> Newword",
                 "[SEP]", "plain text, no special token"] + LINES[:3]


def _with_added(make):
    from tokenizers import AddedToken

    t = make()
    t.add_tokens(["newword"])  # not special: still matched when the special tokens are split
    t.add_special_tokens({"additional_special_tokens": ["<special1>", AddedToken("<sp2>", normalized=True)]})
    return t


@pytest.mark.parametrize("split", [False, True])
def test_split_special_tokens(model_dir, split):
    """split_special_tokens=True: special tokens written in the text (the template's, additional ones,
    raw or normalized) are tokenized as text; non-special added tokens are still matched. Per call, through
    tokenizer_kwargs, and as the tokenizer's own setting (from_pretrained, kept by save_pretrained and
    pickle), with ids, offsets, masks, word ids and tokenize() as transformers gives them, on one thread
    and on the pool."""
    import pickle

    fast = _with_added(lambda: fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=2))
    ref = _with_added(lambda: BertTokenizerFast.from_pretrained(model_dir))
    many = [f"{i} {t}" for i in range(300) for t in SPECIAL_TEXTS]  # enough text for the pool
    for texts in (SPECIAL_TEXTS, many):
        a = fast(texts, split_special_tokens=split, **FIELDS)
        b = ref(texts, split_special_tokens=split, **FIELDS)
        _same(a, b)
        assert all(a.word_ids(k) == b.word_ids(k) for k in range(len(texts)))
    _same(fast(SPECIAL_TEXTS[:2], padding=True, return_tensors="np", split_special_tokens=split),
          ref(SPECIAL_TEXTS[:2], padding=True, return_tensors="np", split_special_tokens=split))
    _same(fast(SPECIAL_TEXTS[0], tokenizer_kwargs={"split_special_tokens": split}),
          ref(SPECIAL_TEXTS[0], tokenizer_kwargs={"split_special_tokens": split}))
    for text in SPECIAL_TEXTS[:3]:
        assert fast.tokenize(text, split_special_tokens=split) == ref.tokenize(text, split_special_tokens=split)
        assert fast.encode(text, split_special_tokens=split) == ref.encode(text, split_special_tokens=split)
    split_fast = fastbert.BertTokenizer.from_pretrained(model_dir, split_special_tokens=True)
    split_ref = BertTokenizerFast.from_pretrained(model_dir, split_special_tokens=True)
    for t in (split_fast, pickle.loads(pickle.dumps(split_fast))):
        assert t.split_special_tokens is True
        assert t(SPECIAL_TEXTS[0])["input_ids"] == split_ref(SPECIAL_TEXTS[0])["input_ids"]
        assert t.encode(SPECIAL_TEXTS[0]) == split_ref.encode(SPECIAL_TEXTS[0])
        assert t(SPECIAL_TEXTS[0], split_special_tokens=split)["input_ids"] == \
            split_ref(SPECIAL_TEXTS[0], split_special_tokens=split)["input_ids"]


def test_split_special_tokens_saved_and_checked(model_dir, tmp_path):
    fastbert.BertTokenizer.from_pretrained(model_dir, split_special_tokens=True).save_pretrained(tmp_path)
    for loaded in (fastbert.BertTokenizer.from_pretrained(tmp_path), BertTokenizerFast.from_pretrained(tmp_path)):
        assert loaded.split_special_tokens is True
        assert loaded("a [CLS] b")["input_ids"][1:-1] == loaded("a [ cls ] b", add_special_tokens=False)["input_ids"]
    with pytest.raises(TypeError, match="split_special_tokens must be a bool"):
        fastbert.BertTokenizer.from_pretrained(model_dir, split_special_tokens="yes")
    with pytest.raises(TypeError, match="split_special_tokens must be a bool"):
        fastbert.BertTokenizer.from_pretrained(model_dir)("a", split_special_tokens=1)


def test_batch_encode_plus_is_gone_as_in_transformers(tok, hf):
    # transformers 5 removed encode_plus / batch_encode_plus: code calling them fails with both
    for name in ("encode_plus", "batch_encode_plus"):
        assert not hasattr(hf, name) and not hasattr(tok, name)


def test_text_target(tok, hf):
    _both(tok, hf, "a b", text_target="c d e")
    _both(tok, hf, text_target=LINES[:3])
    _both(tok, hf, LINES[:3], text_target=LINES[3:6], text_pair_target=LINES[:3], padding=True,
          return_tensors="pt")
    _both(tok, hf, LINES[:3], text_target=LINES[3:6], max_target_length=5, truncation=True)
    with pytest.raises(ValueError, match="text_target"):
        tok(LINES[:3], text_pair_target=LINES[:3])
    with pytest.raises(ValueError, match="text_target"):
        tok()


@pytest.mark.parametrize("wide", ["é", "ü", "\u2019", "\u4e2d", "\U0001f600"], ids=["latin1", "latin1b", "bmp", "cjk", "astral"])
def test_utf8_conversion_around_ascii_runs(tok, hf, wide):
    # str objects of each kind without a cached UTF-8 form are converted in C++, ASCII a machine word
    # at a time: non-ASCII characters at every offset around a word, between runs of every length
    texts = ["".join(("abcdefghijklmnopq"[:k] + wide) * r) + " end" for k in range(18) for r in (1, 2, 3)]
    texts += [wide * k + "x" * (17 - k) for k in range(18)]
    want = hf(texts, return_offsets_mapping=True)
    got = tok(texts, return_offsets_mapping=True)
    assert got["input_ids"] == want["input_ids"]
    assert [list(map(tuple, r)) for r in got["offset_mapping"]] == [list(map(tuple, r)) for r in want["offset_mapping"]]
    with pytest.raises(ValueError, match="character 10;"):
        tok(["ok", "abcdefghi" + wide + "\ud800 tail"])
