"""Sliding-window varlen attention: the blockwise torch path against an fp64 dense masked reference."""
import math

import pytest
import torch

from fastbert.ops.sliding_window import packed_offsets, sliding_window_attention, sliding_window_attention_ref


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
    assert packed_offsets(cu, 5).tolist() == [0, 1, 2, 0, 1]
    q, k, v, cu = packed([4])
    with pytest.raises(ValueError, match="window"):
        sliding_window_attention_ref(q, k, v, cu, -1)
    with pytest.raises(ValueError, match="int32"):
        sliding_window_attention_ref(q, k, v, cu.long(), 2)
    with pytest.raises(ValueError, match="positions"):
        sliding_window_attention_ref(q, k, v, cu, 2, torch.arange(3))
