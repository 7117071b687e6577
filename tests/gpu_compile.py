"""Compile Triton kernels for an sm_90 GPU on a machine without one (Triton's own compiler and
bundled ptxas, no driver): catches what the interpreter lets through, such as non-constexpr globals
or type errors. Shared by the element-wise kernels' tests."""
import json
import os
import subprocess
import sys

import pytest

_COMPILE = r"""
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
import fastbert.kernels.{module} as k
for name, constexprs, types in json.loads(sys.argv[1]):
    fn = getattr(k, name)
    sig = {{a: "constexpr" if a in constexprs else types.get(a, "*fp16" if a.endswith("_ptr") else "i32")
           for a in fn.arg_names}}
    triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                   options={{"num_warps": 4}})
    print("compiled", name, constexprs)
"""


def compile_for_gpu(module, cases, tmp_path):
    """Compiles each (kernel name, constexprs, arg types) case of fastbert.kernels.<module>."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", _COMPILE.format(module=module), json.dumps(cases)],
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "ptxas" in proc.stderr and "not found" in proc.stderr:
        pytest.skip("this Triton install has no ptxas to compile for a GPU")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("compiled") == len(cases)
