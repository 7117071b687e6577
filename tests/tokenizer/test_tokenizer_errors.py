"""fastbert.BertTokenizer on bad input: clear Python exceptions that name the problem; never a crash.
Also: a huge word is cheap, and one tokenizer shared by 8 Python threads gives the serial results."""
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from transformers import BertTokenizerFast

import fastbert
import tokenizer_corpus as tc
import corpora as corpus


# ---- files ------------------------------------------------------------------------------------------

def test_missing_directory(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(OSError, match=re.escape(str(missing))):
        fastbert.BertTokenizer.from_pretrained(str(missing))


def test_directory_without_vocab(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(OSError, match=re.escape(str(tmp_path))):
        fastbert.BertTokenizer.from_pretrained(str(tmp_path))


def test_vocab_without_unk(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\nhello\n##s\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[UNK\]"):
        fastbert.BertTokenizer.from_pretrained(str(tmp_path))


def test_tokenizer_json_without_unk_in_vocab(model_dir, tmp_path):
    import json

    data = json.load(open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8"))
    del data["model"]["vocab"]["[UNK]"]
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] != "[UNK]"]
    (tmp_path / "tokenizer.json").write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ValueError, match=r"\[UNK\]"):
        fastbert.BertTokenizer.from_pretrained(str(tmp_path))


def test_unreadable_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "WordPiece", "vocab": ', encoding="utf-8")
    with pytest.raises((ValueError, OSError), match=re.escape("tokenizer.json")):
        fastbert.BertTokenizer.from_pretrained(str(tmp_path))


# ---- inputs -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [3, None, b"bytes", 4.5, ["nested"]], ids=["int", "None", "bytes", "float", "list"])
def test_non_str_item_names_its_index(tok, bad):
    batch = ["fine", "also fine", "ok", "x", "y", "z", "w", bad, "after"]
    with pytest.raises(TypeError, match=r"\b7\b"):
        tok(batch)


def test_non_str_pair_item_names_its_index(tok):
    with pytest.raises(TypeError, match=r"\b2\b"):
        tok(["a", "b", "c"], ["a", "b", 17])


@pytest.mark.parametrize("padded", [False, True], ids=["ragged", "padded"])
def test_lone_surrogate_names_its_index(tok, padded):
    batch = ["fine", "ok", "more", "x\ud800y", "after"]
    kwargs = dict(padding=True, return_tensors="np") if padded else {}
    with pytest.raises(ValueError, match=r"\b3\b"):
        tok(batch, **kwargs)
    with pytest.raises(ValueError, match=r"\b2\b"):  # a single string: the character's index
        tok("ab\udfffc")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_first_lone_surrogate_is_named_in_a_threaded_batch(model_dir, threads):
    # Non-ASCII strs are made UTF-8 by the thread that encodes their chunk: with bad strs in several
    # chunks (texts and pairs), and an item that fails truncation besides, the error still names the
    # first bad str, every time.
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=threads)
    texts = [f"línea {i} " + "pálabra " * 40 for i in range(400)]  # over 100 KB: many chunks
    pairs = list(texts)
    texts[150] = "x\ud800y"
    texts[390] = "\udfff"
    pairs[20] = "p\ud801"
    for _ in range(3):
        with pytest.raises(ValueError, match=r"batch item 150 has a lone surrogate U\+D800"):
            tok(texts, return_tensors="np", padding=True)
        with pytest.raises(ValueError, match=r"batch item 150 "):
            tok(texts, pairs)
        with pytest.raises(ValueError, match=r"text_pair item 20 has a lone surrogate U\+D801"):
            tok([t.replace("\ud800", "").replace("\udfff", "") for t in texts], pairs)
    # item 0 cannot be cut to max_length (only_second, a long first text): the surrogate still wins
    short = ["b"] * len(texts)
    with pytest.raises(ValueError, match=r"batch item 150 has a lone surrogate"):
        tok(texts, short, truncation="only_second", max_length=10)
    clean = [t.replace("\ud800", "").replace("\udfff", "") for t in texts]
    with pytest.raises(ValueError, match="Truncation error"):
        tok(clean, short, truncation="only_second", max_length=10)
    # and the strs converted before the error give the same ids as ever afterwards
    serial = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=1)
    assert tok(clean, pairs[:20] + ["p"] + pairs[21:])["input_ids"] == \
        serial(clean, pairs[:20] + ["p"] + pairs[21:])["input_ids"]


def test_mismatched_pair_batch(tok):
    with pytest.raises(ValueError, match=r"\b3\b.*\b2\b|\b2\b.*\b3\b"):
        tok(["a", "b", "c"], ["x", "y"])


def test_huge_word_is_unk_fast(tok):
    word = "a" * 10_000_000
    tok(["warm up"])
    start = time.perf_counter()
    enc = tok(word, return_offsets_mapping=True)
    seconds = time.perf_counter() - start
    assert enc["input_ids"] == [tok.cls_token_id, tok.unk_token_id, tok.sep_token_id]
    assert enc["offset_mapping"] == [(0, 0), (0, 10_000_000), (0, 0)]
    assert seconds < 1.0, f"10M-character word took {seconds:.2f} s"
    ids = tok([word, "x " + word + " y"])["input_ids"]
    assert ids[1][1:4] == [tok.convert_tokens_to_ids("x"), tok.unk_token_id, tok.convert_tokens_to_ids("y")]


def test_huge_word_matches_hf(model_dir, tok):
    hf = BertTokenizerFast.from_pretrained(model_dir)
    text = "héllo " + "b" * 300_000 + "\u0301 world " + "é" * 101
    assert dict(tok(text, return_offsets_mapping=True)) == dict(hf(text, return_offsets_mapping=True))


# ---- threads ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("num_threads", [1, None], ids=["serial_pool", "all_cores_pool"])
def test_eight_python_threads_share_one_tokenizer(model_dir, num_threads):
    kwargs = {} if num_threads is None else {"num_threads": num_threads}
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, **kwargs)
    docs = corpus.multilingual_texts(60_000) + tc.EDGE_STRINGS
    chunks = [docs[i::8] for i in range(8)]

    def work(i):
        chunk = chunks[i]
        return (tok(chunk, return_offsets_mapping=True),
                tok(chunk, chunk[::-1], truncation=True, max_length=64, padding=True, return_tensors="np"),
                [tok.encode(t) for t in chunk[:20]],
                tok.batch_decode(tok(chunk[:20])["input_ids"]))

    serial = [work(i) for i in range(8)]
    for _ in range(3):  # several rounds: races show up intermittently
        with ThreadPoolExecutor(max_workers=8) as pool:
            threaded = list(pool.map(work, range(8)))
        for i, (got, want) in enumerate(zip(threaded, serial)):
            assert dict(got[0]) == dict(want[0]), f"thread {i}: ragged batch differs"
            for key in want[1]:
                assert np.array_equal(got[1][key], want[1][key]), f"thread {i}: padded {key} differs"
            assert got[2] == want[2] and got[3] == want[3], f"thread {i}: encode/decode differ"


def test_many_small_batches_from_threads(tok):
    """Back-to-back small batches from several threads: a batch never sees another batch's work."""
    docs = corpus.multilingual_texts(30_000) + tc.EDGE_STRINGS
    batches = [docs[i:i + 1 + i % 5] for i in range(0, len(docs), 3)]
    serial = [tok(b)["input_ids"] for b in batches]

    def work(offset):
        return [(i, tok(batches[i])["input_ids"]) for i in range(offset, len(batches), 4)]

    for _ in range(2):
        with ThreadPoolExecutor(max_workers=4) as pool:
            for part in pool.map(work, range(4)):
                for i, ids in part:
                    assert ids == serial[i], f"batch {i} differs when run concurrently"
