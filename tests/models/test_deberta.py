"""DeBERTa-v2/v3 against transformers on tiny random checkpoints saved here: every head, configs
covering c2p / p2c, log buckets or plain clamped distances, share_att_key, norm_rel_ebd,
position_biased_input on and off, embedding_size != hidden_size, rows longer than the relative span,
a fully padded row; forward_packed, training gradients, strict loading, fastbert.optimize, and the
settings refused with a ConfigError."""
import pytest
import torch
import transformers as T
from test_models import close, labels_for
from tiny_families import DEBERTA_V2_VARIANTS as VARIANTS
from tiny_families import deberta_v2_config as config

import fastbert
from fastbert.models.config import ConfigError
from fastbert.ops import relative_attention as R

TASKS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
         "ForMultipleChoice"]
SEQ = 48   # longer than every variant's relative span (tiny_families.DEBERTA_V2_VARIANTS)


def save(task, variant, path, **extra):
    return save_model("DebertaV2", task, config(variant, **extra), path)


def save_model(prefix, task, cfg, path):
    """A random transformers `prefix + task` saved to path; -> (it reloaded eagerly, fastbert's Auto load)."""
    torch.manual_seed(0)
    if "Question" in task:
        cfg.num_labels = 2
    model = getattr(T, prefix + task)(cfg)
    with torch.no_grad():   # relative embeddings and norms large enough that wrong wiring shows
        for name, p in model.named_parameters():
            if "rel_embeddings" in name:
                p.normal_(0.0, 1.0)
            elif "attention.self" in name and name.endswith("weight"):   # far from uniform attention
                p.normal_(0.0, 0.3)
            elif name.endswith("bias") or "LayerNorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    hf = getattr(T, prefix + task).from_pretrained(path, attn_implementation="eager").eval()
    fast = getattr(fastbert, "AutoModel" + ("" if task == "Model" else task)).from_pretrained(path)
    return hf, fast


def inputs(cfg, batch=4, seq=SEQ, seed=1):
    """Row 0 full length, row 1 two tokens, row 2 fully padded, row 3 random."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(2, cfg.vocab_size, (batch, seq), generator=g)
    lengths = torch.tensor([seq, 2, 0, int(torch.randint(3, seq, (1,), generator=g))])[:batch]
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    ids[mask == 0] = cfg.pad_token_id
    x = {"input_ids": ids, "attention_mask": mask}
    if cfg.type_vocab_size > 1:
        x["token_type_ids"] = (torch.arange(seq)[None] >= seq // 2).long().expand(batch, -1) * mask
    return x


def compare(task, a, b, real):
    if task == "Model":
        close(a.last_hidden_state, b.last_hidden_state, real)
    elif task == "ForQuestionAnswering":
        close(a.start_logits, b.start_logits, real)
        close(a.end_logits, b.end_logits, real)
    elif task in ("ForMaskedLM", "ForTokenClassification"):
        close(a.logits, b.logits, real)
        close(a.loss, b.loss)                                # labels -100 at padding
    else:                                                    # pooled heads: row 2 is all padding
        close(a.logits.reshape(-1)[[0, 1, 3]] if task == "ForMultipleChoice" else a.logits[[0, 1, 3]],
              b.logits.reshape(-1)[[0, 1, 3]] if task == "ForMultipleChoice" else b.logits[[0, 1, 3]])
    for p, q in zip(a.hidden_states, b.hidden_states, strict=True):
        close(p, q, real.view(p.shape[:2]))


CASES = [(t, "v3") for t in TASKS] + [("Model", v) for v in VARIANTS if v != "v3"] + \
        [("ForMaskedLM", "c2p-factorised"), ("ForMaskedLM", "p2c-own-proj"),
         ("ForSequenceClassification", "v2-clamped")]


@pytest.mark.parametrize("task,variant", CASES)
def test_parity(task, variant, tmp_path):
    hf, fast = save(task, variant, tmp_path)
    assert type(fast).__name__ == "DebertaV2" + task
    x = inputs(hf.config, seq=SEQ if task != "ForMultipleChoice" else 20)
    real = x["attention_mask"].bool()
    if task == "ForMultipleChoice":
        x = {k: v.view(2, 2, -1) for k, v in x.items()}
    labels = labels_for(task, hf.config, x, torch.Generator().manual_seed(2)) if "Question" not in task else {}
    with torch.no_grad():
        compare(task, hf(**x, **labels, output_hidden_states=True), fast(**x, **labels, output_hidden_states=True),
                real)
    type(fast).from_hf_config(hf.config).load_state_dict(hf.state_dict(), strict=True)
    hf.load_state_dict(fast.state_dict(), strict=True)


def test_sequence_classification_loss_as_transformers(tmp_path):
    """problem_type unset: transformers' DeBERTa filters labels < 0 and does not store a problem type."""
    hf, fast = save("ForSequenceClassification", "v2-clamped", tmp_path)
    x = {k: v[[0, 1, 3]] for k, v in inputs(hf.config).items()}
    for labels in (torch.tensor([2, -1, 0]), torch.softmax(torch.randn(3, 3), -1)):
        with torch.no_grad():
            close(hf(**x, labels=labels).loss, fast(**x, labels=labels).loss)
    assert fast.config.problem_type is None


@pytest.mark.parametrize("variant", ["v3", "v2-clamped"])
def test_attentions_and_relative_terms_matter(variant, tmp_path):
    hf, fast = save("Model", variant, tmp_path)
    x = inputs(hf.config)
    real = x["attention_mask"].bool()
    with torch.no_grad():
        a, b = hf(**x, output_attentions=True), fast(**x, output_attentions=True)
        for p, q in zip(a.attentions, b.attentions, strict=True):
            close(p.transpose(1, 2)[real], q.transpose(1, 2)[real])
        fast.encoder.rel_embeddings.weight.normal_()          # the position terms are not a no-op
        c = fast(**x).last_hidden_state
    assert (c - b.last_hidden_state)[real].abs().max() > 1e-2


@pytest.mark.parametrize("variant", ["v3", "v2-clamped"])
def test_forward_packed_per_sequence(variant, tmp_path):
    hf, fast = save("Model", variant, tmp_path)
    x = inputs(hf.config)
    real = x["attention_mask"].bool()
    cu = torch.nn.functional.pad(real.sum(1).cumsum(0), (1, 0)).int()
    tt = x["token_type_ids"][real] if "token_type_ids" in x else None
    fast.check_packed(x["input_ids"][real], cu, SEQ, tt)
    with torch.no_grad():
        packed = fast.forward_packed(x["input_ids"][real], cu, SEQ, tt).last_hidden_state
        ref = hf(**x).last_hidden_state[real]
    close(ref, packed)


def test_training_gradients_match(tmp_path):
    hf, fast = save("ForTokenClassification", "v3", tmp_path)
    hf.train(), fast.train()
    x = inputs(hf.config)
    labels = labels_for("ForTokenClassification", hf.config, x, torch.Generator().manual_seed(3))
    a, b = hf(**x, **labels), fast(**x, **labels)
    close(a.loss, b.loss)
    a.loss.backward(), b.loss.backward()
    params_a, params_b = dict(hf.named_parameters()), dict(fast.named_parameters())
    for name in ("deberta.encoder.rel_embeddings.weight", "deberta.encoder.LayerNorm.weight",
                 "deberta.encoder.layer.0.attention.self.query_proj.weight",
                 "deberta.encoder.layer.1.attention.self.key_proj.bias",
                 "deberta.encoder.layer.1.output.dense.weight", "deberta.embeddings.word_embeddings.weight"):
        ga, gb = params_a[name].grad, params_b[name].grad
        assert ga.abs().max() > 0
        close(ga, gb, atol=1e-5)


@pytest.mark.parametrize("variant", ["v3", "c2p-factorised", "no-terms"])
def test_optimize_transformers_model(variant):
    check_optimize(T.DebertaV2ForSequenceClassification, config(variant))


def check_optimize(cls, cfg):
    """fastbert.optimize of a random transformers `cls(cfg)` keeps its logits and last hidden states."""
    torch.manual_seed(0)
    model = cls(cfg).eval()
    x = {k: v[[0, 1, 3]] for k, v in inputs(cfg).items()}
    with torch.no_grad():
        ref = model(**x, output_hidden_states=True)
    assert fastbert.optimize(model) is model and "_fastbert_encoder" in model.deberta.__dict__
    with torch.no_grad():
        got = model(**x, output_hidden_states=True)
    close(ref.logits, got.logits)
    close(ref.hidden_states[-1], got.hidden_states[-1], x["attention_mask"])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cpu_autocast_inference(dtype, tmp_path):
    """Inference under CPU autocast (no autograd: the banded c2p + p2c path, whose products come out
    in the autocast dtype) runs, fastbert's model and an optimized transformers one, and is no further
    from fp32 than transformers under the same autocast (3x)."""
    hf, fast = save("Model", "v3", tmp_path)
    x = {k: v[[0, 1, 3]] for k, v in inputs(hf.config).items()}
    real = x["attention_mask"].bool()
    with torch.no_grad():
        want = hf(**x).last_hidden_state[real]
        with torch.autocast("cpu", dtype=dtype):
            theirs = hf(**x).last_hidden_state[real].float()
            ours = fast(**x).last_hidden_state[real].float()
            fastbert.optimize(hf)
            optimized = hf(**x).last_hidden_state[real].float()
    bound = 3 * (theirs - want).abs().max() + 1e-5
    for got in (ours, optimized):
        assert torch.isfinite(got).all()
        assert (got - want).abs().max() <= bound


@pytest.mark.parametrize("setting,match", [
    (dict(conv_kernel_size=3), "conv_kernel_size=3"),
    (dict(attention_head_size=16), "attention_head_size=16"),
    (dict(pos_att_type=["c2p", "p2p"]), "p2p"),
    (dict(norm_rel_ebd="batch_norm"), "norm_rel_ebd"),
    (dict(legacy=False, embedding_size=24), "legacy=False"),
])
def test_unsupported_settings_are_named(setting, match):
    with pytest.raises(ConfigError, match=match):
        fastbert.DebertaV2Model(config("v3", **setting))
    with pytest.raises(ConfigError, match=match):
        fastbert.optimize(T.DebertaV2Model(config("v3", **setting)))


def test_log_buckets_and_op_on_packed_sequences():
    rel = torch.arange(-40, 41)
    bucketed = R.deberta_log_bucket(rel, 8, 20)
    assert torch.equal(bucketed[36:45], rel[36:45])              # exact for |r| <= mid
    assert torch.equal(bucketed, -bucketed.flip(0)) and (bucketed[40:].diff() >= 0).all()  # odd, monotone
    assert bucketed[-1] == 9 and bucketed[40 + 20] == 8        # log-spaced past mid, not saturated
    g = torch.Generator().manual_seed(0)
    lengths, h, d, span = [5, 0, 30, 1], 2, 8, 6
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    n = sum(lengths)
    q, k, v = (torch.randn(n, h, d, generator=g, dtype=torch.float64) for _ in range(3))
    pk, pq = (torch.randn(2 * span, h, d, generator=g, dtype=torch.float64) for _ in range(2))
    out = R.disentangled_attention(q, k, v, cu, 30, fastbert.ops.varlen.packed_positions(cu, n), pk, pq, span=span,
                                   scale_factor=3)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e == s:
            continue
        i = torch.arange(e - s)
        c = torch.clamp(i[:, None] - i[None, :] + span, 0, 2 * span - 1)     # (query, key) -> row of 2 span
        qs, ks = q[s:e], k[s:e]
        scores = (torch.einsum("ihd,jhd->hij", qs, ks) + torch.einsum("ihd,ijhd->hij", qs, pk[c])
                  + torch.einsum("jhd,ijhd->hij", ks, pq[c])) / (3 * d) ** 0.5
        ref = torch.einsum("hij,jhd->ihd", torch.softmax(scores, -1), v[s:e])
        assert (out[s:e] - ref).abs().max() < 1e-12
    with pytest.raises(ValueError, match="float64"):   # the kernel takes fp16 / bf16 / fp32
        R.disentangled_attention(q, k, v, cu, 30, fastbert.ops.varlen.packed_positions(cu, n), pk, pq, span=span,
                                 backend="triton")


def test_forward_packed_compiles_without_graph_breaks():
    """No device value is read in forward_packed (c2p/p2c included), so fullgraph tracing succeeds."""
    torch.manual_seed(0)
    m = fastbert.DebertaV2Model.from_hf_config(config("v3", num_hidden_layers=1), backend="torch").eval()
    ids, cu = torch.randint(3, 99, (12,)), torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    ref = m.forward_packed(ids, cu, 7).last_hidden_state
    got = torch.compile(lambda i, c: m.forward_packed(i, c, 7).last_hidden_state, fullgraph=True)(ids, cu)
    close(ref.detach(), got.detach(), atol=1e-5)   # with autograd on (the no-grad QKV cache is layers.py's)
