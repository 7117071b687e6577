"""fastbert.BertTokenizer.from_pretrained takes what transformers.BertTokenizer.from_pretrained takes
offline: a hub id in the local Hugging Face cache, `subfolder`, `revision`, `cache_dir`,
`local_files_only`; the same ids as transformers' tokenizer loaded with the same arguments."""
import json
import shutil
from pathlib import Path

import pytest
import transformers as T

import fastbert
from hub_cache import cached_snapshot

FILES = ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MAIN, OLD = "1" * 40, "2" * 40
TEXTS = ["UNwant\u00e9d,running", "Hello World, a SHORT text"]


@pytest.fixture(scope="module")
def cache(model_dir, tmp_path_factory):
    """A cache holding "someone/tok": main has the tokenizer at the root and under tok/; revision OLD
    keeps case (do_lower_case false), so loading the wrong snapshot shows in the ids."""
    cache = tmp_path_factory.mktemp("hub")
    main = cached_snapshot(cache, "someone/tok", Path(model_dir), FILES, MAIN)
    (main / "tok").mkdir()
    for name in FILES:
        shutil.copy(main / name, main / "tok" / name)
    old = main.parent / OLD
    old.mkdir()
    shutil.copy(main / "vocab.txt", old / "vocab.txt")
    (old / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False, "tokenizer_class": "BertTokenizer"}))
    return cache


@pytest.fixture
def offline(cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


def same_ids(cache, args: dict, path="someone/tok"):
    ours = fastbert.BertTokenizer.from_pretrained(path, **args)
    # huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE once, at import: transformers is told here
    theirs = T.BertTokenizer.from_pretrained(path, **{"cache_dir": str(cache), "local_files_only": True, **args})
    assert ours(TEXTS)["input_ids"] == theirs(TEXTS)["input_ids"]
    return ours


@pytest.mark.parametrize("args", [{}, {"subfolder": "tok"}, {"revision": MAIN}, {"local_files_only": True}],
                         ids=["hub-id", "subfolder", "revision-main", "local-files-only"])
def test_cached_hub_id(offline, args):
    tok = same_ids(offline, args)
    assert tok.name_or_path == "someone/tok"


def test_revision_picks_its_snapshot(offline):
    lower, cased = same_ids(offline, {}), same_ids(offline, {"revision": OLD})
    assert lower(TEXTS)["input_ids"] != cased(TEXTS)["input_ids"]


def test_cache_dir_argument(cache, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(cache.parent / "elsewhere"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    same_ids(cache, {"cache_dir": str(cache), "subfolder": "tok"})


def test_local_directory_subfolder(cache, model_dir):
    main = cache / "models--someone--tok" / "snapshots" / MAIN
    same_ids(cache, {"subfolder": "tok"}, path=str(main))


def test_missing_is_an_oserror_naming_it(offline):
    with pytest.raises(OSError, match="someone/not-cached"):
        fastbert.BertTokenizer.from_pretrained("someone/not-cached")
    with pytest.raises(OSError, match="nope"):
        fastbert.BertTokenizer.from_pretrained("someone/tok", subfolder="nope")
    with pytest.raises(OSError, match="someone/tok"):
        fastbert.BertTokenizer.from_pretrained("someone/tok", revision="3" * 40)


def test_auto_tokenizer_takes_subfolder(offline):
    tok = fastbert.AutoTokenizer.from_pretrained("someone/tok", subfolder="tok")
    assert isinstance(tok, fastbert.BertTokenizer)
    assert tok(TEXTS)["input_ids"] == T.BertTokenizer.from_pretrained(
        "someone/tok", subfolder="tok", cache_dir=str(offline), local_files_only=True)(TEXTS)["input_ids"]
