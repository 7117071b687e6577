"""Rotary embeddings on packed q/k: fastbert.ops.rotary against transformers' apply_rotary_pos_emb."""
import pytest
import torch
from transformers.models.modernbert import modeling_modernbert as hf_mb

from fastbert.ops.rotary import Rotary, inv_freq, rotary, rotary_ref


def hf_rotate(qkv, positions, theta):
    """transformers' ModernBERT rotary on (tokens, 3, heads, dim) packed as one batch row."""
    dim = qkv.shape[-1]
    freqs = positions[None, :, None].float() * inv_freq(theta, dim)[None, None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(qkv.dtype), emb.sin().to(qkv.dtype)
    q, k = (qkv[None, :, i].transpose(1, 2) for i in (0, 1))               # (1, heads, tokens, dim)
    q, k = hf_mb.apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)
    return q[0].transpose(0, 1), k[0].transpose(0, 1)


@pytest.mark.parametrize("dim,theta", [(16, 10_000.0), (8, 160_000.0), (64, 1000.0)])
def test_matches_transformers(dim, theta):
    g = torch.Generator().manual_seed(0)
    tokens, heads = 37, 3
    qkv = torch.randn(tokens, 3, heads, dim, generator=g)
    positions = torch.cat([torch.arange(20), torch.arange(17) + 5])            # two packed sequences
    rope = Rotary(dim, 64)
    cos, sin = rope(positions, theta, qkv.dtype)
    q, k = rotary(qkv, cos, sin)
    hq, hk = hf_rotate(qkv, positions, theta)
    assert (q - hq).abs().max() < 1e-5 and (k - hk).abs().max() < 1e-5
    assert torch.equal(qkv[:, 2], qkv[:, 2].clone())                            # v untouched


def test_tables_are_cached_per_device_dtype_theta_on_the_module():
    rope = Rotary(8, 16)
    a = rope.tables(10.0, "cpu", torch.float32)
    assert rope.tables(10.0, "cpu", torch.float32)[0] is a[0]
    b = rope.tables(20.0, "cpu", torch.float32)
    c = rope.tables(10.0, "cpu", torch.float64)
    assert b[0] is not a[0] and c[0].dtype == torch.float64 and len(rope._tables) == 3
    assert len(Rotary(8, 16)._tables) == 0                                      # nothing global
    assert "_tables" not in dict(rope.state_dict())


def test_backward_is_the_inverse_rotation():
    g = torch.Generator().manual_seed(1)
    qkv = torch.randn(5, 3, 2, 8, dtype=torch.float64, generator=g, requires_grad=True)
    positions = torch.arange(5)
    cos, sin = Rotary(8, 32)(positions, 100.0, torch.float64)
    torch.autograd.gradcheck(lambda t: rotary_ref(t, cos, sin), (qkv,))
    q, k = rotary_ref(qkv, cos, sin)
    # rotation preserves norms per (token, head) pair of halves
    assert torch.allclose(q.norm(dim=-1), qkv[:, 0].norm(dim=-1))


def test_errors_name_the_shape():
    rope = Rotary(8, 4)
    cos, sin = rope(torch.arange(3), 10.0, torch.float32)
    with pytest.raises(ValueError, match="qkv must be"):
        rotary(torch.zeros(3, 2, 2, 8), cos, sin)
    with pytest.raises(ValueError, match="cos must be"):
        rotary(torch.zeros(4, 3, 2, 8), cos, sin)
    with pytest.raises(ValueError, match="even"):
        Rotary(7, 4)


# ---- the Triton kernel (Triton's interpreter without a GPU) ------------------------------------------
@pytest.mark.parametrize("dtype,atol,heads,dim", [(torch.float32, 1e-6, 3, 16), (torch.float32, 1e-6, 1, 6),
                                                  (torch.float32, 1e-6, 12, 64), (torch.float16, 2e-3, 3, 16),
                                                  (torch.bfloat16, 2e-2, 12, 64)])
def test_kernel_forward_matches_reference(dtype, atol, heads, dim):
    pytest.importorskip("triton")
    from fastbert.kernels import rotary as kernel
    g = torch.Generator().manual_seed(2)
    tokens = 13
    qkv = torch.randn(tokens, 3, heads, dim, generator=g).to(dtype)
    positions = torch.randint(0, 50, (tokens,), generator=g)
    cos, sin = Rotary(dim, 64)(positions, 500.0, dtype)
    ref_q, ref_k = rotary_ref(qkv, cos, sin)
    before = kernel.launch_count["rotary_fwd"]
    work = qkv.clone()
    q, k = rotary(work, cos, sin, backend="triton", inplace=True)
    assert kernel.launch_count["rotary_fwd"] == before + 1                   # one launch for q and k
    assert q.data_ptr() == work.data_ptr()                                   # in place in the QKV buffer
    assert (q.float() - ref_q.float()).abs().max() <= atol
    assert (k.float() - ref_k.float()).abs().max() <= atol
    assert torch.equal(work[:, 2], qkv[:, 2])                                # v untouched
    q2, _ = rotary(qkv, cos, sin, backend="triton")                          # not in place: input kept
    assert torch.equal(q2, q) and not torch.equal(qkv[:, 0], q2)


def test_kernel_on_a_strided_view():
    pytest.importorskip("triton")
    g = torch.Generator().manual_seed(3)
    big = torch.randn(9, 3, 4, 20, generator=g)
    qkv = big[..., 2:18]                                                      # non-contiguous head_dim 16
    cos, sin = Rotary(16, 16)(torch.arange(9), 10.0, torch.float32)
    ref_q, ref_k = rotary_ref(qkv, cos, sin)
    q, k = rotary(qkv, cos, sin, backend="triton", inplace=True)
    assert (q - ref_q).abs().max() < 1e-6 and (k - ref_k).abs().max() < 1e-6
    assert torch.equal(big[..., :2], torch.randn(9, 3, 4, 20, generator=torch.Generator().manual_seed(3))[..., :2])


def test_kernel_backward_matches_autograd_of_reference():
    pytest.importorskip("triton")
    g = torch.Generator().manual_seed(4)
    qkv = torch.randn(10, 3, 2, 8, generator=g)
    cos, sin = Rotary(8, 16)(torch.arange(10), 100.0, torch.float32)
    dq, dk = torch.randn(10, 2, 8, generator=g), torch.randn(10, 2, 8, generator=g)
    grads = []
    for backend in ("torch", "triton"):
        x = qkv.clone().requires_grad_()
        q, k = rotary(x, cos, sin, backend=backend)
        ((q * dq).sum() + (k * dk).sum() + x[:, 2].sum()).backward()
        grads.append(x.grad)
    assert (grads[0] - grads[1]).abs().max() < 1e-6
    x = qkv.clone().requires_grad_()
    q, _ = rotary(x, cos, sin, backend="triton")                             # k unused: its gradient is None
    q.sum().backward()
    assert (x.grad[:, 1] == 0).all() and x.grad[:, 0].abs().sum() > 0
