"""The packed entry point, forward_packed(input_ids, cu_seqlens, max_seqlen, ...), on every family:
it equals the padded forward on the real tokens, it never reads a device value on the host, and
torch.compile(fullgraph=True) traces it; the padded forward reads the device once.

Host reads are counted with a TorchFunctionMode (tolist / item / bool / int / nonzero), by the
fastbert file that asks for them. Reads and graph breaks inside fastbert.ops are reported apart:
those ops become opaque custom ops, and then the strict checks here hold for the whole call."""
import os
import traceback

import pytest
import torch
import torch.nn.functional as F
import transformers as T
from torch.overrides import TorchFunctionMode

import fastbert
from test_models import FAMILIES
from tiny_families import CONFIGS

OPS_DIR = os.path.join(os.path.dirname(fastbert.__file__), "ops") + os.sep
FASTBERT_DIR = os.path.dirname(fastbert.__file__) + os.sep
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__,
               torch.Tensor.__float__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero}


class HostReads(TorchFunctionMode):
    """Records (fastbert file, function) for each call that copies a device value to the host."""

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _HOST_READS:
            frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(FASTBERT_DIR)]
            where = frames[-1] if frames else None
            self.reads.append((where.filename if where else "?", where.name if where else "?", func.__name__))
        return func(*args, **(kwargs or {}))

    def outside_ops(self):
        return [r for r in self.reads if not r[0].startswith(OPS_DIR)]


def build(family, backend="torch"):
    cls, kwargs, prefix = FAMILIES[family]
    torch.manual_seed(0)
    hf = getattr(T, prefix + "Model")(cls(**kwargs)).eval()
    fast = getattr(fastbert, prefix + "Model").from_hf_config(hf.config, backend=backend)
    fast.load_state_dict(hf.state_dict(), strict=True)
    return fast.eval()


def build_tiny(family):
    """fastbert's model of tiny_families' config, random weights, on the torch path."""
    torch.manual_seed(0)
    return fastbert.AutoModel.from_config(CONFIGS[family](), backend="torch").eval()


def padded_and_packed(config, lengths=(9, 0, 4, 1), seq=9):
    pad = config.pad_token_id if config.pad_token_id is not None else 0
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(pad + 2, config.vocab_size, (len(lengths), seq), generator=g)
    mask = (torch.arange(seq)[None] < torch.tensor(lengths)[:, None]).long()
    ids = torch.where(mask.bool(), ids, pad)
    padded = {"input_ids": ids, "attention_mask": mask}
    packed = {"input_ids": ids[mask.bool()],
              "cu_seqlens": F.pad(torch.tensor(lengths).cumsum(0), (1, 0)).to(torch.int32),
              "max_seqlen": max(lengths)}
    if getattr(config, "type_vocab_size", 0) > 1:
        types = (torch.arange(seq)[None] >= 2).long().expand_as(ids) * mask
        padded["token_type_ids"], packed["token_type_ids"] = types, types[mask.bool()]
    return padded, packed


@pytest.mark.parametrize("family", list(FAMILIES))
def test_forward_packed_equals_padded_forward_on_real_tokens(family):
    model = build(family)
    padded, packed = padded_and_packed(model.config)
    with torch.no_grad():
        want = model(**padded).last_hidden_state[padded["attention_mask"].bool()]
        got = model.forward_packed(**packed).last_hidden_state
        model.check_packed(**packed)
        positions = model.packed_positions(packed["cu_seqlens"], got.shape[0], None)
    assert got.shape == (14, model.dims.hidden_size)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    offset = model.position_offset()
    assert positions.tolist() == [p + offset for n in (9, 0, 4, 1) for p in range(n)]
    with torch.no_grad():        # explicit position ids are used as given
        explicit = model.forward_packed(**packed, position_ids=positions.flip(0)).last_hidden_state
    assert not torch.allclose(explicit, got)


def test_forward_packed_reads_nothing_and_padded_forward_reads_once():
    model = build("bert")
    padded, packed = padded_and_packed(model.config)
    with torch.no_grad():
        with HostReads() as packed_reads:
            model.forward_packed(**packed)
        with HostReads() as padded_reads:
            model(**padded)
    assert packed_reads.outside_ops() == [], packed_reads.outside_ops()
    assert len(padded_reads.outside_ops()) == 1, padded_reads.outside_ops()   # ranges + mask lengths together
    # inside fastbert.ops only CPU-only reads of cu_seqlens: its value check and the CPU attention's
    # runs of equal lengths (host memory, no device sync; CUDA tensors are never read there)
    in_ops = {(os.path.basename(f), n, k) for f, n, k in packed_reads.reads + padded_reads.reads
              if f.startswith(OPS_DIR)}
    assert in_ops <= {("varlen.py", "check_cu_seqlens", "tolist"), ("length_runs.py", "length_runs", "tolist")}, \
        sorted(in_ops)


def test_forward_packed_compiles_with_fullgraph():
    model = build("roberta")
    _, packed = padded_and_packed(model.config)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(model.forward_packed)(**packed)
    breaks = [(r.user_stack[-1].filename if r.user_stack else "?", r.user_stack[-1].lineno if r.user_stack else 0,
               r.reason.splitlines()[0]) for r in explained.break_reasons]
    ours = [b for b in breaks if not b[0].startswith(OPS_DIR)]
    assert ours == [], f"graph breaks outside fastbert.ops: {ours}"
    assert breaks == [], f"graph breaks inside fastbert.ops: {breaks}"
    compiled = torch.compile(model.forward_packed, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(**packed).last_hidden_state,
                                   model.forward_packed(**packed).last_hidden_state, atol=1e-5, rtol=0)


def _compile_sweep(first, *others):
    """The first family in every run; the others (seconds of tracing each) in CI's slow stage."""
    return [first] + [pytest.param(f, marks=pytest.mark.slow) for f in others]


@pytest.mark.parametrize("family", _compile_sweep("bert", "deberta-v2", "mpnet", "nomic_bert"))
def test_compiled_forward_packed_is_not_compiled_again_for_each_max_seqlen(family):
    """Found by use: the compiled forward_packed was compiled again for every new max_seqlen (each
    time for seconds, then eager past torch's recompile limit), as operator.index in the ops' check
    made the symbolic int a constant, and for DeBERTa-v2 and MPNet also as relative attention's torch
    path looped over it. Now one recompile (torch making the changed int symbolic), then every length
    runs the same graph, with the eager outputs. (A batch of one sequence is one more: torch
    specializes sizes of 1.)"""
    from torch._dynamo.testing import CompileCounter

    model = build_tiny(family)
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(model.forward_packed, fullgraph=True, backend=counter)
    for lengths in ((3, 2), (5, 1, 4), (7, 7), (9, 2, 6, 1), (4, 11)):
        _, packed = padded_and_packed(model.config, lengths=lengths, seq=max(lengths))
        with torch.no_grad():
            torch.testing.assert_close(compiled(**packed).last_hidden_state,
                                       model.forward_packed(**packed).last_hidden_state, atol=1e-5, rtol=0)
    assert counter.frame_count == 2, f"compiled {counter.frame_count} times for 5 lengths"


@pytest.mark.parametrize("family", _compile_sweep("bert", "deberta-v2", "mpnet", "modernbert", "nomic_bert"))
def test_compiled_padded_forward_is_not_compiled_again_for_each_length(family):
    """Found by use: torch.compile(model) on the padded forward of DeBERTa-v2, MPNet and ModernBERT was
    compiled again for each new longest-row length (then ran eager past torch's recompile limit): the torch
    paths of relative and sliding-window attention looped in Python over the symbolic length. After the
    first shapes (torch making the changed sizes symbolic, and a batch without padding), new lengths and
    batch sizes run the compiled graphs, with the eager outputs on real tokens. One attention path per
    family: plain (BERT), relative (DeBERTa-v2, MPNet), sliding window (ModernBERT), rotary (NomicBERT)."""
    from torch._dynamo.testing import CompileCounter

    model = build_tiny(family)
    counter = CompileCounter()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=counter)
    # the first shapes: new lengths, a new batch size, no padding at all
    warm_up = [((25, 29, 14, 2, 9), 32), ((30, 26, 27, 10, 16), 32), ((20, 26), 28), ((7, 7), 7)]
    new_lengths = [((18, 4, 12, 14, 11), 19), ((11, 29, 3), 31), ((5, 9, 2, 6), 12), ((24, 27), 30)]
    frames = []
    for lengths, seq in warm_up + new_lengths:
        padded, _ = padded_and_packed(model.config, lengths=lengths, seq=seq)
        with torch.no_grad():
            got, want = compiled(**padded).last_hidden_state, model(**padded).last_hidden_state
        real = padded["attention_mask"].bool()
        torch.testing.assert_close(got[real], want[real], atol=1e-5, rtol=0)
        frames.append(counter.frame_count)
    assert frames[len(warm_up):] == [frames[len(warm_up) - 1]] * len(new_lengths), \
        f"frames compiled after each batch: {frames} (new lengths after the first {len(warm_up)} compiled again)"


def test_a_model_loaded_as_users_do_compiles():
    """The default backend ("auto") runs CPU fp32 inference through oneDNN's fused linear, which
    torch.compile cannot trace: compiled, it must take the plain path (packed and padded forward)."""
    model = build("bert", backend="auto")
    padded, packed = padded_and_packed(model.config)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model.forward_packed, fullgraph=True)(**packed).last_hidden_state
        torch.testing.assert_close(got, model.forward_packed(**packed).last_hidden_state, atol=1e-5, rtol=0)
        got = torch.compile(model)(**padded).last_hidden_state
        torch.testing.assert_close(got, model(**padded).last_hidden_state, atol=1e-5, rtol=0)


def test_forward_packed_input_errors():
    model = build("distilbert")
    _, packed = padded_and_packed(model.config)
    with pytest.raises(ValueError, match="max_seqlen must be a non-negative Python int"):
        model.forward_packed(packed["input_ids"], packed["cu_seqlens"], torch.tensor(9))
    with pytest.raises(ValueError, match="cu_seqlens must be 1-D int32"):
        model.forward_packed(packed["input_ids"], packed["cu_seqlens"].long(), 9)
    with torch.no_grad():  # no token type embeddings: taken and ignored, as transformers' DistilBERT
        torch.testing.assert_close(model.forward_packed(**packed, token_type_ids=torch.ones_like(packed["input_ids"])),
                                   model.forward_packed(**packed), atol=0, rtol=0)
    with pytest.raises(ValueError, match="exceeds the model's limit"):
        model.forward_packed(packed["input_ids"], packed["cu_seqlens"], 10_000)
    with pytest.raises(ValueError, match="smaller than the longest sequence"):
        model.check_packed(packed["input_ids"], packed["cu_seqlens"], 3)
    with pytest.raises(ValueError, match="end at total_tokens=14"):
        model.check_packed(packed["input_ids"], torch.tensor([0, 9, 13], dtype=torch.int32), 9)
    with pytest.raises(ValueError, match="token id 99 is out of range"):
        model.check_packed(torch.full_like(packed["input_ids"], 99), packed["cu_seqlens"], 9)
