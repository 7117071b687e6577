"""BatchEncoding's alignment API (word_ids, sequence_ids, tokens, token_to_*/word_to_*/char_to_*,
encodings, n_sequences) against transformers.BertTokenizerFast: every method, every row, every
token / word / character index (one past the end included), on real text, pairs, truncation with
stride and overflow rows, left and right padding, pre-split words, added tokens, CJK and accents."""
import copy
import json
import os
import pickle
import shutil

import pytest
from hypothesis import HealthCheck, given, settings

import fastbert
import corpora as corpus

import tokenizer_corpus as tc

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def toks(model_dir):
    return (fastbert.BertTokenizer.from_pretrained(model_dir),
            transformers.BertTokenizerFast.from_pretrained(model_dir))


@pytest.fixture(scope="module")
def added_toks(model_dir, tmp_path_factory):
    """The checkpoint with added tokens of every kind: lstrip [MASK], a normalized non-special token,
    single_word, rstrip."""
    d = tmp_path_factory.mktemp("added")
    shutil.copy(os.path.join(model_dir, "vocab.txt"), d)
    cfg = json.load(open(os.path.join(model_dir, "tokenizer_config.json")))

    def entry(content, **flags):
        return dict(dict(content=content, lstrip=False, rstrip=False, normalized=False, single_word=False,
                         special=True), **flags)
    cfg["added_tokens_decoder"] = {
        "0": entry("[PAD]"), "100": entry("[UNK]"), "101": entry("[CLS]"), "102": entry("[SEP]"),
        "103": entry("[MASK]", lstrip=True), "30522": entry("NewTok", normalized=True, special=False),
        "30523": entry("<sw>", single_word=True, special=False), "30524": entry("<r>", rstrip=True)}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    return (fastbert.BertTokenizer.from_pretrained(str(d)), transformers.BertTokenizerFast.from_pretrained(str(d)))


def outcome(f):
    try:
        return f()
    except Exception as e:  # the same exception type is part of the behaviour
        return type(e)


def row_fields(e):
    return (e.ids, e.type_ids, e.tokens, [tuple(o) for o in e.offsets], e.attention_mask, e.special_tokens_mask,
            e.word_ids, e.sequence_ids, e.n_sequences, len(e), [row_fields(o) for o in e.overflowing])


def assert_aligned(got, want):
    """Every alignment method of two BatchEncodings gives the same answer (or raises the same type)."""
    assert got.is_fast and got.n_sequences == want.n_sequences
    assert len(got.encodings) == len(want.encodings)
    for b, (g, w) in enumerate(zip(got.encodings, want.encodings)):
        assert row_fields(g) == row_fields(w), f"row {b}"
        assert got.tokens(b) == want.tokens(b) and got.word_ids(b) == want.word_ids(b)
        assert got.sequence_ids(b) == want.sequence_ids(b)
        n = len(w)
        for t in range(n + 2):
            for name in ("token_to_sequence", "token_to_word", "token_to_chars"):
                assert outcome(lambda: getattr(got, name)(b, t)) == outcome(lambda: getattr(want, name)(b, t)), \
                    (name, b, t)
        words = [x for x in w.word_ids if x is not None]
        chars = max([o[1] for o in w.offsets] + [0])
        for s in (0, 1, 2):
            for x in range(max(words + [0]) + 2):
                for name in ("word_to_tokens", "word_to_chars"):
                    assert outcome(lambda: getattr(got, name)(b, x, s)) == \
                        outcome(lambda: getattr(want, name)(b, x, s)), (name, b, x, s)
            for c in range(chars + 2):
                for name in ("char_to_token", "char_to_word"):
                    assert outcome(lambda: getattr(got, name)(b, c, s)) == \
                        outcome(lambda: getattr(want, name)(b, c, s)), (name, b, c, s)


def plain(v):
    return v.tolist() if hasattr(v, "tolist") else v


def check(fb, hf, *args, **kwargs):
    got, want = fb(*args, **kwargs), hf(*args, **kwargs)
    assert {k: plain(v) for k, v in got.items()} == {k: plain(v) for k, v in want.items()}
    assert_aligned(got, want)
    return got, want


# ---- real text ---------------------------------------------------------------------------------------

def test_english_corpus(toks):
    fb, hf = toks
    lines = corpus.english_lines(20_000)
    check(fb, hf, lines[:48], padding=True, truncation=True, max_length=96)


def test_multilingual_corpus_overflow_left_padding(toks):
    fb, hf = toks
    docs = corpus.multilingual_texts(12_000)[:6]
    check(fb, hf, docs, truncation=True, max_length=48, stride=12, return_overflowing_tokens=True,
          padding="max_length", padding_side="left", return_offsets_mapping=True)


def test_overflow_rows_kept_on_encodings_without_overflow_output(toks):
    # without return_overflowing_tokens HF still keeps the windows on encodings[i].overflowing
    fb, hf = toks
    text = max(corpus.english_texts(20_000), key=len)
    got, want = check(fb, hf, [text, "short"], truncation=True, max_length=32, stride=8, padding=True)
    assert len(got.encodings[0].overflowing) > 1


@pytest.mark.parametrize("strategy", ["only_second", "only_first", "longest_first"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_pairs_truncation_stride(toks, strategy, side):
    fb, hf = toks
    q = corpus.english_lines(3_000)[:4]
    ctx = corpus.english_texts(8_000)[:4]
    first, second = (ctx, q) if strategy == "only_first" else (q, ctx)
    kwargs = dict(truncation=strategy, max_length=64, stride=16, padding="max_length", padding_side=side,
                  return_offsets_mapping=True)
    if strategy != "longest_first":
        kwargs["return_overflowing_tokens"] = True
    check(fb, hf, first, second, **kwargs)


@pytest.mark.parametrize("overflow", [False, True])
def test_pairs_both_overflowing(toks, overflow):
    # longest_first windows both sequences: tokenizers nests (A_i, B_j) rows one level deeper
    fb, hf = toks
    a, b = corpus.english_lines(3_000)[5:7], corpus.english_lines(3_000)[7:9]
    got, _ = check(fb, hf, a, b, truncation="longest_first", max_length=14, stride=2, padding=True,
                   return_overflowing_tokens=overflow)
    assert any(o.overflowing for e in got.encodings for o in e.overflowing)


def test_pair_without_special_tokens(toks):
    fb, hf = toks
    check(fb, hf, *tc.GOLDEN_PAIR, add_special_tokens=False, padding="max_length", max_length=12)
    check(fb, hf, [tc.GOLDEN_PAIR[0]], [tc.GOLDEN_PAIR[1]], padding="max_length", max_length=12,
          padding_side="left")


MIXED = ["Hello, world! Ça va? Ünïcödé café naïve", "野口里佳中文字 CJK混合text", "don't e-mail U.S.A. x1y2", "", "   "]


@pytest.mark.parametrize("text", tc.GOLDEN + MIXED)
def test_golden_cjk_accents(toks, text):
    fb, hf = toks
    check(fb, hf, text)
    check(fb, hf, text, add_special_tokens=False)


def test_edge_strings(toks):
    fb, hf = toks
    check(fb, hf, tc.EDGE_STRINGS, padding=True)


def test_added_tokens(added_toks):
    fb, hf = added_toks
    texts = ["a [MASK] b", "a   [MASK]b", "NewTok newtok NEWTOK néwtok", "z<r>  q", "x<sw>y <sw> z",
             "<r>\t[MASK]", "[CLS] hello [SEP] world [PAD]", "[UNK] [mask]"]
    check(fb, hf, texts, padding=True)
    check(fb, hf, texts, texts[::-1], truncation="longest_first", max_length=12, padding=True)
    check(fb, hf, [["a", "[MASK]", "NewTok", "x<sw>", "<r> z"]], is_split_into_words=True)


@settings(derandomize=True, max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(batch=tc.batches)
def test_hypothesis_word_ids(toks, batch):
    # every character class (whitespace, controls, combining marks, CJK, punctuation, specials in text)
    fb, hf = toks
    got, want = fb(batch, batch[::-1], padding=True), hf(batch, batch[::-1], padding=True)
    for i in range(len(batch)):
        assert (got.word_ids(i), got.sequence_ids(i), got.tokens(i)) == \
            (want.word_ids(i), want.sequence_ids(i), want.tokens(i)), (batch[i], batch[::-1][i])


@pytest.mark.parametrize("kwargs", [{}, dict(truncation="only_first", max_length=9, stride=2, padding=True,
                                             return_overflowing_tokens=True, padding_side="left")])
def test_split_into_words(toks, kwargs):
    fb, hf = toks
    words = [["Hello,", "world!", "", "UNwant\u00e9d,running", "野口里佳", "[MASK]", "x"], ["one"], ["  ", "a b"]]
    check(fb, hf, words, is_split_into_words=True, **kwargs)
    check(fb, hf, words, [["pair", "words"], [], ["z"]], is_split_into_words=True, **kwargs)
    check(fb, hf, words[0], is_split_into_words=True)


# ---- API forms, tensors, errors -------------------------------------------------------------------------

def test_single_text_forms_and_indexing(toks):
    fb, hf = toks
    got, want = check(fb, hf, "Hello world, again")
    for call in ("word_ids()", "tokens()", "sequence_ids()", "token_to_word(2)", "token_to_word(0, 2)",
                 "word_to_tokens(1)", "word_to_chars(1)", "char_to_token(7)", "char_to_word(7)",
                 "token_to_chars(2)", "token_to_sequence(1)", "word_ids(1)", "token_to_word(-1)",
                 "token_to_word(-1, 0)", "word_to_tokens(-1)", "char_to_token(-1)", "token_to_chars(-1)",
                 "word_to_chars(9)", "char_to_token(0, sequence_index=1)", "word_ids(-1)"):
        assert outcome(lambda: eval("got." + call)) == outcome(lambda: eval("want." + call)), call
    assert [row_fields(e) for e in got[0:1]] == [row_fields(e) for e in want[0:1]]
    assert row_fields(got[0]) == row_fields(want[0])
    with pytest.warns(FutureWarning):
        assert got.words() == want.word_ids()


@pytest.mark.parametrize("kind", ["pt", "np"])
def test_tensors_and_to(toks, kind):
    fb, hf = toks
    texts = corpus.english_lines(2_000)[:5]
    got, want = fb(texts, padding=True, return_tensors=kind), hf(texts, padding=True, return_tensors=kind)
    if kind == "pt":
        got, want = got.to("cpu"), want.to("cpu")
    assert_aligned(got, want)


def test_errors_name_the_problem(toks):
    fb, _ = toks
    plain = fastbert.tokenizer.BatchEncoding({"input_ids": [[1, 2]]})
    assert not plain.is_fast and plain.encodings is None and plain.n_sequences is None
    with pytest.raises(ValueError, match=r"word_ids\(\) is not available"):
        plain.word_ids()
    enc = fb(["a b"])
    with pytest.raises(IndexError):
        enc.word_ids(3)
    with pytest.raises(AttributeError, match="negative"):
        enc.token_to_word(0, -1)
    with pytest.raises(TypeError, match="word 7"):
        enc.word_to_chars(7)
    with pytest.raises(OverflowError, match="char_pos"):
        enc.char_to_token(-2)


def test_input_changed_after_call(toks):
    # alignment is computed later, from a copy of the input taken at call time
    fb, hf = toks
    texts, words = ["first text", "second one"], [["a", "b"], ["c"]]
    got, got_w = fb(texts), fb(words, is_split_into_words=True)
    texts[0], words[0][0] = "changed completely", "zzz"
    assert got.word_ids(0) == hf(["first text"]).word_ids(0)
    assert got.tokens(0) == ["[CLS]", "first", "text", "[SEP]"]
    assert got_w.tokens(0) == ["[CLS]", "a", "b", "[SEP]"]


def test_pickle(toks):
    fb, _ = toks
    enc = fb(["Hello world"])
    assert not pickle.loads(pickle.dumps(enc)).is_fast  # nothing computed yet: only the model inputs travel
    fresh = fb(["Hello world"])
    ids = enc.word_ids(0)
    back = pickle.loads(pickle.dumps(enc))
    assert back.word_ids(0) == ids and back.n_sequences == 1 and dict(back) == dict(enc)
    assert copy.copy(fresh).word_ids(0) == copy.deepcopy(fresh).word_ids(0) == ids == [None, 0, 1, None]


# ---- the tutorials' uses ----------------------------------------------------------------------------------

def align_labels(enc, labels):
    """transformers' token classification tutorial: label the first token of each word, -100 elsewhere."""
    out = []
    for i, word_labels in enumerate(labels):
        previous, row = None, []
        for w in enc.word_ids(batch_index=i):
            row.append(-100 if w is None or w == previous else word_labels[w])
            previous = w
        out.append(row)
    return out


def test_ner_label_alignment(toks):
    fb, hf = toks
    words = [["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
             ["Peter", "Blackburn", "naïvely", "visited", "東京"]]
    labels = [[3, 0, 7, 0, 0, 0, 7, 0, 0], [1, 2, 0, 0, 5]]
    kwargs = dict(is_split_into_words=True, truncation=True, max_length=16, padding=True)
    got = align_labels(fb(words, **kwargs), labels)
    assert got == align_labels(hf(words, **kwargs), labels)
    assert got[1][:3] == [-100, 1, 2]  # [CLS], then "peter", "blackburn": one token each


def qa_positions(enc, answers):
    """transformers' question answering tutorial: answer character span -> token positions per window."""
    starts, ends = [], []
    for i, offsets in enumerate(enc["offset_mapping"]):
        a = answers[enc["overflow_to_sample_mapping"][i]]
        s_char, e_char = a["start"], a["start"] + len(a["text"])
        seq = enc.sequence_ids(i)
        ctx_start = seq.index(1)
        ctx_end = len(seq) - 1 - seq[::-1].index(1)
        if offsets[ctx_start][0] > s_char or offsets[ctx_end][1] < e_char:
            starts.append(0)
            ends.append(0)
            continue
        k = ctx_start
        while k <= ctx_end and offsets[k][0] <= s_char:
            k += 1
        starts.append(k - 1)
        k = ctx_end
        while k >= ctx_start and offsets[k][1] >= e_char:
            k -= 1
        ends.append(k + 1)
    return starts, ends


def test_qa_sequence_ids_and_offsets(toks):
    fb, hf = toks
    context = max(corpus.english_texts(20_000), key=len)
    answer = next(w for w in context.split()[60:] if w.isalpha() and len(w) > 4 and f" {w} " in context)
    answers = [{"text": answer, "start": context.index(" " + answer + " ") + 1}]
    kwargs = dict(truncation="only_second", max_length=48, stride=16, return_overflowing_tokens=True,
                  return_offsets_mapping=True, padding="max_length")
    got, want = check(fb, hf, ["Which word is it?"], [context], **kwargs)
    positions = qa_positions(got, answers)
    assert positions == qa_positions(want, answers)
    assert any(s > 0 for s in positions[0])  # some window holds the answer
    for i, (s, e) in enumerate(zip(*positions)):
        if s:
            span = got.token_to_chars(i, s).start, got.token_to_chars(i, e).end
            assert context[span[0]:span[1]].lower() == answer.lower()
