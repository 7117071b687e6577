"""Compile fastbert's Triton kernels for NVIDIA GPUs on a machine without one (Triton's own compiler and
bundled ptxas, no driver): catches what the interpreter lets through (non-constexpr globals, type
errors) and measures what only a GPU compiler sees: registers, spills (stack frame bytes) and shared
memory per block, against each target's limit.

Two entry points:
- compile_for_gpu(module, cases, tmp_path): compiles hand-written (kernel, constexprs, types) cases
  for sm_90 (the element-wise kernels' tests).
- sweep: the launches are recorded from the ops layer (fastbert.ops called on CPU tensors with every
  kernel launch recorded instead of run), bound as Triton's JIT binds them (signature, constexprs,
  16-divisibility), and compiled for each config the autotuner may choose and each target, in parallel,
  with the results cached on disk by the kernel's source hash. `python tests/gpu_compile.py --help`.
  It runs in its own process with TRITON_INTERPRET unset (the test session sets it), see run_sweep().
"""
import argparse
import collections
import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time

import pytest

# Per-block shared memory a kernel may opt into, bytes (CUDA programming guide, compute capabilities).
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
TARGETS = (80, 89, 90)
DEFAULT_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "fastbert", "gpu-compile")

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


def _no_ptxas(stderr: str) -> bool:
    return "ptxas" in stderr and "not found" in stderr


def compile_for_gpu(module, cases, tmp_path):
    """Compiles each (kernel name, constexprs, arg types) case of fastbert.kernels.<module>."""
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", _COMPILE.format(module=module), json.dumps(cases)],
                          env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and _no_ptxas(proc.stderr):
        pytest.skip("this Triton install has no ptxas to compile for a GPU")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("compiled") == len(cases)


# ------------------------------------------------------------------------------------------------
# Launches recorded from the ops layer

class Launch:
    """One kernel launch as a launcher made it: the JIT function, its arguments, and the configs the
    autotuner may choose from (after the kernel's prune) or the fixed meta-parameters."""

    def __init__(self, tuned, kernel, args, kwargs):
        self.kernel = kernel
        self.module = kernel.fn.__module__.rsplit(".", 1)[-1]
        self.name = kernel.fn.__name__
        self.args, self.kwargs = args, kwargs
        self.tuned = tuned

    def configs(self, cc):
        """[(config kwargs, num_warps, num_stages, default?)] the launch can run with on target cc: every
        config that survives the prune (the first is what runs untuned: interpreter, tracing, and
        kernels tuned on no GPU), or the launch's own meta-parameters (no configs)."""
        if self.tuned is None:
            return [({}, self.kwargs.get("num_warps", 4), self.kwargs.get("num_stages", 3), True)]
        nargs = dict(zip(self.kernel.arg_names, self.args))
        configs = self.tuned.choosable(nargs, self.kwargs, SHARED_LIMIT[cc])
        only_first = not self.tuned.autotunes()
        return [(c.kwargs, c.num_warps, c.num_stages, i == 0) for i, c in enumerate(configs)
                if i == 0 or not only_first]


@contextlib.contextmanager
def recording():
    """Within it, fastbert.kernels' launches are appended to the yielded list instead of run; the ops
    take the kernel path on CPU tensors (as under the interpreter) without running anything. Restores
    torch's TF32 flag on the way out (record_ops sets it)."""
    import importlib
    import pkgutil

    import torch

    import fastbert.kernels as pkg
    from fastbert.kernels import _autotune
    modules = [importlib.import_module(f"fastbert.kernels.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)]
    launches = []

    def tuned_launch(self, key, grid, *args, **kwargs):
        launches.append(Launch(self, self.kernel, args, kwargs))

    def plain_launch(kernel, grid, *args, **kwargs):
        launches.append(Launch(None, kernel, args, kwargs))

    saved_env, saved_tf32 = os.environ.get("TRITON_INTERPRET"), torch.backends.cuda.matmul.allow_tf32
    patched = [(_autotune.TunedKernel, "launch", _autotune.TunedKernel.launch)]
    patched += [(m, "launch", m.launch) for m in modules if getattr(m, "launch", None) is _autotune.launch]
    os.environ["TRITON_INTERPRET"] = "1"   # the ops' CPU check for backend="triton"; kernels stay compiled
    try:
        _autotune.TunedKernel.launch = tuned_launch
        for m, name, _ in patched[1:]:
            setattr(m, name, plain_launch)
        yield launches
    finally:
        for obj, name, fn in patched:
            setattr(obj, name, fn)
        torch.backends.cuda.matmul.allow_tf32 = saved_tf32
        if saved_env is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved_env


def bind(launch, config_kwargs, num_warps, num_stages, cc):
    """(signature, constexprs, attrs, options) exactly as Triton's JIT binds the call for target cc."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature
    kernel = launch.kernel
    backend = make_backend(GPUTarget("cuda", cc, 32))
    kwargs = {**launch.kwargs, **config_kwargs, "num_warps": num_warps, "num_stages": num_stages}
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    opts, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return signature, constexprs, attrs, {"num_warps": num_warps, "num_stages": num_stages}


def _plain(v):
    return v if isinstance(v, (int, float, str, bool, type(None))) else str(v)


class Job:
    """One compile: a bound launch, one config, one target. Picklable (the kernel by module and name)."""

    def __init__(self, launch, config_kwargs, num_warps, num_stages, default, cc):
        self.module, self.name, self.cc, self.default = launch.module, launch.name, cc, default
        self.signature, constexprs, self.attrs, self.options = bind(launch, config_kwargs, num_warps,
                                                                    num_stages, cc)
        names = launch.kernel.arg_names
        self.constexprs = {names[p[0]]: _plain(v) for p, v in constexprs.items()}
        self.config = dict(config_kwargs, num_warps=num_warps, num_stages=num_stages)
        self.dtype = next((t[1:] for a, t in self.signature.items() if a.endswith("ptr") and t[1:] in
                           ("fp16", "bf16", "fp32")), "")
        fixed = {k: v for k, v in self.constexprs.items() if k not in config_kwargs}
        self.variant = ",".join(f"{k}={v}" for k, v in fixed.items())
        self.key = hashlib.sha256(json.dumps(
            [launch.kernel.cache_key, self.name, self.signature, sorted(self.constexprs.items()),
             sorted((str(k), str(v)) for k, v in self.attrs.items()), self.options, cc,
             _triton_version()], default=str).encode()).hexdigest()[:32]

    def row(self):
        return dict(kernel=f"{self.module}.{self.name}", variant=self.variant, dtype=self.dtype,
                    config=",".join(f"{k}={v}" for k, v in self.config.items()), target=f"sm_{self.cc}",
                    default=self.default, limit=SHARED_LIMIT[self.cc], key=self.key)


def _triton_version():
    import triton
    return triton.__version__


def _resources(cubin: bytes):
    """(registers, stack frame bytes) of the kernel in cubin, from the cuobjdump Triton ships."""
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    m = re.search(r"REG:(\d+) STACK:(\d+)", out)
    return int(m.group(1)), int(m.group(2))


def _compile(job, keep_ir=False):
    """Compile one job (in a worker process); returns its result dict."""
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    fn = getattr(importlib.import_module(f"fastbert.kernels.{job.module}"), job.name)
    start = time.perf_counter()
    try:
        src = ASTSource(fn=fn, signature=job.signature, constexprs=job.constexprs, attrs=job.attrs)
        compiled = triton.compile(src, target=GPUTarget("cuda", job.cc, 32), options=job.options)
        regs, stack = _resources(compiled.asm["cubin"])
        result = dict(error=None, registers=regs, spills=stack, shared=compiled.metadata.shared)
        if keep_ir:
            result["ttir"] = compiled.asm["ttir"]
    except Exception as e:  # a compile failure is a result, reported by the caller
        result = dict(error=f"{type(e).__name__}: {str(e)[-2000:]}", registers=None, spills=None, shared=None)
    result["seconds"] = round(time.perf_counter() - start, 2)
    return result


def _cached_compile(args):
    job, cache_dir = args
    path = os.path.join(cache_dir, job.key + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return dict(json.load(f), cached=True)
    result = _compile(job)
    if result["error"] is None or "ptxas" not in result["error"]:
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(result, f)
        os.replace(tmp, path)
    return dict(result, cached=False)


def jobs_for(launches, targets, scope):
    """Unique compile jobs: every choosable config (scope 'all') or the default one only ('default')."""
    jobs = {}
    for launch in launches:
        for cc in targets:
            for kw, warps, stages, default in launch.configs(cc):
                if scope == "default" and not default:
                    continue
                job = Job(launch, kw, warps, stages, default, cc)
                if job.key not in jobs or default:
                    jobs[job.key] = job
    return list(jobs.values())


def compile_all(jobs, cache_dir=DEFAULT_CACHE, workers=None):
    """Rows (job.row() + result) for the jobs, compiled in parallel, cached on disk by job key."""
    import concurrent.futures
    import multiprocessing
    os.makedirs(cache_dir, exist_ok=True)
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(cache_dir, "triton"))
    workers = workers or os.cpu_count() or 1
    ctx = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=ctx) as pool:
        results = list(pool.map(_cached_compile, [(j, cache_dir) for j in jobs]))
    return [dict(j.row(), **r) for j, r in zip(jobs, results)]


# ------------------------------------------------------------------------------------------------
# The launch variants: the ops layer called as the models call it

HEAD_DIMS = (32, 64, 80, 96, 128)
HIDDENS = (384, 768, 1024, 2048, 4096, 8192)
DTYPES = ("float16", "bfloat16", "float32")


def record_ops(dtypes=DTYPES, head_dims=HEAD_DIMS, hiddens=HIDDENS, quick=False):
    """Every kernel launch the ops make for these dtypes, head dims and hidden sizes, forward and backward,
    inference and training (dropout), padded and packed, with and without masks, windows, rotary and
    relative position terms. quick: only the variants with the most flags set (training: dropout, key
    mask or window positions, stored statistics; the serving forward, relative attention's too: a prune
    that counts the flags keeps more configs without dropout), which bound the others' registers."""
    import importlib

    import torch
    att = importlib.import_module("fastbert.ops.attention")   # fastbert.ops.attention is also a function
    rel = importlib.import_module("fastbert.ops.relative_attention")
    from fastbert.ops.add_layer_norm import add_layer_norm
    from fastbert.ops.bias_gelu import bias_gelu
    from fastbert.ops.rotary import rotary
    torch.manual_seed(0)
    cu = torch.tensor([0, 40, 64], dtype=torch.int32)
    tokens, seq, heads = 64, 40, 2
    with recording() as launches:
        for name, tf32 in [(n, t) for n in dtypes for t in ((False, True) if n == "float32" else (False,))]:
            # fp32 products go through 3xTF32, or TF32 where torch allows it (dot_precision): both
            torch.backends.cuda.matmul.allow_tf32 = tf32                 # recording() restores it
            dt = getattr(torch, name)

            def leaf(*shape):
                return torch.randn(*shape, dtype=dt).requires_grad_()

            for d in head_dims:
                # padded, with and without a key mask; inference (no grad) and training (grad, dropout)
                for train in (False, True):
                    for mask in (None, torch.ones(2, seq, dtype=torch.int64))[quick:]:
                        q, k, v = (leaf(2, seq, heads, d) for _ in range(3))
                        with torch.set_grad_enabled(train):
                            out = att.attention(q, k, v, mask, backend="triton", dropout_p=0.1 if train else 0.0)
                        if train:
                            out.sum().backward()
                    # packed: global, window over offsets, window over positions
                    windows = ((None, None), (8, None), (8, torch.arange(tokens) % seq))
                    for window, positions in (windows[2:] if quick and train else windows[:1] if quick else windows):
                        qkv = leaf(tokens, 3, heads, d)
                        q, k, v = qkv.unbind(1)
                        with torch.set_grad_enabled(train):
                            out = att.varlen_attention(q, k, v, cu, seq, backend="triton", window=window,
                                                       positions=positions, dropout_p=0.1 if train else 0.0)
                        if train:
                            out.sum().backward()
                    # relative: MPNet bias, DeBERTa c2p + p2c; the serving forward even when quick: without
                    # dropout the forward's prune keeps configs that the training one drops
                    q, k, v = (leaf(tokens, heads, d) for _ in range(3))
                    pos = torch.cat([torch.arange(40), torch.arange(24)])
                    with torch.set_grad_enabled(train):
                        table = torch.randn(32, heads).requires_grad_()
                        out = rel.relative_bias_attention(q, k, v, cu, seq, pos, table,
                                                          backend="triton", dropout_p=0.1 if train else 0.0)
                        span = 256
                        out2 = rel.disentangled_attention(q, k, v, cu, seq, pos, leaf(2 * span, heads, d),
                                                          leaf(2 * span, heads, d), span=span, position_buckets=256,
                                                          max_relative_positions=512, backend="triton",
                                                          dropout_p=0.1 if train else 0.0)
                    if train:
                        (out.sum() + out2.sum()).backward()
                    # rotary on the fused QKV buffer (inference in place, training into a new buffer)
                    if d % 2 == 0 and (train or not quick):
                        h = max(1, 768 // d)
                        qkv = torch.randn(8, 3, h, d, dtype=dt).requires_grad_(train)
                        cos, sin = torch.randn(8, d // 2), torch.randn(8, d // 2)
                        with torch.set_grad_enabled(train):
                            qr, kr = rotary(qkv, cos, sin, backend="triton")
                        if train:
                            (qr.sum() + kr.sum()).backward()
            for n in hiddens if not tf32 else ():       # no matmuls in these
                for train in (True,) if quick else (False, True):
                    x, r = leaf(4, n), leaf(4, n)
                    w, b = torch.ones(n, dtype=dt).requires_grad_(), torch.zeros(n, dtype=dt).requires_grad_()
                    with torch.set_grad_enabled(train):
                        y = add_layer_norm(x, r, w, b, 1e-12, backend="triton", dropout_p=0.1 if train else 0.0)
                        g = bias_gelu(x, b, backend="triton")
                        if not quick:
                            g = g + bias_gelu(x, b, approximate="tanh", backend="triton")
                    if train:
                        (y.sum() + g.sum()).backward()
    return launches


# ------------------------------------------------------------------------------------------------
# Checks and the driver

def problems(rows):
    """What a sweep found wrong in the configs it compiled (each one a launch may run with): compile
    failures, shared memory over the target's limit, spills (a stack frame)."""
    found = []
    for r in rows:
        where = f"{r['kernel']} [{r['variant']}] {r['config']} {r['target']}"
        if r["error"]:
            found.append(f"compile failed: {where}: {r['error'][-300:]}")
        elif r["shared"] > r["limit"]:
            found.append(f"shared memory {r['shared']} B > {r['limit']} B: {where}")
        elif r["spills"]:
            found.append(f"spills ({r['spills']} B stack, {r['registers']} registers): {where}")
    return found


def _run_script(args, timeout):
    """This file as a script in a process of its own (TRITON_INTERPRET unset, so the kernels are JIT
    functions Triton can compile); returns what it wrote to --json. Skips when Triton has no ptxas."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), *args, "--json", out, "--quiet"],
                              env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 and _no_ptxas(proc.stderr):
            pytest.skip("this Triton install has no ptxas to compile for a GPU")
        assert proc.returncode == 0, proc.stderr[-4000:]
        with open(out) as f:
            return json.load(f)


def run_sweep(scope="default", dtypes=DTYPES, head_dims=HEAD_DIMS, hiddens=HIDDENS, targets=TARGETS,
              quick=False, cache_dir=DEFAULT_CACHE, timeout=600):
    """The rows of a sweep (see main()), compiled in a process of its own."""
    return _run_script(["--scope", scope, "--cache", cache_dir, "--dtypes", *dtypes,
                        "--head-dims", *map(str, head_dims), "--hiddens", *map(str, hiddens),
                        "--targets", *map(str, targets)] + ["--quick"] * quick, timeout)


def run_in_compiler(function, timeout=600, **kwargs):
    """function(**kwargs) of this file, run in a compiling process; returns its (JSON) result."""
    return _run_script(["--call", function, "--kwargs", json.dumps(kwargs)], timeout)


def choosable_counts(targets=TARGETS):
    """{kernel: (fewest, most) configs one launch may choose from}, over the launches record_ops() makes
    (every dtype, head dim and hidden size; with and without dropout) on each target, without compiling
    anything: a prune that left a launch nothing raises (TunedKernel.choosable)."""
    counts = {}
    for launch in record_ops(quick=True):
        for cc in targets:
            n = len(launch.configs(cc))
            lo, hi = counts.get(f"{launch.module}.{launch.name}", (n, n))
            counts[f"{launch.module}.{launch.name}"] = (min(lo, n), max(hi, n))
    return counts


# ------------------------------------------------------------------------------------------------
# 64-bit offsets in the compiled IR

def narrow_products(ttir: str, names):
    """Lines of ttir where an argument in `names` (or a splat / broadcast of it) enters a 32-bit integer
    multiply or add: an offset that wraps once the product passes 2^31."""
    derived = {f"%{n}" for n in names}
    bad = []
    for line in ttir.splitlines():
        m = re.match(r"\s*(%[\w.#]+) = (\S+) (.*)", line)
        if not m:
            continue
        result, op, rest = m.groups()
        operands = set(re.findall(r"%[\w.#]+", rest.split(" : ")[0]))
        if not operands & derived:
            continue
        if op in ("tt.splat", "tt.broadcast", "tt.expand_dims"):
            derived.add(result)
        elif op in ("arith.muli", "arith.addi") and re.search(r"(: i32\b|xi32>)", rest):
            bad.append(line.strip()[:200])
    return bad


def token_offset_report(tokens=400_000):
    """{kernel: narrow_products of its token-scaled arguments} for launches at `tokens` packed tokens
    (meta tensors: nothing is allocated), compiled for sm_90: DeBERTa-base's relative attention
    (12 heads, c2p / p2c as the ops make them: (tokens, heads, 2 span) views of (heads, tokens, 2 span)
    GEMM outputs), forward and backward, and LayerNorm with dropout at hidden size 8192."""
    import torch

    from fastbert.kernels import add_layer_norm as ln
    from fastbert.kernels import relative_attention as rel
    heads, dim, span = 12, 64, 256
    meta = dict(device="meta")
    q = torch.empty(tokens, heads, dim, dtype=torch.float16, **meta)
    pos_key = torch.empty(2 * span, heads, dim, dtype=torch.float16, **meta)
    c2p = torch.matmul(q.transpose(0, 1).float(), pos_key.float().permute(1, 2, 0)).transpose(0, 1)
    cu = torch.empty(tokens // 512 + 1, dtype=torch.int32, **meta)
    positions = torch.empty(tokens, dtype=torch.int32, **meta)
    lut = torch.empty(2 * span + 1, dtype=torch.int32, **meta)
    seed = torch.empty(1, dtype=torch.int64, **meta)
    x = torch.empty(tokens, 8192, dtype=torch.float16, **meta)
    w = torch.empty(8192, dtype=torch.float16, **meta)
    with recording() as launches:
        kw = dict(c2p=c2p, p2c=c2p, lut=lut, radius=span, scale=0.1, dropout_p=0.1, seed=seed)
        out, lse = rel.relative_attention_fwd(q, q, q, cu, 512, positions, **kw)
        rel.relative_attention_bwd(q, q, q, q, out, lse, cu, 512, positions, **kw)
        y, s, mean, rstd = ln.add_layer_norm_fwd(x, x, w, w, 1e-12, store_sum=True, dropout_p=0.1, seed=seed)
        ln.add_layer_norm_bwd(x, s, w, mean, rstd, dropout_p=0.1, seed=seed)
    scaled = {"relative_attention": ("stride_cs", "stride_ch"), "add_layer_norm": ("N",)}
    report = {}
    for launch in launches:
        if launch.module not in scaled:
            continue
        kw_, warps, stages, default = launch.configs(90)[0]
        result = _compile(Job(launch, kw_, warps, stages, default, 90), keep_ir=True)
        assert result["error"] is None, result["error"]
        report.setdefault(f"{launch.module}.{launch.name}", []).extend(
            narrow_products(result["ttir"], scaled[launch.module]))
    return report


def main(argv=None):
    p = argparse.ArgumentParser(description="Compile every kernel launch the ops make for NVIDIA targets "
                                            "(no GPU needed) and report registers, spills and shared memory.")
    p.add_argument("--scope", choices=("default", "all"), default="all",
                   help="default: the config each launch runs untuned; all: every config it may choose")
    p.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    p.add_argument("--head-dims", nargs="+", type=int, default=list(HEAD_DIMS))
    p.add_argument("--hiddens", nargs="+", type=int, default=list(HIDDENS))
    p.add_argument("--targets", nargs="+", type=int, default=list(TARGETS))
    p.add_argument("--cache", default=DEFAULT_CACHE, help="result cache folder (by kernel source hash)")
    p.add_argument("--workers", type=int, default=None)
    p.add_argument("--quick", action="store_true", help="only the variants with the most flags (record_ops)")
    p.add_argument("--json", help="write the rows here")
    p.add_argument("--quiet", action="store_true")
    p.add_argument("--call", help=argparse.SUPPRESS)     # run_in_compiler()
    p.add_argument("--kwargs", default="{}", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("unset TRITON_INTERPRET: the kernels must be JIT functions to compile them")
    if a.call:
        result = globals()[a.call](**json.loads(a.kwargs))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(result, f)
        return result
    start = time.perf_counter()
    launches = record_ops(a.dtypes, a.head_dims, a.hiddens, a.quick)
    jobs = jobs_for(launches, a.targets, a.scope)
    rows = compile_all(jobs, a.cache, a.workers)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f)
    if not a.quiet:
        counts = collections.Counter(r["kernel"] for r in rows)
        print(f"{len(launches)} launches recorded, {len(jobs)} compiles ({sum(not r['cached'] for r in rows)} "
              f"not cached) in {time.perf_counter() - start:.0f} s: {dict(counts)}")
        for line in problems(rows):
            print(line)
    return rows


if __name__ == "__main__":
    main()
