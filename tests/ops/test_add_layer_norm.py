"""add_layer_norm: the Triton kernel (on the `device` fixture: CUDA, else CPU in the interpreter) and
the torch path against fp64 autograd; the custom ops' registration (opcheck, torch.compile)."""
import pytest
import torch
import torch.nn.functional as F

import fastbert.ops as ops
from fastbert.ops.add_layer_norm import embed_layer_norm_cpu
from fastbert.kernels import add_layer_norm as kernel
from gpu_compile import compile_for_gpu

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
DTYPES = list(TOL)


def _close(got, ref, dtype, what):
    # element-wise tolerance; reduced grads (dweight, dbias) scale with their magnitude
    tol = TOL[dtype]
    scale = max(1.0, ref.abs().max().item())
    torch.testing.assert_close(got.cpu().double(), ref.cpu(), atol=tol * scale, rtol=tol,
                               msg=lambda m: f"{what}: {m}")


def _inputs(shape, dtype, residual=True, affine=True, seed=0, device="cpu"):
    torch.manual_seed(seed)
    n = shape[-1]
    x = (3 * torch.randn(shape) + 1).to(device, dtype)
    r = torch.randn(shape).to(device, dtype) if residual else None
    w = (1 + 0.5 * torch.randn(n)).to(device, dtype) if affine else None
    b = torch.randn(n).to(device, dtype) if affine else None
    return x, r, w, b


def _leaves(*ts, double=False):
    return [None if t is None else (t.detach().cpu().double() if double else t.detach()).requires_grad_()
            for t in ts]


def _fp64(x, r, w, b, eps, dy, dsum=None, keep=None, p=0.0):
    """fp64 autograd reference: (y, s, dx, dr, dw, db), s = x * keep / (1 - p) + r."""
    xd, rd, wd, bd = _leaves(x, r, w, b, double=True)
    s = xd if keep is None else xd * keep.cpu().double() / (1 - p)
    s = s if rd is None else s + rd
    y = F.layer_norm(s, (x.shape[-1],), wd, bd, eps)
    loss = (y * dy.cpu().double()).sum() + (0 if dsum is None else (s * dsum.cpu().double()).sum())
    loss.backward()
    return y.detach(), s.detach(), *(None if t is None else t.grad for t in (xd, rd, wd, bd))


def _triton(launches, x, r, w, b, eps, dy, dsum=None, **kw):
    xl, rl, wl, bl = _leaves(x, r, w, b)
    calls = launches(kernel, "_fwd", "_bwd")
    out = ops.add_layer_norm(xl, rl, wl, bl, eps, return_sum=dsum is not None, backend="triton", **kw)
    y, s = out if dsum is not None else (out, None)
    if dsum is None:
        y.backward(dy)
    else:
        torch.autograd.backward([y, s], [dy, dsum])
    assert calls == {"_fwd": 1, "_bwd": 1}, "the Triton kernels did not run"
    return y.detach(), (None if s is None else s.detach()), *(None if t is None else t.grad for t in (xl, rl, wl, bl))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 384), (2, 7, 768), (13, 1000), (1023, 64), (3, 3000), (3, 3072), (2, 8192)])
def test_triton_matches_fp64(shape, dtype, device, launches):
    x, r, w, b = _inputs(shape, dtype, seed=shape[0], device=device)
    dy = torch.randn(shape).to(device, dtype)
    got = _triton(launches, x, r, w, b, 1e-5, dy)
    ref = _fp64(x, r, w, b, 1e-5, dy)
    assert got[0].dtype == dtype and got[0].shape == x.shape
    for name, g, e in zip(("y", "s", "dx", "dresidual", "dweight", "dbias"), got, ref):
        if g is not None:
            assert g.dtype == dtype, name
            _close(g, e, dtype, name)


@pytest.mark.parametrize("residual, affine", [(False, True), (True, False), (False, False)])
def test_optional_residual_weight_bias(residual, affine, device, launches):
    x, r, w, b = _inputs((37, 384), torch.float32, residual=residual, affine=affine, seed=4, device=device)
    dy = torch.randn(37, 384, device=device)
    got = _triton(launches, x, r, w, b, 1e-12, dy)
    ref = _fp64(x, r, w, b, 1e-12, dy)
    for name, g, e in zip(("y", "dx", "dresidual", "dweight", "dbias"), got[:1] + got[2:], ref[:1] + ref[2:]):
        assert (g is None) == (e is None), name
        if g is not None:
            _close(g, e, torch.float32, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_return_sum_and_its_gradient(dtype, device, launches):
    # pre-LN style: the sum is used downstream too, so its gradient joins dx and dresidual
    x, r, w, b = _inputs((29, 1000), dtype, seed=5, device=device)
    dy, dsum = torch.randn(29, 1000).to(device, dtype), torch.randn(29, 1000).to(device, dtype)
    got = _triton(launches, x, r, w, b, 1e-5, dy, dsum)
    ref = _fp64(x, r, w, b, 1e-5, dy, dsum)
    for name, g, e in zip(("y", "sum", "dx", "dresidual", "dweight", "dbias"), got, ref):
        _close(g, e, dtype, name)


def test_fp16_branch_on_fp32_residual_stream(device, launches):
    # autocast's case: an fp16 GEMM output added to an fp32 residual with fp32 LayerNorm parameters;
    # the sum and the output are fp32 (torch's promotion), each gradient comes back in its input's dtype
    x, _, _, _ = _inputs((41, 768), torch.float16, seed=12, device=device)
    _, r, w, b = _inputs((41, 768), torch.float32, seed=13, device=device)
    dy = torch.randn(41, 768, device=device)
    got = _triton(launches, x, r, w, b, 1e-12, dy)
    ref = _fp64(x, r, w, b, 1e-12, dy)
    assert [t.dtype for t in got[:1] + got[2:]] == [torch.float32, torch.float16] + [torch.float32] * 3
    for name, g, e in zip(("y", "dx", "dresidual", "dweight", "dbias"), got[:1] + got[2:], ref[:1] + ref[2:]):
        _close(g, e, torch.float16 if name == "dx" else torch.float32, name)
    torch.testing.assert_close(got[0], ops.add_layer_norm(x, r, w, b, 1e-12, backend="torch"))


def test_eps_reaches_the_kernel(device, launches):
    x, r, w, b = _inputs((5, 384), torch.float32, seed=6, device=device)
    dy = torch.randn(5, 384, device=device)
    got = _triton(launches, x, r, w, b, 0.5, dy)
    ref = _fp64(x, r, w, b, 0.5, dy)
    _close(got[0], ref[0], torch.float32, "y")
    _close(got[2], ref[2], torch.float32, "dx")


@pytest.mark.parametrize("layout", ["row_slice", "transposed"])
def test_non_contiguous_inputs_and_grads(layout, device, launches):
    torch.manual_seed(7)
    if layout == "row_slice":  # unit column stride, row stride wider than the row
        x = torch.randn(3, 5, 1000, device=device)[..., :768]
        r = torch.randn(15, 800, device=device)[:, :768].view(3, 5, 768)
        dy = torch.randn(3, 5, 900, device=device)[..., :768]
    else:                      # last dim not unit-stride: the launcher copies
        x, r, dy = (torch.randn(768, 11, device=device).t() for _ in range(3))
    assert not x.is_contiguous() and not dy.is_contiguous()
    w, b = 1 + torch.randn(768, device=device) * 0.3, torch.randn(768, device=device)
    got = _triton(launches, x, r, w, b, 1e-12, dy)
    ref = _fp64(x, r, w, b, 1e-12, dy)
    for name, g, e in zip(("y", "s", "dx", "dresidual", "dweight", "dbias"), got, ref):
        if g is not None:
            _close(g, e, torch.float32, name)


@pytest.mark.parametrize("n", [1, 64, 384, 1000, 3072, 8192])
def test_gpu_config_prune_keeps_a_fitting_tile(n):
    # the GPU autotuner only sees what the prune keeps: never nothing, never a tile over the cap
    block_n = 1 << (n - 1).bit_length()
    for cap, prune in ((16384, kernel._prune(16384)), (8192, kernel._prune(8192))):
        kept = prune(kernel._configs(), {}, BLOCK_N=block_n)
        assert kept and all(c.kwargs["BLOCK_M"] * block_n <= cap for c in kept)


def test_fp32_forward_prune_keeps_at_most_8_warps():
    # one fp32 row of 8192 on 16 warps spilled on sm_89 (AOT compile sweep); 16-bit rows keep 16 warps
    for dtype, most in ((torch.float32, 8), (torch.float16, 16)):
        kept = kernel._fwd.prune(kernel._configs(), {"x_ptr": torch.empty(2, 8192, dtype=dtype)}, BLOCK_N=8192)
        assert kept and max(c.num_warps for c in kept) == most, (dtype, kept)


def test_weight_grads_are_deterministic(device):
    x, r, w, b = _inputs((300, 384), torch.float32, seed=8, device=device)
    dy = torch.randn(300, 384, device=device)
    y, s, mean, rstd = kernel.add_layer_norm_fwd(x, r, w, b, 1e-5, store_sum=True)
    first = kernel.add_layer_norm_bwd(dy, s, w, mean, rstd)
    second = kernel.add_layer_norm_bwd(dy, s, w, mean, rstd)
    assert all(torch.equal(a, c) for a, c in zip(first, second))


def test_dropout_zero_is_exact_and_mask_is_reproducible(device):
    x, r, w, b = _inputs((64, 384), torch.float32, seed=9, device=device)
    plain = ops.add_layer_norm(x, r, w, b, 1e-5, backend="triton")
    assert torch.equal(ops.add_layer_norm(x, r, w, b, 1e-5, dropout_p=0.0, seed=3, backend="triton"), plain)
    one = ops.add_layer_norm(x, r, w, b, 1e-5, dropout_p=0.25, seed=11, backend="triton")
    again = ops.add_layer_norm(x, r, w, b, 1e-5, dropout_p=0.25, seed=11, backend="triton")
    other = ops.add_layer_norm(x, r, w, b, 1e-5, dropout_p=0.25, seed=12, backend="triton")
    assert torch.equal(one, again) and not torch.equal(one, other)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_dropout_statistics_and_gradients(p, device, launches):
    # keep rate within 5 sigma of 1 - p; forward and backward equal fp64 with the kernel's own mask
    shape = (96, 768)
    x, r, w, b = _inputs(shape, torch.float32, seed=10, device=device)
    x = x.abs() + 0.1  # nonzero, so the mask is readable from the returned sum
    dy, dsum = torch.randn(shape, device=device), torch.zeros(shape, device=device)
    got = _triton(launches, x, r, w, b, 1e-5, dy, dsum, dropout_p=p, seed=1234)
    keep = (got[1] - r).abs() > 1e-3
    n = keep.numel()
    rate = keep.double().mean().item()
    assert abs(rate - (1 - p)) < 5 * ((p * (1 - p) / n) ** 0.5), f"keep rate {rate} for p={p}"
    dropped = (x * keep / (1 - p)).cpu().double()
    assert abs(dropped.mean().item() / x.cpu().double().mean().item() - 1) < 0.05  # expectation preserved
    ref = _fp64(x, r, w, b, 1e-5, dy, dsum, keep=keep, p=p)
    for name, g, e in zip(("y", "sum", "dx", "dresidual", "dweight", "dbias"), got, ref):
        _close(g, e, torch.float32, name)


def test_torch_path_autograd_and_dropout(launches):
    x, r, w, b = (t.double() for t in _inputs((2, 3, 8), torch.float32, seed=11))
    calls = launches(kernel, "_fwd", "_bwd")
    f = lambda *a: ops.add_layer_norm(*a, 1e-5, backend="torch")
    assert torch.autograd.gradcheck(f, tuple(_leaves(x, r, w, b)))
    y, s = ops.add_layer_norm(x, r, w, b, 1e-5, return_sum=True)  # auto on CPU = torch
    ops.add_layer_norm(x.float(), r.float(), w.float(), b.float(), 1e-5)
    assert not calls, "auto on CPU must not launch the kernel"
    torch.testing.assert_close(y, F.layer_norm(x + r, (8,), w, b, 1e-5))
    torch.testing.assert_close(s, x + r)
    xs = torch.ones(200, 384)
    y = ops.add_layer_norm(xs, None, None, None, 1e-5, return_sum=True, dropout_p=0.5, seed=1)[1]
    assert set(y.unique().tolist()) == {0.0, 2.0} and abs((y == 0).double().mean().item() - 0.5) < 0.02


_x = torch.zeros(4, 8)
_w = torch.ones(8)


@pytest.mark.parametrize("args, kwargs, match", [
    ((torch.zeros(2, 8193), None, None, None), {}, "hidden size 8193 exceeds 8192"),
    ((_x, torch.zeros(4, 9), _w, _w), {}, r"residual shape \(4, 9\) != x shape \(4, 8\)"),
    ((_x, None, torch.ones(9), _w), {}, r"weight must have shape \(8,\), got \(9,\)"),
    ((_x, None, _w, torch.ones(2, 4)), {}, r"bias must have shape \(8,\), got \(2, 4\)"),
    ((_x, _x.long(), _w, _w), {}, "residual has dtype torch.int64"),
    ((_x, None, _w.int(), _w), {}, "weight has dtype torch.int32"),
    ((_x.int(), None, None, None), {}, "int32"),
    ((_x, torch.zeros(4, 8, device="meta"), _w, _w), {}, "residual is on meta"),
    ((_x, None, _w, _w, 0.0), {}, "eps must be > 0, got 0.0"),
    ((_x, None, _w, _w), {"dropout_p": 1.0}, r"dropout_p must be in \[0, 1\), got 1.0"),
    ((_x.double(), None, None, None), {"backend": "triton"}, "float64"),
    ((_x, None, _w, _w), {"dropout_p": 0.1, "seed": -1}, r"seed must be in \[0, 2\*\*31\), got -1"),
    ((torch.zeros(4, 0), None, None, None), {}, "non-empty last dim"),
])
def test_validation(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ops.add_layer_norm(*args, **kwargs)


@pytest.mark.slow  # a compile for a GPU target (tests/kernels/test_gpu_compile.py compiles every launch)
def test_kernels_compile_for_a_gpu(tmp_path):
    fp32 = {name: "*fp32" for name in ("mean_ptr", "rstd_ptr", "dwp_ptr", "dbp_ptr", "r_ptr", "dr_ptr")}
    fp32.update(eps="fp32", p="fp32", seed_ptr="*i64")
    fwd = [("_add_layer_norm_fwd_kernel", dict(HAS_RESIDUAL=on, STORE_SUM=on, DROPOUT=on, STORE_STATS=on,
                                               BLOCK_M=4, BLOCK_N=1024), fp32)
           for on in (False, True)]
    bwd = [("_add_layer_norm_bwd_kernel", dict(HAS_DSUM=on, DROPOUT=on, STORE_DR=on, BLOCK_M=4, BLOCK_N=1024), fp32)
           for on in (False, True)]
    compile_for_gpu("add_layer_norm", fwd + bwd, tmp_path)


# ------------------------------------------------------------------------------------------------
# the custom ops: registration, inference stores, torch.compile, a training step

def _op_inputs(device, residual_dtype=torch.float32):
    x, r, w, b = _inputs((3, 7, 96), torch.float32, seed=14, device=device)
    return [t.requires_grad_() for t in (x, r.to(residual_dtype), w, b)]


@pytest.mark.parametrize("return_sum, residual_dtype", [(False, torch.float32), (True, torch.float32),
                                                        (False, torch.float16)])
def test_opcheck_cpu_reference(return_sum, residual_dtype):
    """torch.ops.fastbert.add_layer_norm(_backward) on CPU: schema, fake impl, autograd, AOT dispatch."""
    x, r, w, b = _op_inputs("cpu", residual_dtype)
    torch.library.opcheck(torch.ops.fastbert.add_layer_norm.default,
                          (x, r, w, b, 1e-5, return_sum, 0.0, None, True, False))
    y, s, mean, rstd = torch.ops.fastbert.add_layer_norm(x, r, w, b, 1e-5, True, 0.0, None, True, False)
    dy = torch.randn_like(y)
    torch.library.opcheck(torch.ops.fastbert.add_layer_norm_backward.default,
                          (dy, dy if return_sum else None, s.detach(), w.detach(), mean, rstd, 0.0, None,
                           torch.float32, residual_dtype, False))


def test_opcheck_kernel(device):
    """The kernel path, dropout included: eager checks in the interpreter (it cannot run on fake
    tensors), all of them on CUDA."""
    x, r, w, b = _op_inputs(device)
    interpret = device.type == "cpu"
    utils = ("test_schema", "test_autograd_registration", "test_faketensor") + (() if interpret else
                                                                                 ("test_aot_dispatch_dynamic",))
    seed = torch.tensor([7], device=device)
    torch.library.opcheck(torch.ops.fastbert.add_layer_norm.default,
                          (x, r, w, b, 1e-5, True, 0.2, seed, True, interpret), test_utils=utils)


def test_inference_skips_the_statistics(device):
    """Without autograd the op stores neither the sum nor mean/rstd, and y is unchanged."""
    x, r, w, b = _inputs((20, 384), torch.float32, seed=15, device=device)
    interpret = device.type == "cpu"
    full = torch.ops.fastbert.add_layer_norm(x, r, w, b, 1e-5, False, 0.0, None, True, interpret)
    lean = torch.ops.fastbert.add_layer_norm(x, r, w, b, 1e-5, False, 0.0, None, False, interpret)
    assert full[2].shape == (20,) and full[1].shape == x.shape
    assert lean[1].numel() == lean[2].numel() == lean[3].numel() == 0
    assert torch.equal(full[0], lean[0])
    y, s, mean, rstd = kernel.add_layer_norm_fwd(x, r, w, b, 1e-5, store_stats=False)
    assert s is None and mean is None and rstd is None and torch.equal(y, full[0])


def test_compiles_without_graph_breaks():
    """torch.compile(fullgraph=True) over the op on CPU, forward and backward: no graph break."""
    torch._dynamo.reset()
    x, r, w, b = _op_inputs("cpu")

    def f(x, r, w, b):
        y, s = ops.add_layer_norm(x, r, w, b, 1e-5, return_sum=True)
        y2 = torch.ops.fastbert.add_layer_norm(x, None, w, b, 1e-5, False, 0.0, None, True, False)[0]
        return (y * s + y2).square().sum()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, r, w, b)
    got.backward()
    refs = [t.detach().clone().requires_grad_() for t in (x, r, w, b)]
    f(*refs).backward()
    torch.testing.assert_close(got, f(*refs).detach())
    for t, ref in zip((x, r, w, b), refs):
        torch.testing.assert_close(t.grad, ref.grad)


STEP_DTYPES = [torch.float32] + [pytest.param(d, marks=pytest.mark.gpu) for d in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("dtype", STEP_DTYPES, ids=str)
def test_training_step_matches_fp64(dtype, device):
    """One SGD step of Linear -> add_layer_norm(residual) on the kernel path equals the step in fp64."""
    if dtype != torch.float32 and device.type != "cuda":
        pytest.skip(f"{dtype} training step runs on a CUDA GPU (fp32 covers the interpreter)")
    torch.manual_seed(16)
    w0, g0, b0 = torch.randn(128, 64) * 0.1, 1 + 0.1 * torch.randn(128), 0.1 * torch.randn(128)
    inp, res, target = torch.randn(30, 64), torch.randn(30, 128), torch.randn(30, 128)

    def step(dt, dev, backend):
        params = [t.to(dev, dt, copy=True).requires_grad_() for t in (w0, g0, b0)]
        w, g, b = params
        h = inp.to(dev, dt) @ w.t()
        y = ops.add_layer_norm(h, res.to(dev, dt), g, b, 1e-5, backend=backend)
        loss = ((y.float() - target.to(dev)) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= 0.5 * p.grad
        return [t.detach().cpu().double() for t in [loss] + params]
    got = step(dtype, device, "triton")
    ref = step(torch.float64, "cpu", "torch")
    for name, a, e in zip(("loss", "weight", "ln weight", "ln bias"), got, ref):
        _close(a, e, dtype, name)


@pytest.mark.parametrize("rows,n", [(1, 384), (26, 384), (64, 100), (700, 384)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_cpu_inference_takes_the_own_layer_norm(rows, n, with_residual, monkeypatch):
    """CPU fp32 inference runs fastbert._C.layer_norm_f32 (no OpenMP team woken before the C++ layer
    stack; 700 x 384 is split over threads): the fp64 reference's values, a row's bits the same alone
    and among others, and with a gradient to record torch's LayerNorm runs."""
    import importlib

    from fastbert import _C
    module = importlib.import_module("fastbert.ops.add_layer_norm")
    g = torch.Generator().manual_seed(rows)
    x, r = (torch.randn(rows, n, generator=g) * 3 + 1 for _ in range(2))
    w, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    residual = r if with_residual else None
    calls, own = [], _C.layer_norm_f32
    monkeypatch.setattr(module._C, "layer_norm_f32", lambda *a: calls.append(1) or own(*a))
    with torch.inference_mode():
        got = ops.add_layer_norm(x, residual, w, b, 1e-12)
        last = ops.add_layer_norm(x[-1:], None if residual is None else residual[-1:], w, b, 1e-12)
    if not _C.linear_f32_available():
        pytest.skip("fastbert._C's LayerNorm needs a CPU with AVX-512")
    assert len(calls) == 2
    want = F.layer_norm((x + r if with_residual else x).double(), (n,), w.double(), b.double(), 1e-12).float()
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert torch.equal(last, got[-1:])
    calls.clear()
    ops.add_layer_norm(x, residual, w.requires_grad_(), b, 1e-12)      # a gradient to record: torch's
    assert not calls


def _embedding_tables(vocab=50, positions=20, types=2, n=48, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(vocab, n, generator=g), torch.randn(positions, n, generator=g),
            torch.randn(types, n, generator=g), 1 + 0.3 * torch.randn(n, generator=g), torch.randn(n, generator=g))


@pytest.mark.parametrize("given_types", [False, True])
@pytest.mark.parametrize("type_table", [True, False])
def test_embed_layer_norm_cpu_is_the_embeddings_torch_ops(given_types, type_table):
    """The C++ lookups + LayerNorm give the embeddings module's torch ops bit for bit (the same sums in
    the same order), with token type ids, with type 0 implied, and without a type table."""
    word, position, token_type, w, b = _embedding_tables()
    ids, pos = torch.randint(0, 50, (33,)), torch.arange(33) % 20
    types = torch.randint(0, 2, (33,)) if given_types else None
    table = token_type if type_table else None
    other = position[pos]
    if table is not None:
        other = other + (table[types] if given_types else table[0])
    want = ops.add_layer_norm(word[ids], other, w, b, 1e-12)      # CPU float32 inference: fastbert._C's LayerNorm
    torch.testing.assert_close(want, F.layer_norm(word[ids] + other, (48,), w, b, 1e-12), rtol=1e-5, atol=1e-5)
    got = embed_layer_norm_cpu(ids, pos, types if type_table else None, word, position, table, w, b, 1e-12)
    if got is None:
        pytest.skip("this CPU has no AVX-512: the C++ embeddings pass does not run")
    assert torch.equal(got, want)


def test_embed_layer_norm_cpu_rows_do_not_depend_on_their_batch():
    word, position, token_type, w, b = _embedding_tables(n=384)
    ids, pos = torch.randint(0, 50, (700,)), torch.arange(700) % 20      # 700 rows: split over threads
    alone = embed_layer_norm_cpu(ids[5:6], pos[5:6], None, word, position, token_type, w, b, 1e-12)
    together = embed_layer_norm_cpu(ids, pos, None, word, position, token_type, w, b, 1e-12)
    if alone is None:
        pytest.skip("this CPU has no AVX-512: the C++ embeddings pass does not run")
    assert torch.equal(alone[0], together[5])


def test_embed_layer_norm_cpu_names_an_id_out_of_range_and_declines_what_it_cannot_run():
    word, position, token_type, w, b = _embedding_tables()
    ids, pos = torch.tensor([1, 2, 3]), torch.tensor([0, 1, 2])
    if embed_layer_norm_cpu(ids, pos, None, word, position, token_type, w, b, 1e-12) is None:
        pytest.skip("this CPU has no AVX-512: the C++ embeddings pass does not run")
    with pytest.raises(IndexError, match="input id 50 at token 1 is out of range for its table of 50 rows"):
        embed_layer_norm_cpu(torch.tensor([1, 50, 3]), pos, None, word, position, token_type, w, b, 1e-12)
    with pytest.raises(IndexError, match="position id -1"):
        embed_layer_norm_cpu(ids, torch.tensor([0, -1, 2]), None, word, position, token_type, w, b, 1e-12)
    with pytest.raises(IndexError, match="token type id 2"):
        embed_layer_norm_cpu(ids, pos, torch.tensor([0, 2, 1]), word, position, token_type, w, b, 1e-12)
    # a table that records a gradient, and float64 tables, are the torch ops' to run
    assert embed_layer_norm_cpu(ids, pos, None, word.requires_grad_(), position, token_type, w, b, 1e-12) is None
    assert embed_layer_norm_cpu(ids, pos, None, word.detach().double(), position, token_type, w, b, 1e-12) is None
