"""Training parity with transformers: loss, gradients and AdamW steps for every family and head.

Each case builds a small random transformers model, saves it with save_pretrained, loads it with
both libraries (fp32, dropout 0 unless a test says otherwise) and trains both on the same padded
batches. Gradients are compared per parameter, by name: |g_fast - g_hf| / |g_hf| <= 1e-3 (2-norms).

Question answering is compared with a loss that ignores padded positions: transformers' built-in QA
loss also scores the logits of padding positions, which fastbert does not compute (it never runs the
encoder on padding); the built-in losses agree on an unpadded batch, checked here too."""
import importlib
import math

import pytest
import torch
import torch.nn.functional as F
import transformers as T
from torch.overrides import TorchFunctionMode

import fastbert

GRAD_RTOL = 1e-3
GRAD_FLOOR = 1e-3  # x the global gradient norm; see assert_grads_match
LOSS_RTOL = 1e-5
NO_DROPOUT = dict(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
SMALL = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
             max_position_embeddings=64)
ROBERTA = dict(SMALL, pad_token_id=1, max_position_embeddings=66)
FAMILIES = {  # name -> (config class, kwargs with dropout 0, class-name prefix)
    "bert": (T.BertConfig, dict(SMALL, **NO_DROPOUT), "Bert"),
    "roberta": (T.RobertaConfig, dict(ROBERTA, type_vocab_size=1, **NO_DROPOUT), "Roberta"),
    "xlm-roberta": (T.XLMRobertaConfig, dict(ROBERTA, hidden_act="gelu_new", **NO_DROPOUT), "XLMRoberta"),
    "camembert": (T.CamembertConfig, dict(ROBERTA, hidden_act="relu", **NO_DROPOUT), "Camembert"),
    "electra": (T.ElectraConfig, dict(SMALL, embedding_size=16, hidden_size=48, hidden_act="gelu_pytorch_tanh",
                                      summary_last_dropout=0.0, **NO_DROPOUT), "Electra"),
    "distilbert": (T.DistilBertConfig, dict(vocab_size=99, dim=32, n_layers=2, n_heads=4, hidden_dim=37,
                                            max_position_embeddings=64, dropout=0.0, attention_dropout=0.0,
                                            qa_dropout=0.0, seq_classif_dropout=0.0), "DistilBert"),
    "albert": (T.AlbertConfig, dict(SMALL, embedding_size=16, num_hidden_layers=3, num_hidden_groups=2,
                                    inner_group_num=2, classifier_dropout_prob=0.0, **NO_DROPOUT), "Albert"),
}
# head -> config overrides; the sequence classification problem types are separate cases
HEADS = {
    "ForMaskedLM": {},
    "ForSequenceClassification": dict(num_labels=3),
    "ForSequenceClassification-regression": dict(num_labels=1),
    "ForSequenceClassification-multi_label": dict(num_labels=3, problem_type="multi_label_classification"),
    "ForTokenClassification": dict(num_labels=5),
    "ForQuestionAnswering": dict(num_labels=2),
    "ForMultipleChoice": {},
}


def save_checkpoint(family, head, path, **extra):
    """A random transformers model with non-trivial biases and norms, saved with save_pretrained."""
    cls, kwargs, prefix = FAMILIES[family]
    config = cls(**{**kwargs, **HEADS[head], **extra})
    torch.manual_seed(0)
    model = getattr(T, prefix + head.split("-")[0])(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)


def load_both(family, head, path):
    task = head.split("-")[0]
    hf = getattr(T, FAMILIES[family][2] + task).from_pretrained(path, attn_implementation="eager")
    fast = getattr(fastbert, "AutoModel" + task).from_pretrained(path)
    assert type(fast).__name__ == FAMILIES[family][2] + task
    return hf.train(), fast.train()


def make_batch(config, head, seed, batch=4, seq=12, choices=2, padded=True):
    """Random ids and labels; rows of random length, one full row and one of 2 tokens."""
    g = torch.Generator().manual_seed(seed)
    lead = (batch, choices) if head == "ForMultipleChoice" else (batch,)
    pad = config.pad_token_id
    ids = torch.randint(pad + 2, config.vocab_size, (*lead, seq), generator=g)
    lengths = torch.randint(3, seq + 1, lead, generator=g) if padded else torch.full(lead, seq)
    if padded:
        lengths.view(-1)[0], lengths.view(-1)[1] = seq, 2
    mask = (torch.arange(seq) < lengths[..., None]).long()
    inputs = {"input_ids": ids.masked_fill(mask == 0, pad), "attention_mask": mask}
    if getattr(config, "type_vocab_size", 1) > 1:
        inputs["token_type_ids"] = (torch.arange(seq) >= seq // 2).long().expand_as(ids) * mask
    n = config.num_labels
    if head == "ForMaskedLM" or head == "ForTokenClassification":
        labels = torch.randint(0, config.vocab_size if head == "ForMaskedLM" else n, ids.shape, generator=g)
        labels[mask == 0] = -100
        labels[:, 1] = -100
        inputs["labels"] = labels
    elif head == "ForSequenceClassification":
        inputs["labels"] = torch.randint(0, n, (batch,), generator=g)
    elif head.endswith("regression"):
        inputs["labels"] = torch.randn(batch, generator=g)
    elif head.endswith("multi_label"):
        inputs["labels"] = torch.randint(0, 2, (batch, n), generator=g).float()
    elif head == "ForQuestionAnswering":
        start = (torch.rand(batch, generator=g) * lengths).long()
        inputs["start_positions"] = start
        inputs["end_positions"] = torch.minimum(start + 1, lengths - 1)
    elif head == "ForMultipleChoice":
        inputs["labels"] = torch.randint(0, choices, (batch,), generator=g)
    return inputs


def masked_qa_loss(out, inputs):
    """transformers' QA loss with padded positions left out of the softmax."""
    pad = inputs["attention_mask"] == 0
    start = out.start_logits.masked_fill(pad, -1e4)
    end = out.end_logits.masked_fill(pad, -1e4)
    return (F.cross_entropy(start, inputs["start_positions"]) + F.cross_entropy(end, inputs["end_positions"])) / 2


def training_loss(model, head, inputs):
    if head != "ForQuestionAnswering":
        return model(**inputs).loss
    plain = {k: v for k, v in inputs.items() if not k.endswith("_positions")}
    return masked_qa_loss(model(**plain), inputs)


def assert_grads_match(hf, fast, rtol=GRAD_RTOL):
    """Every trainable parameter, by name (tied ones under each name): 2-norm error <= rtol times
    max(|g_hf|, GRAD_FLOOR * global norm). The floor is for gradients that are 0 in exact arithmetic
    (key biases and the multiple-choice/QA output biases cancel under softmax) and are float32 noise."""
    ref = {n: p.grad for n, p in hf.named_parameters(remove_duplicate=False) if p.requires_grad}
    got = {n: p.grad for n, p in fast.named_parameters(remove_duplicate=False) if p.requires_grad}
    assert sorted(ref) == sorted(got), set(ref) ^ set(got)
    missing = [n for n in ref if ref[n] is None or got[n] is None]
    assert not missing, f"no gradient for {missing}"
    floor = GRAD_FLOOR * torch.stack([g.norm() for g in ref.values()]).norm().item()
    worst = []
    for name, g_ref in ref.items():
        assert torch.isfinite(got[name]).all(), f"{name}: non-finite gradient"
        scale = g_ref.norm().item()
        worst.append(((got[name] - g_ref).norm().item() / max(scale, floor), name, scale))
    bad = [w for w in worst if w[0] > rtol]
    assert not bad, "gradients differ (rel err, name, |g_hf|): " + ", ".join(f"{e:.2e} {n} {s:.1e}"
                                                                              for e, n, s in sorted(bad)[-5:])
    return max(worst)


def assert_close(a, b, rtol=LOSS_RTOL, what="loss"):
    a, b = float(a.detach() if torch.is_tensor(a) else a), float(b.detach() if torch.is_tensor(b) else b)
    assert math.isfinite(a) and math.isfinite(b), (what, a, b)
    assert abs(a - b) <= rtol * max(abs(a), 1.0), f"{what}: transformers {a:.8f}, fastbert {b:.8f}"


@pytest.fixture(autouse=True)
def one_thread():
    """These models are tiny: one intra-op thread is fastest, and avoids spinning on a shared CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


CASES = [(f, h) for f in FAMILIES for h in HEADS]


@pytest.mark.parametrize("family,head", CASES)
def test_loss_gradients_and_adamw_steps_match_transformers(family, head, tmp_path):
    save_checkpoint(family, head, tmp_path)
    hf, fast = load_both(family, head, tmp_path)
    config = hf.config

    # one step: the same loss and gradients, with padding
    inputs = make_batch(config, head, seed=0)
    losses = [training_loss(m, head, inputs) for m in (hf, fast)]
    assert_close(*losses)
    for loss in losses:
        loss.backward()
    assert_grads_match(hf, fast)

    # AdamW: the same loss at every step, on a new padded batch each step
    opts = [torch.optim.AdamW(m.parameters(), lr=5e-5, weight_decay=0.01) for m in (hf, fast)]
    history = []
    for step in range(5):
        inputs = make_batch(config, head, seed=1 + step % 2)
        step_losses = []
        for model, opt in zip((hf, fast), opts):
            opt.zero_grad()
            loss = training_loss(model, head, inputs)
            loss.backward()
            opt.step()
            step_losses.append(loss.item())
        assert_close(*step_losses, what=f"loss at step {step}")
        history.append(step_losses[1])
    assert history[2] < history[0] and history[4] < history[2], f"training did not lower the loss: {history}"


@pytest.mark.parametrize("family", ["bert", "roberta", "electra", "distilbert", "albert"])
def test_builtin_question_answering_loss_without_padding(family, tmp_path):
    head = "ForQuestionAnswering"
    save_checkpoint(family, head, tmp_path)
    hf, fast = load_both(family, head, tmp_path)
    inputs = make_batch(hf.config, head, seed=3, padded=False)
    inputs["end_positions"][2] = 40   # out of range: clamped and ignored, as transformers does
    losses = [m(**inputs).loss for m in (hf, fast)]
    assert_close(*losses)
    for loss in losses:
        loss.backward()
    assert_grads_match(hf, fast)


# ---- dropout in train() --------------------------------------------------------------------------------
DROPOUT = {  # distinct rates per site: hidden 0.1, attention probabilities 0.2, classifier 0.3
    "bert": dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2, classifier_dropout=0.3),
    "distilbert": dict(dropout=0.1, attention_dropout=0.2, seq_classif_dropout=0.3, qa_dropout=0.3),
    "albert": dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2, classifier_dropout_prob=0.3),
    "electra": dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.2, classifier_dropout=0.3,
                    summary_last_dropout=0.3),
}


class DropoutLog(TorchFunctionMode):
    """Records every active dropout: F.dropout calls (p, input, output) and, through a wrapper
    installed by the test, the dropout_p fastbert hands to its attention op."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func is F.dropout:
            bound = {**dict(zip(("input", "p", "training"), args)), **kwargs}
            if bound.get("training", True) and bound.get("p", 0.5) > 0:
                self.calls.append((round(float(bound["p"]), 6), bound["input"], out))
        return out

    def rates(self):
        return sorted(p for p, _, _ in self.calls)


@pytest.mark.parametrize("family,head", [(f, h) for f in FAMILIES for h in HEADS if "-" not in h])
def test_dropout_sites_and_keep_rate_in_train_mode(family, head, monkeypatch):
    """fastbert drops at transformers' sites with transformers' rates (one record per call), keeps
    1 - p of the values scaled by 1 / (1 - p), is seeded by torch.manual_seed, and drops nothing in eval."""
    cls, kwargs, prefix = FAMILIES[family]
    rates = DROPOUT.get(family, DROPOUT["bert"])
    config = cls(**{**kwargs, **HEADS[head], **rates})
    torch.manual_seed(0)
    hf = getattr(T, prefix + head)(config)
    hf.config._attn_implementation = "eager"  # attention dropout as an F.dropout call
    fast = getattr(fastbert, prefix + head).from_hf_config(config)
    inputs = {k: v for k, v in make_batch(config, head, seed=0, seq=24).items()
              if k in ("input_ids", "attention_mask", "token_type_ids")}

    log = DropoutLog()
    attention_op = fastbert.ops.varlen_attention

    def logged_attention(*args, dropout_p=0.0, **kw):
        if dropout_p > 0:
            log.calls.append((round(dropout_p, 6), None, None))
        return attention_op(*args, dropout_p=dropout_p, **kw)

    monkeypatch.setattr(fastbert.ops, "varlen_attention", logged_attention)
    for model in (hf, fast):
        model.eval()
        with log:
            model(**inputs)
        assert log.calls == [], f"{type(model).__module__}: dropout in eval mode"
    hf.train(), fast.train()
    with log:
        hf(**inputs)
    want, log.calls = log.rates(), []
    with torch.no_grad(), log:
        torch.manual_seed(1)
        first = fast(**inputs)[0]
    assert log.rates() == want, "dropout rates per call differ from transformers'"

    # keep rate and scaling of fastbert's hidden dropouts, pooled per rate
    for p in sorted({p for p, x, _ in log.calls if x is not None}):
        x = torch.cat([i.flatten() for q, i, _ in log.calls if q == p and i is not None])
        y = torch.cat([o.flatten() for q, i, o in log.calls if q == p and i is not None])
        live = x != 0
        dropped = (y[live] == 0).double().mean().item()
        n = int(live.sum())
        assert abs(dropped - p) <= 5 * math.sqrt(p * (1 - p) / n), f"p={p}: dropped {dropped:.4f} of {n}"
        kept = live & (y != 0)
        torch.testing.assert_close(y[kept], x[kept] / (1 - p))

    with torch.no_grad():
        torch.manual_seed(1)
        again = fast(**inputs)[0]
        other = fast(**inputs)[0]
    assert torch.equal(first, again), "train() output not reproducible under torch.manual_seed"
    assert not torch.allclose(first, other), "train() output is deterministic with dropout > 0"


# ---- autocast, gradient checkpointing ------------------------------------------------------------------
def grads_of(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def rel_err(got, want):
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("family,head", [("bert", "ForSequenceClassification"), ("electra", "ForMaskedLM"),
                                         ("albert", "ForTokenClassification"),
                                         ("distilbert", "ForQuestionAnswering")])
def test_cpu_bf16_autocast(family, head, tmp_path):
    """Under torch.autocast("cpu", bfloat16) the loss is as close to the fp32 loss as transformers'
    under the same autocast (3x its error, STYLE.md's whole-model rule, plus 5e-4 relative) and the
    gradients are finite and as close to the fp32 gradients."""
    save_checkpoint(family, head, tmp_path)
    hf, fast = load_both(family, head, tmp_path)
    inputs = make_batch(hf.config, head, seed=0)
    ref = training_loss(hf, head, inputs)
    ref.backward()
    order = list(grads_of(hf))                                   # compare by name, in one order
    ref_grads = torch.cat([g.flatten() for g in grads_of(hf).values()])
    results = {}
    for name, model in (("hf", hf), ("fast", fast)):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = training_loss(model, head, inputs)
        loss.backward()
        grads = grads_of(model)
        grads = torch.cat([grads[n].flatten() for n in order])
        assert torch.isfinite(grads).all(), f"{name}: non-finite gradients under autocast"
        results[name] = (abs(loss.item() - ref.item()), rel_err(grads, ref_grads))
    (hf_loss_err, hf_grad_err), (loss_err, grad_err) = results["hf"], results["fast"]
    assert loss_err <= 3 * hf_loss_err + 5e-4 * abs(ref.item()), results
    assert grad_err <= 3 * hf_grad_err + 1e-3, results


@pytest.mark.parametrize("family,head", [("bert", "ForMaskedLM"), ("distilbert", "ForSequenceClassification"),
                                         ("albert", "ForMultipleChoice")])
def test_gradient_checkpointing_gives_the_same_gradients(family, head, tmp_path, monkeypatch):
    """With dropout on (train mode, seeded), checkpointing recomputes each layer in the backward with
    the same dropout masks: the gradients equal those without checkpointing."""
    save_checkpoint(family, head, tmp_path, **DROPOUT.get(family, DROPOUT["bert"]))
    fast = getattr(fastbert, "AutoModel" + head).from_pretrained(tmp_path).train()
    inputs = make_batch(fast.config, head, seed=0)
    layers = fast.base_model.encoder_layers()
    calls = []
    layer_parts = type(layers[0]).parts

    def counted(self):  # module hooks do not fire in checkpoint's recompute; every layer run reads its parts
        calls.append(self)
        return layer_parts(self)

    monkeypatch.setattr(type(layers[0]), "parts", counted)

    def run():
        fast.zero_grad()
        calls.clear()
        torch.manual_seed(7)
        fast(**inputs).loss.backward()
        return grads_of(fast), len(calls)

    plain, n_plain = run()
    assert not fast.is_gradient_checkpointing
    fast.gradient_checkpointing_enable()
    assert fast.is_gradient_checkpointing and fast.supports_gradient_checkpointing
    ckpt, n_ckpt = run()
    assert (n_plain, n_ckpt) == (len(layers), 2 * len(layers)), "layers were not recomputed in the backward"
    assert plain.keys() == ckpt.keys()
    for name in plain:
        torch.testing.assert_close(ckpt[name], plain[name], rtol=1e-5, atol=1e-7, msg=name)
    fast.gradient_checkpointing_enable(every_n_layers=2)
    _, n_half = run()
    assert n_half == len(layers) + (len(layers) + 1) // 2
    fast.gradient_checkpointing_disable()
    assert run()[1] == len(layers)


# ---- through the Triton kernels ---------------------------------------------------------------------------
@pytest.fixture
def triton_path(monkeypatch):
    """Every fastbert op on its Triton kernel: on CPU in Triton's interpreter (conftest sets
    TRITON_INTERPRET=1 without a GPU). -> the list of dispatch decisions taken."""
    pytest.importorskip("triton", reason="the Triton path needs the triton package")
    from fastbert.ops import _dispatch
    if not _dispatch.interpreting():
        pytest.skip("forcing CPU tensors onto the kernels needs TRITON_INTERPRET=1 (a GPU machine runs "
                    "the kernels through the models' CUDA tests instead)")
    calls = []

    def forced(backend, *tensors):
        calls.append(_dispatch.use_triton("triton", *tensors))
        return calls[-1]

    for op in ("attention", "add_layer_norm", "bias_gelu"):
        monkeypatch.setattr(importlib.import_module(f"fastbert.ops.{op}"), "use_triton", forced)
    return calls


@pytest.mark.parametrize("family,head", [("bert", "ForSequenceClassification"), ("electra", "ForMaskedLM")])
def test_gradients_through_the_triton_kernels(family, head, tmp_path, triton_path):
    """Forward and backward kernels (attention, bias+GELU erf/tanh, add+LayerNorm) in a whole model:
    transformers' loss and gradients."""
    save_checkpoint(family, head, tmp_path)
    hf, fast = load_both(family, head, tmp_path)
    inputs = make_batch(hf.config, head, seed=0)
    losses = [training_loss(m, head, inputs) for m in (hf, fast)]
    assert triton_path and all(triton_path), "the ops did not take the Triton path"
    assert_close(*losses)
    for loss in losses:
        loss.backward()
    assert_grads_match(hf, fast)


def test_kernel_attention_dropout_replays_under_checkpointing(tmp_path, triton_path):
    """The attention kernel's dropout seed comes from torch's generator, so torch.manual_seed fixes
    it and checkpointing's recompute sees the same mask: equal gradients with and without."""
    save_checkpoint("bert", "ForMaskedLM", tmp_path, **DROPOUT["bert"])
    fast = fastbert.AutoModelForMaskedLM.from_pretrained(tmp_path).train()
    inputs = make_batch(fast.config, "ForMaskedLM", seed=0, batch=2, seq=8)  # small: the interpreter is slow

    def grads(seed):
        fast.zero_grad()
        torch.manual_seed(seed)
        fast(**inputs).loss.backward()
        return grads_of(fast)

    plain, other = grads(3), grads(4)
    fast.gradient_checkpointing_enable()
    ckpt = grads(3)
    assert triton_path and all(triton_path)
    name = "bert.encoder.layer.0.attention.self.query.weight"
    assert rel_err(other[name], plain[name]) > 1e-3, "dropout did not change with the seed"
    for n in plain:
        torch.testing.assert_close(ckpt[n], plain[n], rtol=1e-5, atol=1e-7, msg=n)


# ---- transformers.Trainer ---------------------------------------------------------------------------------
def _trainer(model, rows, out_dir, **arguments):
    """transformers.Trainer on CPU, seed 0, a loss logged at every step."""
    args = T.TrainingArguments(output_dir=str(out_dir), per_device_train_batch_size=4, learning_rate=1e-2,
                               logging_steps=1, report_to="none", use_cpu=True, seed=0, disable_tqdm=True,
                               dataloader_num_workers=0, **arguments)
    return T.Trainer(model=model, args=args, train_dataset=rows)


def _logged_losses(trainer):
    return [h["loss"] for h in trainer.state.log_history if "loss" in h]


def _trainer_losses(model, rows, out_dir, **arguments):
    """The losses transformers.Trainer logs at each step (no checkpoints)."""
    trainer = _trainer(model, rows, out_dir, save_strategy="no", **arguments)
    trainer.train()
    return _logged_losses(trainer)


def _rows(config, head, n):
    batch = make_batch(config, head, seed=0, batch=n)
    return [{k: v[i] for k, v in batch.items()} for i in range(n)]


def test_transformers_trainer_drop_in(tmp_path):
    """fastbert's model in transformers.Trainer: trains, lowers the loss, and logs the same losses
    as the transformers model it was loaded from, step by step."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the test extras)")
    head = "ForSequenceClassification"
    save_checkpoint("bert", head, tmp_path / "ckpt")
    hf, fast = load_both("bert", head, tmp_path / "ckpt")
    rows = _rows(hf.config, head, 8)
    want, got = (_trainer_losses(model, rows, tmp_path / name, max_steps=12) for name, model in (("hf", hf), ("fast", fast)))
    assert len(got) == 12
    for step, (a, b) in enumerate(zip(want, got)):
        assert_close(a, b, rtol=1e-4, what=f"Trainer loss at step {step}")
    assert sum(got[-4:]) < 0.8 * sum(got[:4]), f"Trainer did not lower the loss: {got}"


def test_trainer_on_an_optimized_transformers_model(tmp_path):
    """Found by use: an optimize()d transformers model failed Trainer's first step, as its head passes
    Trainer's num_items_in_batch down to the encoder. It now logs the losses of the model unchanged
    (transformers' heads with Trainer's loss kwargs, both sides)."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the test extras)")
    head = "ForSequenceClassification"
    save_checkpoint("bert", head, tmp_path / "ckpt")
    rows = _rows(T.BertConfig.from_pretrained(tmp_path / "ckpt"), head, 8)
    losses = []
    for name in ("hf", "optimized"):
        model = T.BertForSequenceClassification.from_pretrained(tmp_path / "ckpt", attn_implementation="eager")
        if name == "optimized":
            fastbert.optimize(model)
        losses.append(_trainer_losses(model, rows, tmp_path / name, max_steps=6, gradient_accumulation_steps=2))
    want, got = losses
    assert len(got) == 6
    for step, (a, b) in enumerate(zip(want, got)):
        assert_close(a, b, rtol=1e-4, what=f"Trainer loss at step {step}")


@pytest.mark.parametrize("convert", ["native", "optimize"])
def test_trainer_neftune_is_refused_by_name(convert, tmp_path):
    """Found by use: TrainingArguments(neftune_noise_alpha=...) crashed in transformers' hook with an
    IndexError (it reads the embeddings' output as (batch, seq, hidden)); it is refused by name, for a
    fastbert model and an optimize()d one."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the test extras)")
    head = "ForSequenceClassification"
    save_checkpoint("bert", head, tmp_path / "ckpt")
    hf, fast = load_both("bert", head, tmp_path / "ckpt")
    model = fast if convert == "native" else fastbert.optimize(hf)
    with pytest.raises(ValueError, match="NEFTune.*neftune_noise_alpha"):
        _trainer_losses(model, _rows(hf.config, head, 4), tmp_path / "out", max_steps=1, neftune_noise_alpha=5.0)


@pytest.mark.parametrize("head", ["ForMaskedLM", "ForSequenceClassification"])
def test_trainer_checkpoints_load_in_both_libraries(head, tmp_path):
    """Found by use: Trainer saved a fastbert model as a bare state dict without config.json (neither
    library could load the folder), and a masked-LM one not at all (safetensors refused its tied
    weights), so training stopped at the first checkpoint. A fastbert model is now a transformers
    PreTrainedModel to Trainer, which saves it with its own save_pretrained: the checkpoints and
    save_model()'s folder hold the trained weights, loaded equal by fastbert and by transformers."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the test extras)")
    save_checkpoint("bert", head, tmp_path / "ckpt")
    _, fast = load_both("bert", head, tmp_path / "ckpt")
    trainer = _trainer(fast, _rows(fast.config, head, 8), tmp_path / "run", max_steps=4, save_strategy="steps",
                       save_steps=2)
    trainer.train()
    trainer.save_model(str(tmp_path / "final"))
    trained = {k: v.detach().clone() for k, v in fast.state_dict().items()}
    start = load_both("bert", head, tmp_path / "ckpt")[1].state_dict()
    assert any(not torch.equal(start[k], v) for k, v in trained.items()), "training changed no weight"
    for folder in (tmp_path / "run" / "checkpoint-4", tmp_path / "final"):
        for loaded in (getattr(fastbert, "AutoModel" + head).from_pretrained(folder),
                       getattr(T, "AutoModel" + head).from_pretrained(folder)):
            state = loaded.state_dict()
            for name, value in trained.items():
                torch.testing.assert_close(state[name], value, rtol=0, atol=0, msg=f"{folder.name}: {name}")


def test_trainer_resumes_a_fastbert_model_from_its_checkpoint(tmp_path):
    """resume_from_checkpoint on a fastbert masked-LM model: the steps after the checkpoint log the
    losses of a run that never stopped (weights, optimizer and scheduler state all restored)."""
    pytest.importorskip("accelerate", reason="transformers.Trainer needs accelerate (the test extras)")
    head = "ForMaskedLM"
    save_checkpoint("bert", head, tmp_path / "ckpt")

    def fresh():
        return load_both("bert", head, tmp_path / "ckpt")[1]

    rows = _rows(fresh().config, head, 8)
    want = _trainer_losses(fresh(), rows, tmp_path / "whole", max_steps=6)
    _trainer(fresh(), rows, tmp_path / "split", max_steps=6, save_strategy="steps", save_steps=3).train()
    resumed = _trainer(fresh(), rows, tmp_path / "split", max_steps=6, save_strategy="no")
    resumed.train(resume_from_checkpoint=str(tmp_path / "split" / "checkpoint-3"))
    got = _logged_losses(resumed)
    assert len(got) == len(want) == 6, (want, got)
    for step, (a, b) in enumerate(zip(want, got), start=1):
        assert abs(a - b) <= 1e-4 * abs(a), f"step {step}: {a} without a stop, {b} resumed"


BITFIT_FAMILIES = {**FAMILIES,
                   "deberta-v2": (T.DebertaV2Config, dict(SMALL, relative_attention=True, pos_att_type=["c2p", "p2c"],
                                                          max_relative_positions=8, **NO_DROPOUT), "DebertaV2"),
                   "mpnet": (T.MPNetConfig, dict(SMALL, **NO_DROPOUT), "MPNet")}


@pytest.mark.parametrize("convert", ["native", "optimize"])
@pytest.mark.parametrize("family", BITFIT_FAMILIES)
def test_bias_only_training_gets_every_bias_gradient(family, convert, tmp_path, monkeypatch):
    """BitFit: only the biases train, embeddings and weights frozen, so a Linear's input and weight
    need no gradient while its bias does. The CPU fast path (a GEMM with no backward) must not take
    such a call: transformers' bias gradients, every one, including ALBERT's shared layers."""
    monkeypatch.setitem(FAMILIES, family, BITFIT_FAMILIES[family])
    head = "ForSequenceClassification"
    save_checkpoint(family, head, tmp_path)
    hf, fast = load_both(family, head, tmp_path)
    if convert == "optimize":
        fast = fastbert.optimize(getattr(T, FAMILIES[family][2] + head).from_pretrained(tmp_path).train())
    for model in (hf, fast):
        for name, p in model.named_parameters():
            p.requires_grad_(name.endswith("bias") and "embeddings" not in name)
    inputs = make_batch(hf.config, head, seed=0)
    losses = [training_loss(m, head, inputs) for m in (hf, fast)]
    assert_close(*losses)
    for loss in losses:
        loss.backward()
    assert_grads_match(hf, fast)
