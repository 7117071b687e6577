"""Core checks of fastbert's C++ tokenizer against transformers.BertTokenizerFast.

The first test runs every Unicode code point through both tokenizers with a vocabulary holding
every character (so each normalized character shows up as its own id and offset), for each
normalizer setting; the rest cover the post-processor, truncation/overflow, padding and errors.
"""
import os
import threading

import numpy as np
import pytest

transformers = pytest.importorskip("transformers")
from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors  # noqa: E402
from tokenizers.models import WordPiece  # noqa: E402

import fastbert  # noqa: E402

ALL_CPS = [cp for cp in range(0x110000) if not 0xD800 <= cp < 0xE000]


def _char_vocab():
    # ASCII plus every character that lowercasing or NFD changes, and what it becomes, each alone
    # and as a "##" piece: a wrong class (space, punctuation, removed) shows in the token
    # boundaries and offsets, a wrong mapping in the ids.
    import unicodedata
    chars = {chr(c) for c in range(32, 127)}
    for cp in ALL_CPS:
        ch = chr(cp)
        for out in (ch.lower(), unicodedata.normalize("NFD", ch)):
            if out != ch:
                chars.add(ch)
                chars.update(out)
    chars = sorted(chars)
    return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + ["##" + c for c in chars]


@pytest.fixture(scope="module")
def char_vocab():
    return _char_vocab()


def _hf(vocab, lowercase, strip_accents, clean_text=True, chinese=True):
    tok = Tokenizer(WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(clean_text=clean_text, handle_chinese_chars=chinese,
                                                strip_accents=strip_accents, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok


# Two settings cover every step on and off: uncased defaults, and cased + strip_accents - clean_text.
@pytest.mark.parametrize("lowercase,strip_accents,clean_text", [(True, None, True), (False, True, False)])
def test_every_code_point_matches_hf(char_vocab, lowercase, strip_accents, clean_text):
    hf = _hf(char_vocab, lowercase, strip_accents, clean_text)
    ours = fastbert.BertTokenizer(vocab=char_vocab, do_lower_case=lowercase, strip_accents=strip_accents,
                                  clean_text=clean_text, num_threads=2)
    # each code point inside a word ("a" + ch + "b"): a space, a punctuation mark, a removed or a
    # changed character each give other tokens and offsets; 4000 code points per text
    texts = ["".join(f"a{chr(cp)}b " for cp in ALL_CPS[i:i + 4000]) for i in range(0, len(ALL_CPS), 4000)]
    ref = hf.encode_batch(texts)
    got = ours(texts, return_offsets_mapping=True)
    bad = []
    for i, e in enumerate(ref):
        if e.ids != got["input_ids"][i] or e.offsets != got["offset_mapping"][i]:
            j = next(k for k in range(min(len(e.ids), len(got["input_ids"][i])) + 1)
                     if k >= len(e.ids) or k >= len(got["input_ids"][i]) or e.ids[k] != got["input_ids"][i][k]
                     or e.offsets[k] != got["offset_mapping"][i][k])
            bad.append((i, j, e.tokens[j - 1:j + 2], e.offsets[j - 1:j + 2], got["offset_mapping"][i][j - 1:j + 2],
                        [ours.convert_ids_to_tokens(x) for x in got["input_ids"][i][j - 1:j + 2]]))
    assert not bad, f"{len(bad)} of {len(texts)} texts differ; first: {bad[:3]}"


@pytest.fixture(scope="module")
def pair_of_tokenizers(model_dir):
    hf = transformers.BertTokenizerFast.from_pretrained(model_dir)
    return hf, fastbert.BertTokenizer.from_pretrained(model_dir)


TEXTS = [
    "UNwant\u00e9d,running", "野口里佳 Noguchi Rika", "\ufeffHello", "My name is John", "pair",
    "Héllo wörld! İstanbul straße ﬁne Σίσυφος", "", "   ", "a" * 150 + " short", "[CLS] inside [MASK] text [SEP]",
    "The quick brown fox jumps over the lazy dog. " * 20, "emoji 😀👍🏽 zero\u200bwidth\u00adsoft", "tabs\tand\nnewlines\r\n",
    "unaffable supercalifragilisticexpialidocious", "x [mask] y [UNK] z", "数学 и русский текст, ελληνικά.",
]


def _compare(hf, ours, *args, **kw):
    try:
        a = hf(*args, **kw)
    except Exception as e:  # where HF refuses, fastbert must refuse too
        with pytest.raises(Exception):
            ours(*args, **kw)
        return str(e)
    b = ours(*args, **kw)
    assert sorted(a.keys()) == sorted(b.keys()), (a.keys(), b.keys())
    for k in a.keys():
        x, y = a[k], b[k]
        if hasattr(x, "numpy"):
            x = x.numpy()
        if hasattr(y, "numpy"):
            y = y.numpy()
        if isinstance(x, np.ndarray):
            assert isinstance(y, np.ndarray) and x.dtype == y.dtype and x.shape == y.shape, (k, x, y)
            np.testing.assert_array_equal(x, y, err_msg=k)
        else:
            assert x == y, (k, args, kw, x, y)


@pytest.mark.parametrize("kw", [
    {}, {"return_offsets_mapping": True, "return_special_tokens_mask": True, "return_length": True},
    {"padding": True}, {"padding": "max_length", "max_length": 40, "truncation": True},
    {"padding": True, "pad_to_multiple_of": 8, "padding_side": "left"},
    {"truncation": True, "max_length": 12, "stride": 3, "return_overflowing_tokens": True,
     "return_offsets_mapping": True},
    {"truncation": "longest_first", "max_length": 9}, {"add_special_tokens": False, "return_length": True},
    {"padding": True, "return_tensors": "np", "return_special_tokens_mask": True},
    {"padding": "max_length", "max_length": 64, "truncation": True, "return_tensors": "pt",
     "return_offsets_mapping": True},
    {"return_token_type_ids": False, "return_attention_mask": False},
])
def test_batch_options_match_hf(pair_of_tokenizers, kw):
    hf, ours = pair_of_tokenizers
    _compare(hf, ours, TEXTS, **kw)
    for t in TEXTS[:6]:
        _compare(hf, ours, t, **kw)


@pytest.mark.parametrize("kw", [
    {}, {"truncation": True, "max_length": 10}, {"truncation": "only_first", "max_length": 14},
    {"truncation": "only_second", "max_length": 14, "stride": 2, "return_overflowing_tokens": True},
    {"truncation": "longest_first", "max_length": 13, "stride": 1, "return_overflowing_tokens": True,
     "return_offsets_mapping": True, "padding": True},
    {"padding": "max_length", "max_length": 32, "truncation": True, "return_tensors": "np"},
])
def test_pairs_match_hf(pair_of_tokenizers, kw):
    hf, ours = pair_of_tokenizers
    firsts = ["The quick brown fox jumps over the lazy dog again and again", "short one", "My name is John"]
    seconds = ["pair", "a much longer second sentence that needs truncation for sure", "x y z w v u t s"]
    _compare(hf, ours, firsts, seconds, **kw)
    _compare(hf, ours, firsts[0], seconds[1], **kw)


def test_split_into_words_matches_hf(pair_of_tokenizers):
    hf, ours = pair_of_tokenizers
    words = [["Hello", "wörld!", "unaffable"], ["野口", "里佳"], ["x"]]
    _compare(hf, ours, words, is_split_into_words=True, return_offsets_mapping=True, padding=True)


def test_decode_and_conversions_match_hf(pair_of_tokenizers):
    hf, ours = pair_of_tokenizers
    ids = hf("Hello , world ! isn't it [MASK] unaffable.")["input_ids"]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    assert ours.batch_decode([ids, ids[:3]]) == hf.batch_decode([ids, ids[:3]])
    assert ours.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert ours.convert_tokens_to_ids(["hello", "nope-not-a-token", "[SEP]"]) == \
        hf.convert_tokens_to_ids(["hello", "nope-not-a-token", "[SEP]"])
    assert ours.tokenize(TEXTS[5]) == hf.tokenize(TEXTS[5])
    assert ours.encode("Hello world") == hf.encode("Hello world")
    assert (ours.vocab_size, len(ours)) == (hf.vocab_size, len(hf))
    for name in ("cls", "sep", "pad", "unk", "mask"):
        assert getattr(ours, f"{name}_token") == getattr(hf, f"{name}_token")
        assert getattr(ours, f"{name}_token_id") == getattr(hf, f"{name}_token_id")
    assert ours.model_max_length == hf.model_max_length


def test_huge_word_is_unk_fast(pair_of_tokenizers):
    import time
    _, ours = pair_of_tokenizers
    t0 = time.perf_counter()
    enc = ours("a" * 10_000_000, return_offsets_mapping=True)
    assert time.perf_counter() - t0 < 1.0
    assert enc["input_ids"] == [101, 100, 102]
    assert enc["offset_mapping"][1] == (0, 10_000_000)


def test_bad_inputs(tmp_path, model_dir):
    with pytest.raises(OSError, match="nope"):
        fastbert.BertTokenizer.from_pretrained(str(tmp_path / "nope"))
    (tmp_path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\nhello\n")
    with pytest.raises(ValueError, match=r"\[UNK\]"):
        fastbert.BertTokenizer(str(tmp_path / "vocab.txt"))
    tok = fastbert.BertTokenizer.from_pretrained(model_dir)
    with pytest.raises(TypeError, match="item 2"):
        tok(["a", "b", 3])
    with pytest.raises(ValueError, match=r"item 1 .*character 3"):
        tok(["ok", "abc\ud800def"])


def test_threads_agree_with_serial(model_dir):
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=1)
    texts = [t * (i % 5 + 1) for i, t in enumerate(TEXTS * 40)]
    ref = tok(texts, return_offsets_mapping=True)
    par = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=4)
    assert par(texts, return_offsets_mapping=True) == ref
    results, errors = [None] * 8, []

    def work(k):
        try:
            for _ in range(5):
                results[k] = par(texts, return_offsets_mapping=True)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and all(r == ref for r in results)


def test_short_chunks_with_many_ids_from_every_thread(model_dir):
    # Chunks of at most 15 bytes go through one cache for all threads, which holds up to 10 ids
    # and notes that a chunk with more is kept in each thread's own cache: chunks of 9 to 15 ids
    # (one per punctuation mark), met first on one thread and then on others, and again in a later
    # call, tokenize as transformers does.
    hf = transformers.BertTokenizerFast.from_pretrained(model_dir)
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=2)
    marks = "!?.,;:()[]{}-+*"
    chunks = ["".join(marks[(i + j) % len(marks)] for j in range(n)) for n in range(9, 16) for i in range(6)]
    chunks += [c[:-1] + "a" for c in chunks]  # a letter at the end: one id fewer, some under the bar
    assert {len(hf.tokenize(c)) for c in chunks} >= {10, 11, 15}
    texts = [" ".join(chunks[(i * 7) % len(chunks):] + chunks[:3]) for i in range(400)]  # > 100 KB
    want = hf(texts)["input_ids"]
    assert tok(texts)["input_ids"] == want
    assert tok(texts[::-1])["input_ids"] == want[::-1]
    tok.clear_cache()
    assert tok(texts[::-1])["input_ids"] == want[::-1]


@pytest.mark.parametrize("threads", [2, 3])
def test_uneven_batches_agree_with_serial(model_dir, threads):
    # the batch is cut into chunks by bytes, large first: one long text among short and empty ones,
    # pairs and overflow rows must come back in input order, as on one thread
    long_text = " ".join(TEXTS) * 60
    texts = ["", long_text] + [t * (i % 7) for i, t in enumerate(TEXTS * 30)] + [long_text, ""]
    pairs = [TEXTS[i % len(TEXTS)] for i in range(len(texts))]
    serial = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=1)
    par = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=threads)
    for kwargs in ({}, {"text_pair": pairs, "truncation": True, "max_length": 48, "stride": 8,
                        "return_overflowing_tokens": True}):
        ref = serial(texts, return_offsets_mapping=True, **kwargs)
        assert len(ref["input_ids"]) >= len(texts)
        assert par(texts, return_offsets_mapping=True, **kwargs) == ref
        assert par(texts, padding=True, return_tensors="np", **kwargs)["input_ids"].tolist() == \
            serial(texts, padding=True, return_tensors="np", **kwargs)["input_ids"].tolist()


@pytest.mark.parametrize("threads", [1, 2])
def test_max_length_padding_with_threads_matches_hf(model_dir, threads):
    hf = transformers.BertTokenizerFast.from_pretrained(model_dir)
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=threads)
    texts = [t * (i % 9 + 1) for i, t in enumerate(TEXTS * 40)]  # rows longer and shorter than 48
    pairs = [TEXTS[(i + 1) % len(TEXTS)] for i in range(len(texts))]
    for kwargs in ({}, {"text_pair": pairs}, {"padding_side": "left"}, {"pad_to_multiple_of": 16},
                   {"return_offsets_mapping": True, "return_special_tokens_mask": True}):
        args = dict(padding="max_length", truncation=True, max_length=48, return_tensors="np", **kwargs)
        want, got = hf(texts, **args), tok(texts, **args)
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{key} with {kwargs}")
    # rows longer than max_length (no truncation): the general path, as BertTokenizerFast
    args = dict(padding="max_length", max_length=8)
    assert tok(texts, **args)["input_ids"] == hf(texts, **args)["input_ids"]
    want, got = hf(texts, return_tensors="np", **args), tok(texts, return_tensors="np", **args)
    assert got["input_ids"].shape == want["input_ids"].shape == (len(texts),)  # ragged: one object per row
    assert [list(r) for r in got["input_ids"]] == [list(r) for r in want["input_ids"]]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_lists_built_while_the_pool_encodes_match_hf(model_dir, threads):
    # Lists of a shape known in advance (no overflow rows, no padding="longest") are built chunk by
    # chunk on the calling thread, which takes the GIL back for each chunk while the pool encodes the
    # later ones; a Python thread competing for the GIL meanwhile changes nothing.
    from corpora import english_lines

    hf = transformers.BertTokenizerFast.from_pretrained(model_dir)
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=threads)
    texts = [t[:300] for t in english_lines()[:600]] + ["", " "] + TEXTS  # over 100 KB: many chunks
    pairs = texts[1:] + texts[:1]
    cases = [{}, {"padding": "max_length", "truncation": True, "max_length": 40},
             {"padding": "max_length", "max_length": 30, "pad_to_multiple_of": 16,
              "padding_side": "left", "return_special_tokens_mask": True},
             {"text_pair": pairs, "truncation": True, "max_length": 64, "return_offsets_mapping": True,
              "return_length": True},
             {"padding": "max_length", "max_length": 8}]  # rows longer than max_length stay whole
    busy = threading.Event()

    def hold_the_gil_now_and_then():
        while not busy.is_set():
            sum(range(20_000))

    rival = threading.Thread(target=hold_the_gil_now_and_then)
    rival.start()
    try:
        got = [tok(texts, **kwargs) for kwargs in cases]
    finally:
        busy.set()
        rival.join()
    for kwargs, g in zip(cases, got):
        want = hf(texts, **kwargs)
        assert sorted(g) == sorted(want), kwargs
        for key in want:
            assert g[key] == want[key], f"{key} with {kwargs}"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_pool_survives_fork(model_dir):
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=2)
    texts = TEXTS * 10
    ref = tok(texts)["input_ids"]
    pid = os.fork()
    if pid == 0:  # child: the parent's pool threads do not exist here
        ok = tok(texts)["input_ids"] == ref
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
