"""bias_gelu: the Triton kernel (interpreter on CPU) and the torch path against fp64 autograd."""
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
    torch.testing.assert_close(got.double(), ref, atol=tol * scale, rtol=tol, msg=lambda m: f"{what}: {m}")


def _fp64_grads(x, bias, dy, approximate):
    xd = x.detach().double().requires_grad_()
    bd = bias.detach().double().requires_grad_()
    y = F.gelu(xd + bd, approximate=approximate)
    y.backward(dy.double())
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
def test_triton_matches_fp64(shape, approximate, dtype):
    torch.manual_seed(sum(shape))
    x = (2 * torch.randn(shape)).to(dtype)
    bias = torch.randn(shape[-1]).to(dtype)
    dy = torch.randn(shape).to(dtype)
    before = kernel.launch_count["bias_gelu_fwd"], kernel.launch_count["bias_gelu_bwd"]
    y, dx, dbias = _run(x, bias, dy, approximate)
    after = kernel.launch_count["bias_gelu_fwd"], kernel.launch_count["bias_gelu_bwd"]
    assert after == (before[0] + 1, before[1] + 1), "the Triton kernels did not run"
    y_ref, dx_ref, db_ref = _fp64_grads(x, bias, dy, approximate)
    assert y.dtype == dx.dtype == dbias.dtype == dtype and y.shape == x.shape
    _close(y, y_ref, dtype, "y")
    _close(dx, dx_ref, dtype, "dx")
    _close(dbias, db_ref, dtype, "dbias")


def test_tanh_differs_from_erf():
    # the flag must reach the kernel: the two GELUs differ by ~1e-4 around |h| = 2
    x = torch.linspace(-3, 3, 384).reshape(1, 384)
    bias = torch.zeros(384)
    erf = ops.bias_gelu(x, bias, backend="triton")
    tanh = ops.bias_gelu(x, bias, approximate="tanh", backend="triton")
    assert (erf - tanh).abs().max() > 1e-4
    torch.testing.assert_close(tanh, F.gelu(x, approximate="tanh"), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("layout", ["row_slice", "transposed"])
def test_non_contiguous_inputs_and_grads(layout):
    torch.manual_seed(1)
    if layout == "row_slice":   # unit column stride, row stride 1000 (a slice of a wider tensor)
        x = torch.randn(2, 5, 1000)[..., :768]
        dy = torch.randn(2, 5, 900)[..., :768]
    else:                       # last dim not unit-stride: the launcher copies
        x = torch.randn(768, 10).t()
        dy = torch.randn(768, 10).t()
    assert not x.is_contiguous() and not dy.is_contiguous()
    bias = torch.randn(768)
    y, dx, dbias = _run(x, bias, dy, "none")
    y_ref, dx_ref, db_ref = _fp64_grads(x, bias, dy, "none")
    _close(y, y_ref, torch.float32, "y")
    _close(dx, dx_ref, torch.float32, "dx")
    _close(dbias, db_ref, torch.float32, "dbias")


def test_fp32_bias_on_fp16_activations():
    # autocast's case: the GEMM output is fp16, the bias parameter stays fp32
    torch.manual_seed(4)
    x, bias, dy = torch.randn(33, 768).half(), torch.randn(768), torch.randn(33, 768).half()
    y, dx, dbias = _run(x, bias, dy, "tanh")
    assert (y.dtype, dx.dtype, dbias.dtype) == (torch.float16, torch.float16, torch.float32)
    y_ref, dx_ref, db_ref = _fp64_grads(x, bias, dy, "tanh")
    _close(y, y_ref, torch.float16, "y")
    _close(dx, dx_ref, torch.float16, "dx")
    _close(dbias, db_ref, torch.float32, "dbias")
    torch.testing.assert_close(y, ops.bias_gelu(x, bias, approximate="tanh", backend="torch"), atol=1e-3, rtol=1e-3)


def test_dbias_is_deterministic():
    torch.manual_seed(2)
    x, bias, dy = torch.randn(200, 384), torch.randn(384), torch.randn(200, 384)
    first = kernel.bias_gelu_bwd(dy, x, bias)
    second = kernel.bias_gelu_bwd(dy, x, bias)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_torch_path_autograd(approximate):
    torch.manual_seed(3)
    x = torch.randn(3, 5, 384, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(384, dtype=torch.float64, requires_grad=True)
    before = dict(kernel.launch_count)
    assert torch.autograd.gradcheck(lambda a, b: ops.bias_gelu(a, b, approximate=approximate, backend="torch"),
                                    (x[:1, :2, :16].detach().requires_grad_(), bias[:16].detach().requires_grad_()))
    y = ops.bias_gelu(x, bias, approximate=approximate)  # auto on CPU = torch
    assert dict(kernel.launch_count) == before, "auto on CPU must not launch the kernel"
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


def test_kernels_compile_for_a_gpu(tmp_path):
    cases = [(name, {"APPROX_TANH": tanh, "BLOCK_M": m, "BLOCK_N": n}, {"b_ptr": "*fp32", "dbp_ptr": "*fp32"})
             for name, m, n in (("_bias_gelu_fwd_kernel", 8, 256), ("_bias_gelu_bwd_kernel", 16, 128))
             for tanh in (False, True)]
    compile_for_gpu("bias_gelu", cases, tmp_path)
