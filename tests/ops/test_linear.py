"""fastbert.ops.linear: every path (oneDNN epilogues for CPU inference, F.linear + bias_gelu, the
reference) against an fp64 torch reference, forward and backward, and its argument errors."""
import pytest
import torch

from fastbert.ops import linear as L

ACTIVATIONS = [None, "gelu", "gelu_tanh", "relu"]


def operands(tokens=37, n_in=48, n_out=67, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(tokens, n_in, generator=g), torch.randn(n_out, n_in, generator=g) / 7
    return x, w, torch.randn(n_out, generator=g), torch.randn(tokens, n_out, generator=g)


def ref64(x, w, b, activation=None, residual=None):
    return L.linear_ref(x.double(), w.double(), b.double(), activation,
                        None if residual is None else residual.double()).float()


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_inference_paths_match_the_reference(activation, backend):
    x, w, b, _ = operands()
    if backend == "auto" and L._ONEDNN is None:
        pytest.skip("this torch build has no oneDNN (mkldnn) linear")
    with torch.no_grad():
        assert L.uses_cpu_gemm(x, w, backend) == (backend == "auto")
        got = L.linear(x, w, b, activation=activation, backend=backend)
    torch.testing.assert_close(got, ref64(x, w, b, activation), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_residual_epilogue(backend):
    x, w, b, r = operands(seed=1)
    with torch.no_grad():
        got = L.linear(x, w, b, residual=r, backend=backend)
    torch.testing.assert_close(got, ref64(x, w, b, residual=r), atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("epilogue", [*ACTIVATIONS, "residual"])
def test_packed_weight_matches_the_reference(epilogue):
    if L._ONEDNN is None:
        pytest.skip("this torch build has no oneDNN (mkldnn) linear")
    x, w, b, r = operands(seed=4)
    packed = L.pack_weight(w)
    residual, activation = (r, None) if epilogue == "residual" else (None, epilogue)
    with torch.no_grad():
        got = L.linear(x, w, b, activation=activation, residual=residual, packed=packed)
    torch.testing.assert_close(got, ref64(x, w, b, activation, residual), atol=2e-5, rtol=1e-5)
    with torch.no_grad():
        w.mul_(2)                                      # a copy: it keeps the weight it was made from
        stale = L.linear(x, w, b, activation=activation, residual=residual, packed=packed)
    torch.testing.assert_close(stale, got, atol=0, rtol=0)
    with pytest.raises(ValueError, match="packed must be pack_weight"):
        L.linear(x, w, b, packed=w)
    with pytest.raises(ValueError, match="packed must be pack_weight"):
        L.linear(x, w, b, packed=L.pack_weight(w[:5]))
    with pytest.raises(ValueError, match="2-D float32 CPU weight"):
        L.pack_weight(w.double())


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_autograd_path_matches_the_reference(activation):
    x, w, b, _ = operands(seed=2)
    leaves = [t.clone().requires_grad_() for t in (x, w, b)]
    assert not L.uses_cpu_gemm(leaves[0], leaves[1])              # a gradient is needed: never oneDNN
    out = L.linear(*leaves, activation=activation)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref_leaves = [t.double().requires_grad_() for t in (x, w, b)]
    L.linear_ref(*ref_leaves, activation).backward(grad.double())
    torch.testing.assert_close(out, ref64(x, w, b, activation), atol=2e-5, rtol=1e-5)
    for got, want in zip(leaves, ref_leaves):
        torch.testing.assert_close(got.grad, want.grad.float(), atol=1e-4, rtol=1e-5)


def test_non_contiguous_and_other_dtypes():
    x, w, b, _ = operands(seed=3)
    xt = x.t().contiguous().t()                                 # same values, transposed strides
    with torch.no_grad():
        torch.testing.assert_close(L.linear(xt[::2], w, b, activation="gelu"), ref64(x[::2], w, b, "gelu"),
                                   atol=2e-5, rtol=1e-5)
        half = L.linear(x.bfloat16(), w.bfloat16(), b.bfloat16(), activation="gelu")
    assert half.dtype == torch.bfloat16 and not L.uses_cpu_gemm(x.bfloat16(), w.bfloat16())
    torch.testing.assert_close(half.float(), ref64(x, w, b, "gelu"), atol=0.1, rtol=2e-2)


def test_errors_name_the_argument():
    x, w, b, r = operands()
    with pytest.raises(ValueError, match="activation must be one of"):
        L.linear(x, w, b, activation="swish")
    with pytest.raises(ValueError, match="not both"):
        L.linear(x, w, b, activation="gelu", residual=r)
    with pytest.raises(ValueError, match="does not fit weight"):
        L.linear(x[:, :5], w, b)
    with pytest.raises(ValueError, match="bias must have shape"):
        L.linear(x, w, b[:3])
    with pytest.raises(ValueError, match="residual must have shape"):
        L.linear(x, w, b, residual=r[:, :4])
    with pytest.raises(ValueError, match="backend must be one of"):
        L.linear(x, w, b, backend="cuda")


@pytest.mark.parametrize("epilogue", [*ACTIVATIONS, "residual"])
def test_packed_weight_serves_every_token_count(epilogue):
    """One packed weight for all token counts: MKL's packed GEMM (its copy packed once, for
    MKL_MAX_TOKENS rows) at every count up to MKL_MAX_TOKENS, oneDNN past it; made under one
    intra-op thread count and used under another, as an Encoder does."""
    if L._ONEDNN is None:
        pytest.skip("this torch build has no oneDNN (mkldnn) linear")
    before = torch.get_num_threads()
    limit = L.MKL_MAX_TOKENS
    try:
        for n_in, n_out in ((384, 1536), (48, 67)):
            x, w, b, r = operands(tokens=limit + 172, n_in=n_in, n_out=n_out, seed=5)
            packed = L.pack_weight(w)
            for threads, tokens in ((1, 1), (2, 2), (1, 7), (2, 16), (1, 31), (2, limit), (1, limit + 1), (2, 300)):
                torch.set_num_threads(threads)
                assert packed.uses_mkl(tokens) == (L._MKL is not None and tokens <= limit)
                residual, activation = (r[:tokens], None) if epilogue == "residual" else (None, epilogue)
                with torch.no_grad():
                    got = L.linear(x[:tokens], w, b, activation=activation, residual=residual, packed=packed)
                torch.testing.assert_close(got, ref64(x[:tokens], w, b, activation, residual), atol=1e-4, rtol=1e-5,
                                           msg=lambda m: f"{tokens} tokens, {n_in}->{n_out}: {m}")
    finally:
        torch.set_num_threads(before)
