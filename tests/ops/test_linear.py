"""fastbert.ops.linear: every path (oneDNN epilogues for CPU inference, packed weights on fastbert's
own GEMM, MKL's and oneDNN's, F.linear + bias_gelu, the reference) against an fp64 torch reference,
forward and backward, and its argument errors; fastbert._C.linear_f32 on its own."""
import pytest
import torch

from fastbert import _C
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


@pytest.mark.parametrize("own", [True, False], ids=["own", "no own"])
@pytest.mark.parametrize("epilogue", [*ACTIVATIONS, "residual"])
def test_packed_weight_serves_every_token_count(epilogue, own, monkeypatch):
    """One packed weight for all token counts: fastbert's own GEMM up to OWN_MAX_TOKENS on one
    thread (where the CPU has AVX-512; "no own" is the path of a CPU without), MKL's packed GEMM
    (its copy packed once, for MKL_MAX_TOKENS rows) up to MKL_MAX_TOKENS, oneDNN past it; made under
    one intra-op thread count and used under another, as an Encoder does."""
    if L._ONEDNN is None:
        pytest.skip("this torch build has no oneDNN (mkldnn) linear")
    if own and not L._OWN:
        pytest.skip("fastbert's own GEMM needs a CPU with AVX-512")
    monkeypatch.setattr(L, "_OWN", own)
    before = torch.get_num_threads()
    limit, own_limit = L.MKL_MAX_TOKENS, L.OWN_MAX_TOKENS
    counts = (1, 2, 7, 16, own_limit, 31, own_limit + 1, limit, limit + 1, 300)   # on 1, 2, 1, 2, ... threads
    try:
        for n_in, n_out in ((384, 1536), (48, 67)):
            x, w, b, r = operands(tokens=limit + 172, n_in=n_in, n_out=n_out, seed=5)
            packed = L.pack_weight(w)
            for threads, tokens in zip((1, 2) * 5, counts):
                torch.set_num_threads(threads)
                own_path = own and tokens <= own_limit and threads == 1
                assert packed.uses_own(tokens) == own_path
                assert packed.uses_mkl(tokens) == (L._MKL is not None and tokens <= limit and not own_path)
                residual, activation = (r[:tokens], None) if epilogue == "residual" else (None, epilogue)
                with torch.no_grad():
                    got = L.linear(x[:tokens], w, b, activation=activation, residual=residual, packed=packed)
                torch.testing.assert_close(got, ref64(x[:tokens], w, b, activation, residual), atol=1e-4, rtol=1e-5,
                                           msg=lambda m: f"{tokens} tokens, {n_in}->{n_out}: {m}")
    finally:
        torch.set_num_threads(before)


def test_own_path_in_inference_mode_with_parameters():
    """As a model's lean forward calls it: inference mode, a bias that is a Parameter (it needs a
    gradient outside); the copy made there is a normal tensor, usable outside inference mode."""
    if not L._OWN:
        pytest.skip("fastbert's own GEMM needs a CPU with AVX-512")
    x, w, b, r = operands(tokens=9, n_in=100, n_out=40, seed=8)
    packed, bias = L.pack_weight(w), torch.nn.Parameter(b)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            assert packed.uses_own(9)
            got = L.packed_linear(x, packed, bias, residual=r)
    finally:
        torch.set_num_threads(before)
    assert packed._own is not None and not packed._own.is_inference()
    torch.testing.assert_close(got, ref64(x, w, b, residual=r), atol=2e-5, rtol=1e-5)


# ---- fastbert's own small-M GEMM (fastbert._C.linear_f32, csrc/py_linear.cpp) ----------------------------

def own_linear(x, w, b=None, gelu=False, residual=None, threads=1):
    """pack w, then out = x w^T + b (+ the epilogue) through fastbert._C directly."""
    if not _C.linear_f32_available():
        pytest.skip("fastbert._C.linear_f32 needs a CPU with AVX-512")
    packed = torch.empty((w.shape[0] + 31) // 32, w.shape[1], 32)
    _C.linear_f32_pack(w.numpy(), packed.numpy())
    out = torch.empty(x.shape[0], w.shape[0])
    _C.linear_f32(x.numpy(), packed.numpy(), None if b is None else b.numpy(), out.numpy(),
                  None if residual is None else residual.numpy(), gelu, threads)
    return out


@pytest.mark.parametrize("epilogue", [None, "gelu", "residual", "no bias"])
@pytest.mark.parametrize("n_in,n_out", [(40, 100), (100, 40), (384, 1152), (1536, 384)])
def test_own_gemm_matches_the_reference(epilogue, n_in, n_out):
    """Every row-block size the kernel has (1..14 rows, ragged splits of more), N and K that are not
    multiples of 16 or 32 (a masked last panel), each epilogue, on one thread and two."""
    x, w, b, r = operands(tokens=64, n_in=n_in, n_out=n_out, seed=6)
    residual = r if epilogue == "residual" else None
    bias = None if epilogue == "no bias" else b
    counts = range(1, 65) if n_in == 40 else (1, 5, 13, 14, 15, 26, 29, 43, 64)
    for tokens in counts:
        res = None if residual is None else residual[:tokens]
        want = L.linear_ref(x[:tokens].double(), w.double(), None if bias is None else bias.double(),
                            "gelu" if epilogue == "gelu" else None, None if res is None else res.double()).float()
        for threads in (1, 2):
            got = own_linear(x[:tokens], w, bias, epilogue == "gelu", res, threads)
            torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5,
                                       msg=lambda m: f"{tokens} tokens, {threads} threads: {m}")


def test_own_gemm_rows_do_not_depend_on_the_batch():
    """A row's result is the same bits alone, inside a larger x (another row block split, other
    neighbours), and on any thread count: the k order is fixed."""
    x, w, b, _ = operands(tokens=64, n_in=384, n_out=1152, seed=7)
    alone = torch.cat([own_linear(x[i:i + 1], w, b, gelu=True) for i in range(64)])
    for tokens, threads in ((64, 1), (64, 2), (27, 2), (13, 1)):
        assert torch.equal(own_linear(x[:tokens], w, b, gelu=True, threads=threads), alone[:tokens]), (tokens, threads)


def test_own_gemm_errors():
    x, w, b, r = operands(tokens=8, n_in=40, n_out=100)
    own_linear(x, w, b)                                             # skips where the kernel is not available
    packed = torch.empty(4, 40, 32)
    _C.linear_f32_pack(w.numpy(), packed.numpy())
    out = torch.empty(8, 100)
    with pytest.raises(ValueError, match="packed must have shape"):
        _C.linear_f32_pack(w.numpy(), torch.empty(3, 40, 32).numpy())
    with pytest.raises(ValueError, match="same k"):
        _C.linear_f32(x[:, :39].contiguous().numpy(), packed.numpy(), b.numpy(), out.numpy(), None, False)
    with pytest.raises(ValueError, match="out must be"):
        _C.linear_f32(x.numpy(), packed.numpy(), b.numpy(), torch.empty(8, 96).numpy(), None, False)
    with pytest.raises(ValueError, match="bias must have n entries"):
        _C.linear_f32(x.numpy(), packed.numpy(), b[:99].numpy(), out.numpy(), None, False)
    with pytest.raises(ValueError, match="residual must have"):
        _C.linear_f32(x.numpy(), packed.numpy(), b.numpy(), out.numpy(), r[:7].numpy(), False)
    with pytest.raises(ValueError, match="not both"):
        _C.linear_f32(x.numpy(), packed.numpy(), b.numpy(), out.numpy(), r.numpy(), True)
    with pytest.raises(ValueError, match="must not share memory"):                    # out holds partial sums
        _C.linear_f32(x.numpy(), packed.numpy(), b.numpy(), r.numpy(), r.numpy(), False)
    with pytest.raises(ValueError, match="64-byte aligned"):
        _C.linear_f32(x.numpy(), torch.empty(4 * 40 * 32 + 1)[1:].view(4, 40, 32).numpy(), b.numpy(), out.numpy(),
                      None, False)
    with pytest.raises(TypeError):                                  # another dtype is never converted
        _C.linear_f32(x.double().numpy(), packed.numpy(), b.numpy(), out.numpy(), None, False)
    with pytest.raises(TypeError):                                  # nor a strided x copied
        _C.linear_f32(x.t().contiguous().t().numpy(), packed.numpy(), b.numpy(), out.numpy(), None, False)
