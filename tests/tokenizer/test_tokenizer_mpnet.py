"""MPNet's tokenizer files (RobertaProcessing, TemplateProcessing, vocab.txt with MPNetTokenizer) served by
fastbert's C++ BertTokenizer: exactly MPNetTokenizerFast's outputs."""
import pytest
import transformers as T

import fastbert


def _mpnet_vocab_dir(tmp_path):
    vocab = ["<s>", "<pad>", "</s>", "[UNK]", "hello", "world", "un", "##want", "##ed", ",", "running", "my",
             "name", "is", "john", "pair", "<mask>"]
    T.MPNetTokenizerFast(vocab={t: i for i, t in enumerate(vocab)}).save_pretrained(tmp_path)
    return tmp_path


def test_tokenizer_single_sequences_match(tmp_path):
    """fastbert.AutoTokenizer sees a WordPiece tokenizer.json and serves it with its C++ BertTokenizer,
    which reads <s> / </s> from the post-processor: single sequences get MPNet's ids and mask."""
    d = _mpnet_vocab_dir(tmp_path)
    hf, fb = T.AutoTokenizer.from_pretrained(d), fastbert.AutoTokenizer.from_pretrained(d)
    texts = ["hello world", "My name is John", "UNwant\u00e9d,running", ""]
    a, b = hf(texts, padding=True), fb(texts, padding=True)
    assert a["input_ids"] == b["input_ids"] and a["attention_mask"] == b["attention_mask"]


# ---- the tokenizer on a real-size MPNet vocabulary: exactly MPNetTokenizerFast ----------------------------

@pytest.fixture(scope="module")
def mpnet_tokenizers(model_dir, tmp_path_factory):
    """(form, fastbert.AutoTokenizer, transformers.AutoTokenizer) for MPNet's vocabulary (all-mpnet-base-v2's
    layout: <s> <pad> </s> <unk>, BERT's uncased WordPiece vocabulary, <mask>) in three file forms:
    tokenizer.json with RobertaProcessing (what transformers saves), vocab.txt with tokenizer_class
    MPNetTokenizer, and tokenizer.json with a TemplateProcessing giving B type 1 under a generic class
    (MPNetTokenizer itself replaces any post-processor with RobertaProcessing)."""
    import json

    with open(f"{model_dir}/vocab.txt", encoding="utf-8") as f:
        bert = [line.rstrip("\n") for line in f]
    vocab = {t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + bert + ["<mask>"])}
    out = []
    d = tmp_path_factory.mktemp("mpnet_json")
    T.MPNetTokenizerFast(vocab=vocab).save_pretrained(d)
    out.append(("RobertaProcessing", d))
    t = tmp_path_factory.mktemp("mpnet_template")
    cfg = json.loads((d / "tokenizer_config.json").read_text(encoding="utf-8"))
    cfg.update(tokenizer_class="PreTrainedTokenizerFast", model_input_names=["input_ids", "attention_mask"])
    (t / "tokenizer_config.json").write_text(json.dumps(cfg), encoding="utf-8")
    tj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    s, e = {"SpecialToken": {"id": "<s>", "type_id": 0}}, {"SpecialToken": {"id": "</s>", "type_id": 0}}
    e1 = {"SpecialToken": {"id": "</s>", "type_id": 1}}
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [s, {"Sequence": {"id": "A", "type_id": 0}}, e],
        "pair": [s, {"Sequence": {"id": "A", "type_id": 0}}, e, e, {"Sequence": {"id": "B", "type_id": 1}}, e1],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                           "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}}
    (t / "tokenizer.json").write_text(json.dumps(tj), encoding="utf-8")
    out.append(("TemplateProcessing", t))
    v = tmp_path_factory.mktemp("mpnet_vocab")
    (v / "vocab.txt").write_text("".join(k + "\n" for k in vocab), encoding="utf-8")
    (v / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "MPNetTokenizer",
                                                         "do_lower_case": True}), encoding="utf-8")
    out.append(("vocab.txt", v))
    return [(form, fastbert.AutoTokenizer.from_pretrained(p), T.AutoTokenizer.from_pretrained(p)) for form, p in out]


def test_tokenizer_exact_parity_with_mpnet_fast(mpnet_tokenizers):
    """Single texts, pairs and batches of pairs with every output (offsets, special-tokens mask, type ids on
    request), padding to numpy and torch, the pair template's truncation (every strategy, with stride and
    overflow windows) and the alignment (sequence_ids, word_ids, tokens): exactly MPNetTokenizerFast's."""
    import corpora
    import tokenizer_corpus as tc
    from test_tokenizer import ALL_FIELDS, check_call

    texts = tc.GOLDEN + tc.EDGE_STRINGS[:40] + [t[:300] for t in corpora.english_texts(20_000)[:30]]
    pairs = list(zip(texts, texts[7:] + texts[:7]))
    for form, fb, hf in mpnet_tokenizers:
        assert isinstance(fb, fastbert.BertTokenizer), form  # the C++ tokenizer, not the fallback
        assert fb.model_input_names == hf.model_input_names == ["input_ids", "attention_mask"]
        assert fb.special_tokens_map == hf.special_tokens_map and fb.all_special_ids == hf.all_special_ids
        assert [fb.num_special_tokens_to_add(p) for p in (False, True)] == [2, 4]
        check_call(fb, hf, *tc.GOLDEN_PAIR)
        check_call(fb, hf, *tc.GOLDEN_PAIR, return_token_type_ids=True, **ALL_FIELDS)
        check_call(fb, hf, *tc.GOLDEN_PAIR, add_special_tokens=False, return_token_type_ids=True)
        check_call(fb, hf, texts, return_token_type_ids=True, **ALL_FIELDS)
        check_call(fb, hf, pairs, return_token_type_ids=True, **ALL_FIELDS)
        for tensors in ("np", "pt"):
            check_call(fb, hf, pairs, padding=True, return_tensors=tensors, **ALL_FIELDS)
        for strategy in ("longest_first", "only_first", "only_second"):
            for max_length, stride in ((12, 0), (16, 3)):
                check_call(fb, hf, pairs, truncation=strategy, max_length=max_length, stride=stride,
                           return_overflowing_tokens=True, padding="max_length", **ALL_FIELDS)
        one, batch = fb(*tc.GOLDEN_PAIR), fb(pairs[:8], truncation=True, max_length=12,
                                                     return_overflowing_tokens=True)
        want_one, want_batch = hf(*tc.GOLDEN_PAIR), hf(pairs[:8], truncation=True, max_length=12,
                                                         return_overflowing_tokens=True)
        assert one.sequence_ids() == want_one.sequence_ids() and one.word_ids() == want_one.word_ids()
        assert one.tokens() == want_one.tokens(), form
        for k in range(len(want_batch["input_ids"])):
            assert batch.sequence_ids(k) == want_batch.sequence_ids(k), (form, k)
            assert batch.word_ids(k) == want_batch.word_ids(k), (form, k)
            assert batch.token_to_chars(k, 5) == want_batch.token_to_chars(k, 5), (form, k)


def test_tokenizer_mpnet_save_and_reload(mpnet_tokenizers, tmp_path):
    """save_pretrained writes vocab.txt with tokenizer_class MPNetTokenizer: fastbert and transformers read
    the MPNet template back from it; pickling keeps it."""
    import pickle

    from test_tokenizer import check_call

    _, fb, hf = mpnet_tokenizers[0]
    fb.save_pretrained(tmp_path)
    again = fastbert.AutoTokenizer.from_pretrained(tmp_path)
    for other in (again, T.AutoTokenizer.from_pretrained(tmp_path), pickle.loads(pickle.dumps(fb))):
        check_call(other, hf, [("hello world", "my name is john")], return_token_type_ids=True)
    custom = fastbert.BertTokenizer(vocab=["[UNK]", "[CLS]", "[SEP]", "a"], post_processor={
        "type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}]})
    assert custom("a", "a")["input_ids"] == [3, 3]
    with pytest.raises(ValueError, match="cannot hold this tokenizer's post-processor"):
        custom.save_pretrained(tmp_path / "custom")


@pytest.mark.parametrize("bad, match", [
    ({"type": "ByteLevel"}, "post_processor type 'ByteLevel' is not supported"),
    ({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "B", "type_id": 0}}], "pair": []},
     "single-sequence template must hold"),
    ({"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [{"Sequence": {"id": "B", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}]},
     "must put \\$A before \\$B"),
    ({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "x", "type_id": 0}}], "pair": [],
      "special_tokens": {"x": {"id": "x", "ids": [1, 2], "tokens": ["a", "b"]}}}, "exactly one id"),
])
def test_tokenizer_template_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        fastbert.BertTokenizer(vocab=["[UNK]", "[CLS]", "[SEP]", "a"], post_processor=bad)
