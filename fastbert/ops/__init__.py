"""Torch-facing ops: each dispatches between a Triton kernel and a pure-torch reference.

Importing this package registers the custom ops torch.ops.fastbert.{attention, varlen_attention,
bias_gelu, add_layer_norm} and their *_backward ops."""
from fastbert.ops.add_layer_norm import add_layer_norm, add_layer_norm_ref
from fastbert.ops.attention import attention, attention_ref, varlen_attention, varlen_attention_ref
from fastbert.ops.bias_gelu import bias_gelu, bias_gelu_ref
from fastbert.ops.varlen import check_cu_seqlens

__all__ = [
    "add_layer_norm", "add_layer_norm_ref",
    "attention", "attention_ref", "check_cu_seqlens", "varlen_attention", "varlen_attention_ref",
    "bias_gelu", "bias_gelu_ref",
]
