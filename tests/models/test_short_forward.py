"""EncoderModel.short_states: one short sequence's whole forward as one C++ call
(fastbert/models/short_forward.py), the values of packed_states, remade or declined whenever what it
holds stops being the model's."""
import copy
import pickle

import pytest
import torch
from torch import nn

from fastbert.models import layers as Ly
from test_layers import native_bert


@pytest.fixture
def model():
    model, _ = native_bert()
    model.prepack_weights()
    if model.encoder_layers()[0].lean_plan().native() is None:
        pytest.skip("the native layer stack needs a CPU with AVX-512")
    return model


def packed(model, ids):
    n = len(ids)
    return model.packed_states(torch.tensor(ids), torch.tensor([0, n], dtype=torch.int32), n)


IDS = [2, 17, 5, 98, 40, 3, 3, 61, 1]


def test_short_states_is_packed_states_of_one_sequence(model):
    """Bit for bit packed_states' values; declined (None) where the stack does not run: more than
    STACK_MAX_TOKENS tokens, none, training, autograd, a layer without its lean plan."""
    ids = torch.randint(5, model.config.vocab_size, (Ly.STACK_MAX_TOKENS + 1,), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        for n in (1, 13, model.config.max_position_embeddings):
            assert torch.equal(model.short_states(ids[:n].tolist()), packed(model, ids[:n].tolist()))
        assert model.short_states(ids.tolist()) is None
        assert model.short_states([]) is None
    assert model.short_states(ids[:5].tolist()) is None                     # autograd on
    with torch.inference_mode():
        model.train()
        assert model.short_states(ids[:5].tolist()) is None
        model.eval()
        model.prepack_weights(False)                                         # no lean plan
        assert model.short_states(ids[:5].tolist()) is None
        model.prepack_weights()
        assert model.short_states(ids[:5].tolist()) is not None


@pytest.mark.parametrize("change", ["word row in place", "word parameter replaced", "word .data replaced",
                                    "position row in place", "type row 0 in place", "embedding norm eps",
                                    "layer weight in place", "layer bias .data replaced", "layer module replaced",
                                    "embeddings module replaced"])
def test_a_change_to_the_model_is_seen(model, change):
    """After any change to a tensor, module or setting the C++ forward reads, short_states gives the
    changed model's packed_states (it is remade, or reads the tensor in place)."""
    emb, layer = model.embeddings, model.encoder_layers()[1]
    with torch.inference_mode():
        before = model.short_states(IDS)
    with torch.no_grad():
        if change == "word row in place":
            emb.word_embeddings.weight[17] += 1.0
        elif change == "word parameter replaced":
            emb.word_embeddings.weight = nn.Parameter(emb.word_embeddings.weight * 2)
        elif change == "word .data replaced":
            emb.word_embeddings.weight.data = emb.word_embeddings.weight.data * 2
        elif change == "position row in place":
            emb.position_embeddings.weight[3] -= 0.5
        elif change == "type row 0 in place":
            emb.token_type_embeddings.weight[0] += 0.25
        elif change == "embedding norm eps":
            emb.LayerNorm.eps = 0.5
        elif change == "layer weight in place":
            layer.intermediate.dense.weight.mul_(1.5)
        elif change == "layer bias .data replaced":
            layer.output.dense.bias.data = layer.output.dense.bias.data + 1.0
        elif change == "layer module replaced":
            old = layer.attention.self.query
            new = nn.Linear(old.in_features, old.out_features)
            new.load_state_dict({"weight": old.weight * 0.5, "bias": old.bias})
            layer.attention.self.query = new
        else:
            new = copy.deepcopy(emb)
            new.word_embeddings.weight.mul_(3)
            model.embeddings = new
    with torch.inference_mode():
        got, want = model.short_states(IDS), packed(model, IDS)
    assert not torch.equal(got, before)
    assert torch.equal(got, want)


def test_hooks_make_it_decline(model):
    """A hook on the embeddings, on one of their tables, on a layer or on a module inside it: the C++
    forward would skip it, so short_states declines and the caller's general path runs the hook."""
    modules = [model.embeddings, model.embeddings.word_embeddings, model.encoder_layers()[0],
               model.encoder_layers()[1].attention.output.LayerNorm]
    with torch.inference_mode():
        assert model.short_states(IDS) is not None
        for m in modules:
            handle = m.register_forward_hook(lambda *a: None)
            assert model.short_states(IDS) is None, m
            handle.remove()
            assert model.short_states(IDS) is not None


def test_copies_make_their_own(model):
    """A deep copy or an unpickled model runs its own forward on its own tensors: a change to the copy
    leaves the original's vectors as they were."""
    with torch.inference_mode():
        want = model.short_states(IDS)
    for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        with torch.no_grad():
            clone.embeddings.word_embeddings.weight.mul_(2)
        with torch.inference_mode():
            assert torch.equal(clone.short_states(IDS), packed(clone, IDS))
            assert not torch.equal(clone.short_states(IDS), want)
            assert torch.equal(model.short_states(IDS), want)


def test_bad_ids_are_index_errors(model):
    vocab, positions = model.config.vocab_size, model.config.max_position_embeddings
    with torch.inference_mode():
        with pytest.raises(IndexError, match=f"input id {vocab} at token 1 is out of range for its table of {vocab} rows"):
            model.short_states([1, vocab])
        with pytest.raises(IndexError, match="input id -1 at token 0"):
            model.short_states([-1, 2])
        with pytest.raises(IndexError, match=f"position id {positions} is out of range for its table of {positions} rows"):
            model.short_states([1] * (positions + 1))
        with pytest.raises(TypeError):
            model.short_states(["a", "b"])


def int8_bert(skip=()):
    """native_bert's shape with an FFN width the int8 stack takes (a multiple of 16), its Linears int8
    but those in `skip`."""
    import fastbert
    import transformers as T
    torch.manual_seed(0)
    hf = T.BertModel(T.BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=112, max_position_embeddings=64)).eval()
    model = fastbert.BertModel.from_hf_config(hf.config, backend="auto")
    model.load_state_dict(hf.state_dict(), strict=True)
    model.eval().prepack_weights()
    return fastbert.quantize(model, "int8", skip=skip)


@pytest.fixture
def int8_model():
    if not Ly._C.int8_gemm_available():
        pytest.skip("the int8 layer stack needs a CPU with AVX-512 VNNI")
    return int8_bert()


def test_int8_short_states_are_packed_states_bit_for_bit(int8_model):
    """The int8 stack (csrc/py_layers.cpp: run_int8_layers, fastbert's few-row int8 GEMM) gives packed_states'
    int8 values exactly, at one token, a few, and the most it takes; a stack with one float32 layer
    (quantize's skip) declines, and packed_states runs it."""
    ids = torch.randint(5, 99, (64,), generator=torch.Generator().manual_seed(3)).tolist()
    with torch.inference_mode():
        for n in (1, 2, 13, 15, 29, 64):                 # 15, 29: two and three blocks of the GEMM's 14 rows
            got = int8_model.short_states(ids[:n])
            assert got is not None and torch.equal(got, packed(int8_model, ids[:n])), n
    mixed = int8_bert(skip=["encoder.layer.1.output.dense"])
    with torch.inference_mode():
        assert mixed.short_states(IDS) is None
        assert int8_bert(skip=["encoder.layer.0.attention.self.query"]).short_states(IDS) is None


@pytest.mark.parametrize("change", ["int8 weights loaded", "norm weight in place", "int8 module replaced",
                                    "dequantized back to float32"])
def test_int8_stack_sees_a_change_to_the_model(int8_model, change):
    """After a change to what the int8 stack holds it gives the changed model's packed_states (remade,
    or reading the tensor in place), or declines for a layer it cannot run."""
    import fastbert
    layer = int8_model.encoder_layers()[0]
    with torch.inference_mode():
        before = int8_model.short_states(IDS)
    dense = layer.intermediate.dense
    with torch.no_grad():
        if change == "int8 weights loaded":
            state = dense.state_dict()
            state["qweight"] = -state["qweight"]
            dense.load_state_dict(state)
        elif change == "norm weight in place":
            layer.output.LayerNorm.weight.mul_(1.5)
        elif change == "int8 module replaced":
            linear = nn.Linear(dense.in_features, dense.out_features)
            layer.intermediate.dense = fastbert.QuantizedLinear.from_linear(linear)
        else:
            linear = nn.Linear(dense.in_features, dense.out_features)
            linear.weight.copy_(dense.dequantized_weight())
            linear.bias.copy_(dense.bias)
            layer.intermediate.dense = linear
    with torch.inference_mode():
        got = int8_model.short_states(IDS)
        if change == "dequantized back to float32":
            assert got is None
            return
        assert not torch.equal(got, before)
        assert torch.equal(got, packed(int8_model, IDS))


def test_int8_stack_declines_for_hooks(int8_model):
    with torch.inference_mode():
        assert int8_model.short_states(IDS) is not None
        for m in (int8_model.encoder_layers()[1], int8_model.encoder_layers()[1].attention.self.key):
            handle = m.register_forward_hook(lambda *a: None)
            assert int8_model.short_states(IDS) is None, m
            handle.remove()
            assert int8_model.short_states(IDS) is not None
