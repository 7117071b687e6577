"""fastbert.ops.length_runs: packed CPU attention with no padding: fastbert._C's kernel (float32, head_dim
a multiple of 16, AVX-512), else one SDPA per run of equal lengths."""
import pytest
import torch

from fastbert import _C
from fastbert.ops import varlen_attention
from fastbert.ops.attention import varlen_attention_ref
from fastbert.ops.length_runs import (MAX_RUNS, length_runs, packed_attention, packed_attention_calls, runs_apply,
                                      varlen_attention_runs)


def _packed(lengths, heads=3, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths), 0)
    qkv = torch.randn(int(cu[-1]), 3, heads, dim, generator=g)    # q, k, v strided, as the fused QKV GEMM gives
    return (*qkv.unbind(1), cu)


def test_runs_of_adjacent_equal_lengths():
    _, _, _, cu = _packed([5, 5, 3, 0, 0, 5, 1])
    assert length_runs(cu) == [(0, 2, 5), (10, 1, 3), (13, 2, 0), (13, 1, 5), (18, 1, 1)]


@pytest.mark.parametrize("lengths", [[7, 7, 7, 6, 4, 4, 1], [1, 13, 2, 13, 0, 5], [1]])
def test_matches_the_padded_reference(lengths):
    q, k, v, cu = _packed(lengths)
    want = varlen_attention_ref(q.double(), k.double(), v.double(), cu, max(lengths)).float()
    got = varlen_attention(q, k, v, cu, max(lengths))             # the op's CPU inference path
    assert runs_apply(q, k, v, cu, 0.0) is not None and got.is_contiguous()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _kernel_or_skip(q, k, v, cu):
    out = packed_attention(q, k, v, cu, q.shape[-1] ** -0.5)
    if out is None:
        pytest.skip("fastbert._C's attention kernel needs an AVX-512 CPU")
    return out


@pytest.mark.parametrize("dim", [16, 32, 64, 128])
@pytest.mark.parametrize("lengths", [[1], [100, 17, 0, 64, 3, 16], [513, 31]])
def test_kernel_matches_the_padded_reference(lengths, dim):
    q, k, v, cu = _packed(lengths, heads=2, dim=dim)
    got = _kernel_or_skip(q, k, v, cu)
    want = varlen_attention_ref(q.double(), k.double(), v.double(), cu, max(lengths)).float()
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(varlen_attention(q, k, v, cu, max(lengths)), got, atol=0, rtol=0)   # the op's path
    torch.testing.assert_close(varlen_attention_runs(q, k, v, length_runs(cu), dim ** -0.5), want,
                               atol=1e-5, rtol=1e-5)   # the SDPA runs it replaces, where it does not run


def test_kernel_bits_do_not_depend_on_the_thread_count():
    q, k, v, cu = _packed([300, 200, 100, 7], heads=12, dim=32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _kernel_or_skip(q, k, v, cu)
        torch.set_num_threads(4)
        assert torch.equal(packed_attention(q, k, v, cu, 32 ** -0.5), one)
    finally:
        torch.set_num_threads(threads)


def test_kernel_refuses_what_it_cannot_take():
    q, k, v, cu = _packed([3, 2], dim=32)
    assert packed_attention(q.double(), k.double(), v.double(), cu, 0.2) is None   # float64: SDPA runs
    assert packed_attention(q[..., :24], k[..., :24], v[..., :24], cu, 0.2) is None   # head_dim 24
    out = torch.empty(q.shape)
    with pytest.raises(ValueError, match="cu_seqlens must start at 0 and end at the token count"):
        _C.attention_packed(q.numpy(), k.numpy(), v.numpy(), torch.tensor([0, 4]).numpy(), out.numpy(), 0.2)


def test_calls_over_one_batch_equal_the_kernel_per_call():
    # a forward's layers: q, k, v as unbound views of one (tokens, 3, heads, head_dim) QKV output
    q, k, v, cu = _packed([9, 30, 1], heads=3, dim=32)
    want = _kernel_or_skip(q, k, v, cu)
    attend = packed_attention_calls(cu, 32, 32 ** -0.5)
    for _ in range(2):
        assert torch.equal(attend(q, k, v), want)
    qkv = torch.stack([q, k, v], 1)
    assert torch.equal(attend(*qkv.unbind(1)), want)
    assert packed_attention_calls(cu, 24, 0.2) is None and packed_attention_calls(cu, 144, 0.2) is None


@pytest.mark.parametrize("dim", [8, 32])   # SDPA runs, the kernel
def test_a_sequence_gives_the_same_bits_alone_and_in_any_batch(dim):
    q, k, v, cu = _packed([9, 9, 9, 4], dim=dim)
    together = varlen_attention(q, k, v, cu, 9)
    for first, n in ((0, 9), (9, 9), (27, 4)):
        alone = varlen_attention(q[first:first + n], k[first:first + n], v[first:first + n],
                                 torch.tensor([0, n], dtype=torch.int32), n)
        assert torch.equal(alone, together[first:first + n])


def test_falls_back_where_it_does_not_apply():
    q, k, v, cu = _packed([3, 2])
    assert runs_apply(q, k, v, cu, 0.1) is None                                   # dropout
    assert runs_apply(q.half(), k.half(), v.half(), cu, 0.0) is None              # half precision
    qg = q.clone().requires_grad_()
    assert runs_apply(qg, k, v, cu, 0.0) is None                                  # autograd
    out = varlen_attention(qg, k, v, cu, 3)
    out.sum().backward()
    assert qg.grad is not None
    q, k, v, cu = _packed([1 + i % 2 for i in range(MAX_RUNS + 1)])
    assert runs_apply(q, k, v, cu, 0.0) is None                                   # too many runs: padded
    torch.testing.assert_close(varlen_attention_runs(q, k, v, length_runs(cu), q.shape[-1] ** -0.5),
                               varlen_attention(q, k, v, cu, 2), atol=1e-6, rtol=1e-5)
