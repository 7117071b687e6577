"""bias_gelu: the Triton kernel (on the `device` fixture: CUDA, else CPU in the interpreter) and the
torch path against fp64 autograd; the custom ops' registration (opcheck, torch.compile)."""
import pytest
import torch
import torch.nn.functional as F

import fastbert.ops as ops
from fastbert.kernels import bias_gelu as kernel
from gpu_compile import compile_for_gpu

TOL = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 2e-2}
DTYPES = list(TOL)


def _close(got, ref, dtype, what):
    # element-wise tolerance; reduced grads (dbias) scale with their magnitude
    tol = TOL[dtype]
    scale = max(1.0, ref.abs().max().item())
    torch.testing.assert_close(got.cpu().double(), ref.cpu(), atol=tol * scale, rtol=tol,
                               msg=lambda m: f"{what}: {m}")


def _fp64_grads(x, bias, dy, approximate):
    xd = x.detach().cpu().double().requires_grad_()
    bd = bias.detach().cpu().double().requires_grad_()
    y = F.gelu(xd + bd, approximate=approximate)
    y.backward(dy.cpu().double())
    return y.detach(), xd.grad, bd.grad


def _run(x, bias, dy, approximate, backend="triton"):
    x = x.detach().requires_grad_()
    bias = bias.detach().requires_grad_()
    y = ops.bias_gelu(x, bias, approximate=approximate, backend=backend)
    y.backward(dy)
    return y.detach(), x.grad, bias.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(1, 384), (2, 7, 768), (13, 1000), (1023, 64), (3, 3072), (2, 8192)])
def test_triton_matches_fp64(shape, approximate, dtype, device, launches):
    torch.manual_seed(sum(shape))
    x = (2 * torch.randn(shape)).to(device, dtype)
    bias = torch.randn(shape[-1]).to(device, dtype)
    dy = torch.randn(shape).to(device, dtype)
    calls = launches(kernel, "_fwd", "_bwd")
    y, dx, dbias = _run(x, bias, dy, approximate)
    assert calls == {"_fwd": 1, "_bwd": 1}, "the Triton kernels did not run"
    y_ref, dx_ref, db_ref = _fp64_grads(x, bias, dy, approximate)
    assert y.dtype == dx.dtype == dbias.dtype == dtype and y.shape == x.shape
    _close(y, y_ref, dtype, "y")
    _close(dx, dx_ref, dtype, "dx")
    _close(dbias, db_ref, dtype, "dbias")


def test_tanh_differs_from_erf(device):
    # the flag must reach the kernel: the two GELUs differ by ~1e-4 around |h| = 2
    x = torch.linspace(-3, 3, 384, device=device).reshape(1, 384)
    bias = torch.zeros(384, device=device)
    erf = ops.bias_gelu(x, bias, backend="triton")
    tanh = ops.bias_gelu(x, bias, approximate="tanh", backend="triton")
    assert (erf - tanh).abs().max() > 1e-4
    torch.testing.assert_close(tanh, F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("layout", ["row_slice", "transposed"])
def test_non_contiguous_inputs_and_grads(layout, device):
    torch.manual_seed(1)
    if layout == "row_slice":   # unit column stride, row stride 1000 (a slice of a wider tensor)
        x = torch.randn(2, 5, 1000, device=device)[..., :768]
        dy = torch.randn(2, 5, 900, device=device)[..., :768]
    else:                       # last dim not unit-stride: the launcher copies
        x = torch.randn(768, 10, device=device).t()
        dy = torch.randn(768, 10, device=device).t()
    assert not x.is_contiguous() and not dy.is_contiguous()
    bias = torch.randn(768, device=device)
    y, dx, dbias = _run(x, bias, dy, "none")
    y_ref, dx_ref, db_ref = _fp64_grads(x, bias, dy, "none")
    _close(y, y_ref, torch.float32, "y")
    _close(dx, dx_ref, torch.float32, "dx")
    _close(dbias, db_ref, torch.float32, "dbias")


def test_fp32_bias_on_fp16_activations(device):
    # autocast's case: the GEMM output is fp16, the bias parameter stays fp32
    torch.manual_seed(4)
    x, bias, dy = (torch.randn(33, 768, device=device).half(), torch.randn(768, device=device),
                   torch.randn(33, 768, device=device).half())
    y, dx, dbias = _run(x, bias, dy, "tanh")
    assert (y.dtype, dx.dtype, dbias.dtype) == (torch.float16, torch.float16, torch.float32)
    y_ref, dx_ref, db_ref = _fp64_grads(x, bias, dy, "tanh")
    _close(y, y_ref, torch.float16, "y")
    _close(dx, dx_ref, torch.float16, "dx")
    _close(dbias, db_ref, torch.float32, "dbias")
    torch.testing.assert_close(y, ops.bias_gelu(x, bias, approximate="tanh", backend="torch"), atol=1e-3, rtol=1e-3)


def test_dbias_is_deterministic(device):
    torch.manual_seed(2)
    x, bias, dy = (torch.randn(200, 384, device=device), torch.randn(384, device=device),
                   torch.randn(200, 384, device=device))
    first = kernel.bias_gelu_bwd(dy, x, bias)
    second = kernel.bias_gelu_bwd(dy, x, bias)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_torch_path_autograd(approximate, launches):
    torch.manual_seed(3)
    x = torch.randn(3, 5, 384, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(384, dtype=torch.float64, requires_grad=True)
    calls = launches(kernel, "_fwd", "_bwd")
    assert torch.autograd.gradcheck(lambda a, b: ops.bias_gelu(a, b, approximate=approximate, backend="torch"),
                                    (x[:1, :2, :16].detach().requires_grad_(), bias[:16].detach().requires_grad_()))
    y = ops.bias_gelu(x, bias, approximate=approximate)  # auto on CPU = torch
    y32 = ops.bias_gelu(x.float(), bias.float(), approximate=approximate)
    assert not calls, "auto on CPU must not launch the kernel"
    torch.testing.assert_close(y32, F.gelu(x + bias, approximate=approximate).float())
    torch.testing.assert_close(y, F.gelu(x + bias, approximate=approximate))


@pytest.mark.parametrize("args, kwargs, match", [
    ((torch.zeros(4, 8), torch.zeros(8)), {"approximate": "fast"}, "approximate.*'fast'"),
    ((torch.zeros(4, 8), torch.zeros(7)), {}, r"\(8,\).*\(4, 8\).*\(7,\)"),
    ((torch.zeros(4, 8), torch.zeros(1, 8)), {}, r"\(1, 8\)"),
    ((torch.zeros(4, 8), torch.zeros(8, dtype=torch.int64)), {}, "bias has dtype torch.int64"),
    ((torch.zeros(4, 8, dtype=torch.int32), torch.zeros(8, dtype=torch.int32)), {}, "int32"),
    ((torch.zeros(4, 8), torch.zeros(8, device="meta")), {}, "cpu and meta"),
    ((torch.zeros(4, 8, dtype=torch.float64), torch.zeros(8, dtype=torch.float64)), {"backend": "triton"},
     "float64"),
    ((torch.zeros(4, 8), torch.zeros(8)), {"backend": "cuda"}, "'cuda'"),
])
def test_validation(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        ops.bias_gelu(*args, **kwargs)


@pytest.mark.slow  # a compile for a GPU target (tests/kernels/test_gpu_compile.py compiles every launch)
def test_kernels_compile_for_a_gpu(tmp_path):
    cases = [(name, {"APPROX_TANH": tanh, "BLOCK_M": m, "BLOCK_N": n}, {"b_ptr": "*fp32", "dbp_ptr": "*fp32"})
             for name, m, n in (("_bias_gelu_fwd_kernel", 8, 256), ("_bias_gelu_bwd_kernel", 16, 128))
             for tanh in (False, True)]
    compile_for_gpu("bias_gelu", cases, tmp_path)


# ------------------------------------------------------------------------------------------------
# the custom ops: registration, torch.compile, a training step

def _op_args(device, requires_grad=False):
    torch.manual_seed(5)
    x = torch.randn(6, 5, 48, device=device, requires_grad=requires_grad)
    bias = torch.randn(48, device=device, requires_grad=requires_grad)
    return x, bias


@pytest.mark.parametrize("approx_tanh", [False, True])
def test_opcheck_cpu_reference(approx_tanh):
    """torch.ops.fastbert.bias_gelu(_backward) on CPU: schema, fake impl, autograd, AOT dispatch."""
    x, bias = _op_args("cpu", requires_grad=True)
    torch.library.opcheck(torch.ops.fastbert.bias_gelu.default, (x, bias, approx_tanh, False))
    dy = torch.randn_like(x)
    torch.library.opcheck(torch.ops.fastbert.bias_gelu_backward.default,
                          (dy, x.detach(), bias.detach(), approx_tanh, False))


def test_opcheck_kernel(device):
    """The kernel path: eager checks in the interpreter (it cannot run on fake tensors), all on CUDA."""
    x, bias = _op_args(device, requires_grad=True)
    interpret = device.type == "cpu"
    utils = ("test_schema", "test_autograd_registration", "test_faketensor") + (() if interpret else
                                                                                 ("test_aot_dispatch_dynamic",))
    torch.library.opcheck(torch.ops.fastbert.bias_gelu.default, (x, bias, True, interpret), test_utils=utils)
    torch.library.opcheck(torch.ops.fastbert.bias_gelu_backward.default,
                          (torch.randn_like(x), x.detach(), bias.detach(), False, interpret), test_utils=utils)


def test_compiles_without_graph_breaks():
    """torch.compile(fullgraph=True) over the op on CPU, forward and backward: no graph break."""
    torch._dynamo.reset()
    x, bias = _op_args("cpu", requires_grad=True)

    def f(x, bias):
        return (ops.bias_gelu(x, bias, approximate="tanh")
                + torch.ops.fastbert.bias_gelu(x, bias, False, False)).square().sum()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(x, bias)
    got.backward()
    ref_x, ref_b = (t.detach().clone().requires_grad_() for t in (x, bias))
    f(ref_x, ref_b).backward()
    torch.testing.assert_close(got, f(ref_x, ref_b).detach())
    torch.testing.assert_close(x.grad, ref_x.grad)
    torch.testing.assert_close(bias.grad, ref_b.grad)


STEP_DTYPES = [torch.float32] + [pytest.param(d, marks=pytest.mark.gpu) for d in (torch.float16, torch.bfloat16)]


@pytest.mark.parametrize("dtype", STEP_DTYPES, ids=str)
def test_training_step_matches_fp64(dtype, device):
    """One SGD step of Linear -> bias_gelu on the kernel path equals the same step in fp64."""
    if dtype != torch.float32 and device.type != "cuda":
        pytest.skip(f"{dtype} training step runs on a CUDA GPU (fp32 covers the interpreter)")
    torch.manual_seed(6)
    w0, b0 = torch.randn(256, 64) * 0.1, torch.randn(256) * 0.1
    inp, target = torch.randn(40, 64), torch.randn(40, 256)

    def step(dt, dev, backend):
        w = w0.to(dev, dt, copy=True).requires_grad_()
        b = b0.to(dev, dt, copy=True).requires_grad_()
        h = inp.to(dev, dt) @ w.t()
        loss = ((ops.bias_gelu(h, b, backend=backend).float() - target.to(dev)) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            for p in (w, b):
                p -= 0.5 * p.grad
        return loss.detach().cpu().double(), w.detach().cpu().double(), b.detach().cpu().double()
    got = step(dtype, device, "triton")
    ref = step(torch.float64, "cpu", "torch")
    for name, g, r in zip(("loss", "weight", "bias"), got, ref):
        _close(g, r, dtype, name)
