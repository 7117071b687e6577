"""fastbert.ops.attention / varlen_attention: the Triton kernel (interpreter on CPU) vs fp64 references.

Tolerance (flash-attention's rule): the kernel's error against an fp64 reference is at most twice the
error of plain torch computing in the same dtype, plus a small absolute floor."""
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import fastbert.kernels.attention as kernel
from fastbert.ops import attention, attention_ref, check_cu_seqlens, varlen_attention, varlen_attention_ref

FLOOR = {torch.float32: 2e-6, torch.float16: 2e-4, torch.bfloat16: 2e-3}
GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"  # what conftest's `device` fixture gives; the helpers below use it


def _qkv(b, s, h, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, s, h, d, generator=g).to(DEVICE, dtype) for _ in range(3)]


def _mask(b, s, seed=0):
    """Random key mask: row 0 all real, row 1 fully padded, others random with one real token."""
    g = torch.Generator().manual_seed(seed + 1)
    m = (torch.rand(b, s, generator=g) > 0.4).long()
    m[0] = 1
    m[1] = 0
    m[2:, 0] = 1
    return m.to(DEVICE)


def _plain(q, k, v, mask, scale=None):
    """Attention computed entirely in the inputs' dtype (the error baseline)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = torch.einsum("bihd,bjhd->bhij", q, k) * scale
    if mask is not None:
        s = s.masked_fill(mask[:, None, None, :] == 0, float("-inf"))
    p = torch.softmax(s, -1).nan_to_num(0.0)
    return torch.einsum("bhij,bjhd->bihd", p, v)


def _assert_rule(name, got, ref64, plain):
    err = (got.double() - ref64).abs().max().item()
    base = (plain.double() - ref64).abs().max().item()
    bound = 2 * base + FLOOR[got.dtype]
    assert err <= bound, f"{name}: error {err:.3g} > 2 x torch {got.dtype} error {base:.3g} + floor"


def _grads(fn, tensors, dout):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(dout)
    return out, [t.grad for t in leaves]


@pytest.fixture
def kernel_launches(launches):
    """Counts of the attention kernels' launches: forward, backward dk/dv and dq passes."""
    return launches(kernel, "_fwd", "_dkdv", "_dq")


# ------------------------------------------------------------------------------------------------
# forward and backward against fp64

# head dims 80 and 96 run in two column chunks (64 + 16 / 32), the others in one
FWD_CASES = [(torch.float32, 1, 16), (torch.float32, 37, 48), (torch.float32, 130, 64),
             (torch.float32, 7, 128), (torch.float32, 37, 80), (torch.float16, 7, 32), (torch.float16, 37, 80),
             (torch.float16, 130, 96), (torch.float16, 1, 64)]


@pytest.mark.parametrize("dtype,seq,head_dim", FWD_CASES)
def test_forward_matches_fp64(dtype, seq, head_dim, kernel_launches):
    q, k, v = _qkv(3, seq, 2, head_dim, dtype, seed=seq + head_dim)
    mask = _mask(3, seq, seed=seq)
    out = attention(q, k, v, mask, backend="triton")
    assert kernel_launches["_fwd"] == 1
    assert out.dtype == dtype and out.shape == q.shape
    ref = attention_ref(*(t.double() for t in (q, k, v)), mask)
    _assert_rule("out", out, ref, _plain(q, k, v, mask))
    assert torch.all(out[1] == 0), "a fully padded sequence must give zeros"


BWD_CASES = [(torch.float32, 37, 48), (torch.float32, 130, 64), (torch.float32, 7, 96), (torch.float32, 37, 80),
             (torch.float16, 37, 80), (torch.float16, 130, 96), (torch.float16, 7, 128), (torch.float16, 1, 16)]


@pytest.mark.parametrize("dtype,seq,head_dim", BWD_CASES)
def test_backward_matches_fp64(dtype, seq, head_dim, kernel_launches):
    q, k, v = _qkv(3, seq, 2, head_dim, dtype, seed=7 * seq + head_dim)
    mask = _mask(3, seq, seed=seq + 3)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(5)).to(DEVICE, dtype)
    _, got = _grads(lambda *t: attention(*t, mask, backend="triton"), (q, k, v), dout)
    assert kernel_launches["_dkdv"] == 1
    assert kernel_launches["_dq"] == 1
    _, ref = _grads(lambda *t: attention_ref(*t, mask), [t.double() for t in (q, k, v)], dout.double())
    _, plain = _grads(lambda *t: _plain(*t, mask), (q, k, v), dout)
    for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, plain):
        assert g.dtype == dtype and torch.isfinite(g).all()
        _assert_rule(name, g, r, p)
        assert torch.all(g[1] == 0), f"{name} of a fully padded sequence must be zero"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_head_dims_80_and_96_are_not_padded_to_128(dtype):
    """The launches take the columns in two chunks, 64 + 16 / 32, for head dims 80 and 96: the forward and
    both backward passes, in every dtype (the fp32 dk/dv pass also 64 + 64 at 128); one chunk of the next
    power of two elsewhere."""
    from gpu_compile import recording
    got = {}
    for d in (64, 80, 96, 128):
        q = torch.empty(2, 8, 2, d, dtype=dtype)
        with recording() as launches:
            out, lse = kernel.attention_fwd(q, q, q, scale=0.1)
            kernel.attention_bwd(q, q, q, q, out, lse, scale=0.1)
        got[d] = [x.kwargs.get("BLOCK_D2") for x in launches]   # fwd, preprocess, dk/dv, dq
    fp32 = dtype == torch.float32
    assert got == {64: [0, None, 0, 0], 80: [16, None, 16, 16], 96: [32, None, 32, 32],
                   128: [0, None, 64 if fp32 else 0, 0]}


@pytest.mark.gpu
@pytest.mark.parametrize("seq,head_dim", [(37, 64), (130, 80)])
def test_bfloat16_forward_backward(seq, head_dim):
    if not GPU:
        pytest.skip("bf16 tl.dot is wrong under Triton's interpreter; runs on a CUDA GPU only")
    q, k, v = _qkv(3, seq, 2, head_dim, torch.bfloat16, seed=seq)
    mask = _mask(3, seq)
    dout = torch.randn_like(q)
    out, got = _grads(lambda *t: attention(*t, mask, backend="triton"), (q, k, v), dout)
    ref_out, ref = _grads(lambda *t: attention_ref(*t, mask), [t.double() for t in (q, k, v)], dout.double())
    plain_out, plain = _grads(lambda *t: _plain(*t, mask), (q, k, v), dout)
    _assert_rule("out", out, ref_out, plain_out)
    for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, plain):
        _assert_rule(name, g, r, p)


def test_fused_qkv_views_and_strided_grad():
    """q, k, v as views into one (batch, seq, 3, heads, dim) tensor, the way the models call it."""
    b, s, h, d = 2, 37, 3, 32
    qkv = torch.randn(b, s, 3, h, d, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    mask = _mask(b, s)
    dout = torch.randn(b, h, s, d).to(DEVICE).transpose(1, 2)        # non-contiguous dO too
    q, k, v = qkv.unbind(2)
    assert not q.is_contiguous()
    out, got = _grads(lambda *t: attention(*t, mask, backend="triton"), (q, k, v), dout)
    ref_out, ref = _grads(lambda *t: attention_ref(*t, mask), [t.double() for t in (q, k, v)], dout.double())
    plain_out, plain = _grads(lambda *t: _plain(*t, mask), (q, k, v), dout)
    _assert_rule("out", out, ref_out, plain_out)
    for name, g, r, p in zip(("dq", "dk", "dv"), got, ref, plain):
        _assert_rule(name, g, r, p)


def test_backward_is_deterministic():
    """No atomics: two backward passes give bitwise-equal gradients."""
    q, k, v = _qkv(2, 70, 2, 32, torch.float16, seed=1)
    mask = _mask(2, 70)
    dout = torch.randn_like(q)
    first = _grads(lambda *t: attention(*t, mask, backend="triton"), (q, k, v), dout)[1]
    second = _grads(lambda *t: attention(*t, mask, backend="triton"), (q, k, v), dout)[1]
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def _pack(lengths, h, d, dtype, seed=0):
    """Packed q, k, v (a fused (total, 3, heads, dim) buffer) and cu_seqlens for given lengths."""
    total = sum(lengths)
    qkv = torch.randn(total, 3, h, d, generator=torch.Generator().manual_seed(seed)).to(DEVICE, dtype)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32, device=DEVICE)
    return qkv.unbind(1), cu


def _repad(t, lengths, max_len):
    """Packed (total, ...) -> right-padded (batch, max_len, ...) plus its mask."""
    out = t.new_zeros((len(lengths), max_len) + tuple(t.shape[1:]))
    mask = torch.zeros(len(lengths), max_len, dtype=torch.long, device=t.device)
    start = 0
    for i, n in enumerate(lengths):
        out[i, :n] = t[start:start + n]
        mask[i, :n] = 1
        start += n
    return out, mask


def _plain_varlen(q, k, v, lengths, max_len):
    padded = [_repad(t, lengths, max_len)[0] for t in (q, k, v)]
    out = _plain(*padded, _repad(q, lengths, max_len)[1])
    return torch.cat([out[i, :n] for i, n in enumerate(lengths)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_varlen_matches_fp64_and_padded(dtype, kernel_launches):
    lengths, h, d = [5, 0, 37, 1, 12], 2, 48
    (q, k, v), cu = _pack(lengths, h, d, dtype, seed=11)
    max_len = max(lengths)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE, dtype)
    out, got = _grads(lambda *t: varlen_attention(*t, cu, max_len, backend="triton"), (q, k, v), dout)
    assert kernel_launches["_fwd"] == 1
    ref_out, ref = _grads(lambda *t: varlen_attention_ref(*t, cu, max_len),
                          [t.double() for t in (q, k, v)], dout.double())
    plain_out, plain = _grads(lambda *t: _plain_varlen(*t, lengths, max_len), (q, k, v), dout)
    _assert_rule("out", out, ref_out, plain_out)
    for name, g, r, pl in zip(("dq", "dk", "dv"), got, ref, plain):
        assert torch.isfinite(g).all()
        _assert_rule(name, g, r, pl)
    padded = [_repad(t, lengths, max_len)[0] for t in (q, k, v)]
    mask = _repad(q, lengths, max_len)[1]
    # the padded entry point over the same tokens agrees with the packed one
    dpad = _repad(dout, lengths, max_len)[0]
    pout, pgot = _grads(lambda *t: attention(*t, mask, backend="triton"), padded, dpad)
    tol = dict(atol=1e-6, rtol=0) if dtype == torch.float32 else dict(atol=2e-3, rtol=0)
    real = mask.bool()
    torch.testing.assert_close(pout[real], out, **tol)
    for g_pad, g in zip(pgot, got):
        torch.testing.assert_close(g_pad[real], g, **tol)


def test_fully_padded_sequence_is_zero_on_both_backends():
    q, k, v = _qkv(2, 9, 2, 16, torch.float32)
    mask = torch.zeros(2, 9, dtype=torch.long, device=DEVICE)
    mask[0, :4] = 1
    for backend in ("triton", "torch"):
        out, grads = _grads(lambda *t: attention(*t, mask, backend=backend), (q, k, v), torch.ones_like(q))
        assert torch.isfinite(out).all() and torch.all(out[1] == 0), backend
        for g in grads:
            assert torch.isfinite(g).all() and torch.all(g[1] == 0), backend


def test_varlen_with_no_tokens():
    q = torch.zeros(0, 2, 16, device=DEVICE, requires_grad=True)
    cu = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    for backend in ("triton", "torch"):
        q.grad = None
        out = varlen_attention(q, q, q, cu, 4, backend=backend)
        out.sum().backward()
        assert out.shape == (0, 2, 16) and q.grad.shape == (0, 2, 16), backend


# ------------------------------------------------------------------------------------------------
# the torch references: autograd (the models' CPU path) and an independent per-sequence oracle

def test_references_match_per_sequence_loop_and_gradcheck():
    q, k, v = (t.double() for t in _qkv(3, 5, 2, 4, torch.float32, seed=4))
    mask = _mask(3, 5, seed=2)
    scale = 0.3
    expected = torch.zeros_like(q)
    for i in range(3):
        real = mask[i].bool()  # row 1 is fully padded and stays zero
        if real.any():
            s = torch.einsum("qhd,khd->hqk", q[i], k[i][real]) * scale
            expected[i] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v[i][real])
    torch.testing.assert_close(attention_ref(q, k, v, mask, scale), expected, atol=1e-12, rtol=0)
    lengths = [3, 0, 5, 2]
    (pq, pk, pv), cu = _pack(lengths, 2, 4, torch.float64, seed=6)
    packed = varlen_attention_ref(pq, pk, pv, cu, 5, scale)
    start = 0
    for n in lengths:
        sl = slice(start, start + n)
        s = torch.einsum("qhd,khd->hqk", pq[sl], pk[sl]) * scale
        torch.testing.assert_close(packed[sl], torch.einsum("hqk,khd->qhd", s.softmax(-1), pv[sl]),
                                   atol=1e-12, rtol=0)
        start += n
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *t: attention_ref(*t, mask), leaves)
    leaves = [t.clone().requires_grad_() for t in (pq, pk, pv)]
    assert torch.autograd.gradcheck(lambda *t: varlen_attention_ref(*t, cu, 5), leaves)


def test_auto_backend_on_cpu_runs_torch(kernel_launches):
    if GPU:
        pytest.skip("on a GPU 'auto' runs the kernel")
    q, k, v = _qkv(2, 5, 2, 16, torch.float32)
    torch.testing.assert_close(attention(q, k, v), attention_ref(q, k, v))
    assert kernel_launches["_fwd"] == 0


# ------------------------------------------------------------------------------------------------
# dropout

def _one_hot_v(b, s, h, d):
    """v with v[:, j, :, j] = 1: the output row i then equals the (dropped) probability row i."""
    v = torch.zeros(b, s, h, d, device=DEVICE)
    idx = torch.arange(s, device=DEVICE)
    v[:, idx, :, idx] = 1.0
    return v


def _recover_keep(out, s):
    """(batch, heads, s, s) keep mask read back from an output computed with _one_hot_v."""
    return (out[..., :s] != 0).permute(0, 2, 1, 3)


def test_dropout_zero_is_exact():
    q, k, v = _qkv(2, 7, 2, 16, torch.float32)
    mask = _mask(2, 7)
    for backend in ("triton", "torch"):
        base = attention(q, k, v, mask, backend=backend)
        assert torch.equal(attention(q, k, v, mask, backend=backend, dropout_p=0.0), base)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_dropout_keep_rate_and_scaling(backend):
    b, s, h, d, p = 2, 37, 2, 48, 0.3
    q, k, _ = _qkv(b, s, h, d, torch.float32, seed=9)
    v = _one_hot_v(b, s, h, d)
    out = attention(q, k, v, backend=backend, dropout_p=p, generator=torch.Generator().manual_seed(1))
    probs = attention_ref(q, k, v)                                    # undropped probabilities
    keep = out[..., :s] != 0
    n = keep.numel()
    rate = keep.float().mean().item()
    assert abs(rate - (1 - p)) < 4 * math.sqrt(p * (1 - p) / n), f"keep rate {rate} for p={p}"
    # kept entries are scaled by exactly 1/(1-p); dropped ones are 0
    torch.testing.assert_close(out[..., :s] * keep * (1 - p), probs[..., :s] * keep, atol=1e-6, rtol=1e-5)


def test_dropout_draws_are_independent_across_columns_rows_and_heads():
    """The kernel draws one Philox call per four columns (its four outputs): the four columns of a group,
    neighbouring rows and the heads each get draws of their own (a shared or misplaced counter agrees
    far more often than chance: p^k + (1-p)^k)."""
    b, s, h, d, p = 2, 64, 2, 64, 0.5
    q, k, _ = _qkv(b, s, h, d, torch.float32, seed=3)
    out = attention(q, k, _one_hot_v(b, s, h, d), backend="triton", dropout_p=p,
                    generator=torch.Generator().manual_seed(5))
    keep = _recover_keep(out, s)                                        # (b, h, s, s)
    groups = keep.reshape(b, h, s, s // 4, 4)
    all_four = (groups.all(-1) | (~groups).all(-1)).float().mean().item()
    n = groups[..., 0].numel()
    assert abs(all_four - 2 * 0.5 ** 4) < 4 * math.sqrt(0.125 * 0.875 / n), all_four
    for a, c in ((keep[:, :, 1:], keep[:, :, :-1]), (keep[:, 1], keep[:, 0]), (keep[1], keep[0])):
        same = (a == c).float().mean().item()                            # rows, heads, batches
        assert abs(same - 0.5) < 4 * math.sqrt(0.25 / a.numel()), same


def test_dropout_expectation_over_seeds():
    b, s, h, d, p, n = 1, 20, 2, 16, 0.4, 60
    q, k, v = _qkv(b, s, h, d, torch.float32, seed=12)
    samples = torch.stack([attention(q, k, v, backend="triton", dropout_p=p,
                                     generator=torch.Generator().manual_seed(i)) for i in range(n)])
    mean, se = samples.mean(0), samples.std(0) / math.sqrt(n)
    z = (mean - attention_ref(q, k, v)) / (se + 1e-6)
    assert z.abs().max().item() < 6.0, "E[dropout output] differs from the no-dropout output"
    assert 0.5 < (z ** 2).mean().item() < 1.5, "spread of the mean is not that of independent masks"


def test_dropout_seed_reproduces():
    q, k, v = _qkv(2, 13, 2, 32, torch.float32, seed=1)
    mask = _mask(2, 13)

    def run(seed):
        torch.manual_seed(seed)
        return attention(q, k, v, mask, backend="triton", dropout_p=0.2)
    assert torch.equal(run(5), run(5))
    assert not torch.equal(run(5), run(6))
    gen = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    a = attention(q, k, v, mask, backend="triton", dropout_p=0.2, generator=gen())
    assert torch.equal(a, attention(q, k, v, mask, backend="triton", dropout_p=0.2, generator=gen()))


@pytest.mark.parametrize("dtype,d", [(torch.float32, 32), (torch.float16, 32), (torch.float32, 80), (torch.float16, 80),
                                     (torch.float32, 96), (torch.float16, 96)])
def test_dropout_backward_uses_forward_mask(dtype, d):
    """Recover the kernel's mask for a seed, replay it in the fp64 reference, compare gradients (head dims
    80 and 96: two column chunks)."""
    b, s, h, p = 3, 19, 2, 0.25
    mask = _mask(b, s, seed=4)
    q0, k0, _ = _qkv(b, s, h, d, torch.float32, seed=8)
    seeded = lambda: torch.Generator().manual_seed(77)  # noqa: E731
    probe = attention(q0, k0, _one_hot_v(b, s, h, d), backend="triton", dropout_p=p, generator=seeded())
    keep = _recover_keep(probe, s)                                   # no key mask: every P > 0
    q, k, v = _qkv(b, s, h, d, dtype, seed=21)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(4)).to(DEVICE, dtype)
    out, got = _grads(lambda *t: attention(*t, mask, backend="triton", dropout_p=p, generator=seeded()),
                      (q, k, v), dout)
    ref_out, ref = _grads(lambda *t: attention_ref(*t, mask, dropout_p=p, _drop_keep=keep),
                          [t.double() for t in (q, k, v)], dout.double())
    atol = 1e-5 if dtype == torch.float32 else 3e-3
    torch.testing.assert_close(out.double(), ref_out, atol=atol, rtol=0)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.double(), r, atol=atol, rtol=0)


def test_dropout_backward_varlen_window_uses_forward_mask():
    """The dq pass reads the mask the dk/dv pass wrote as bits: packed sequences longer than one block,
    a sliding window (blocks skipped), gradients against the fp64 reference replaying the recovered mask."""
    lengths, h, d, p, window = [70, 9, 33], 2, 16, 0.3, 20
    (q, k, v), cu = _pack(lengths, h, d, torch.float32, seed=6)
    seeded = lambda: torch.Generator().manual_seed(31)  # noqa: E731
    q0, k0, _ = _qkv(3, 70, h, 128, torch.float32, seed=8)          # the mask does not depend on head_dim
    keep = _recover_keep(attention(q0, k0, _one_hot_v(3, 70, h, 128), backend="triton", dropout_p=p,
                                   generator=seeded()), 70)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(2)).to(DEVICE)
    kw = dict(dropout_p=p, window=window)
    out, got = _grads(lambda *t: varlen_attention(*t, cu, 70, backend="triton", generator=seeded(), **kw),
                      (q, k, v), dout)
    ref_out, ref = _grads(lambda *t: varlen_attention_ref(*t, cu, 70, _drop_keep=keep, **kw),
                          [t.double() for t in (q, k, v)], dout.double())
    torch.testing.assert_close(out.double(), ref_out, atol=1e-5, rtol=0)
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.double(), r, atol=1e-5, rtol=0)


def test_dropout_padded_and_varlen_draw_the_same_mask():
    lengths, h, d = [6, 17, 3], 2, 16
    (q, k, v), cu = _pack(lengths, h, d, torch.float32, seed=5)
    packed = varlen_attention(q, k, v, cu, 17, backend="triton", dropout_p=0.5,
                              generator=torch.Generator().manual_seed(9))
    padded = [_repad(t, lengths, 17)[0] for t in (q, k, v)]
    mask = _repad(q, lengths, 17)[1]
    out = attention(*padded, mask, backend="triton", dropout_p=0.5, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(out[mask.bool()], packed, atol=1e-6, rtol=0)


# ------------------------------------------------------------------------------------------------
# autotuning keys, dispatch and validation

@pytest.mark.parametrize("precision", ["tf32", "tf32x3"])
def test_fp32_forward_at_128_keeps_a_config_that_did_not_spill(precision):
    # one chunk of 128 fp32 columns: every flag combination keeps a config outside the spilled table
    q = torch.empty(1, dtype=torch.float32)
    for varlen, mask, dropout, window in ((v, m, dr, w) for v in (False, True) for m in (False, True)
                                          for dr in (False, True) for w in (0, 1, 2)):
        meta = dict(BLOCK_D=128, BLOCK_D2=0, DOT_PRECISION=precision, IS_VARLEN=varlen, HAS_MASK=mask,
                    HAS_DROPOUT=dropout, WINDOW=window)
        kept = kernel._fwd.prune(kernel._fwd.configs, {"q_ptr": q}, **meta)
        flags = (precision, varlen, mask, dropout, window)
        assert kept and all(flags not in kernel._FWD_SPILLED_128.get(kernel._shape(c), ()) for c in kept), meta


def test_autotune_key_uses_bucketed_length():
    assert [kernel.seq_bucket(n) for n in (1, 16, 17, 100, 128, 129, 513)] == [16, 16, 32, 128, 128, 256, 1024]
    assert kernel.seq_bucket(100_000) == kernel.SEQ_BUCKET_CAP
    for tuned in (kernel._fwd, kernel._dkdv, kernel._dq):
        if tuned.tuner is not None:
            assert "SEQ_BUCKET" in tuned.tuner.keys and "max_seqlen" not in tuned.tuner.keys
        else:
            # the interpreter cannot autotune: it runs one choosable config; a GPU times them all
            assert tuned.tuner is None and tuned.autotunes() and len(tuned.configs) > 1


@pytest.mark.gpu
def test_new_lengths_in_one_bucket_do_not_retune():
    tuned = kernel._fwd
    if tuned.tuner is None:
        pytest.skip("Triton's autotuner times configs on a CUDA GPU only, and not with FASTBERT_AUTOTUNE=0")
    before, chosen = len(tuned.tuner.cache), len(tuned.chosen)
    for seq in (100, 113, 127):                                      # one bucket: 128
        q, k, v = _qkv(2, seq, 2, 40, torch.float16, seed=seq)       # head_dim 40: a fresh key
        attention(q, k, v, backend="triton")
    assert len(tuned.tuner.cache) - before == 1 and len(tuned.chosen) - chosen == 1


_COMPILE_FOR_HOPPER = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import fastbert.kernels.attention as K
flags = dict(HEAD_DIM=80, BLOCK_D=128, IS_VARLEN=True, BLOCK_M=64)
tuned = dict(flags, DOT_PRECISION="tf32", HAS_MASK=True, HAS_DROPOUT=True, BLOCK_N=64)
window = lambda w: dict(tuned, WINDOW=w)  # 0 global, 1 window over offsets, 2 over positions
for fn, const in ((K._attention_fwd_kernel, dict(window(0), STORE_LSE=True, BLOCK_D2=16)),
                  (K._attention_bwd_preprocess_kernel, flags),
                  (K._attention_bwd_dkdv_kernel, dict(window(0), BLOCK_D2=16)),
                  (K._attention_bwd_dq_kernel, dict(window(0), BLOCK_D2=16)),
                  (K._attention_fwd_kernel, dict(window(1), STORE_LSE=True, BLOCK_D2=0)),
                  (K._attention_bwd_dkdv_kernel, dict(window(2), BLOCK_D2=16))):
    sig = {n: "constexpr" if n in const else "*fp32" if n in ("lse_ptr", "delta_ptr") else "*i8"
           if n == "mask_ptr" else "*i32" if n == "cu_ptr" else "*i64" if n in ("seed_ptr", "pos_ptr")
           else "*fp16" if n.endswith("_ptr")
           else "fp32" if n in ("sm_scale", "dropout_p") else "i32" for n in fn.arg_names}
    binary = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const),
                            target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=2))
    assert binary.asm["cubin"], fn.__name__
print("compiled")
"""


@pytest.mark.slow  # a compile for a GPU target (tests/kernels/test_gpu_compile.py compiles every launch)
def test_kernels_compile_for_hopper(tmp_path):
    """The interpreter is lenient; compile every kernel (fp16, all flags) to an sm_90 cubin."""
    if GPU:
        pytest.skip("on a GPU the other tests compile and run the kernels")
    backends = os.path.join(os.path.dirname(__import__("triton").__file__), "backends", "nvidia", "bin")
    if not os.path.exists(os.path.join(backends, "ptxas")):
        pytest.skip("this triton build has no bundled ptxas to compile for CUDA")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(TRITON_CACHE_DIR=str(tmp_path), TRITON_DEFAULT_FP_FUSION="1")
    run = subprocess.run([sys.executable, "-c", _COMPILE_FOR_HOPPER], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0 and "compiled" in run.stdout, run.stderr[-3000:]


def test_triton_on_cpu_without_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    q, k, v = (t.cpu() for t in _qkv(1, 4, 1, 16, torch.float32))
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        attention(q, k, v, backend="triton")


def _bad_calls():
    q, k, v = _qkv(2, 5, 2, 16, torch.float32)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    p3 = [t.reshape(10, 2, 16) for t in (q, k, v)]
    big = torch.zeros(2, 5, 2, 129)
    cu10 = torch.tensor([0, 4, 10], dtype=torch.int32)
    return [
        (lambda: attention(q[0], k, v), "4-D"),
        (lambda: attention(q, k[:, :4], v), "shapes differ"),
        (lambda: attention(q, k.half(), v), "dtypes differ"),
        (lambda: attention(q.int(), k, v), "dtype torch.int32"),
        (lambda: attention(big, big, big), "head_dim 129 exceeds 128"),
        (lambda: attention(q, k, v, torch.ones(2, 4)), r"\(batch, seq\) = \(2, 5\)"),
        (lambda: attention(q, k, v, backend="cuda"), "backend must be one of"),
        (lambda: attention(q, k, v, dropout_p=1.0), r"dropout_p must be in \[0, 1\), got 1.0"),
        (lambda: attention(q.double(), k.double(), v.double(), backend="triton"), "float64"),
        (lambda: varlen_attention(*p3, cu.long(), 3), "int32, got torch.int64"),
        (lambda: varlen_attention(*p3, torch.tensor([0, 6, 5, 10], dtype=torch.int32), 6), "decreases at index 2"),
        (lambda: varlen_attention(*p3, torch.tensor([0, 2, 9], dtype=torch.int32), 7), "total_tokens=10"),
        (lambda: varlen_attention(*p3, torch.tensor([0, 2, 10], dtype=torch.int32), 5), "max_seqlen=5"),
        (lambda: varlen_attention(q, k, v, cu, 3), "3-D"),
        (lambda: attention(q, k.to("meta"), v), "devices differ"),
        (lambda: attention(q, k, v, torch.ones(2, 5, device="meta")), "attention_mask is on meta"),
        (lambda: varlen_attention(*p3, cu.to("meta"), 3), "cu_seqlens is on meta"),
        (lambda: varlen_attention(*p3, cu10, 6, window=-1), r"window must be an int >= 0 .*got -1"),
        (lambda: varlen_attention(*p3, cu10, 6, window=2.5), "window must be an int >= 0"),
        (lambda: varlen_attention(*p3, cu10, 6, window=True), "window must be an int >= 0"),
        (lambda: varlen_attention(*p3, cu10, 6, positions=torch.arange(10)), "pass them with window="),
        (lambda: varlen_attention(*p3, cu10, 6, window=2, positions=torch.ones(10)), "integer tensor"),
        (lambda: varlen_attention(*p3, cu10, 6, window=2, positions=torch.arange(9)), r"\(total_tokens,\) = \(10,\)"),
    ]


@pytest.mark.parametrize("case", range(23))
def test_validation_names_the_problem(case):
    call, message = _bad_calls()[case]
    with pytest.raises(ValueError, match=message):
        call()


def test_cu_seqlens_made_under_inference_mode():
    """Packing metadata built under torch.inference_mode (as a tokenizer's output is) is valid input:
    no version counter is read, and the CPU check still reads the values on every call."""
    q = torch.randn(5, 2, 16)
    with torch.inference_mode():
        cu = torch.tensor([0, 2, 5], dtype=torch.int32)
        for backend in ("triton", "torch"):
            out = varlen_attention(q, q, q, cu, 3, backend=backend)
            torch.testing.assert_close(out, varlen_attention_ref(q, q, q, cu, 3), atol=1e-6, rtol=0)
    bad = torch.tensor([0, 2, 5], dtype=torch.int32)
    varlen_attention(q, q, q, bad, 3, backend="torch")
    bad[1] = 6                                                       # in place: seen by the next call
    with pytest.raises(ValueError, match="decreases at index 2"):
        varlen_attention(q, q, q, bad, 3, backend="torch")


def test_check_cu_seqlens_helper():
    cu = torch.tensor([0, 3, 3, 7], dtype=torch.int32)
    check_cu_seqlens(cu, 7, 4)
    for args, match in (((cu, 8, 4), "total_tokens=8"), ((cu, 7, 3), "max_seqlen=3"),
                        ((cu.long(), 7, 4), "int32"), ((torch.tensor([0, 4, 2, 7], dtype=torch.int32), 7, 4),
                                                       "decreases at index 2")):
        with pytest.raises(ValueError, match=match):
            check_cu_seqlens(*args)
    with pytest.raises(ValueError, match="Python int"):
        varlen_attention(*(torch.zeros(7, 1, 16),) * 3, cu, torch.tensor(4))
    # refused, not converted: int("4") or int(4.9) would pass a different value than the caller's
    for bad in ("4", 4.9, True, -1):
        with pytest.raises(ValueError, match=r"max_seqlen must be a Python int >= 0, got"):
            varlen_attention(*(torch.zeros(7, 1, 16),) * 3, cu, bad)
    assert varlen_attention(*(torch.zeros(7, 1, 16),) * 3, cu, np.int64(4), backend="torch").shape == (7, 1, 16)


# ------------------------------------------------------------------------------------------------
# the custom ops: registration, torch.compile, a training step

def _op_args(padded, requires_grad=True, device="cpu", dtype=torch.float32):
    """Arguments of torch.ops.fastbert.attention (padded) or varlen_attention, dropout off."""
    if padded:
        q, k, v = (t.to(device) for t in _qkv(3, 11, 2, 16, dtype, seed=2))
        layout = (_mask(3, 11).to(device) != 0).to(torch.int8)
        extra = (layout,)
    else:
        lengths = [4, 0, 9, 1]
        (q, k, v), cu = _pack(lengths, 2, 16, dtype, seed=3)
        q, k, v, cu = q.to(device), k.to(device), v.to(device), cu.to(device)
        extra = (cu, 9)
    q, k, v = (t.detach().clone().requires_grad_(requires_grad) for t in (q, k, v))
    return q, k, v, extra


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "varlen"])
def test_opcheck_cpu_reference(padded):
    """The ops and their backward ops on CPU (the torch reference): schema, fake impl, autograd
    registration, AOT dispatch; and the reference backward equals autograd through attention_ref."""
    q, k, v, extra = _op_args(padded)
    fwd = torch.ops.fastbert.attention if padded else torch.ops.fastbert.varlen_attention
    bwd = torch.ops.fastbert.attention_backward if padded else torch.ops.fastbert.varlen_attention_backward
    torch.library.opcheck(fwd.default, (q, k, v, *extra, 0.3, 0.0, None, True, False))
    out, lse = fwd(q, k, v, *extra, 0.3, 0.0, None, True, False)
    dout = torch.randn_like(out)
    torch.library.opcheck(bwd.default, (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, *extra,
                                        0.3, 0.0, None, False))
    grads = torch.autograd.grad(out, (q, k, v), dout)
    ref = (attention_ref(q, k, v, extra[0], 0.3) if padded else varlen_attention_ref(q, k, v, *extra, 0.3))
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    for g, r in zip(grads, torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("padded", [True, False], ids=["padded", "varlen"])
def test_opcheck_kernel(padded, device):
    """The kernel path: eager checks in the interpreter (it cannot run on fake tensors), all on CUDA."""
    q, k, v, extra = _op_args(padded, device=device)
    interpret = device.type == "cpu"
    utils = ("test_schema", "test_autograd_registration", "test_faketensor") + (() if interpret else
                                                                                 ("test_aot_dispatch_dynamic",))
    fwd = torch.ops.fastbert.attention if padded else torch.ops.fastbert.varlen_attention
    seed = torch.tensor([5], device=device)
    torch.library.opcheck(fwd.default, (q, k, v, *extra, 0.3, 0.25, seed, True, interpret), test_utils=utils)


def test_opcheck_window(device):
    """varlen_attention's window (with positions: holes in the first two sequences) through the custom
    ops: opcheck on the CPU reference and the kernel's fake-tensor check, values and gradients against
    varlen_attention_ref's dense window mask. (Window values: tests/ops/test_sliding_window.py.)"""
    q, k, v, (cu, max_len) = _op_args(False)
    pos = torch.tensor([0, 1, 3, 4] + [0, 2, 3, 5, 6, 7, 9, 10, 11] + [4])
    window = (2, pos)
    # aot_dispatch of this op is checked without a window in test_opcheck_cpu_reference (it costs ~10 s)
    torch.library.opcheck(torch.ops.fastbert.varlen_attention.default,
                          (q, k, v, cu, max_len, 0.3, 0.0, None, True, False, *window),
                          test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    out, lse = torch.ops.fastbert.varlen_attention(q, k, v, cu, max_len, 0.3, 0.0, None, True, False, *window)
    dout = torch.randn_like(out)
    torch.library.opcheck(torch.ops.fastbert.varlen_attention_backward.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse, cu, max_len, 0.3, 0.0,
                           None, False, *window), test_utils=("test_schema", "test_faketensor"))
    ref = varlen_attention_ref(q, k, v, cu, max_len, 0.3, window=2, positions=pos)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), dout), torch.autograd.grad(ref, (q, k, v), dout)):
        torch.testing.assert_close(g, r, atol=1e-5, rtol=1e-5)
    interpret = device.type == "cpu"
    args = [t.detach().to(device).requires_grad_() for t in (q, k, v)]
    kpos = None if pos is None else pos.to(device)
    torch.library.opcheck(torch.ops.fastbert.varlen_attention.default,
                          (*args, cu.to(device), max_len, 0.3, 0.0, None, True, interpret, 2, kpos),
                          test_utils=("test_faketensor",))
    got = varlen_attention(*args, cu.to(device), max_len, scale=0.3, window=2, positions=kpos, backend="triton")
    torch.testing.assert_close(got.cpu(), ref.detach(), atol=1e-5, rtol=1e-5)


def test_inference_skips_lse():
    q, k, v, extra = _op_args(False, requires_grad=False)
    out, lse = torch.ops.fastbert.varlen_attention(q, k, v, *extra, 0.25, 0.0, None, False, True)
    full, full_lse = torch.ops.fastbert.varlen_attention(q, k, v, *extra, 0.25, 0.0, None, True, True)
    assert lse.numel() == 0 and full_lse.shape == (4, 2, 9) and torch.equal(out, full)


def test_compiles_without_graph_breaks():
    """torch.compile(fullgraph=True) over both ops on CPU (functional entry points and torch.ops),
    forward and backward: no graph break, same values and gradients as eager."""
    torch._dynamo.reset()
    q, k, v, (mask,) = _op_args(True)
    pq, pk, pv, (cu, max_len) = _op_args(False)

    def f(q, k, v, pq, pk, pv):
        a = attention(q, k, v, mask) + torch.ops.fastbert.attention(q, k, v, mask, 0.2, 0.0, None, True, False)[0]
        b = varlen_attention(pq, pk, pv, cu, max_len)
        c = torch.ops.fastbert.varlen_attention(pq, pk, pv, cu, max_len, 0.2, 0.0, None, True, False)[0]
        return a.square().sum() + (b * c).sum()
    leaves = (q, k, v, pq, pk, pv)
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(*leaves)
    got.backward()
    refs = [t.detach().clone().requires_grad_() for t in leaves]
    f(*refs).backward()
    torch.testing.assert_close(got, f(*refs).detach())
    for t, r in zip(leaves, refs):
        torch.testing.assert_close(t.grad, r.grad, atol=1e-5, rtol=1e-5)


STEP_DTYPES = [torch.float32] + [pytest.param(d, marks=pytest.mark.gpu) for d in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("dtype", STEP_DTYPES, ids=str)
def test_training_step_matches_fp64(dtype, device):
    """One SGD step of a QKV projection -> varlen attention on the kernel path equals the fp64 step."""
    if dtype != torch.float32 and device.type != "cuda":
        pytest.skip(f"{dtype} training step runs on a CUDA GPU (bf16 tl.dot is wrong in the interpreter)")
    lengths, heads, d = [7, 0, 19, 3], 2, 16
    total = sum(lengths)
    g = torch.Generator().manual_seed(8)
    w0 = torch.randn(3 * heads * d, 32, generator=g) * 0.2
    inp, target = torch.randn(total, 32, generator=g), torch.randn(total, heads, d, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)

    def step(dt, dev, backend):
        w = w0.to(dev, dt, copy=True).requires_grad_()
        q, k, v = (inp.to(dev, dt) @ w.t()).view(total, 3, heads, d).unbind(1)
        out = varlen_attention(q, k, v, cu.to(dev), max(lengths), backend=backend)
        loss = ((out.float() if dt != torch.float64 else out) - target.to(dev)).square().mean()
        loss.backward()
        with torch.no_grad():
            w -= 0.5 * w.grad
        return loss.detach().cpu().double(), w.detach().cpu().double(), out.detach().cpu().double()
    got = step(dtype, device, "triton")
    ref = step(torch.float64, "cpu", "torch")
    plain = step(dtype, "cpu", "torch") if dtype == torch.float32 else None
    tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    for name, a, e in zip(("loss", "weight", "out"), got, ref):
        err = (a - e).abs().max().item()
        bound = tol if plain is None else max(tol, 2 * (plain[("loss", "weight", "out").index(name)] - e).abs().max().item())
        assert err <= bound, f"{name}: error {err:.3g} > {bound:.3g}"
