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
def count_launches(monkeypatch):
    """A list that gets the name of each rotary kernel launch."""
    from fastbert.kernels import rotary as kernel
    names = []
    launch = kernel.launch
    monkeypatch.setattr(kernel, "launch", lambda fn, *a, **kw: names.append(fn.__name__) or launch(fn, *a, **kw))
    return names


@pytest.mark.parametrize("dtype,atol,heads,dim", [(torch.float32, 1e-6, 3, 16), (torch.float32, 1e-6, 1, 6),
                                                  (torch.float32, 1e-6, 12, 64), (torch.float16, 2e-3, 3, 16),
                                                  (torch.bfloat16, 2e-2, 12, 64)])
def test_kernel_forward_matches_reference(dtype, atol, heads, dim, monkeypatch):
    pytest.importorskip("triton")
    g = torch.Generator().manual_seed(2)
    tokens = 13
    qkv = torch.randn(tokens, 3, heads, dim, generator=g).to(dtype)
    positions = torch.randint(0, 50, (tokens,), generator=g)
    cos, sin = Rotary(dim, 64)(positions, 500.0, dtype)
    ref_q, ref_k = rotary_ref(qkv, cos, sin)
    launches = count_launches(monkeypatch)
    work = qkv.clone()
    q, k = rotary(work, cos, sin, backend="triton", inplace=True)
    assert launches == ["_rotary_fwd_kernel"]                                # one launch for q and k
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


def _op_inputs(dtype=torch.float32, requires_grad=True):
    g = torch.Generator().manual_seed(5)
    qkv = torch.randn(7, 3, 2, 8, generator=g).to(dtype).requires_grad_(requires_grad)
    cos, sin = Rotary(8, 16)(torch.tensor([0, 1, 2, 3, 0, 1, 9]), 100.0, dtype)
    return qkv, cos, sin


def test_opcheck_custom_ops(device):
    """torch.ops.fastbert.rotary / rotary_: schema, fake kernel, autograd registration (CPU reference,
    and the kernel: in the interpreter on CPU); the op's backward is the inverse rotation."""
    qkv, cos, sin = _op_inputs()
    torch.library.opcheck(torch.ops.fastbert.rotary.default, (qkv[:, :2], cos, sin, False, False))
    utils = ("test_schema", "test_autograd_registration", "test_faketensor")
    torch.library.opcheck(torch.ops.fastbert.rotary_.default, (qkv.detach().clone()[:, :2], cos, sin, False, False),
                          test_utils=utils)
    interpret = device.type == "cpu"
    x, c, s = (t.detach().to(device) for t in (qkv, cos, sin))
    torch.library.opcheck(torch.ops.fastbert.rotary.default, (x.requires_grad_()[:, :2], c, s, False, interpret),
                          test_utils=utils[1:])
    torch.library.opcheck(torch.ops.fastbert.rotary_.default, (x.detach().clone()[:, :2], c, s, True, interpret),
                          test_utils=utils[2:])
    x64 = qkv.detach().double().requires_grad_()
    torch.autograd.gradcheck(lambda t: torch.ops.fastbert.rotary(t[:, :2], cos.double(), sin.double(), False,
                                                                   False), (x64,))


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-6), (torch.float16, 2e-3)], ids=str)
def test_kernel_op_forward_backward_one_launch_each(dtype, atol, device, monkeypatch):
    """Training path: one kernel launch forward (into a new q/k buffer, qkv kept), one backward."""
    qkv, cos, sin = (t.detach().to(device) for t in _op_inputs(dtype))
    dq, dk = (torch.randn(7, 2, 8, generator=torch.Generator().manual_seed(i)).to(device, dtype) for i in (6, 7))
    grads, outs = [], []
    launches = count_launches(monkeypatch)
    for backend in ("torch", "triton"):
        x = qkv.clone().requires_grad_()
        q, k = rotary(x, cos, sin, backend=backend, inplace=True)            # inplace ignored: x needs a grad
        ((q.float() * dq.float()).sum() + (k.float() * dk.float()).sum()).backward()
        grads.append(x.grad.float())
        outs.append(torch.cat([q, k]).float())
        assert torch.equal(x.detach(), qkv)                                 # the input is not overwritten
    assert launches == ["_rotary_fwd_kernel"] * 2
    assert (outs[0] - outs[1]).abs().max() <= atol and (grads[0] - grads[1]).abs().max() <= atol
    assert (grads[1][:, 2] == 0).all()


def test_compiles_without_graph_breaks():
    """torch.compile(fullgraph=True) traces through the rotary ops (CPU reference), forward and backward."""
    torch._dynamo.reset()
    qkv, cos, sin = _op_inputs()

    def f(x):
        q, k = rotary(x, cos, sin, backend="auto")
        q2, k2 = torch.ops.fastbert.rotary(x[:, :2], cos, sin, False, False).unbind(1)
        return (q * k2).sum() + (k * q2).sum()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(qkv)
    got.backward()
    ref = qkv.detach().clone().requires_grad_()
    f(ref).backward()
    torch.testing.assert_close(got, f(ref).detach())
    torch.testing.assert_close(qkv.grad, ref.grad)


def test_inplace_op_compiles_without_graph_breaks():
    """The in-place op on the q/k view of a fused buffer under torch.compile(fullgraph=True)."""
    torch._dynamo.reset()
    qkv, cos, sin = _op_inputs(requires_grad=False)

    def f(x):
        x = x * 1.0                                                          # a fresh QKV buffer
        torch.ops.fastbert.rotary_(x[:, :2], cos, sin, False, False)
        return x
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(qkv)
    q, k = rotary_ref(qkv, cos, sin)
    torch.testing.assert_close(got, torch.stack([q, k, qkv[:, 2]], 1))
