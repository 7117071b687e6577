"""Which int8 GEMM fastbert.ops.quantized_linear uses on CPU: measured, not guessed.

Candidates (all torch's own kernels, dynamic int8: activations quantized per call, weights per
output channel once), each a backend of fastbert.ops.quantized_linear:
  per_token       torch.ops.onednn.qlinear_pointwise, uint8 activations with a scale and zero point
                  per row (token), applied after the GEMM with one scale pass and a rank-2 addmm_
  linear_dynamic  torch.ops.quantized.linear_dynamic (FBGEMM), one activation scale per tensor
  per_tensor      torch.ops.onednn.qlinear_pointwise, one activation scale per tensor
against the fp32 GEMMs fastbert runs today: oneDNN linear (torch.ops.mkldnn._linear_pointwise) and
F.linear. Inputs look like a LayerNorm output: one outlier channel and rows of different
magnitude, so the error column shows what per-tensor scales lose. Shapes: all-MiniLM-L6-v2's GEMMs
over `--tokens` tokens (a benchmark batch of 32 lines is ~1,000), and bert-base's FFN. Time: the
best of `--repeats` blocks of 10 calls after warm-up, candidates interleaved block by block (on a shared machine the best block is the one
least disturbed); ratios against fp32 oneDNN in the same run.
torch._int_mm (int8 x int8 -> int32) is per_token's GEMM up to ql.INT_MM_MAX_ROWS rows on weights of up to
ql.INT_MM_MAX_WEIGHT values, the int32 sums scaled in the rescale pass: run with --tokens 18 (a short text
alone) to see that route; at 1,024 tokens, and on bert-base's larger weights, it was slower than
qlinear_pointwise.

    python bench/bench_quantized_linear.py [--tokens 1024] [--repeats 7]
"""
import argparse
import time

import torch
import torch.nn.functional as F

from fastbert.ops import quantized_linear as ql

SHAPES = {  # name: (in_features, out_features)
    "MiniLM QKV 384->1152": (384, 1152),
    "MiniLM attn out 384->384": (384, 384),
    "MiniLM FFN1 384->1536": (384, 1536),
    "MiniLM FFN2 1536->384": (1536, 384),
    "bert-base FFN1 768->3072": (768, 3072),
}


def best_ms(runs: dict, repeats: int, block: int = 10) -> dict:
    """{label: ms}: the best of `repeats` blocks of `block` calls, candidates interleaved block by block."""
    for fn in runs.values():
        fn()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(repeats):
        for label, fn in runs.items():
            start = time.perf_counter()
            for _ in range(block):
                fn()
            best[label] = min(best[label], (time.perf_counter() - start) / block)
    return {label: 1e3 * t for label, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.manual_seed(0)
    mkldnn = torch.ops.mkldnn._linear_pointwise
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, engine "
          f"{torch.backends.quantized.engine}, {args.tokens} tokens, int8 weights to +-{ql.weight_max()}; "
          "ms (speedup vs fp32 oneDNN, max error relative to max |y|)")
    with torch.inference_mode():
        for name, (k, n) in SHAPES.items():
            x = torch.randn(args.tokens, k) * torch.rand(args.tokens, 1) * 2
            x[:, 7] += 20                                   # an outlier channel
            w, b = torch.randn(n, k) / k ** 0.5, torch.randn(n)
            ref = F.linear(x.double(), w.double(), b.double())
            runs = {"fp32 F.linear": lambda: F.linear(x, w, b),
                    "fp32 oneDNN": lambda: mkldnn(x, w, b, "none", [None], "")}
            for backend in ql.BACKENDS:
                packed = ql.pack(w, b, backend=backend)
                runs[f"int8 {backend}"] = lambda packed=packed: ql.quantized_linear(x, packed)
            times = best_ms(runs, args.repeats)
            base = times["fp32 oneDNN"]
            cells = []
            for label, fn in runs.items():
                err = (fn().double() - ref).abs().max().item() / ref.abs().max().item()
                cells.append(f"{label} {times[label]:.2f} ({base / times[label]:.2f}x, rel err {err:.1e})")
            print(f"{name}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
