"""fastbert.ops._dispatch without triton: the ops register as plain custom ops, silently, and a model
runs forward and backward on the torch references; asking for the kernel is a clear error."""
import subprocess
import sys

# Run in a fresh interpreter where `import triton` fails, as on a machine without it.
CODE = """
import sys, warnings
sys.modules["triton"] = None
warnings.simplefilter("error")
import torch, fastbert
from transformers import BertConfig
from fastbert.ops._dispatch import triton_available, use_triton
assert not triton_available()
cfg = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
model = fastbert.BertModel(cfg)
out = model(torch.tensor([[1, 2, 3], [4, 5, 6]]), attention_mask=torch.tensor([[1, 1, 0], [1, 1, 1]]))[0]
(out * torch.linspace(-1, 1, 32)).sum().backward()  # out.sum() after LayerNorm has no gradient but rounding
assert out.shape == (2, 3, 32) and model.embeddings.word_embeddings.weight.grad.abs().sum() > 0
assert torch.ops.fastbert.add_layer_norm.default is not None
try:
    use_triton("triton", out)
except RuntimeError as e:
    assert "needs the `triton` package" in str(e), e
else:
    raise AssertionError("backend='triton' without triton should raise")
"""


def test_without_triton_ops_register_silently_and_run_the_references():
    done = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", f"expected no warnings or logs, got:\n{done.stderr}"
