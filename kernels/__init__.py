"""Triton kernels only (no torch.nn, no dispatch); installed as `fastbert.kernels`.

Import the submodules directly (`from fastbert.kernels import attention`): they import triton.
"""
