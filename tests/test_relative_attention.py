"""Relative-position attention (MPNet's bucketed bias, DeBERTa's c2p / p2c): the Triton kernel (the
interpreter on CPU, compiled on a GPU) and the blocked torch path against the plain fp64 reference
that materialises (batch, heads, L, L), forward and backward; the custom ops under opcheck.

Sequences of lengths 29 (prime, longer than every relative span here), 0 (a fully padded / empty
row), 1 and 13; small spans (DeBERTa span 8 with log buckets, MPNet max_distance 10) so distances
saturate inside a row."""
import pytest
import torch

from fastbert.ops import relative_attention as R
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


def _inputs(lengths=LENGTHS, positions=None, seed=0):
    """fp64 leaves: q, k, v (tokens, heads, d), pos_key / pos_query (2 span, heads, d), table (32, heads)."""
    g = torch.Generator().manual_seed(seed)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = int(cu[-1])
    if positions is None:
        positions = torch.cat([torch.arange(n) for n in lengths])
    t = {name: torch.randn(*shape, generator=g, dtype=torch.float64)
         for name, shape in (("q", (total, HEADS, HEAD_DIM)), ("k", (total, HEADS, HEAD_DIM)),
                             ("v", (total, HEADS, HEAD_DIM)), ("pk", (2 * SPAN, HEADS, HEAD_DIM)),
                             ("pq", (2 * SPAN, HEADS, HEAD_DIM)), ("table", (32, HEADS)))}
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
    fn, oracle, opts, names = VARIANTS[variant]
    t, cu, L, positions = _inputs()
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


def test_dropout_runs_the_torch_path_and_drops():
    """The kernel has no dropout: dropout_p > 0 runs the blocked torch path (backend="triton" too)."""
    t, cu, L, positions = _inputs()
    args = (t["q"].float(), t["k"].float(), t["v"].float(), cu, L, positions)
    keep = R.disentangled_attention(*args, t["pk"].float(), None, span=SPAN, backend="triton")
    torch.manual_seed(0)
    dropped = R.disentangled_attention(*args, t["pk"].float(), None, span=SPAN, dropout_p=0.5, backend="triton")
    assert dropped.shape == keep.shape and not torch.allclose(dropped, keep)


def test_bad_input_is_a_clear_error():
    t, cu, L, positions = _inputs()
    with pytest.raises(ValueError, match="table must be"):
        R.relative_bias_attention(t["q"], t["k"], t["v"], cu, L, positions, t["table"][:, :1])
    with pytest.raises(ValueError, match="pos_key must be"):
        R.disentangled_attention(t["q"], t["k"], t["v"], cu, L, positions, t["pk"][:3], span=SPAN)
    with pytest.raises(ValueError, match="positions must be"):
        R.disentangled_attention(t["q"], t["k"], t["v"], cu, L, positions[:3], span=SPAN)


def test_opcheck(device):
    """Schema, fake kernels, autograd registration of fastbert::relative_attention and its backward."""
    t, cu, L, positions = _inputs(lengths=(5, 0, 3))
    f32 = {n: x.float().to(device) for n, x in t.items()}
    q, k, v = (f32[n].requires_grad_() for n in ("q", "k", "v"))
    lut, radius = R.deberta_lut(SPAN, SPAN, 20, device)
    c2p = torch.matmul(f32["q"].transpose(0, 1), f32["pk"].permute(1, 2, 0)).transpose(0, 1).requires_grad_()
    p2c = torch.matmul(f32["k"].transpose(0, 1), f32["pq"].permute(1, 2, 0)).transpose(0, 1)
    bias = torch.randn(2 * radius + 1, HEADS, device=device, requires_grad=True)
    interpret = device.type == "cpu"
    args = (q, k, v, cu.to(device), L, positions.to(device, torch.int32), c2p, p2c.detach(), lut, bias, radius,
            0.3, interpret)
    utils = ("test_schema", "test_autograd_registration", "test_faketensor") + (() if interpret else
                                                                                 ("test_aot_dispatch_dynamic",))
    torch.library.opcheck(torch.ops.fastbert.relative_attention.default, args, test_utils=utils)
    out, lse = torch.ops.fastbert.relative_attention(*args)
    torch.library.opcheck(torch.ops.fastbert.relative_attention_backward.default,
                          (torch.randn_like(out), q.detach(), k.detach(), v.detach(), out.detach(), lse,
                           *args[3:6], c2p.detach(), None, lut, None, radius, 0.3, interpret), test_utils=utils)


# ---- End to end: tiny MPNet and DeBERTa-v3-style models on backend="triton" against transformers -------
TINY = dict(vocab_size=67, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40,
            max_position_embeddings=40, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
FAMILIES = {   # family -> (config, model class, parameters whose gradients are compared)
    "mpnet": (lambda T: T.MPNetConfig(**TINY, pad_token_id=1), "MPNetModel",
              ("encoder.layer.0.attention.attn.q.weight", "encoder.relative_attention_bias.weight",
               "encoder.layer.0.intermediate.dense.bias", "embeddings.word_embeddings.weight")),
    "deberta-v2": (lambda T: T.DebertaV2Config(**TINY, pad_token_id=0, type_vocab_size=0, relative_attention=True,
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
