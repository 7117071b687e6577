"""MPNet against transformers on tiny random checkpoints saved here: every head, padded batches with
a fully padded row and rows longer than the bias' bucket span (distances past 128 share the last
bucket), forward_packed, training gradients, strict loading, fastbert.optimize (also inside a
SentenceTransformer) and the bias op itself. MPNet's tokenizer: tests/tokenizer/test_tokenizer_mpnet.py."""
import pytest
import torch
import transformers as T

import fastbert
from fastbert.models.config import ConfigError
from fastbert.ops import relative_attention as R
from test_models import close, labels_for

TASKS = ["Model", "ForMaskedLM", "ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering",
         "ForMultipleChoice"]
SEQ = 150   # > 128: the longest rows reach past the last distance bucket


def config(**extra):
    kw = dict(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
              max_position_embeddings=SEQ + 2, num_labels=3, hidden_dropout_prob=0.0,
              attention_probs_dropout_prob=0.0)
    return T.MPNetConfig(**dict(kw, **extra))


def save(task, path, **extra):
    torch.manual_seed(0)
    model = getattr(T, "MPNet" + task)(config(**dict(dict(num_labels=2) if "Question" in task else {}, **extra)))
    with torch.no_grad():   # a bias table and norms large enough that wrong wiring shows
        model.base_model.encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
        for name, p in model.named_parameters():
            if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(path)
    hf = getattr(T, "MPNet" + task).from_pretrained(path, attn_implementation="eager").eval()
    fast = getattr(fastbert, "AutoModel" + ("" if task == "Model" else task)).from_pretrained(path)
    return hf, fast


def inputs(batch=4, seq=SEQ, seed=1):
    """Row 0 full length, row 1 two tokens, row 2 fully padded, row 3 random; pad id 1."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 99, (batch, seq), generator=g)
    lengths = torch.tensor([seq, 2, 0, int(torch.randint(3, seq, (1,), generator=g))])[:batch]
    mask = (torch.arange(seq)[None] < lengths[:, None]).long()
    ids[mask == 0] = 1
    return {"input_ids": ids, "attention_mask": mask}


@pytest.mark.parametrize("task", TASKS)
def test_parity_every_head(task, tmp_path):
    hf, fast = save(task, tmp_path)
    assert type(fast).__name__ == "MPNet" + task
    x = inputs(seq=SEQ if task != "ForMultipleChoice" else 40)
    mask = x["attention_mask"]
    if task == "ForMultipleChoice":
        x = {k: v.view(2, 2, -1) for k, v in x.items()}
    labels = labels_for(task, hf.config, x, torch.Generator().manual_seed(2)) if "Question" not in task else {}
    with torch.no_grad():
        a = hf(**x, **labels, output_hidden_states=True)
        b = fast(**x, **labels, output_hidden_states=True)
    real = mask.bool()
    if task == "Model":
        close(a.last_hidden_state, b.last_hidden_state, real)
        close(a.pooler_output[[0, 1, 3]], b.pooler_output[[0, 1, 3]])
    elif task == "ForQuestionAnswering":
        close(a.start_logits, b.start_logits, real)
        close(a.end_logits, b.end_logits, real)
    elif task in ("ForMaskedLM", "ForTokenClassification"):
        close(a.logits, b.logits, real)
    elif task == "ForSequenceClassification":
        close(a.logits[[0, 1, 3]], b.logits[[0, 1, 3]])
    else:
        close(a.logits.view(-1)[[0, 1, 3]], b.logits.view(-1)[[0, 1, 3]])   # choice 2 is all padding
    if task in ("ForMaskedLM", "ForTokenClassification"):   # labels -100 at padding; the pooled
        close(a.loss, b.loss)                                # heads' losses include the all-padding row
    for p, q in zip(a.hidden_states, b.hidden_states):
        close(p, q, real.view(p.shape[:2]))
    # strict both ways
    type(fast).from_hf_config(hf.config).load_state_dict(hf.state_dict(), strict=True)
    hf.load_state_dict(fast.state_dict(), strict=True)


def test_attentions_and_bias_matters(tmp_path):
    hf, fast = save("Model", tmp_path)
    x = inputs(seq=40)
    real = x["attention_mask"].bool()
    with torch.no_grad():
        a, b = hf(**x, output_attentions=True), fast(**x, output_attentions=True)
        assert len(a.attentions) == len(b.attentions) == 2
        for p, q in zip(a.attentions, b.attentions):
            close(p.transpose(1, 2)[real], q.transpose(1, 2)[real])
        fast.encoder.relative_attention_bias.weight.zero_()   # the bias is not a no-op
        c = fast(**x).last_hidden_state
    assert (c - b.last_hidden_state)[real].abs().max() > 1e-2


def test_forward_packed_per_sequence(tmp_path):
    hf, fast = save("Model", tmp_path)
    x = inputs()
    lengths = x["attention_mask"].sum(1)
    real = x["attention_mask"].bool()
    ids = x["input_ids"][real]
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).int()
    fast.check_packed(ids, cu, SEQ)
    with torch.no_grad():
        packed = fast.forward_packed(ids, cu, SEQ).last_hidden_state
        ref = hf(**x).last_hidden_state[real]
    close(ref, packed)


def test_training_gradients_match(tmp_path):
    hf, fast = save("ForMaskedLM", tmp_path)
    hf.train(), fast.train()
    x = inputs(seq=140)
    labels = labels_for("ForMaskedLM", hf.config, x, torch.Generator().manual_seed(3))
    a, b = hf(**x, **labels), fast(**x, **labels)
    close(a.loss, b.loss)
    a.loss.backward(), b.loss.backward()
    params_a, params_b = dict(hf.named_parameters()), dict(fast.named_parameters())
    for name in ("mpnet.encoder.relative_attention_bias.weight", "mpnet.encoder.layer.0.attention.attn.q.weight",
                 "mpnet.encoder.layer.1.attention.attn.k.bias", "mpnet.encoder.layer.1.output.dense.weight",
                 "mpnet.embeddings.word_embeddings.weight", "lm_head.dense.weight"):
        ga, gb = params_a[name].grad, params_b[name].grad
        assert ga.abs().max() > 0
        close(ga, gb, atol=1e-5)


def test_optimize_transformers_and_sentence_transformer(tmp_path):
    hf, _ = save("Model", tmp_path)
    x = inputs(seq=60)
    real = x["attention_mask"].bool()
    with torch.no_grad():
        ref = hf(**x).last_hidden_state
    assert fastbert.optimize(hf) is hf and "_fastbert_encoder" in hf.__dict__
    with torch.no_grad():
        close(ref, hf(**x).last_hidden_state, real)
    st = pytest.importorskip("sentence_transformers")
    modules = pytest.importorskip("sentence_transformers.base.modules", reason="needs sentence-transformers >= 6")
    from sentence_transformers.sentence_transformer.modules import Pooling
    tok = T.MPNetTokenizerFast(vocab={t: i for i, t in enumerate(["<s>", "<pad>", "</s>", "[UNK]", "<mask>"] +
                                                                   [f"w{i}" for i in range(94)])})
    tok.save_pretrained(tmp_path)

    def build():
        return st.SentenceTransformer(modules=[modules.Transformer(str(tmp_path)), Pooling(32, "mean")],
                                      device="cpu")

    model, plain = build(), build()
    texts = ["w1 w2 w3", "w5 " * 140, "w7", "w2 w9 w11 w4"]
    expected = plain.encode(texts, convert_to_tensor=True)
    assert fastbert.optimize(model) is model and "_fastbert_encoder" in model[0].auto_model.__dict__
    close(expected, model.encode(texts, convert_to_tensor=True))
    # fastbert.Encoder on the same directory (packed path, fastbert's tokenizer): mean pooling by default
    close(expected, torch.as_tensor(fastbert.Encoder.from_pretrained(str(tmp_path)).encode(texts)))


def test_config_refusal_names_the_setting():
    with pytest.raises(ConfigError, match="relative_attention_num_buckets=8"):
        fastbert.MPNetModel(config(relative_attention_num_buckets=8))
    # why: transformers indexes 32 buckets whatever the table holds, and fails on a smaller one
    with pytest.raises(IndexError):
        T.MPNetModel(config(relative_attention_num_buckets=8))(torch.tensor([[0, 5, 6, 2]]))


def test_bias_op_packed_equals_per_sequence_padded():
    g = torch.Generator().manual_seed(0)
    lengths = [5, 0, 140, 1]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    n, h, d = sum(lengths), 3, 8
    q, k, v = (torch.randn(n, h, d, generator=g, dtype=torch.float64) for _ in range(3))
    table = torch.randn(32, h, generator=g, dtype=torch.float64)
    positions = fastbert.ops.varlen.packed_positions(cu, n)
    out = R.relative_bias_attention(q, k, v, cu, 140, positions, table)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        if e == s:
            continue
        # one sequence alone, bias from the bucket of each (key - query) distance
        qs, ks, vs = q[s:e], k[s:e], v[s:e]
        scores = torch.einsum("ihd,jhd->hij", qs, ks) / d ** 0.5
        idx = torch.arange(e - s)
        bucket = R.mpnet_bucket(idx[None, :] - idx[:, None])
        ref = torch.einsum("hij,jhd->ihd", torch.softmax(scores + table[bucket].permute(2, 0, 1), -1), vs)
        assert (out[s:e] - ref).abs().max() < 1e-12
    # buckets: exact below 8, log-spaced to 128, saturated beyond; keys after the query use the upper half
    rel = torch.tensor([0, -1, -7, -8, -127, -128, -1000, 1, 7, 1000])
    assert R.mpnet_bucket(rel).tolist() == [0, 1, 7, 8, 15, 15, 15, 17, 23, 31]
    with pytest.raises(ValueError, match="float64"):   # the kernel takes fp16 / bf16 / fp32
        R.relative_bias_attention(q, k, v, cu, 140, positions, table, backend="triton")


def test_forward_packed_compiles_without_graph_breaks():
    """No device value is read in forward_packed (bias included), so fullgraph tracing succeeds."""
    torch.manual_seed(0)
    m = fastbert.MPNetModel.from_hf_config(config(num_hidden_layers=1), backend="torch").eval()
    ids, cu = torch.randint(3, 99, (12,)), torch.tensor([0, 5, 5, 12], dtype=torch.int32)
    ref = m.forward_packed(ids, cu, 7).last_hidden_state
    got = torch.compile(lambda i, c: m.forward_packed(i, c, 7).last_hidden_state, fullgraph=True)(ids, cu)
    close(ref.detach(), got.detach(), atol=1e-5)   # with autograd on (the no-grad QKV cache is layers.py's)
