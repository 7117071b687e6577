"""The kernel launchers under torch.compile and on several GPUs, without running a kernel: a symbolic
max_seqlen stays symbolic (no int() that would specialise the graph on its value), and every launch
makes its tensors' CUDA device current."""
import contextlib

import pytest
import torch
from gpu_compile import recording
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from fastbert.kernels import _autotune
from fastbert.kernels import attention as att
from fastbert.kernels import relative_attention as rel


@pytest.fixture
def symbolic():
    """(fake tensor mode, an unbacked SymInt): any guard on the SymInt's value raises."""
    env = ShapeEnv()
    with FakeTensorMode(shape_env=env) as mode:
        yield mode, env.create_unbacked_symint()


def _scalars(launch):
    return [a for a in launch.args if isinstance(a, torch.SymInt)]


def test_varlen_attention_keeps_max_seqlen_symbolic(symbolic):
    _, max_seqlen = symbolic
    q = torch.empty(40, 2, 64, dtype=torch.float16)
    cu = torch.empty(3, dtype=torch.int32)
    with recording() as launches:
        out, lse = att.attention_fwd(q, q, q, scale=0.125, cu_seqlens=cu, max_seqlen=max_seqlen)
        att.attention_bwd(q, q, q, q, out, lse, scale=0.125, cu_seqlens=cu, max_seqlen=max_seqlen)
    assert [x.name for x in launches] == ["_attention_fwd_kernel", "_attention_bwd_preprocess_kernel",
                                          "_attention_bwd_dkdv_kernel", "_attention_bwd_dq_kernel"]
    assert lse.shape[2] is max_seqlen or str(lse.shape[2]) == str(max_seqlen)
    assert all(_scalars(x) for x in launches), "max_seqlen reached every launch as a SymInt"


def test_relative_attention_keeps_max_seqlen_symbolic(symbolic):
    _, max_seqlen = symbolic
    q = torch.empty(40, 2, 32, dtype=torch.float16)
    cu, pos = torch.empty(3, dtype=torch.int32), torch.empty(40, dtype=torch.int32)
    bias = torch.empty(9, 2, dtype=torch.float32)
    with recording() as launches:
        rel.relative_attention_fwd(q, q, q, cu, max_seqlen, pos, bias=bias, radius=4, scale=0.2)
    assert len(launches) == 1 and _scalars(launches[0])


def test_launches_make_the_tensors_device_current(monkeypatch):
    """A tensor on cuda:1 while cuda:0 is current: the launch runs inside torch.cuda.device(cuda:1)."""
    entered = []

    @contextlib.contextmanager
    def device(d):
        entered.append(torch.device(d))
        yield

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", device)

    class OnGpu1:
        device = torch.device("cuda", 1)

    with _autotune.on_device(OnGpu1()):
        pass
    with _autotune.on_device(torch.empty(1)):                     # CPU: nothing to switch
        pass
    OnGpu1.device = torch.device("cuda", 0)
    with _autotune.on_device(OnGpu1()):                           # already current: no switch
        pass
    assert entered == [torch.device("cuda", 1)]
