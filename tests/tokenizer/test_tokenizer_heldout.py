"""Held-out parity: fastbert.BertTokenizer against transformers.BertTokenizerFast on real text the
other tokenizer tests never see, with vocabularies trained on it and every __call__ option.

Text: Faker's locale data (names, addresses, companies, lorem text in ~110 locales), Babel's CLDR
data (language, territory, month and day names in ~1100 locales), the emoji package (every emoji,
ZWJ sequences, skin tones, flags, with its names in 14 languages), HTML5 entities, and the same
text sprinkled with bidi marks, ZWJ/ZWNJ, variation selectors, soft hyphens and fullwidth forms.
Vocabularies: the real uncased checkpoint, the same with added tokens of every kind, and
WordPiece vocabularies trained here (cased, multilingual as tokenizer.json only, no clean_text).
"""
import json
import os
import random
import shutil
import tempfile

import numpy as np
import pytest
import torch
from transformers import BertTokenizerFast

import fastbert

faker = pytest.importorskip("faker", reason="faker (pip install faker) gives the held-out locale text")
babel = pytest.importorskip("babel", reason="babel (pip install babel) gives the held-out CLDR text")
emoji = pytest.importorskip("emoji", reason="emoji (pip install emoji) gives the held-out emoji text")

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
# Characters that change nothing visible but stress normalization and offsets.
MARKS = ("\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200c\u200d\ufe0e\ufe0f"
         "\u00ad\u00a0\u2009\u061c\u034f\u3000")
FIELDS = dict(return_offsets_mapping=True, return_special_tokens_mask=True)


def _corpus() -> list[str]:
    import html.entities
    import warnings

    from babel import Locale, localedata
    from faker.config import AVAILABLE_LOCALES

    texts = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecated locales (fr_QC) warn
        for loc in AVAILABLE_LOCALES:
            f = faker.Faker(loc)
            f.seed_instance(0)
            texts += [f.name() + ", " + f.job(), f.address(), f.company(), f.text(max_nb_chars=300)]
    for loc in sorted(localedata.locale_identifiers())[::5]:
        cldr = Locale.parse(loc)
        texts += [" ".join(list(cldr.languages.values())[:60]), ", ".join(list(cldr.territories.values())[:60]),
                  " ".join(cldr.months["format"]["wide"].values()) + " " + " ".join(cldr.days["format"]["wide"].values())]
    for i, (e, names) in enumerate(emoji.EMOJI_DATA.items()):
        lang = emoji.LANGUAGES[i % len(emoji.LANGUAGES)]
        if i % 3 == 0 and lang in names:
            texts.append(f"{e} {names[lang].strip(':').replace('_', ' ')} {e}{e}")
    entities = list(html.entities.html5.values())
    texts += [" ".join(entities[i:i + 40]) for i in range(0, len(entities), 40)]
    rng = random.Random(7)
    for t in rng.sample(texts, 400):
        chars = list(t)
        for _ in range(max(1, len(chars) // 15)):
            chars.insert(rng.randrange(len(chars) + 1), rng.choice(MARKS))
        texts.append("".join(chars))
    for t in rng.sample(texts, 150):  # fullwidth ASCII
        texts.append("".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else ("\u3000" if c == " " else c) for c in t))
    return [t for t in texts if t]


@pytest.fixture(scope="module")
def texts():
    return _corpus()


def _added(content, **flags):
    return dict(dict(content=content, lstrip=False, rstrip=False, normalized=False, single_word=False,
                     special=True), **flags)


def _train(texts, d, size, json_only, lowercase, strip_accents, clean_text=True, chinese=True):
    from tokenizers import BertWordPieceTokenizer

    trainer = BertWordPieceTokenizer(clean_text=clean_text, handle_chinese_chars=chinese,
                                     strip_accents=strip_accents, lowercase=lowercase)
    trainer.train_from_iterator(texts[::2], vocab_size=size, min_frequency=2, limit_alphabet=3000,
                                special_tokens=SPECIALS)
    if json_only:
        trainer.save(os.path.join(d, "tokenizer.json"))
    else:
        trainer.save_model(d)
    config = dict(tokenizer_class="BertTokenizer", model_max_length=512, do_lower_case=lowercase,
                  strip_accents=strip_accents, tokenize_chinese_chars=chinese)
    with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f)


VARIANTS = ["uncased", "added", "cased_2k", "multi_8k_json_strip_nochinese", "noclean_3k"]


@pytest.fixture(scope="module", params=VARIANTS)
def toks(request, texts, model_dir, tmp_path_factory):
    """(name, fastbert, BertTokenizerFast), both loaded from the same directory."""
    name = request.param
    d = str(tmp_path_factory.mktemp(name))
    fb_overrides = {}
    if name in ("uncased", "added"):
        for f in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(os.path.join(model_dir, f), d)
    if name == "added":  # added tokens of every kind, chosen to occur in the text
        with open(os.path.join(model_dir, "tokenizer_config.json"), encoding="utf-8") as f:
            config = json.load(f)
        config["added_tokens_decoder"] = {
            "0": _added("[PAD]"), "100": _added("[UNK]"), "101": _added("[CLS]"), "102": _added("[SEP]"),
            "103": _added("[MASK]", lstrip=True, rstrip=True),
            "2003": _added("is", special=False, single_word=True),  # already in the vocab
            "30522": _added("Straße", normalized=True, special=False),
            "30523": _added("de", single_word=True, special=False),
            "30524": _added("東京", rstrip=True, special=False),
            "30525": _added("ال", lstrip=True),
            "30526": _added("\U0001f1eb\U0001f1f7", special=False),
            "30527": _added("e-mail", normalized=True, special=False, single_word=True),
            "30528": _added("Ünïcödé", normalized=True, special=False),
            "30529": _added("and", lstrip=True, rstrip=True, special=False),
            "30530": _added("и", single_word=True),
        }
        config["additional_special_tokens"] = ["ال", "и"]
        with open(os.path.join(d, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(config, f, ensure_ascii=False)
    elif name == "cased_2k":
        _train(texts, d, 2000, False, lowercase=False, strip_accents=False)
    elif name == "multi_8k_json_strip_nochinese":
        _train(texts, d, 8000, True, lowercase=False, strip_accents=True, chinese=False)
    elif name == "noclean_3k":
        _train(texts, d, 3000, False, lowercase=True, strip_accents=None, clean_text=False)
        fb_overrides["clean_text"] = False
    fb = fastbert.BertTokenizer.from_pretrained(d, **fb_overrides)
    hf = BertTokenizerFast.from_pretrained(d)
    if name == "noclean_3k":  # BertTokenizerFast has no clean_text option: set its normalizer's
        from tokenizers import normalizers

        hf.backend_tokenizer.normalizer = normalizers.BertNormalizer(
            clean_text=False, handle_chinese_chars=True, strip_accents=None, lowercase=True)
    return name, fb, hf


# ---- comparison -------------------------------------------------------------------------------------

def same_value(got, want) -> bool:
    if isinstance(want, np.ndarray):
        if not isinstance(got, np.ndarray) or got.dtype != want.dtype or got.shape != want.shape:
            return False
        if want.dtype == object:
            return all(same_value(g, w) for g, w in zip(got, want))
        return np.array_equal(got, want)
    if isinstance(want, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape
                and torch.equal(got, want))
    return got == want and repr(got) == repr(want)


def diffs(fb, hf, *args, **kwargs) -> list[str]:
    """Both tokenizers on one call: [] when the encodings are equal (or both raise), else what differs."""
    what = f"args={args!r:.200} kwargs={kwargs}"
    try:
        want = hf(*args, **kwargs)
    except BaseException as e:  # tokenizers panics (a BaseException) on some strides
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        try:
            fb(*args, **kwargs)
        except Exception:
            return []
        return [f"{what}: BertTokenizerFast raised {type(e).__name__}, fastbert did not"]
    got = fb(*args, **kwargs)
    if sorted(got.keys()) != sorted(want.keys()):
        return [f"{what}: keys {sorted(got.keys())} != {sorted(want.keys())}"]
    return [f"{what} [{k}]:\n got  {got[k]!r:.300}\n want {want[k]!r:.300}"
            for k in want.keys() if not same_value(got[k], want[k])]


# ---- tests ------------------------------------------------------------------------------------------

def test_corpus_size(texts):
    """The held-out text is what it claims to be: large and in many scripts."""
    size = sum(len(t.encode("utf-8")) for t in texts)
    assert len(texts) > 1500 and size > 500_000, (len(texts), size)
    scripts = {"Cyrillic": "\u0400", "Greek": "\u0370", "Hebrew": "\u0590", "Arabic": "\u0600",
               "Devanagari": "\u0900", "Thai": "\u0e00", "Hangul": "\uac00", "Kana": "\u3040",
               "CJK": "\u4e00", "Emoji": "\U0001f300", "Fullwidth": "\uff00"}
    joined = "".join(texts)
    for script, start in scripts.items():
        lo = ord(start)
        assert any(lo <= ord(c) < lo + 0x100 for c in joined), f"no {script} text"


def test_every_text(toks, texts):
    """The whole corpus in one batch: ids, types, mask, special-tokens mask and offsets per text."""
    name, fb, hf = toks
    got, want = fb(texts, **FIELDS), hf(texts, **FIELDS)
    bad = [f"{texts[i][:80]!r}: {k}" for i in range(len(texts)) for k in want.keys() if got[k][i] != want[k][i]]
    assert not bad, f"{name}: {len(bad)} differ:\n" + "\n".join(bad[:10])


TRUNCATION = [dict(truncation=t, max_length=m, stride=s, return_overflowing_tokens=o)
              for t in (True, "only_first", "only_second", False) for m in (1, 3, 8, 33)
              for s in (0, 2) for o in (False, True)]
PADDING = [dict(padding=True), dict(padding=True, pad_to_multiple_of=8, padding_side="left"),
           dict(padding="max_length", max_length=40, truncation=True, pad_to_multiple_of=16),
           # pairs overflow into every (first window, second window) pair: at 16 tokens thousands of rows per
           # batch of 12 (at 12, 14,000 rows and most of this test's time)
           dict(padding="max_length", max_length=16, truncation=True, return_overflowing_tokens=True, stride=3,
                padding_side="left"),
           dict(padding=True, return_length=True, return_token_type_ids=False),
           dict(padding=True, add_special_tokens=False, return_attention_mask=False),
           dict(padding=True, truncation=True, max_length=600)]


def test_call_options(toks, texts):
    """Pairs through truncation strategies, stride and overflow; padded batches as lists, numpy and
    torch; left truncation; pre-split words; one and many threads."""
    name, fb, hf = toks
    rng = random.Random(name)
    sample = [t[:300] for t in rng.sample(texts, 36)]  # long enough to overflow, short enough to be quick
    short = [t[:rng.randint(0, 60)] for t in sample]
    bad = []
    for i in range(0, 36, 2):
        for kw in rng.sample(TRUNCATION, 5):
            bad += diffs(fb, hf, short[i], short[i + 1], **FIELDS, **kw)
            bad += diffs(fb, hf, short[i:i + 4], short[i + 4:i + 8] or None, **FIELDS, **kw)
    for j in range(0, 36, 12):
        batch, pairs = sample[j:j + 12], short[j:j + 12]
        for kw in PADDING:
            for tensors in (None, "np", "pt"):
                bad += diffs(fb, hf, batch, pairs, **FIELDS, **kw, return_tensors=tensors)
        bad += diffs(fb, hf, [t.split() for t in batch], [t.split() for t in pairs], is_split_into_words=True,
                     **FIELDS, padding=True, truncation=True, max_length=24)
        fb.truncation_side = hf.truncation_side = "left"
        try:
            bad += diffs(fb, hf, batch, pairs, **FIELDS, truncation=True, max_length=20,
                         return_overflowing_tokens=True, stride=4)
        finally:
            fb.truncation_side = hf.truncation_side = "right"
    threads = fb.num_threads
    try:
        for n in (1, 8):
            fb.num_threads = n
            bad += diffs(fb, hf, texts[::10], **FIELDS, padding=True, truncation=True, max_length=64)
    finally:
        fb.num_threads = threads
    assert not bad, f"{name}: {len(bad)} calls differ:\n" + "\n".join(bad[:5])


def test_tokenize_decode_convert(toks, texts):
    name, fb, hf = toks
    sample = random.Random(name).sample(texts, 120)
    for t in sample:
        assert fb.tokenize(t) == hf.tokenize(t), (name, t)
        ids = hf.encode(t)
        assert fb.encode(t) == ids, (name, t)
        tokens = hf.convert_ids_to_tokens(ids)
        assert fb.convert_ids_to_tokens(ids) == tokens, (name, t)
        assert fb.convert_tokens_to_ids(tokens) == hf.convert_tokens_to_ids(tokens), (name, t)
        assert fb.convert_tokens_to_string(tokens) == hf.convert_tokens_to_string(tokens), (name, t)
        for skip in (False, True):
            for cleanup in (False, True):
                assert fb.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=cleanup) == \
                    hf.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=cleanup), (name, t)
    # pairs: an added token with lstrip/rstrip keeps its spaces in the second sequence too
    for t, p in list(zip(sample[:40], sample[40:80])) + [("x", "y and z"), ("x", "y 東京 z [MASK] q")]:
        for special in (False, True):
            assert fb.tokenize(t, p, add_special_tokens=special) == hf.tokenize(t, p, add_special_tokens=special), \
                (name, t, p)
    batch = hf(sample[:30], truncation=True, max_length=24, padding=True)["input_ids"]
    for skip in (False, True):
        assert fb.batch_decode(batch, skip_special_tokens=skip) == hf.batch_decode(batch, skip_special_tokens=skip)


def test_save_reload(toks, texts):
    """save_pretrained, then load the directory with fastbert and with transformers: same encodings."""
    name, fb, hf = toks
    sample = random.Random(name).sample(texts, 200)
    want = hf(sample, **FIELDS)
    with tempfile.TemporaryDirectory() as d:
        fb.save_pretrained(d)
        fb2, hf2 = fastbert.BertTokenizer.from_pretrained(d), BertTokenizerFast.from_pretrained(d)
    if name == "noclean_3k":  # clean_text (fastbert's own option) comes back; transformers has no such option
        got = fb2(sample, **FIELDS)
        assert fb2.clean_text is False and all(got[k] == want[k] for k in want.keys())
        return
    assert fb2.get_vocab() == hf2.get_vocab() == hf.get_vocab()
    assert fb2.all_special_tokens == hf.all_special_tokens and fb2.added_tokens_encoder == hf.added_tokens_encoder
    assert fb2.special_tokens_map == hf2.special_tokens_map == hf.special_tokens_map
    for tok in (fb2, hf2):
        got = tok(sample, **FIELDS)
        for k in want.keys():
            assert got[k] == want[k], (name, type(tok).__name__, k)


def test_load_transformers_save(toks, texts):
    """A directory written by transformers' save_pretrained (transformers 5 names the additional special
    tokens extra_special_tokens): fastbert loads the same special tokens and encodes the same."""
    name, fb, hf = toks
    if name == "noclean_3k":
        pytest.skip("clean_text is not a BertTokenizerFast option: transformers cannot save it")
    sample = random.Random(name).sample(texts, 100)
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        fb2 = fastbert.BertTokenizer.from_pretrained(d)
    assert fb2.all_special_tokens == hf.all_special_tokens and fb2.all_special_ids == hf.all_special_ids
    assert fb2.special_tokens_map == hf.special_tokens_map
    assert fb2.extra_special_tokens == list(getattr(hf, "extra_special_tokens", None)
                                            or getattr(hf, "additional_special_tokens", []))
    want = hf(sample, **FIELDS)
    got = fb2(sample, **FIELDS)
    for k in want.keys():
        assert got[k] == want[k], (name, k)
    ids = hf.encode(" ".join(sample[:20]))
    assert fb2.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)


# Added tokens in tokenizer.json, each kind of flag, glued to the corpus words they are put before.
JSON_ADDED = [("Москва", False, {}), ("ÉCOLE", False, dict(normalized=True)),
              ("über", False, dict(single_word=True, normalized=True)), ("<ent>", True, dict(lstrip=True)),
              ("</ent>", True, dict(rstrip=True)), ("नमस्ते", False, dict(lstrip=True, rstrip=True)),
              ("😀", False, {}), ("ﬁ", False, dict(normalized=True)), ("İ", False, {}),
              ("ß", False, dict(normalized=True, single_word=True)), ("the", False, dict(single_word=True, normalized=True)),
              (" x", False, {})]


@pytest.mark.parametrize("flags", [{}, dict(do_lower_case=False), dict(do_lower_case=False, strip_accents=True)],
                         ids=["uncased", "cased", "cased_strip"])
def test_added_tokens_in_text(model_dir, texts, tmp_path, flags):
    """Added tokens read from tokenizer.json, put before words of real text (single_word boundaries
    against every script's letters, emoji and symbols, normalized matches after lowercasing)."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    for i, (content, special, kw) in enumerate(JSON_ADDED):
        tj["added_tokens"].append(dict(dict(id=30522 + i, content=content, single_word=False, lstrip=False, rstrip=False,
                                            normalized=not special, special=special), **kw))
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    fb, hf = fastbert.BertTokenizer.from_pretrained(tmp_path, **flags), BertTokenizerFast.from_pretrained(tmp_path, **flags)
    rng = random.Random(3)
    inserts = [c for c, _, _ in JSON_ADDED] + ["école", "Über", "fi", "SS", "The", "x"]
    sample = [" ".join(rng.choice(inserts) + rng.choice(["", " "]) + w for w in t[:200].split(" "))
              for t in rng.sample(texts, 1500)]
    got, want = fb(sample, **FIELDS), hf(sample, **FIELDS)
    bad = [f"{sample[i]!r:.200}: {k}" for i in range(len(sample)) for k in want.keys() if got[k][i] != want[k][i]]
    assert not bad, f"{len(bad)} differ:\n" + "\n".join(bad[:10])
    for t in sample[:100]:
        assert fb.tokenize(t) == hf.tokenize(t), t
        ids = want["input_ids"][sample.index(t)]
        assert fb.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True), t


def test_normalized_added_token_beside_cjk(model_dir, tmp_path):
    """BertTokenizerFast cuts a normalized added token's string from the normalized text: next to a CJK
    character, the spaces the normalizer put around it that lstrip/rstrip took belong to the token."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    tj["added_tokens"].append(dict(id=30522, content="qqz", single_word=False, lstrip=True, rstrip=True,
                                   normalized=True, special=False))
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tj, f)
    fb, hf = fastbert.BertTokenizer.from_pretrained(tmp_path), BertTokenizerFast.from_pretrained(tmp_path)
    for text in ["x qqz玻 y", "玻 qqz", "玻qqz玻", "x  qqz  玻", "QQZ玻", "玻\u00a0QqZ\u3000玻", "玻 qqzqqz 玻"]:
        assert fb(text, **FIELDS) == hf(text, **FIELDS)
        assert fb.tokenize(text) == hf.tokenize(text), text  # e.g. ' qqz ' for the first
        assert fb(text).tokens() == hf(text).tokens(), text


@pytest.mark.parametrize("flags", [{}, dict(do_lower_case=False), dict(strip_accents=False)],
                         ids=["uncased", "cased", "keep-accents"])
def test_normalized_added_token_back_to_text(model_dir, tmp_path, flags):
    """convert_ids_to_tokens and decode give a normalized added token in its normalized form, as
    BertTokenizerFast does: the whole BERT normalizer (CJK spacing, whitespace, dropped zero-width
    characters), not only lowercasing and accent stripping."""
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tj = json.load(f)
    contents = ["Ünï玻", "A\tB", "Ab C", "x\u200by", "café"]
    for i, content in enumerate(contents):
        tj["added_tokens"].append(dict(id=30522 + i, content=content, single_word=False, lstrip=False,
                                       rstrip=False, normalized=True, special=False))
    with open(tmp_path / "tokenizer.json", "w", encoding="utf-8") as f:
        json.dump(tj, f)
    fb = fastbert.BertTokenizer.from_pretrained(tmp_path, **flags)
    hf = BertTokenizerFast.from_pretrained(tmp_path, **flags)
    ids = [101] + [30522 + i for i in range(len(contents))] + [2023, 102]
    assert fb.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert fb.decode(ids) == hf.decode(ids)
    assert fb.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
