"""fastbert.optimize on sentence-transformers objects: CrossEncoder, SparseEncoder (SPLADE) and
SentenceTransformer pipelines with Dense / Normalize / prompts, against the same objects unoptimized.

Each case builds two identical objects from a tiny random BERT checkpoint saved in the test,
optimizes one and compares: scores and embeddings within 1e-4 (cosine within 1e-5), sparse
embeddings with the same non-zero indices. Saving the optimized object and loading it back (without
fastbert) gives the same results."""
import numpy as np
import pytest
import torch
import transformers as T

import fastbert
import tiny_bert
from fastbert.models.config import ConfigError

st = pytest.importorskip("sentence_transformers")
pytest.importorskip("sentence_transformers.base.modules", reason="these tests use the module layout of "
                    f"sentence-transformers >= 6; {st.__version__} is installed")
from sentence_transformers.base.modules import Dense, Normalize, Transformer  # noqa: E402
from sentence_transformers.sentence_transformer.modules import Pooling, StaticEmbedding  # noqa: E402
from sentence_transformers.sparse_encoder.modules import MLMTransformer, SpladePooling  # noqa: E402

TOL = 1e-4
TEXTS = ["john lives in paris", "the movie was great !", "a", "what is the weather in new york city today ?"]
PAIRS = [("john lives in paris", t) for t in TEXTS] + [("a", "the weather is bad today")]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    root = tmp_path_factory.mktemp("sentence_transformers")
    return {
        "ce1": tiny_bert.save(root, "BertForSequenceClassification", name="ce1", num_labels=1),
        "ce3": tiny_bert.save(root, "BertForSequenceClassification", name="ce3",
                              labels=["contradiction", "neutral", "entailment"]),
        "mlm": tiny_bert.save(root, "BertForMaskedLM", name="mlm"),
        "base": tiny_bert.save(root, "BertModel", name="base"),
    }


def assert_optimized(obj, hf_model):
    ptrs = [p.data_ptr() for p in obj.parameters()]
    assert fastbert.optimize(obj) is obj
    assert type(hf_model.base_model.encoder).__module__.startswith("fastbert")
    assert [p.data_ptr() for p in obj.parameters()] == ptrs     # the same tensors, nothing copied


def close(a, b, tol=TOL):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    assert a.shape == b.shape and np.abs(a - b).max() <= tol, f"max abs diff {np.abs(a - b).max():.2e}"


@pytest.mark.parametrize("num_labels", [1, 3])
def test_cross_encoder_predict_and_rank(ckpt, num_labels, tmp_path):
    path = ckpt[f"ce{num_labels}"]
    ref, model = st.CrossEncoder(path, device="cpu"), st.CrossEncoder(path, device="cpu")
    assert_optimized(model, model[0].auto_model)
    raw = ref.predict(PAIRS, activation_fn=torch.nn.Identity())
    assert raw.std() > 1e-2                                       # scores that can tell pairs apart
    close(raw, model.predict(PAIRS, activation_fn=torch.nn.Identity()))
    close(ref.predict(PAIRS), model.predict(PAIRS))
    close(ref.predict(PAIRS, batch_size=2), model.predict(PAIRS, batch_size=2))
    if num_labels == 3:
        close(ref.predict(PAIRS, apply_softmax=True), model.predict(PAIRS, apply_softmax=True))
    else:
        a = ref.rank("john lives in paris", TEXTS, return_documents=True)
        b = model.rank("john lives in paris", TEXTS, return_documents=True)
        assert [(r["corpus_id"], r["text"]) for r in a] == [(r["corpus_id"], r["text"]) for r in b]
        close([r["score"] for r in a], [r["score"] for r in b])
        assert [r["corpus_id"] for r in model.rank("a", TEXTS, top_k=2)] == \
               [r["corpus_id"] for r in ref.rank("a", TEXTS, top_k=2)]
    model.save(str(tmp_path))                                    # round trip: plain transformers again
    reloaded = st.CrossEncoder(str(tmp_path), device="cpu")
    assert type(reloaded[0].auto_model.bert.encoder).__module__.startswith("transformers")
    assert reloaded.config.num_labels == num_labels
    close(ref.predict(PAIRS), reloaded.predict(PAIRS))
    fastbert.optimize(reloaded)
    close(ref.predict(PAIRS), reloaded.predict(PAIRS))


def _splade(path, form):
    if form == "MLMTransformer":
        first = MLMTransformer(path)
    else:
        first = Transformer(path, transformer_task="fill-mask")
    return st.SparseEncoder(modules=[first, SpladePooling("max")], device="cpu")


def assert_same_sparse(a, b):
    a, b = a.coalesce(), b.coalesce()
    assert a.shape == b.shape
    assert torch.equal(a.indices(), b.indices()), "different non-zero indices"
    close(a.values(), b.values())


@pytest.mark.parametrize("form", ["MLMTransformer", "Transformer(fill-mask)"])
def test_sparse_encoder_splade(ckpt, form, tmp_path):
    ref, model = _splade(ckpt["mlm"], form), _splade(ckpt["mlm"], form)
    assert_optimized(model, model[0].auto_model)
    a = ref.encode(TEXTS, convert_to_tensor=True)
    b = model.encode(TEXTS, convert_to_tensor=True)
    assert a.is_sparse and a.coalesce().values().numel() > 20    # enough active dimensions to compare
    assert_same_sparse(a, b)
    assert_same_sparse(ref.encode(TEXTS, batch_size=3, convert_to_tensor=True),
                       model.encode(TEXTS, batch_size=3, convert_to_tensor=True))
    assert_same_sparse(ref.encode_query(TEXTS[:2], convert_to_tensor=True),
                       model.encode_query(TEXTS[:2], convert_to_tensor=True))
    model.save(str(tmp_path))
    reloaded = st.SparseEncoder(str(tmp_path), device="cpu")
    assert_same_sparse(a, reloaded.encode(TEXTS, convert_to_tensor=True))


def _sentence_transformer(path, pooling):
    torch.manual_seed(1)  # the same Dense weights for both copies
    first = Transformer(path)
    dense = Dense(first.get_embedding_dimension(), 16, activation_function=torch.nn.Tanh())
    return st.SentenceTransformer(modules=[first, Pooling(first.get_embedding_dimension(), pooling), dense,
                                           Normalize()], prompts={"query": "query: "}, device="cpu")


def assert_embeddings_close(a, b):
    a, b = torch.as_tensor(a), torch.as_tensor(b)
    close(a, b)
    assert torch.nn.functional.cosine_similarity(a.double(), b.double(), dim=-1).min().item() >= 1 - 1e-5


@pytest.mark.parametrize("pooling", ["mean", "cls", "max"])
def test_sentence_transformer_dense_normalize_prompts(ckpt, pooling, tmp_path):
    ref, model = _sentence_transformer(ckpt["base"], pooling), _sentence_transformer(ckpt["base"], pooling)
    assert_optimized(model, model[0].auto_model)
    plain = ref.encode(TEXTS, convert_to_tensor=True)
    query = ref.encode(TEXTS, prompt_name="query", convert_to_tensor=True)
    assert (plain - query).abs().max() > 1e-3                     # the prompt changes the embeddings
    assert_embeddings_close(plain, model.encode(TEXTS, convert_to_tensor=True))
    assert_embeddings_close(query, model.encode(TEXTS, prompt_name="query", convert_to_tensor=True))
    assert_embeddings_close(query, model.encode_query(TEXTS, convert_to_tensor=True))
    assert_embeddings_close(ref.encode(TEXTS, prompt="passage: ", batch_size=3),
                            model.encode(TEXTS, prompt="passage: ", batch_size=3))
    assert model.model_card_data is not None
    model.save(str(tmp_path))
    assert (tmp_path / "README.md").is_file() and (tmp_path / "2_Dense").is_dir()
    reloaded = st.SentenceTransformer(str(tmp_path), device="cpu")
    assert reloaded.prompts["query"] == "query: "
    assert_embeddings_close(query, reloaded.encode(TEXTS, prompt_name="query", convert_to_tensor=True))
    fastbert.optimize(reloaded)
    assert_embeddings_close(query, reloaded.encode(TEXTS, prompt_name="query", convert_to_tensor=True))


def test_sentence_transformer_packed_weights_follow_weight_changes(ckpt):
    """An optimized SentenceTransformer's CPU GEMMs read packed weight copies, as fastbert.Encoder's:
    after in-place writes to every parameter it still gives the unoptimized model's embeddings."""
    ref, model = _sentence_transformer(ckpt["base"], "mean"), _sentence_transformer(ckpt["base"], "mean")
    fastbert.optimize(model)
    fast = model[0].auto_model.__dict__["_fastbert_encoder"]
    assert all(layer.packed_weights is not None for layer in fast.encoder.layer)
    assert_embeddings_close(ref.encode(TEXTS, convert_to_tensor=True), model.encode(TEXTS, convert_to_tensor=True))
    ours = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in ref.named_parameters():
            scale = 1.0 + 0.3 * torch.rand(p.shape, generator=torch.Generator().manual_seed(len(name)))
            p.mul_(scale)
            ours[name].mul_(scale)
    assert_embeddings_close(ref.encode(TEXTS, convert_to_tensor=True), model.encode(TEXTS, convert_to_tensor=True))


def test_unsupported_objects_name_their_type_and_what_is_supported(ckpt):
    supported = "a peft PeftModel of one of those, or a sentence-transformers SentenceTransformer, CrossEncoder or SparseEncoder"
    for obj, name in [(torch.nn.Linear(2, 2), "torch.nn.modules.linear.Linear"), ("bert", "got str"),
                      (object(), "got object")]:
        with pytest.raises(TypeError, match=name) as info:
            fastbert.optimize(obj)
        assert supported in str(info.value)
    static = st.SentenceTransformer(modules=[StaticEmbedding(T.BertTokenizerFast.from_pretrained(ckpt["base"]),
                                                             embedding_dim=8)], device="cpu")
    with pytest.raises(TypeError, match=r"SentenceTransformer has no transformers model.*StaticEmbedding"):
        fastbert.optimize(static)


def test_unsupported_model_inside_leaves_the_object_untouched(ckpt, tmp_path):
    config = T.BertConfig(vocab_size=len(tiny_bert.VOCAB), hidden_size=32, num_hidden_layers=1,
                          num_attention_heads=4, intermediate_size=48, num_labels=1,
                          position_embedding_type="relative_key")
    T.BertForSequenceClassification(config).save_pretrained(tmp_path)
    tiny_bert.tokenizer(tmp_path / "vocab").save_pretrained(tmp_path)
    model = st.CrossEncoder(str(tmp_path), device="cpu")
    with pytest.raises(ConfigError, match="relative_key"):
        fastbert.optimize(model)
    assert type(model[0].auto_model.bert.encoder).__module__.startswith("transformers")

    flattened = _splade(ckpt["mlm"], "Transformer(fill-mask)")
    flattened[0].can_flatten_inputs = True   # what flash attention 2 with unpad_inputs turns on
    with pytest.raises(ValueError, match=r"unpad_inputs = False"):
        fastbert.optimize(flattened)
    assert type(flattened[0].auto_model.bert.encoder).__module__.startswith("transformers")


def test_sentence_transformer_with_a_lora_adapter(ckpt):
    """A SentenceTransformer whose transformers model was wrapped by peft (get_peft_model on
    auto_model, as LoRA fine-tuning recipes do): optimize finds the model inside the PeftModel and
    keeps the adapters, so the embeddings are the adapted ones, not the base model's."""
    peft = pytest.importorskip("peft", reason="peft is not installed (pip install fastbert[test])")
    lora = dict(r=4, target_modules=["query", "value"], init_lora_weights=False)
    ref, model = _sentence_transformer(ckpt["base"], "mean"), _sentence_transformer(ckpt["base"], "mean")
    plain = ref.encode(TEXTS, convert_to_tensor=True)
    for obj in (ref, model):
        torch.manual_seed(2)  # the same adapter weights for both
        obj[0].auto_model = peft.get_peft_model(obj[0].auto_model, peft.LoraConfig(**lora))
    want = ref.encode(TEXTS, convert_to_tensor=True)
    assert (want - plain).abs().max() > 1e-3                     # the adapter changes the embeddings
    assert fastbert.optimize(model) is model
    assert any("_fastbert_encoder" in m.__dict__ for m in model.modules())
    assert sum(isinstance(m, peft.tuners.lora.LoraLayer) for m in model.modules()) == 4
    assert_embeddings_close(want, model.encode(TEXTS, convert_to_tensor=True))
