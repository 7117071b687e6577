"""fastbert.models.layers' lean path (LeanPlan: CPU fp32 inference of the default post-LN layer with its
lookups, checks and packed weights made once): it gives the layer path's results on every family that
takes it, only when it may run (eval, autograd off, packed weights on, no hooks), and it follows every
change to the modules and parameters that the layer path sees."""
import pytest
import torch
import transformers as T
from torch import nn

from fastbert.models import layers as Ly
from test_forward_packed import build, padded_and_packed
from test_models import FAMILIES

LENGTHS = (9, 0, 4, 4, 1, 17)


def packed_inputs(model):
    _, packed = padded_and_packed(model.config, LENGTHS, seq=max(LENGTHS))
    return packed


def run(model, packed):
    with torch.inference_mode():
        return model.forward_packed(**packed).last_hidden_state


def layer_path(model, packed):
    """The same forward on the layers' own path (no packed weights: no lean plan)."""
    model.prepack_weights(False)
    try:
        return run(model, packed)
    finally:
        model.prepack_weights()


@pytest.fixture
def lean_calls(monkeypatch):
    """The plans the lean path ran, on either of its two paths: the whole stack in one C++ call on a
    few tokens (a plan's native layer handed over), or one plan's forward at a time."""
    calls = []
    forward, native = Ly.LeanPlan.forward, Ly.LeanPlan.native
    monkeypatch.setattr(Ly.LeanPlan, "forward", lambda self, *a: calls.append(self) or forward(self, *a))

    def counted_native(self):
        layer = native(self)
        if layer is not None:
            calls.append(self)
        return layer
    monkeypatch.setattr(Ly.LeanPlan, "native", counted_native)
    return calls


@pytest.mark.parametrize("family", list(FAMILIES))
def test_lean_path_equals_the_layer_path_and_transformers(family, lean_calls):
    model = build(family, backend="auto")
    model.prepack_weights()
    packed = packed_inputs(model)
    got = run(model, packed)
    assert len(lean_calls) == len(model.encoder_layers())
    torch.testing.assert_close(got, layer_path(model, packed), atol=1e-5, rtol=1e-5)
    hf = getattr(T, FAMILIES[family][2] + "Model")(model.config).eval()
    hf.load_state_dict(model.state_dict(), strict=False)
    starts = packed["cu_seqlens"].tolist()
    with torch.no_grad():
        for n, (a, b) in zip(LENGTHS, zip(starts, starts[1:])):
            if n:
                want = hf(input_ids=packed["input_ids"][a:b][None],
                          **({"token_type_ids": packed["token_type_ids"][a:b][None]}
                             if "token_type_ids" in packed else {})).last_hidden_state[0]
                torch.testing.assert_close(got[a:b], want, atol=1e-5, rtol=1e-5)


def test_lean_path_runs_only_where_it_may(lean_calls):
    model = build("bert", backend="auto")
    packed = packed_inputs(model)
    run(model, packed)                                          # no packed weights: never lean
    assert not lean_calls
    model.prepack_weights()
    with torch.no_grad():
        run(model, packed)                                      # inference mode or no_grad: lean
    assert len(lean_calls) == 2
    lean_calls.clear()
    model.forward_packed(**packed)                              # autograd on
    model.train()
    run(model, packed)
    model.eval()
    model.backend = "torch"
    run(model, packed)
    model.backend = "auto"
    seen = []
    handle = model.encoder.layer[1].register_forward_hook(lambda *a: seen.append(1))
    run(model, packed)
    handle.remove()
    handle = nn.modules.module.register_module_forward_hook(lambda *a: seen.append(2))
    run(model, packed)
    handle.remove()
    assert not lean_calls and seen[0] == 1 and 2 in seen
    run(model, packed)
    assert len(lean_calls) == 2


def test_lean_path_follows_module_and_parameter_changes(lean_calls):
    """Each edit changes the output, and the lean path gives what the layer path gives after it."""
    model = build("bert", backend="auto")
    model.prepack_weights()
    packed = packed_inputs(model)
    layer = model.encoder.layer[-1]
    g = torch.Generator().manual_seed(7)

    def new_linear(old):
        new = nn.Linear(old.in_features, old.out_features)
        with torch.no_grad():
            new.weight.copy_(torch.randn(new.weight.shape, generator=g) / 5)
        return new

    def replace_dense():
        layer.attention.output.dense = new_linear(layer.attention.output.dense)

    def replace_attention_output():        # a module above the Linear: its old one keeps the old weights
        old = layer.attention.output
        new = type(old)(old.dense.in_features, model.dims)
        new.load_state_dict(old.state_dict())
        new.dense = new_linear(old.dense)
        layer.attention.output = new

    def replace_bias():
        layer.intermediate.dense.bias = nn.Parameter(torch.randn(model.config.intermediate_size, generator=g))

    def in_place_key_weight():
        with torch.no_grad():
            layer.attention.self.key.weight.mul_(1.5)

    def in_place_norm():
        with torch.no_grad():
            layer.output.LayerNorm.weight.mul_(0.5)

    def hooked_module():                   # a hook on a Linear: the layer path calls it as a module
        layer.output.dense.register_forward_hook(lambda m, i, out: out * 2)

    before = run(model, packed)
    for edit in (replace_dense, replace_attention_output, replace_bias, in_place_key_weight, in_place_norm,
                 hooked_module):
        edit()
        lean_calls.clear()
        got = run(model, packed)
        assert bool(lean_calls) == (edit is not hooked_module), edit.__name__
        torch.testing.assert_close(got, layer_path(model, packed), atol=1e-5, rtol=1e-5, msg=edit.__name__)
        assert (got - before).abs().max() > 1e-3, edit.__name__
        before = got


def test_a_layer_without_a_plan_is_not_checked_again_until_its_modules_change(monkeypatch):
    """An int8 (QuantizedLinear) layer has no plan: lean_plan answers from a Watch of its modules instead
    of checking them again on every call, and a change to them (the Linear put back, a hook added and
    removed) is seen: the plan comes back."""
    from fastbert import quantize

    model = build("bert", backend="auto")
    model.prepack_weights()
    layer = model.encoder.layer[0]
    dense = layer.output.dense
    quantize(model)
    builds = []
    build_plan = Ly._build_plan
    monkeypatch.setattr(Ly, "_build_plan", lambda *a: builds.append(1) or build_plan(*a))
    assert layer.lean_plan() is None and layer.lean_plan() is None and len(builds) == 1
    for name in ("query", "key", "value"):
        setattr(layer.attention.self, name, nn.Linear(dense.out_features, dense.out_features))
    layer.attention.output.dense = nn.Linear(dense.out_features, dense.out_features)
    layer.intermediate.dense = nn.Linear(dense.out_features, dense.in_features)
    assert layer.lean_plan() is None and len(builds) == 2        # output.dense is still int8
    layer.output.dense = dense
    assert layer.lean_plan() is not None and len(builds) == 3
    handle = layer.output.LayerNorm.register_forward_hook(lambda *a: None)
    assert layer.lean_plan() is None and layer.lean_plan() is None and len(builds) == 5   # hooked: each call
    handle.remove()
    assert layer.lean_plan() is not None


@pytest.mark.parametrize("family", ["deberta-v2", "mpnet", "nomic_bert"])
def test_families_that_change_the_layer_keep_their_own_path(family):
    from tiny_families import CONFIGS

    import fastbert
    torch.manual_seed(0)
    model = fastbert.AutoModel.from_config(CONFIGS[family]()).eval()
    model.prepack_weights()
    assert all(not isinstance(layer, Ly.FastLayer) or layer.lean_plan() is None for layer in model.encoder_layers())


def test_no_tokens_take_the_layer_path(lean_calls):
    model = build("bert", backend="auto")
    model.prepack_weights()
    _, packed = padded_and_packed(model.config, (0, 0), seq=3)
    assert run(model, packed).shape == (0, model.config.hidden_size)
    assert not lean_calls


def native_bert():
    """A BERT whose layers have a native form: head_dim 32 (the tests' SMALL has 8), an FFN width of 100
    (not a whole number of the GEMM's 32-column panels)."""
    import fastbert
    torch.manual_seed(0)
    hf = T.BertModel(T.BertConfig(vocab_size=99, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=100, max_position_embeddings=64)).eval()
    model = fastbert.BertModel.from_hf_config(hf.config, backend="auto")
    model.load_state_dict(hf.state_dict(), strict=True)
    return model.eval(), hf


@pytest.mark.parametrize("lengths", [(9, 0, 4, 4, 1, 17), (1,), (64,), (40, 25), (50, 40)])
def test_native_stack_equals_the_plans_one_op_at_a_time(lengths, monkeypatch):
    """Up to STACK_MAX_TOKENS tokens the stack runs in one C++ call (csrc/py_layers.cpp); past it, and
    where a layer has no native form, each plan's forward runs: the same values either way, and
    transformers' per sequence."""
    model, hf = native_bert()
    model.prepack_weights()
    _, packed = padded_and_packed(model.config, lengths, seq=max(lengths))
    if model.encoder_layers()[0].lean_plan().native() is None:
        pytest.skip("the native layer stack needs a CPU with AVX-512")
    stacked = []
    layers_forward = Ly._C.layers_forward
    monkeypatch.setattr(Ly._C, "layers_forward", lambda *a: stacked.append(1) or layers_forward(*a))
    got = run(model, packed)
    assert bool(stacked) == (sum(lengths) <= Ly.STACK_MAX_TOKENS)
    monkeypatch.setattr(Ly.LeanPlan, "native", lambda self: None)
    torch.testing.assert_close(got, run(model, packed), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got, layer_path(model, packed), atol=1e-5, rtol=1e-5)
    starts = packed["cu_seqlens"].tolist()
    with torch.no_grad():
        for n, a, b in zip(lengths, starts, starts[1:]):
            if n:
                want = hf(input_ids=packed["input_ids"][a:b][None],
                          token_type_ids=packed["token_type_ids"][a:b][None]).last_hidden_state[0]
                torch.testing.assert_close(got[a:b], want, atol=1e-5, rtol=1e-5)


def test_native_stack_follows_parameter_changes():
    """A LayerNorm or bias edited in place is read in place; a weight edited in place remakes the plan."""
    model, _ = native_bert()
    model.prepack_weights()
    _, packed = padded_and_packed(model.config, (7, 3), seq=7)
    if model.encoder_layers()[0].lean_plan().native() is None:
        pytest.skip("the native layer stack needs a CPU with AVX-512")
    layer = model.encoder.layer[-1]
    g = torch.Generator().manual_seed(5)
    before = run(model, packed)
    for param in (layer.output.LayerNorm.weight, layer.output.dense.bias, layer.intermediate.dense.weight):
        with torch.no_grad():
            param.add_(torch.randn(param.shape, generator=g) * 0.3)   # not a uniform shift: LayerNorm removes that
        got = run(model, packed)
        torch.testing.assert_close(got, layer_path(model, packed), atol=1e-5, rtol=1e-5)
        assert (got - before).abs().max() > 1e-3
        before = got


def test_native_stack_refuses_bad_arguments():
    model, _ = native_bert()
    model.prepack_weights()
    layer = model.encoder_layers()[0].lean_plan().native()
    if layer is None:
        pytest.skip("the native layer stack needs a CPU with AVX-512")
    x = torch.zeros(5, 64)
    with pytest.raises(ValueError, match="cu_seqlens must be 1-D, start at 0 and end at the token count"):
        Ly._C.layers_forward(x.numpy(), torch.tensor([0, 4]).numpy(), [layer], 0.2, 1)
    with pytest.raises(ValueError, match=r"x must be \(tokens, 64\)"):
        Ly._C.layers_forward(torch.zeros(5, 32).numpy(), torch.tensor([0, 5]).numpy(), [layer], 0.2, 1)
    plan = model.encoder_layers()[0].lean_plan()
    qkv, out, ffn_in, ffn_out = (p.own().numpy() for p in plan.packed)
    ones, zeros = torch.ones(64).numpy(), torch.zeros(64).numpy()

    def layer_with(heads, head_dim, ffn_in_bias=torch.zeros(100).numpy()):
        return Ly._C.Layer(qkv, torch.zeros(192).numpy(), out, zeros, ones, zeros, 1e-12, ffn_in, ffn_in_bias,
                           ffn_out, zeros, ones, zeros, 1e-12, heads, head_dim)
    layer_with(2, 32)
    with pytest.raises(ValueError, match=r"head_dim 16, 32, ... 128, got 8"):
        layer_with(8, 8)
    with pytest.raises(ValueError, match=r"ffn_in: packed must be \(ceil\(n / 32\), 64, 32\)"):
        layer_with(2, 32, torch.zeros(200).numpy())


@pytest.mark.parametrize("lengths", [(18,), (9, 0, 4, 4, 1, 17), (64,)])
def test_native_stack_bits_do_not_depend_on_the_thread_count(lengths):
    """The stack's threads share each step (GEMM panels, (sequence, head) tasks, LayerNorm rows): the
    result is the same bits on 1, 2 and 3 threads."""
    model, _ = native_bert()
    model.prepack_weights()
    if model.encoder_layers()[0].lean_plan().native() is None:
        pytest.skip("the native layer stack needs a CPU with AVX-512")
    layers = [layer.lean_plan().native() for layer in model.encoder_layers()]
    x = torch.randn(sum(lengths), 64, generator=torch.Generator().manual_seed(3))
    bounds = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int64)
    outs = []
    for threads in (1, 2, 3):
        out = x.clone()
        assert Ly._C.layers_forward(out.numpy(), bounds.numpy(), layers, 32 ** -0.5, threads)
        outs.append(out)
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    assert not torch.equal(outs[0], x)
