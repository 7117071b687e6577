"""transformers' tokenizer API beyond encoding, as BertTokenizerFast gives it: add_special_tokens,
get_added_vocab, added_tokens_decoder, max_len_single_sentence / max_len_sentences_pair,
BatchEncoding.data, tokenize()'s ignored truncation, and save_pretrained's arguments; and that the
tokenizer alone loads neither torch nor the models."""
import os
import subprocess
import sys

import pytest
import transformers

import fastbert

TEXTS = ["UNwant\u00E9d,running <e1> x <e2>", "野口里佳 Noguchi Rika <CLS2>", "\ufeffHello"]


@pytest.fixture
def pair(model_dir):
    # fresh for each test: add_special_tokens changes them
    return (fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=1),
            transformers.BertTokenizerFast.from_pretrained(model_dir))


def _same_state(fb, hf):
    assert len(fb) == len(hf)
    assert fb.get_added_vocab() == hf.get_added_vocab()
    assert {i: (str(a), a.special, a.normalized, a.lstrip, a.rstrip, a.single_word)
            for i, a in fb.added_tokens_decoder.items()} == \
        {i: (str(a), a.special, a.normalized, a.lstrip, a.rstrip, a.single_word)
         for i, a in hf.added_tokens_decoder.items()}
    assert fb.all_special_tokens == hf.all_special_tokens and fb.all_special_ids == hf.all_special_ids
    assert fb.cls_token == hf.cls_token and fb.cls_token_id == hf.cls_token_id
    for text in TEXTS:
        assert fb.tokenize(text) == hf.tokenize(text), repr(text)
    assert dict(fb(TEXTS, TEXTS[::-1])) == dict(hf(TEXTS, TEXTS[::-1]))
    ids = hf(TEXTS)["input_ids"]
    for skip in (False, True):
        assert fb.batch_decode(ids, skip_special_tokens=skip) == hf.batch_decode(ids, skip_special_tokens=skip)


def test_added_vocab_and_lengths(pair):
    fb, hf = pair
    _same_state(fb, hf)
    assert (fb.max_len_single_sentence, fb.max_len_sentences_pair) == \
        (hf.max_len_single_sentence, hf.max_len_sentences_pair) == (510, 509)


@pytest.mark.parametrize("replace", [True, False])
def test_add_special_tokens(pair, replace):
    """sentence-transformers' call and transformers' semantics: the return value counts new vocabulary
    entries; additional special tokens replace (or extend) the list; a named token is replaced."""
    fb, hf = pair
    for tok in (fb, hf):
        assert tok.add_special_tokens({"additional_special_tokens": ["<e1>"]}) == 1
        assert tok.add_special_tokens({"additional_special_tokens": ["<e2>", "<e1>"]},
                                      **{"replace_additional_special_tokens" if tok is fb else
                                         "replace_extra_special_tokens": replace}) == 1
        assert tok.add_special_tokens({"cls_token": "<CLS2>", "pad_token": "[PAD]"}) == 1
        assert tok.add_special_tokens({}) == 0
    _same_state(fb, hf)
    assert fb.extra_special_tokens == [str(t) for t in hf.extra_special_tokens]
    with pytest.raises(ValueError, match="Key foo_token is not a valid special token"):
        fb.add_special_tokens({"foo_token": "<x>"})
    with pytest.raises(ValueError, match="should be a list of str or AddedToken"):
        fb.add_special_tokens({"additional_special_tokens": "<x>"})


def test_tokenize_ignores_truncation(pair):
    """transformers' tokenize() returns every token whatever truncation / max_length say."""
    fb, hf = pair
    for kwargs in (dict(truncation=True, max_length=3), dict(max_length=2), dict(padding="max_length", max_length=9)):
        assert fb.tokenize("hello world foo bar", **kwargs) == hf.tokenize("hello world foo bar", **kwargs) == \
            ["hello", "world", "foo", "bar"]


def test_batch_encoding_data(pair):
    fb, hf = pair
    enc = fb(TEXTS)
    assert isinstance(enc.data, dict) and enc.data == hf(TEXTS).data
    enc.data["extra"] = [1]
    assert enc["extra"] == [1]


def test_save_pretrained_arguments(pair, tmp_path):
    """filename_prefix names the files as transformers names them; the arguments fastbert cannot honour
    are refused by name, never ignored."""
    fb, hf = pair
    written = fb.save_pretrained(tmp_path / "fb", filename_prefix="mine", legacy_format=True, push_to_hub=False)
    assert sorted(os.path.basename(p) for p in written) == \
        ["mine-special_tokens_map.json", "mine-tokenizer_config.json", "mine-vocab.txt"]
    assert sorted(os.listdir(tmp_path / "fb")) == sorted(os.path.basename(p) for p in written)
    hf.save_pretrained(tmp_path / "hf", filename_prefix="mine", legacy_format=True)
    assert "mine-tokenizer_config.json" in os.listdir(tmp_path / "hf")  # transformers' naming
    with pytest.raises(ValueError, match="push_to_hub=True"):
        fb.save_pretrained(tmp_path / "x", push_to_hub=True)
    with pytest.raises(ValueError, match="legacy_format=False"):
        fb.save_pretrained(tmp_path / "x", legacy_format=False)
    with pytest.raises(TypeError, match="commit_message"):
        fb.save_pretrained(tmp_path / "x", commit_message="hi")
    assert not (tmp_path / "x").exists()


def test_the_tokenizer_alone_imports_neither_torch_nor_the_models(model_dir):
    """Found by use: `from fastbert import BertTokenizer` took seconds, as its `from fastbert import _C`
    went through the package's lazy __getattr__, which imported every model (torch, transformers,
    the Triton ops) to look for a name `_C` before the import system loaded the submodule.
    transformers' tokenizer base classes are imported (the tokenizer is a PreTrainedTokenizerBase,
    its output a BatchEncoding); they load no torch."""
    code = ("import sys; from fastbert import BertTokenizer; "
            f"tok = BertTokenizer.from_pretrained({model_dir!r}); "
            "out = tok(['hello world', 'a b'], padding=True, return_tensors='np'); "
            "assert out['input_ids'].shape == (2, 4), out['input_ids'].shape; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('torch', 'triton') "
            "or m.startswith(('fastbert.models', 'transformers.models'))]; "
            "assert not bad, sorted(bad)[:5]")
    subprocess.run([sys.executable, "-c", code], check=True)
