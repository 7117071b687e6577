"""fastbert.cuda_graphs: bucketing (padding tokens and sequences, slicing back) equals the unbucketed
forward on CPU, where it runs eagerly; on a GPU, graph replay equals eager and graphs are dropped when
the weights change."""
import math

import pytest
import torch
import torch.nn.functional as F

import fastbert
from fastbert import ops
from fastbert._cuda_graphs import CudaGraphs, pack_metadata, plan_for, unpack_metadata


class TinyPackedEncoder(torch.nn.Module):
    """One post-LN encoder layer over packed tokens, built from fastbert.ops: the same call pattern
    as the models' forward_packed (embeddings + add_layer_norm, varlen attention, bias_gelu)."""

    def __init__(self, vocab=50, hidden=32, heads=2, ffn=64, positions=64, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        p = lambda *shape: torch.nn.Parameter(torch.randn(*shape, generator=g) * 0.2)  # noqa: E731
        self.heads = heads
        self.words, self.types, self.pos = p(vocab, hidden), p(2, hidden), p(positions, hidden)
        self.ln0_w, self.ln0_b = p(hidden), p(hidden)
        self.qkv, self.out = p(3 * hidden, hidden), p(hidden, hidden)
        self.ln1_w, self.ln1_b = p(hidden), p(hidden)
        self.ffn1, self.ffn1_b, self.ffn2 = p(ffn, hidden), p(ffn), p(hidden, ffn)
        self.ln2_w, self.ln2_b = p(hidden), p(hidden)

    def forward_packed(self, input_ids, cu_seqlens, max_seqlen, token_type_ids=None, position_ids=None):
        tokens = input_ids.shape[0]
        if position_ids is None:                 # 0..len-1 per sequence, from cu_seqlens alone
            idx = torch.arange(tokens, device=input_ids.device, dtype=cu_seqlens.dtype)
            seq = torch.searchsorted(cu_seqlens[1:].contiguous(), idx, right=True)
            position_ids = idx - cu_seqlens[seq]
        types = torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids
        x = ops.add_layer_norm(F.embedding(input_ids, self.words), F.embedding(types, self.types)
                               + F.embedding(position_ids, self.pos), self.ln0_w, self.ln0_b, 1e-12)
        d = x.shape[-1] // self.heads
        q, k, v = (x @ self.qkv.t()).view(tokens, 3, self.heads, d).unbind(1)
        ctx = ops.varlen_attention(q, k, v, cu_seqlens, max_seqlen).reshape(tokens, -1)
        x = ops.add_layer_norm(ctx @ self.out.t(), x, self.ln1_w, self.ln1_b, 1e-12)
        h = ops.bias_gelu(x @ self.ffn1.t(), self.ffn1_b)
        return ops.add_layer_norm(h @ self.ffn2.t(), x, self.ln2_w, self.ln2_b, 1e-12)


def _batch(lengths, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    return (torch.randint(0, vocab, (total,), generator=g), cu, max(lengths),
            torch.randint(0, 2, (total,), generator=g))


def test_plan_rounds_up_and_pads_with_sequences():
    plan = plan_for(100, 5, 30, True, False, token_buckets=(64, 128, 256), seq_buckets=(16, 32, 64),
                    batch_buckets=(4, 8, 16))
    # 28 padding tokens in one padding sequence of <= 32; 5 + 1 sequences -> batch bucket 8
    assert (plan.tokens, plan.max_seqlen, plan.batch) == (128, 32, 8)
    ids, cu, mx, types = _batch([30, 0, 20, 25, 25])
    buf = pack_metadata(plan, ids, cu, types)
    got_ids, got_cu, got_types, got_pos = unpack_metadata(plan, buf)
    assert got_pos is None and got_ids.shape == got_types.shape == (128,)
    assert got_cu.tolist() == [0, 30, 30, 50, 75, 100, 128, 128, 128]
    assert torch.equal(got_ids[:100], ids.int()) and torch.all(got_ids[100:] == 0)
    assert torch.equal(got_types[:100], types.int()) and torch.all(got_types[100:] == 0)
    many = plan_for(200, 2, 10, False, False, token_buckets=(256,), seq_buckets=(16,), batch_buckets=(8, 16))
    assert many.batch == 8 and math.ceil(56 / 16) + 2 <= many.batch
    with pytest.raises(ValueError, match="tokens 300 exceeds the largest bucket 256; pass larger token_buckets"):
        plan_for(300, 2, 10, False, False, token_buckets=(256,), seq_buckets=(16,), batch_buckets=(8,))
    with pytest.raises(ValueError, match="max_seqlen 17 exceeds the largest bucket 16; pass larger seq_buckets"):
        plan_for(30, 2, 17, False, False, token_buckets=(256,), seq_buckets=(16,), batch_buckets=(8,))
    # the max_seqlen bucket stops at the model's position limit (padding sequences too)
    capped = plan_for(70, 1, 70, False, False, token_buckets=(256,), seq_buckets=(64, 128), batch_buckets=(8,),
                      seq_limit=100)
    assert capped.max_seqlen == 100 and capped.batch == 8
    got_cu = unpack_metadata(capped, pack_metadata(capped, *_batch([70])[:2]))[1]
    assert max(b - a for a, b in zip(got_cu.tolist()[:-1], got_cu.tolist()[1:])) == 100


@pytest.mark.parametrize("with_types", [True, False])
def test_bucketed_equals_unbucketed_on_cpu(with_types):
    """CPU runs the bucketing eagerly: padded tokens and sequences change nothing on the real tokens."""
    model = TinyPackedEncoder()
    served = fastbert.cuda_graphs(model, token_buckets=(64, 128), seq_buckets=(16, 32, 64), batch_buckets=(8,))
    assert isinstance(served, CudaGraphs)
    for lengths in ([13, 0, 31, 2, 1], [40], [3, 3, 3]):
        ids, cu, mx, types = _batch(lengths, seed=len(lengths))
        types = types if with_types else None
        with torch.inference_mode():
            ref = model.forward_packed(ids, cu, mx, token_type_ids=types)
        got = served(ids, cu, mx, token_type_ids=types)
        assert got.shape == ref.shape == (sum(lengths), 32)
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert served.num_graphs == 0, "no graphs off CUDA"


def test_model_built_under_inference_mode():
    """Weights that are inference tensors (no version counter) are served too."""
    with torch.inference_mode():
        model = TinyPackedEncoder(seed=1)
        ids, cu, mx, types = _batch([5, 9], seed=2)
        ref = model.forward_packed(ids, cu, mx, token_type_ids=types)
    got = fastbert.cuda_graphs(model, token_buckets=(16,), seq_buckets=(16,), batch_buckets=(4,))(
        ids, cu, mx, token_type_ids=types)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_a_real_model_if_present(tmp_path):
    """The models' forward_packed through the wrapper, when the models carry it."""
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=64)
    transformers.BertModel(config).save_pretrained(tmp_path)
    model = fastbert.AutoModel.from_pretrained(str(tmp_path)).eval()
    if not hasattr(model, "forward_packed"):
        pytest.skip("this checkout's models have no forward_packed yet")
    ids, cu, mx, types = _batch([9, 0, 17, 4], vocab=99, seed=3)
    with torch.inference_mode():
        ref = model.forward_packed(ids, cu, mx, token_type_ids=types)
    got = fastbert.cuda_graphs(model, token_buckets=(32, 64), seq_buckets=(32,), batch_buckets=(8,))(
        ids, cu, mx, token_type_ids=types)
    ref_h = ref if isinstance(ref, torch.Tensor) else ref.last_hidden_state
    got_h = got if isinstance(got, torch.Tensor) else got.last_hidden_state
    torch.testing.assert_close(got_h, ref_h, atol=1e-5, rtol=1e-5)


def _saved_bert(tmp_path, **config):
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, **config)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(tmp_path)
    return fastbert.AutoModel.from_pretrained(str(tmp_path)).eval()


def test_position_limit_between_buckets(tmp_path):
    """A checkpoint with 100 positions: max_seqlen 70 rounds up to 100, not to the 128 bucket the
    model would refuse, and sequences of exactly 100 tokens are served."""
    model = _saved_bert(tmp_path, max_position_embeddings=100)
    served = fastbert.cuda_graphs(model)
    for lengths in ([70, 3], [100, 100, 1]):
        ids, cu, mx, types = _batch(lengths, vocab=99, seed=4)
        with torch.inference_mode():
            ref = model.forward_packed(ids, cu, mx, token_type_ids=types).last_hidden_state
        got = served(ids, cu, mx, token_type_ids=types).last_hidden_state
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)


def test_empty_batch_as_the_tokenizer_packs_it(tmp_path):
    """tokenizer([], packed=True) gives cu_seqlens [0] and no tokens: forward_packed and the wrapper
    return no rows instead of refusing the batch."""
    model = _saved_bert(tmp_path, max_position_embeddings=64)
    ids, cu = torch.zeros(0, dtype=torch.long), torch.zeros(1, dtype=torch.int32)
    with torch.inference_mode():
        assert model.forward_packed(ids, cu, 0).last_hidden_state.shape == (0, 32)
        model.check_packed(ids, cu, 0)
    assert fastbert.cuda_graphs(model)(ids, cu, 0).last_hidden_state.shape == (0, 32)
    with pytest.raises(ValueError, match="no sequence but input_ids has 2 tokens"):
        fastbert.cuda_graphs(model)(torch.ones(2, dtype=torch.long), cu, 2)
    with pytest.raises(ValueError, match="no sequences, but input_ids has 2 tokens"):
        model.forward_packed(torch.ones(2, dtype=torch.long), cu, 2)


def test_bad_arguments():
    model = TinyPackedEncoder()
    with pytest.raises(TypeError, match="forward_packed"):
        fastbert.cuda_graphs(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="increasing"):
        fastbert.cuda_graphs(model, seq_buckets=(64, 32))
    served = fastbert.cuda_graphs(model)
    ids, cu, mx, _ = _batch([4, 5])
    with pytest.raises(ValueError, match="Python int"):
        served(ids, cu, torch.tensor(mx))
    with pytest.raises(ValueError, match="max_seqlen=3"):
        served(ids, cu, 3)
    # the metadata buffer is int32: host values that do not fit are refused, not wrapped into valid ids
    with pytest.raises(ValueError, match=r"input_ids has values outside int32 \(0 \.\.\. 4294967303\)"):
        served(torch.where(torch.arange(9) == 3, 2**32 + 7, 0), cu, mx)
    with pytest.raises(ValueError, match="token_type_ids has values outside int32"):
        served(ids, cu, mx, token_type_ids=torch.full((9,), -2**40))


@pytest.mark.gpu
def test_replay_equals_eager_and_weights_invalidate():
    if not torch.cuda.is_available():
        pytest.skip("CUDA graphs need a CUDA GPU (the CPU tests cover the bucketing)")
    model = TinyPackedEncoder().cuda().half()
    served = fastbert.cuda_graphs(model, token_buckets=(64, 128), seq_buckets=(32, 64), batch_buckets=(8,),
                                  warmup=1)
    for seed, lengths in enumerate(([13, 0, 31, 2, 1], [20, 20], [13, 0, 31, 2, 1], [5, 7, 9])):
        ids, cu, mx, types = _batch(lengths, seed=seed)
        with torch.inference_mode():
            ref = model.forward_packed(ids.cuda(), cu.cuda(), mx, token_type_ids=types.cuda())
        got = served(ids, cu, mx, token_type_ids=types)   # host inputs: one upload per call
        torch.testing.assert_close(got, ref, atol=2e-3, rtol=2e-3)
    assert served.num_graphs >= 1, "the repeated bucket was not captured"
    with torch.no_grad():
        model.ln2_b.add_(1.0)                               # in-place weight change: _version moves
    ids, cu, mx, types = _batch([13, 0, 31, 2, 1], seed=0)
    with torch.inference_mode():
        ref = model.forward_packed(ids.cuda(), cu.cuda(), mx, token_type_ids=types.cuda())
    torch.testing.assert_close(served(ids, cu, mx, token_type_ids=types), ref, atol=2e-3, rtol=2e-3)
    assert served.num_graphs == 0, "graphs of the old weights must be dropped"
