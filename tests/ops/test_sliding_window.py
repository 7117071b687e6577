"""Sliding-window varlen attention: the blockwise torch path against an fp64 dense masked reference."""
import math

import pytest
import torch

from fastbert.ops.attention import sliding_window_attention
from fastbert.ops.sliding_window import sliding_window_attention_ref
from fastbert.ops.varlen import packed_positions


def dense_window_ref(q, k, v, lengths, window, positions=None):
    """fp64, one (tokens, tokens) score matrix: same sequence and |pos_i - pos_j| <= window."""
    seq = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    pos = positions if positions is not None else torch.cat([torch.arange(n) for n in lengths])
    allowed = (seq[:, None] == seq[None, :]) & ((pos[:, None] - pos[None, :]).abs() <= window)
    q, k, v = (t.double().transpose(0, 1) for t in (q, k, v))                 # (heads, tokens, dim)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return (torch.softmax(scores, -1) @ v).transpose(0, 1)


def packed(lengths, heads=3, dim=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    n = sum(lengths)
    q, k, v = (torch.randn(n, heads, dim, generator=g, dtype=dtype) for _ in range(3))
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return q, k, v, cu


LENGTHS = [37, 1, 5, 0, 64, 20]        # longer and shorter than every window, a single token, an empty row


@pytest.mark.parametrize("window", [4, 16, 7])
@pytest.mark.parametrize("block", [None, 16, 5])
def test_matches_dense_fp64_reference(window, block):
    q, k, v, cu = packed(LENGTHS)
    ref = dense_window_ref(q, k, v, LENGTHS, window)
    out = sliding_window_attention_ref(q, k, v, cu, window, block=block)
    assert out.dtype == torch.float32
    assert (out.double() - ref).abs().max() < 1e-5
    out64 = sliding_window_attention_ref(*(t.double() for t in (q, k, v)), cu, window, block=block)
    assert (out64 - ref).abs().max() < 1e-12


@pytest.mark.parametrize("window", [4, 7])
def test_backward_matches_dense_fp64_reference(window):
    q, k, v, cu = packed(LENGTHS, dtype=torch.float64)
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    g = torch.randn_like(q)
    grads = []
    for fn in (lambda: dense_window_ref(q, k, v, LENGTHS, window),
               lambda: sliding_window_attention_ref(q, k, v, cu, window, block=8)):
        (fn() * g).sum().backward()
        grads.append([t.grad.clone() for t in (q, k, v)])
        for t in (q, k, v):
            t.grad = None
    for a, b in zip(*grads):
        assert (a - b).abs().max() < 1e-10


def test_positions_with_holes():
    """Window measured in given indices (a holey mask keeps array indices): still every key found."""
    lengths = [30, 12]
    q, k, v, cu = packed(lengths)
    pos = torch.cat([torch.arange(30) * 2, torch.arange(12) + 3])    # gaps of 2 in the first sequence
    ref = dense_window_ref(q, k, v, lengths, 6, pos)
    out = sliding_window_attention_ref(q, k, v, cu, 6, pos)
    assert (out.double() - ref).abs().max() < 1e-5


@pytest.mark.parametrize("compiling", [False, True])
def test_shared_mask_blocks_and_gathered_blocks_agree(monkeypatch, compiling):
    """Long sequences (most blocks share one mask, on views) packed with short ones and a holey one
    (gathered blocks); under torch.compile every block takes the gathered path: both match fp64."""
    lengths = [300, 7, 150]
    q, k, v, cu = packed(lengths, seed=3)
    pos = torch.cat([torch.arange(300), torch.arange(7) * 3, torch.arange(150) + 5])
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    for positions in (None, pos):
        ref = dense_window_ref(q, k, v, lengths, 9, positions)
        out = sliding_window_attention_ref(q, k, v, cu, 9, positions, block=16)
        assert (out.double() - ref).abs().max() < 1e-5


def test_short_sequences_take_the_global_path_and_agree():
    lengths = [5, 3, 6]
    q, k, v, cu = packed(lengths)
    ref = dense_window_ref(q, k, v, lengths, 5)                        # the window covers every row
    assert (sliding_window_attention(q, k, v, cu, 6, 5) - ref).abs().max() < 1e-5
    assert (sliding_window_attention_ref(q, k, v, cu, 5) - ref).abs().max() < 1e-5


def test_scores_stay_local_at_8k_tokens(monkeypatch):
    """8k tokens, window 64: every attention call sees at most block + 2 * window keys and a bounded
    number of scores (never a (tokens, tokens) matrix), and the output still matches a local check."""
    n, heads, dim, window = 8192, 2, 16, 64
    q, k, v, cu = packed([n], heads=heads, dim=dim)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(qb, kb, vb, **kw):
        calls.append((tuple(qb.shape), tuple(kb.shape)))
        return sdpa(qb, kb, vb, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    out = sliding_window_attention_ref(q, k, v, cu, window)
    assert calls and all(kshape[2] <= 64 + 2 * window for _, kshape in calls)
    assert max(qs[0] * qs[1] * qs[2] * ks[2] for qs, ks in calls) <= 1 << 24
    assert sum(qs[0] * qs[2] for qs, _ in calls) >= n                       # every query row covered
    i = 5000                                                                 # one row against fp64
    lo, hi = i - window, i + window + 1
    ref = dense_window_ref(q[lo:hi], k[lo:hi], v[lo:hi], [hi - lo], 10 ** 9)[window]
    assert (out[i].double() - ref).abs().max() < 1e-5


def test_offsets_and_errors():
    cu = torch.tensor([0, 3, 3, 5], dtype=torch.int32)
    assert packed_positions(cu, 5).tolist() == [0, 1, 2, 0, 1]
    q, k, v, cu = packed([4])
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention_ref(q, k, v, cu, -1)
    with pytest.raises(ValueError, match="int32"):
        sliding_window_attention_ref(q, k, v, cu.long(), 2)
    with pytest.raises(ValueError, match="positions"):
        sliding_window_attention_ref(q, k, v, cu, 2, torch.arange(3))


# ------------------------------------------------------------------------------------------------
# the window inside the varlen flash kernel (Triton's interpreter on CPU, compiled on a GPU)

KERNEL_LENGTHS = [70, 1, 5, 0, 20]     # 70 > one 64-row block and > every window; seq 1; an empty row
TOL = {torch.float32: 2e-5, torch.float16: 4e-3}


def _kernel_vs_fp64(device, lengths, window, dtype, positions=None, heads=2, dim=16):
    q, k, v, cu = packed(lengths, heads=heads, dim=dim, seed=window)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    leaves = [t.to(device, dtype, copy=True).requires_grad_() for t in (q, k, v)]
    pos = None if positions is None else positions.to(device)
    out = sliding_window_attention(*leaves, cu.to(device), max(lengths), window, pos, backend="triton")
    out.backward(dout.to(device, dtype))
    ref64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = dense_window_ref(*ref64, lengths, window, positions)
    ref.backward(dout.double())
    tol = TOL[dtype]
    assert (out.detach().cpu().double() - ref.detach()).abs().max() < tol
    for name, got, r in zip("qkv", leaves, ref64):
        err = (got.grad.cpu().double() - r.grad).abs().max().item()
        assert err < 2 * tol, f"d{name}: error {err:.3g}"


@pytest.mark.parametrize("window,dtype", [(4, torch.float32), (16, torch.float32), (7, torch.float32),
                                          (7, torch.float16)], ids=str)
def test_kernel_matches_fp64_forward_backward(window, dtype, device, launches):
    from fastbert.kernels import attention as kernel
    calls = launches(kernel, "_fwd", "_dkdv", "_dq")
    _kernel_vs_fp64(device, KERNEL_LENGTHS, window, dtype)
    assert calls == {"_fwd": 1, "_dkdv": 1, "_dq": 1}


def test_kernel_positions_with_holes(device):
    """Window measured in given positions (a holey mask keeps padded-row indices), forward and backward."""
    lengths = [70, 12]
    pos = torch.cat([torch.arange(70) * 2, torch.arange(12) + 3])      # gaps of 2 in the first sequence
    _kernel_vs_fp64(device, lengths, 6, torch.float32, positions=pos)


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")   # the global path's NaN read, on purpose
def test_kernel_skips_key_blocks_outside_the_window(device):
    """Blocks entirely outside the window are never loaded: NaN in q, k, v and dO far from the first
    block leaves its output and gradients finite and exact; the global path does read them (NaN)."""
    from fastbert.kernels import attention as kernel
    if device.type == "cuda":
        pytest.skip("block sizes are autotuned on a GPU; the interpreter's single config is known")
    window, n = 4, 256
    fm, fn = (kernel._FWD_CONFIGS[0].kwargs[b] for b in ("BLOCK_M", "BLOCK_N"))
    bm, bn = (kernel._BWD_CONFIGS[0].kwargs[b] for b in ("BLOCK_M", "BLOCK_N"))
    first, step = max(fm, bm, bn), min(fn, bm, bn)                     # rows/cols checked: the first block

    def blocks_end(i):                                                 # end of the blocks reached from [0, i)
        return -(-(i + window) // step) * step
    # never visited from the first block, nor seen by the rows it visits (their lse/delta stay finite)
    far = blocks_end(blocks_end(first))
    assert far + fn <= n
    q, k, v, cu = packed([n], heads=1, dim=16)
    dout = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    ref64 = [t.double().requires_grad_() for t in (q, k, v)]
    ref = dense_window_ref(*ref64, [n], window)
    ref.backward(dout.double())
    poisoned = [t.clone() for t in (q, k, v, dout)]
    for t in poisoned:
        t[far:] = float("nan")
    q, k, v, dout = poisoned
    kw = dict(scale=0.25, cu_seqlens=cu, max_seqlen=n)
    out, lse = kernel.attention_fwd(q, k, v, window=window, **kw)
    grads = kernel.attention_bwd(dout, q, k, v, out, lse, window=window, **kw)
    assert (out[:first].double() - ref[:first]).abs().max() < 2e-5
    for got, r in zip(grads, ref64):
        assert (got[:first].double() - r.grad[:first]).abs().max() < 4e-5
    assert kernel.attention_fwd(q, k, v, **kw)[0][:first].isnan().any()  # the poison is visible to a reader
