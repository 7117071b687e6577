"""fastbert.ops.attention's `layout=`: (batch, seq, heads, head_dim) by default, torch SDPA's
(batch, heads, seq, head_dim) when said, checked against the mask where the sizes allow; torch's
scaled_dot_product_attention is the reference."""
import pytest
import torch
import torch.nn.functional as F

from fastbert.ops import attention, attention_ref


def _sdpa_inputs(batch=3, heads=2, seq=5, dim=8):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[1, 3:] = 0
    return q, k, v, mask


def _sdpa(q, k, v, mask):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].bool())


def test_bhsd_layout_is_sdpa():
    q, k, v, mask = _sdpa_inputs()
    out = attention(q, k, v, mask, layout="bhsd")
    assert out.shape == q.shape
    torch.testing.assert_close(out, _sdpa(q, k, v, mask))
    # the same tensors said the other way round run as (batch, seq, heads, head_dim): other numbers
    torch.testing.assert_close(attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask),
                               out.transpose(1, 2))


def test_bhsd_gradients_match_sdpa():
    q, k, v, mask = _sdpa_inputs()
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    dout = torch.randn_like(q)
    attention(*leaves, mask, layout="bhsd").backward(dout)
    _sdpa(*refs, mask).backward(dout)
    for a, b in zip(leaves, refs):
        torch.testing.assert_close(a.grad, b.grad)


def test_mask_that_fits_the_other_layout_names_it():
    q, k, v, mask = _sdpa_inputs(heads=2, seq=5)
    with pytest.raises(ValueError, match=r"layout 'bshd'.*pass layout='bhsd'"):
        attention(q, k, v, mask)                                  # SDPA tensors, default layout
    with pytest.raises(ValueError, match=r"layout 'bhsd'.*pass layout='bshd'"):
        attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, layout="bhsd")
    with pytest.raises(ValueError, match=r"pass layout='bhsd'"):   # the reference takes (batch, seq, ...) only
        attention_ref(q, k, v, mask)


def test_unknown_layout_and_wrong_rank_are_refused():
    q, k, v, mask = _sdpa_inputs()
    with pytest.raises(ValueError, match="layout must be one of"):
        attention(q, k, v, mask, layout="bsd")
    with pytest.raises(ValueError, match=r"4-D \(batch, heads, seq, head_dim\)"):
        attention(q[0], k[0], v[0], layout="bhsd")
