"""Tracing and export: fastbert's padded forward drops padding by the mask's values, so a traced graph
would freeze one batch's packing and be wrong on another mask (found by use: torch.jit.trace with
backend="torch" gave outputs off by 1e-2, silently). Every way to trace or export the padded forward
raises an error that says why and how to export instead; torch.compile keeps working."""
import warnings

import pytest
import torch
import transformers as T

import fastbert
from tiny_families import SMALL

IDS = torch.randint(5, 99, (2, 8), generator=torch.Generator().manual_seed(0))
MASK = torch.tensor([[1] * 6 + [0] * 2, [1] * 8])


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("bert")
    T.BertModel(T.BertConfig(**SMALL)).save_pretrained(out)
    return out


def _models(path):
    yield "fastbert", fastbert.AutoModel.from_pretrained(path)
    yield "fastbert backend=torch", fastbert.AutoModel.from_pretrained(path, backend="torch")
    yield "optimize(transformers)", fastbert.optimize(T.AutoModel.from_pretrained(path).eval())


EXPORTS = {
    "jit.trace": lambda m, f: torch.jit.trace(m, (IDS, MASK), strict=False, check_trace=False),
    "onnx (legacy)": lambda m, f: torch.onnx.export(m, (IDS, MASK), f, dynamo=False),
    "torch.export": lambda m, f: torch.export.export(m, (IDS, MASK)),
    "torch.export strict": lambda m, f: torch.export.export(m, (IDS, MASK), strict=True),
}


@pytest.mark.parametrize("how", list(EXPORTS))
def test_tracing_or_exporting_the_padded_forward_is_refused_with_the_way_out(path, how, tmp_path):
    for name, model in _models(path):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(Exception, match="removes padding by the values of the attention mask") as err:
                EXPORTS[how](model, str(tmp_path / "m.onnx"))
        assert "load_state_dict" in str(err.value), name


def test_the_export_recipe_of_the_message_works(path):
    """transformers' model with fastbert's state_dict traces, and gives fastbert's outputs."""
    fast = fastbert.AutoModel.from_pretrained(path)
    hf = T.AutoModel.from_config(fast.config)
    hf.load_state_dict(fast.state_dict())
    traced = torch.jit.trace(hf.eval(), (IDS, MASK), strict=False)
    with torch.no_grad():
        want = fast(IDS, MASK).last_hidden_state
        got = traced(IDS, MASK)["last_hidden_state"]
    real = MASK.bool()
    assert torch.allclose(got[real], want[real], atol=1e-5)


def test_compile_still_works(path):
    fast = fastbert.AutoModel.from_pretrained(path)
    compiled = torch.compile(fast)
    with torch.no_grad():
        assert torch.allclose(compiled(IDS, MASK).last_hidden_state, fast(IDS, MASK).last_hidden_state, atol=1e-5)
