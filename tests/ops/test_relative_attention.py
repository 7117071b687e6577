"""Relative-position attention (MPNet's bucketed bias, DeBERTa's c2p / p2c): the Triton kernel (the
interpreter on CPU, compiled on a GPU) and the blocked torch path against the plain fp64 reference
that materialises (batch, heads, L, L), forward and backward; the custom ops under opcheck.

Sequences of lengths 29 (prime, longer than every relative span here), 0 (a fully padded / empty
row), 1 and 13; small spans (DeBERTa span 8 with log buckets, MPNet max_distance 10) so distances
saturate inside a row."""
import pytest
import torch

from fastbert.ops import relative_attention as R
from fastbert.ops import varlen_attention
from test_attention import _one_hot_v, _recover_keep, _repad
from test_backend import kernel_launches, match_transformers, padded_batch  # noqa: F401  (a fixture: the kernels that ran)

HEADS, HEAD_DIM, SPAN = 2, 16, 8
LENGTHS = (29, 0, 1, 13)
# variant -> (op, oracle, options, which of pos_key / pos_query / table it takes)
VARIANTS = {
    "deberta-log-buckets": (R.disentangled_attention, R.disentangled_attention_ref,
                            dict(span=SPAN, position_buckets=SPAN, max_relative_positions=20), ("pk", "pq")),
    "deberta-plain": (R.disentangled_attention, R.disentangled_attention_ref, dict(span=SPAN), ("pk", "pq")),
    "deberta-c2p-scale3": (R.disentangled_attention, R.disentangled_attention_ref,
                           dict(span=SPAN, scale_factor=3), ("pk",)),
    "deberta-p2c": (R.disentangled_attention, R.disentangled_attention_ref, dict(span=SPAN), (None, "pq")),
    "mpnet": (R.relative_bias_attention, R.relative_bias_attention_ref, dict(num_buckets=32, max_distance=10),
              ("table",)),
}


def _inputs(lengths=LENGTHS, positions=None, seed=0, head_dim=HEAD_DIM):
    """fp64 leaves: q, k, v (tokens, heads, d), pos_key / pos_query (2 span, heads, d), table (32, heads)."""
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    if positions is None:
        positions = torch.cat([torch.arange(n) for n in lengths])
    t = {name: torch.randn(*shape, generator=g, dtype=torch.float64)
         for name, shape in (("q", (total, HEADS, head_dim)), ("k", (total, HEADS, head_dim)),
                             ("v", (total, HEADS, head_dim)), ("pk", (2 * SPAN, HEADS, head_dim)),
                             ("pq", (2 * SPAN, HEADS, head_dim)), ("table", (32, HEADS)))}
    return t, cu, max(lengths), positions


def _run(fn, t, names, cu, L, positions, dtype, **kwargs):
    """fn on copies of t in dtype: (out, grads of q, k, v and the position inputs in `names`)."""
    leaves = {n: x.detach().to(dtype).requires_grad_() for n, x in t.items()}
    extra = [leaves[n] if n is not None else None for n in names]
    out = fn(leaves["q"], leaves["k"], leaves["v"], cu, L, positions, *extra, **kwargs)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    wrt = [leaves["q"], leaves["k"], leaves["v"]] + [x for x in extra if x is not None]
    grads = torch.autograd.grad(out, wrt, dout.to(dtype))
    return [out.double()] + [g.double() for g in grads]


CASES = [(v, torch.float32) for v in VARIANTS] + [(v, dt) for v in ("deberta-log-buckets", "mpnet")
                                                 for dt in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("variant, dtype", CASES, ids=[f"{v}-{str(dt)[6:]}" for v, dt in CASES])
def test_kernel_matches_fp64_reference(variant, dtype, device):
    if dtype == torch.bfloat16 and device.type == "cpu":
        pytest.skip("bf16 tl.dot is wrong under Triton's interpreter (triton-lang/triton#11584); GPU only")
    _check_kernel(variant, dtype, device)


@pytest.mark.parametrize("variant", ["deberta-log-buckets", "mpnet"])
def test_kernel_matches_fp64_reference_fp32_head_dim_80(variant, device):
    """fp32 at head_dim 80 (a 128-wide head block, masked): the backward takes the head dimension in two
    64-wide halves there (tiles, accumulators and products over it)."""
    _check_kernel(variant, torch.float32, device, head_dim=80)


def _check_kernel(variant, dtype, device, head_dim=HEAD_DIM):
    """The kernel (backend="triton") against the fp64 reference: out and every gradient."""
    fn, oracle, opts, names = VARIANTS[variant]
    t, cu, L, positions = _inputs(head_dim=head_dim)
    t = {n: x.to(device) for n, x in t.items()}
    cu, positions = cu.to(device), positions.to(device)
    want = _run(oracle, t, names, cu, L, positions, torch.float64, **opts)
    got = _run(fn, t, names, cu, L, positions, dtype, backend="triton", **opts)
    plain = _run(oracle, t, names, cu, L, positions, dtype, **opts)   # plain torch in the same dtype
    labels = ["out", "dq", "dk", "dv"] + [n for n in names if n is not None]
    for label, g, w, p in zip(labels, got, want, plain):
        err, base = (g - w).abs().max().item(), (p - w).abs().max().item()
        bound = 1e-5 * max(1.0, w.abs().max().item()) if dtype == torch.float32 else 2 * base + 2e-3
        assert err <= bound, f"{variant} {dtype} {label}: error {err:.2e} > {bound:.2e} (plain torch {base:.2e})"


@pytest.mark.parametrize("variant", ["deberta-log-buckets", "deberta-p2c", "mpnet"])
def test_blocked_torch_path_equals_reference(variant, monkeypatch):
    """The CPU path, forced into 16-row query blocks, equals the plain reference (fp64), with padded-column
    positions that have holes (as on a padded batch with a mask with holes)."""
    monkeypatch.setattr(R, "BLOCK_BUDGET", 16 * HEADS * 29 * len(LENGTHS))
    fn, oracle, opts, names = VARIANTS[variant]
    positions = torch.cat([torch.arange(29) * 2, torch.arange(0), torch.tensor([3]), torch.arange(13) + 5])
    t, cu, L, positions = _inputs(positions=positions)
    got = _run(fn, t, names, cu, L, positions, torch.float64, backend="torch", **opts)
    want = _run(oracle, t, names, cu, L, positions, torch.float64, **opts)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("variant", ["deberta-log-buckets", "deberta-plain"])
def test_banded_fast_path_equals_reference(variant, monkeypatch):
    """Inference with default positions takes the banded path (saturated columns as broadcast sums, only the
    band gathered); in 16-row blocks over sequences longer than the span (a padded batch of 70 and 29 tokens)
    it equals the plain fp64 reference."""
    monkeypatch.setattr(R, "BLOCK_BUDGET", 16 * HEADS * 70 * 2)
    calls = []
    banded = R._banded_terms
    monkeypatch.setattr(R, "_banded_terms", lambda *a: calls.append(a[-1]) or banded(*a))
    fn, oracle, opts, _ = VARIANTS[variant]
    t, cu, L, positions = _inputs(lengths=(70, 29))
    with torch.no_grad():
        got = fn(t["q"], t["k"], t["v"], cu, L, positions, t["pk"], t["pq"], backend="torch", **opts)
        want = oracle(t["q"], t["k"], t["v"], cu, L, positions, t["pk"], t["pq"], **opts)
    assert calls == list(range(0, 70, 16))
    torch.testing.assert_close(got, want, atol=1e-10, rtol=1e-10)


# ---- Attention dropout in the kernel (as fastbert.kernels.attention: a Philox mask from a seed tensor) ------
P = 0.3
DROP_LENGTHS = (13, 0, 1, 9)   # max length <= HEAD_DIM: a one-hot v reads the mask back; 13 > the spans


def _dropout_inputs(device, head_dim=HEAD_DIM):
    t, cu, L, positions = _inputs(DROP_LENGTHS, head_dim=head_dim)
    return {n: x.to(device) for n, x in t.items()}, cu.to(device), L, positions.to(device)


def _one_hot_run(fn, t, names, cu, L, positions, dropout_p, seed=11, **opts):
    """fn with v[token at offset j] = e_j in fp32 after torch.manual_seed(seed): (out padded to
    (batch, L, heads, d): row i holds the dropped probabilities of row i, key mask (batch, L))."""
    lengths = (cu[1:] - cu[:-1]).tolist()
    mask = _repad(t["q"], lengths, L)[1].bool()
    v = _one_hot_v(len(lengths), L, HEADS, t["q"].shape[-1]).to(cu.device)[mask]
    extra = [t[n].float() if n is not None else None for n in names]
    torch.manual_seed(seed)
    out = fn(t["q"].float(), t["k"].float(), v, cu, L, positions, *extra, dropout_p=dropout_p, **opts)
    return _repad(out, lengths, L)[0], mask


def test_dropout_keep_rate_scaling_and_empty_rows(device):
    """Kept probabilities are scaled by exactly 1/(1-p), dropped ones are 0, the keep rate is 1-p over the real
    (query, key) pairs; a one-token row keeps its one key (out = v/(1-p)) or drops it (0, XSoftmax's row
    semantics); an empty sequence writes nothing and disturbs no other row."""
    fn, oracle, opts, names = VARIANTS["deberta-log-buckets"]
    t, cu, L, positions = _dropout_inputs(device)
    out, mask = _one_hot_run(fn, t, names, cu, L, positions, P, backend="triton", **opts)
    probs, _ = _one_hot_run(oracle, t, names, cu, L, positions, 0.0, **opts)    # undropped, fp32 reference
    assert torch.isfinite(out).all()
    keep = _recover_keep(out, L)                                           # (batch, heads, L, L)
    real = (mask[:, None, :, None] & mask[:, None, None, :]).expand_as(keep)
    rate, n = keep[real].float().mean().item(), int(real.sum())
    assert abs(rate - (1 - P)) < 4 * (P * (1 - P) / n) ** 0.5, f"keep rate {rate:.3f} for p={P} over {n} pairs"
    torch.testing.assert_close(out * (1 - P), probs * (out != 0), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(out[2, 0, :, 0], keep[2, :, 0, 0].float() / (1 - P))   # one-token row, per head


def test_dropout_zero_and_the_seed(device):
    """dropout_p=0 is the no-dropout call; torch.manual_seed reproduces a mask, another seed changes it; with
    no position term the mask is varlen_attention's for the same seed (one Philox scheme for both kernels)."""
    fn, _, opts, names = VARIANTS["mpnet"]
    t, cu, L, positions = _dropout_inputs(device)
    q, k, v = (t[n].float() for n in ("q", "k", "v"))

    def run(seed, p=P, table=t["table"].float()):
        torch.manual_seed(seed)
        return fn(q, k, v, cu, L, positions, table, dropout_p=p, backend="triton", **opts)
    assert torch.equal(run(0, p=0.0), fn(q, k, v, cu, L, positions, t["table"].float(), backend="triton", **opts))
    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))
    zero_bias = run(5, table=torch.zeros_like(t["table"]).float())
    torch.manual_seed(5)
    plain = varlen_attention(q, k, v, cu, L, backend="triton", dropout_p=P)
    torch.testing.assert_close(zero_bias, plain, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("variant, head_dim", [("deberta-log-buckets", HEAD_DIM), ("mpnet", HEAD_DIM),
                                               ("deberta-log-buckets", 80)])
def test_dropout_backward_uses_the_forward_mask(variant, head_dim, device):
    """The kernel's mask for a seed, read back with a one-hot v, replayed in the fp64 reference: output and
    the gradients of q, k, v and the position inputs (pos_key / pos_query, the table) agree. The backward's
    query pass draws the mask and writes it as bits that its key pass reads (dk, dv, dpos_query), so a bit
    out of place fails here; head_dim 80 runs the two-halves path."""
    fn, oracle, opts, names = VARIANTS[variant]
    t, cu, L, positions = _dropout_inputs(device, head_dim)
    keep = _recover_keep(_one_hot_run(fn, t, names, cu, L, positions, P, seed=11, backend="triton", **opts)[0], L)
    torch.manual_seed(11)
    got = _run(fn, t, names, cu, L, positions, torch.float32, backend="triton", dropout_p=P, **opts)
    want = _run(oracle, t, names, cu, L, positions, torch.float64, dropout_p=P, _drop_keep=keep, **opts)
    labels = ["out", "dq", "dk", "dv"] + [n for n in names if n is not None]
    for label, g, w in zip(labels, got, want):
        err, bound = (g - w).abs().max().item(), 1e-5 * max(1.0, w.abs().max().item())
        assert err <= bound, f"{variant} {label}: error {err:.2e} > {bound:.2e}"


def test_bad_input_is_a_clear_error():
    t, cu, L, positions = _inputs()
    with pytest.raises(ValueError, match="table must be"):
        R.relative_bias_attention(t["q"], t["k"], t["v"], cu, L, positions, t["table"][:, :1])
    with pytest.raises(ValueError, match="pos_key must be"):
        R.disentangled_attention(t["q"], t["k"], t["v"], cu, L, positions, t["pk"][:3], span=SPAN)
    with pytest.raises(ValueError, match="positions must be"):
        R.disentangled_attention(t["q"], t["k"], t["v"], cu, L, positions[:3], span=SPAN)


@pytest.mark.parametrize("family", ["mpnet", "deberta-v2"])
def test_models_hold_their_distance_tables(family, monkeypatch):
    """The distance table is built once, with the model (also on the meta device, as from_pretrained builds),
    and held by it: forwards build none and pass the model's table to the op; the ops module keeps none, so
    a call without a table builds its own. A table for another device is refused by name."""
    import transformers as T

    import fastbert
    make_config, cls, _ = FAMILIES[family]
    builder = "mpnet_distances" if family == "mpnet" else "deberta_lut"
    built, passed = [], []
    real_build = getattr(R, builder)
    monkeypatch.setattr(R, builder, lambda *a, **k: built.append(a) or real_build(*a, **k))
    with torch.device("meta"):
        meta = getattr(fastbert, cls).from_hf_config(make_config(T))
    model = getattr(fastbert, cls).from_hf_config(make_config(T), backend="torch").eval()
    assert len(built) == 2
    held = meta.encoder.distances if family == "mpnet" else meta.encoder.spec.distances
    assert not held.on(torch.device("cpu")).index.is_meta                # a meta build still gets a real table
    op = "relative_bias_attention" if family == "mpnet" else "disentangled_attention"
    real_op = getattr(R, op)
    monkeypatch.setattr(R, op, lambda *a, distances=None, **k: passed.append(distances) or real_op(
        *a, distances=distances, **k))
    ids, mask = padded_batch(model.config, seq=12)
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
        model(input_ids=ids, attention_mask=mask)
    assert len(built) == 2 and len(passed) == 2 and passed[0] is passed[1] and passed[0].index.device.type == "cpu"
    t, cu, L, positions = _inputs()
    other = R.DistanceTable(passed[0].index.to("meta"), passed[0].radius)
    args = (t["q"], t["k"], t["v"], cu, L, positions, t["table"] if family == "mpnet" else t["pk"])
    opts = VARIANTS["mpnet" if family == "mpnet" else "deberta-plain"][2]
    real_op(*args, **opts)
    assert len(built) == 3                                               # no module-level memo
    with pytest.raises(ValueError, match="distances must be"):
        real_op(*args, distances=other, **opts)


def test_distance_cache_follows_the_device():
    """One copy per device, made when a call on that device first asks; the CPU original stays."""
    cache = R.DistanceCache(R.mpnet_distances(32, 10))
    cpu = cache.on(torch.device("cpu"))
    assert cache.on(torch.device("cpu")) is cpu
    meta = cache.on(torch.device("meta"))
    assert meta.index.is_meta and meta.radius == cpu.radius and cache.on(torch.device("meta")) is meta
    torch.testing.assert_close(cache.on(torch.device("cpu")).index, cpu.index, rtol=0, atol=0)


def test_opcheck(device):
    """Schema, fake kernels, autograd registration of fastbert::relative_attention and its backward (with
    dropout: a fixed seed tensor, so every rerun draws the same mask)."""
    t, cu, L, positions = _inputs(lengths=(5, 0, 3))
    f32 = {n: x.float().to(device) for n, x in t.items()}
    q, k, v = (f32[n].requires_grad_() for n in ("q", "k", "v"))
    lut, radius = R.deberta_lut(SPAN, SPAN, 20, device)
    c2p = torch.matmul(f32["q"].transpose(0, 1), f32["pk"].permute(1, 2, 0)).transpose(0, 1).requires_grad_()
    p2c = torch.matmul(f32["k"].transpose(0, 1), f32["pq"].permute(1, 2, 0)).transpose(0, 1)
    bias = torch.randn(2 * radius + 1, HEADS, device=device, requires_grad=True)
    interpret = device.type == "cpu"
    seed = torch.tensor([123], dtype=torch.int64, device=device)
    args = (q, k, v, cu.to(device), L, positions.to(device, torch.int32), c2p, p2c.detach(), lut, bias, radius,
            0.3, 0.2, seed, interpret)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor") + (() if interpret else
                                                                                 ("test_aot_dispatch_dynamic",))
    torch.library.opcheck(torch.ops.fastbert.relative_attention.default, args, test_utils=utils)
    out, lse = torch.ops.fastbert.relative_attention(*args)
    torch.library.opcheck(torch.ops.fastbert.relative_attention_backward.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse,
                           *args[3:6], c2p.detach(), None, lut, None, radius, 0.3, 0.2, seed, interpret),
                          test_utils=utils)


# ---- End to end: tiny MPNet and DeBERTa-v3-style models on backend="triton" against transformers -------
TINY = dict(vocab_size=67, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40,
            max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
FAMILIES = {   # family -> (config, model class, parameters whose gradients are compared)
    "mpnet": (lambda T: T.MPNetConfig(**TINY, pad_token_id=1), "MPNetModel",
              ("encoder.layer.0.attention.attn.q.weight", "encoder.relative_attention_bias.weight",
               "encoder.layer.0.intermediate.dense.bias", "embeddings.word_embeddings.weight")),
    # attention dropout configured: eval mode must ignore it (the training test below uses it)
    "deberta-v2": (lambda T: T.DebertaV2Config(**dict(TINY, attention_probs_dropout_prob=0.3), pad_token_id=0,
                                               type_vocab_size=0, relative_attention=True,
                                               pos_att_type=["c2p", "p2c"], position_buckets=4,
                                               max_relative_positions=16, share_att_key=True,
                                               norm_rel_ebd="layer_norm", position_biased_input=False),
                   "DebertaV2Model",
                   ("encoder.layer.0.attention.self.query_proj.weight", "encoder.rel_embeddings.weight",
                    "encoder.LayerNorm.weight", "encoder.layer.0.intermediate.dense.bias")),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_on_the_kernel_matches_transformers(family, tmp_path, kernel_launches):
    """Forward and backward of a whole model with backend="triton" (the relative kernel in the
    interpreter) equal transformers' eager model, with rows longer than the relative span (12 > 4),
    a short row and a fully padded one."""
    import transformers as T

    import fastbert
    make_config, cls, grads = FAMILIES[family]
    torch.manual_seed(0)
    getattr(T, cls)(make_config(T)).save_pretrained(tmp_path)
    hf = getattr(T, cls).from_pretrained(tmp_path, attn_implementation="eager").eval()
    fast = fastbert.AutoModel.from_pretrained(tmp_path, backend="triton")
    match_transformers(hf, fast, *padded_batch(hf.config, seq=12), grads, family)
    for name in ("_relative_attention_fwd_kernel", "_relative_attention_bwd_kernel"):
        assert name in kernel_launches, f"{name} did not run: {sorted(kernel_launches)}"


def test_deberta_attention_dropout_on_the_kernel(device, launches, monkeypatch):
    """DeBERTa-v2 with attention dropout 0.3 (whose eval mode equals transformers' above): train mode runs forward
    and backward on the kernel (the torch path is disabled) and its loss differs from eval's (no other dropout
    is on); gradients are finite. (The op tests above check the mask itself.)"""
    import transformers as T

    import fastbert
    from fastbert.kernels import relative_attention as kernel
    make_config, cls, grads = FAMILIES["deberta-v2"]
    config = make_config(T)
    assert config.attention_probs_dropout_prob == 0.3 and config.hidden_dropout_prob == 0.0
    torch.manual_seed(0)
    fast = fastbert.DebertaV2Model.from_hf_config(config, backend="triton").to(device).eval()
    ids, mask = (t.to(device) for t in padded_batch(config, seq=12))
    monkeypatch.setattr(R, "_blocked", lambda *a, **k: pytest.fail("attention dropout ran the torch path"))
    calls = launches(kernel, "_fwd", "_bwd")
    real = mask.bool()
    weight = torch.randn(*ids.shape, config.hidden_size, generator=torch.Generator().manual_seed(2)).to(device)[real]

    def loss(seed):
        torch.manual_seed(seed)
        return (fast(input_ids=ids, attention_mask=mask).last_hidden_state[real] * weight).sum()
    with torch.no_grad():
        base = loss(0)
    fast.train()
    dropped = loss(1)
    dropped.backward()
    assert abs(dropped.item() - base.item()) > 1e-3 * abs(base.item()), "attention dropout changed nothing"
    for name in grads:
        g = fast.get_parameter(name).grad
        assert g is not None and torch.isfinite(g).all() and g.abs().max() > 0, name
    assert calls["_fwd"] == 2 and calls["_bwd"] == 2, calls          # a forward each; the backward's two passes
