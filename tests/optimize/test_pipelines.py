"""transformers pipelines running fastbert, against the plain transformers pipeline.

Three ways in, each compared with `transformers.pipeline(task, model=path)` on the same tiny random
BERT checkpoint: a fastbert model with HF's BertTokenizerFast, a fastbert model with fastbert's
tokenizer, and a transformers pipeline whose model went through fastbert.optimize. Results must be
equal: labels, words, tokens, offsets and indices exactly; scores and features within 1e-5.
"""
import numbers

import numpy as np
import pytest
import torch
import transformers as T

import fastbert
import tiny_bert

TOL = 1e-5
TASKS = {  # task -> (transformers class, fastbert class, labels)
    "fill-mask": ("BertForMaskedLM", fastbert.AutoModelForMaskedLM, None),
    "token-classification": ("BertForTokenClassification", fastbert.AutoModelForTokenClassification,
                             ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]),
    "text-classification": ("BertForSequenceClassification", fastbert.AutoModelForSequenceClassification,
                            ["NEG", "POS", "MID"]),
    "feature-extraction": ("BertModel", fastbert.AutoModel, None),
    "zero-shot-classification": ("BertForSequenceClassification", fastbert.AutoModelForSequenceClassification,
                                 ["contradiction", "neutral", "entailment"]),
}
KINDS = ("fastbert-model/hf-tokenizer", "fastbert-model/fastbert-tokenizer", "optimized-transformers-pipeline")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("pipelines")
    return {task: tiny_bert.save(root, cls, name=task, labels=labels) for task, (cls, _, labels) in TASKS.items()}


@pytest.fixture(scope="module")
def reference(checkpoints):
    cache = {}

    def get(task):
        if task not in cache:
            cache[task] = T.pipeline(task, model=checkpoints[task], device="cpu")
        return cache[task]
    return get


def make_pipeline(task, path, kind):
    if kind == "optimized-transformers-pipeline":
        pipe = T.pipeline(task, model=path, device="cpu")
        assert fastbert.optimize(pipe.model) is pipe.model
        assert type(pipe.model.base_model.encoder).__module__.startswith("fastbert")
        return pipe
    if kind == "fastbert-model/hf-tokenizer":
        tokenizer = T.BertTokenizerFast.from_pretrained(path)
    else:
        tokenizer = fastbert.AutoTokenizer.from_pretrained(path)
        assert type(tokenizer).__module__.startswith("fastbert")
    return T.pipeline(task, model=TASKS[task][1].from_pretrained(path), tokenizer=tokenizer, device="cpu")


def assert_same(ref, got, where="result"):
    """Equal structure, keys, strings and ints; floats (and arrays of them) within TOL."""
    if isinstance(ref, dict):
        assert isinstance(got, dict) and list(got) == list(ref), f"{where}: keys {list(got)} != {list(ref)}"
        for k in ref:
            assert_same(ref[k], got[k], f"{where}[{k!r}]")
    elif isinstance(ref, (list, tuple)):
        assert type(got) is type(ref) and len(got) == len(ref), f"{where}: {got!r} != {ref!r}"
        for i, (a, b) in enumerate(zip(ref, got)):
            assert_same(a, b, f"{where}[{i}]")
    elif isinstance(ref, (np.ndarray, torch.Tensor)):
        a, b = np.asarray(ref, dtype=np.float64), np.asarray(got, dtype=np.float64)
        assert a.shape == b.shape and np.abs(a - b).max(initial=0) <= TOL, f"{where}: arrays differ"
    elif isinstance(ref, numbers.Real) and not isinstance(ref, numbers.Integral):
        assert type(got) is type(ref) and abs(float(got) - float(ref)) <= TOL, f"{where}: {got!r} != {ref!r}"
    else:
        assert type(got) is type(ref) and got == ref, f"{where}: {got!r} != {ref!r}"


@pytest.mark.parametrize("kind", KINDS)
def test_fill_mask(checkpoints, reference, kind):
    ref, pipe = reference("fill-mask"), make_pipeline("fill-mask", checkpoints["fill-mask"], kind)
    texts = ["john lives in [MASK] .", "the [MASK] was great !"]
    for text in texts:
        assert_same(ref(text), pipe(text), text)
    assert_same(ref(texts, top_k=3, batch_size=2), pipe(texts, top_k=3, batch_size=2), "batch")
    assert_same(ref(texts[0], targets=["paris", "york", "city"]), pipe(texts[0], targets=["paris", "york", "city"]))


PLAIN = ["john lives in new york city", "unwanted running playing walks"]  # subwords, no punctuation
PUNCTUATED = "john, unwanted! played? paris."


@pytest.mark.parametrize("strategy", ["none", "simple", "first", "average", "max"])
@pytest.mark.parametrize("kind", KINDS)
def test_token_classification(checkpoints, reference, kind, strategy):
    task = "token-classification"
    ref, pipe = reference(task), make_pipeline(task, checkpoints[task], kind)
    for text in PLAIN:  # ignore_labels=[]: every token or word comes back, "O" included
        assert_same(ref(text, aggregation_strategy=strategy, ignore_labels=[]),
                    pipe(text, aggregation_strategy=strategy, ignore_labels=[]), text)
    assert_same(ref(PLAIN, aggregation_strategy=strategy, batch_size=2),
                pipe(PLAIN, aggregation_strategy=strategy, batch_size=2), "batch")
    # Word boundaries next to punctuation: the pipeline reads them from the tokenizer's
    # `_tokenizer.model.continuing_subword_prefix` (a tokenizers.Tokenizer) and otherwise guesses
    # from spaces, so "john," would become one word.
    assert pipe.tokenizer._tokenizer.model.continuing_subword_prefix == "##"
    assert_same(ref(PUNCTUATED, aggregation_strategy=strategy, ignore_labels=[]),
                pipe(PUNCTUATED, aggregation_strategy=strategy, ignore_labels=[]), PUNCTUATED)


@pytest.mark.parametrize("kind", KINDS)
def test_text_classification(checkpoints, reference, kind):
    task = "text-classification"
    ref, pipe = reference(task), make_pipeline(task, checkpoints[task], kind)
    pair = {"text": "i love this", "text_pair": "i hate it"}
    for x in ["i love this movie", pair]:
        assert_same(ref(x), pipe(x), repr(x))
        assert_same(ref(x, top_k=None), pipe(x, top_k=None), repr(x))
    texts = ["i love this movie", "the weather is bad today", "a"]
    assert_same(ref(texts, batch_size=2, function_to_apply="none"), pipe(texts, batch_size=2, function_to_apply="none"))


@pytest.mark.parametrize("kind", KINDS)
def test_feature_extraction(checkpoints, reference, kind):
    task = "feature-extraction"
    ref, pipe = reference(task), make_pipeline(task, checkpoints[task], kind)
    texts = ["john lives in paris", "a", "what is the weather in new york city today ?"]
    for text in texts:
        assert_same(ref(text), pipe(text), text)
    assert_same(ref(texts[0], return_tensors=True), pipe(texts[0], return_tensors=True), "tensors")
    # batched: the pipeline returns each row at the padded length; fastbert leaves padding
    # positions at zero (it never computes them), so only the real tokens are compared
    a, b = ref(texts, batch_size=3), pipe(texts, batch_size=3)
    for text, x, y in zip(texts, a, b):
        n = len(ref.tokenizer(text)["input_ids"])
        assert np.shape(x) == np.shape(y)
        assert_same(np.asarray(x)[:, :n], np.asarray(y)[:, :n], text)


@pytest.mark.parametrize("kind", KINDS)
def test_zero_shot_classification(checkpoints, reference, kind):
    task = "zero-shot-classification"
    ref, pipe = reference(task), make_pipeline(task, checkpoints[task], kind)
    try:
        pipe.tokenizer([["i love this movie", "this is about film."]], padding=True)
    except TypeError as e:
        pytest.skip(f"this tokenizer does not take a batch of [text, pair] lists, the input form "
                    f"zero-shot-classification sends ({e})")
    labels = ["sports", "politics", "film"]
    text = "i love this movie"
    assert_same(ref(text, candidate_labels=labels), pipe(text, candidate_labels=labels), text)
    assert_same(ref(text, candidate_labels=labels, multi_label=True),
                pipe(text, candidate_labels=labels, multi_label=True), text)
    assert_same(ref(["a", "the movie was great"], candidate_labels=labels, hypothesis_template="it is {} .",
                    batch_size=2),
                pipe(["a", "the movie was great"], candidate_labels=labels, hypothesis_template="it is {} .",
                     batch_size=2))


def test_pipeline_repr_save_and_optimize_of_a_pipeline(checkpoints, reference, tmp_path):
    """What else a pipeline reads from its model (repr, dtype, save_pretrained) works on fastbert's,
    and fastbert.optimize also takes the pipeline itself."""
    task = "text-classification"
    pipe = make_pipeline(task, checkpoints[task], "fastbert-model/hf-tokenizer")
    assert "BertForSequenceClassification" in repr(pipe) and pipe.dtype == torch.float32
    pipe.save_pretrained(tmp_path)
    reloaded = T.pipeline(task, model=str(tmp_path), device="cpu")  # transformers' own model again
    assert type(reloaded.model).__module__.startswith("transformers")
    assert_same(reference(task)("i love this movie", top_k=None), reloaded("i love this movie", top_k=None))

    plain = T.pipeline(task, model=checkpoints[task], device="cpu")
    assert fastbert.optimize(plain) is plain
    assert type(plain.model.bert.encoder).__module__.startswith("fastbert")
    assert_same(reference(task)("i love this movie", top_k=None), plain("i love this movie", top_k=None))


@pytest.fixture(scope="module")
def deberta_v3_nli(tmp_path_factory):
    """A tiny DeBERTa-v3 NLI checkpoint (entailment in label2id) with a SentencePiece Unigram tokenizer
    trained here by `tokenizers` and saved as transformers' DebertaV2TokenizerFast."""
    from tokenizers import SentencePieceUnigramTokenizer

    from tiny_families import deberta_v2_config

    path = tmp_path_factory.mktemp("deberta-v3-nli")
    corpus = ["i love this movie", "the film was great fun", "politics is about the government and votes",
              "sports like football and tennis", "this example is about film.", "the movie was bad"] * 10
    sp = SentencePieceUnigramTokenizer()
    sp.train_from_iterator(corpus, vocab_size=90, unk_token="[UNK]", show_progress=False,
                           special_tokens=["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"])
    specials = dict(bos_token="[CLS]", eos_token="[SEP]", unk_token="[UNK]", sep_token="[SEP]", pad_token="[PAD]",
                    cls_token="[CLS]", mask_token="[MASK]")
    T.DebertaV2TokenizerFast(tokenizer_object=sp._tokenizer, **specials).save_pretrained(path)
    labels = ["contradiction", "neutral", "entailment"]
    cfg = deberta_v2_config("v3", vocab_size=len(sp.get_vocab()), num_labels=3, pad_token_id=0,
                         id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    torch.manual_seed(0)
    model = T.DebertaV2ForSequenceClassification(cfg)
    with torch.no_grad():   # logits far enough apart that a wrong model changes the ranking
        for name, p in model.named_parameters():
            if name.endswith("weight") and ("attention.self" in name or "pooler" in name or "classifier" in name):
                p.normal_(0.0, 0.5)
    model.save_pretrained(path)
    return path


@pytest.mark.parametrize("kind", ["fastbert-model", "optimized-transformers-pipeline"])
def test_zero_shot_deberta_v3_with_sentencepiece(deberta_v3_nli, kind):
    """The seeds' use: zero-shot classification on DeBERTa-v3 through transformers' pipeline, with a
    SentencePiece tokenizer loaded by fastbert.AutoTokenizer."""
    task, path = "zero-shot-classification", deberta_v3_nli
    tokenizer = fastbert.AutoTokenizer.from_pretrained(path)
    assert type(tokenizer).__name__.startswith("DebertaV2Tokenizer")
    ref = T.pipeline(task, model=T.DebertaV2ForSequenceClassification.from_pretrained(path), tokenizer=tokenizer,
                     device="cpu")
    if kind == "fastbert-model":
        pipe = T.pipeline(task, model=fastbert.AutoModelForSequenceClassification.from_pretrained(path),
                          tokenizer=tokenizer, device="cpu")
        assert type(pipe.model).__module__.startswith("fastbert")
    else:
        pipe = T.pipeline(task, model=path, tokenizer=tokenizer, device="cpu")
        assert fastbert.optimize(pipe.model) is pipe.model
        assert type(pipe.model.deberta.encoder).__module__.startswith("fastbert")
    labels = ["sports", "politics", "film", "government"]
    for text, options in [("i love this movie", {}), ("the film was great fun", {"multi_label": True}),
                          (["football and tennis", "votes"], {"hypothesis_template": "this example is about {}."})]:
        a, b = ref(text, candidate_labels=labels, **options), pipe(text, candidate_labels=labels, **options)
        for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b], strict=True):
            assert x["sequence"] == y["sequence"] and x["labels"] == y["labels"], (x, y)
            assert np.abs(np.subtract(x["scores"], y["scores"])).max() <= 1e-4, (x, y)
        scores = (a if isinstance(a, list) else [a])[0]["scores"]
        assert max(scores) - min(scores) > 1e-3     # the labels are told apart: the ranking means something
