"""Which int8 GEMM fastbert.ops.quantized_linear uses on CPU: measured, not guessed.

Candidates (all torch's own kernels, dynamic int8: activations quantized per call, weights per
output channel once):
  fbgemm   torch.ops.quantized.linear_dynamic on a torch.ops.quantized.linear_prepack'ed weight
  onednn   torch.ops.onednn.qlinear_pointwise (uint8 activations quantized here per tensor, an
           int8 weight packed by torch.ops.onednn.qlinear_prepack), fp32 out
against the fp32 GEMMs fastbert runs today: oneDNN linear (torch.ops.mkldnn._linear_pointwise) and
F.linear. Shapes: all-MiniLM-L6-v2's four GEMMs (hidden 384, FFN 1536) over 2,048 tokens, and
bert-base's FFN. Median of `--repeats` timed calls after warm-up; ratios against fp32 oneDNN in the
same run.

    python bench/bench_quantized_linear.py [--tokens 2048] [--repeats 30]
"""
import argparse
import statistics
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


def median_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.manual_seed(0)
    mkldnn = torch.ops.mkldnn._linear_pointwise
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, engine "
          f"{torch.backends.quantized.engine}, {args.tokens} tokens; ms (speedup vs fp32 oneDNN)")
    with torch.inference_mode():
        for name, (k, n) in SHAPES.items():
            x = torch.randn(args.tokens, k)
            w, b = torch.randn(n, k) / k ** 0.5, torch.randn(n)
            ref = F.linear(x.double(), w.double(), b.double())
            runs = {"fp32 F.linear": lambda: F.linear(x, w, b),
                    "fp32 oneDNN": lambda: mkldnn(x, w, b, "none", [None], "")}
            for backend in ql.BACKENDS:
                packed = ql.pack(w, b, backend=backend)
                runs[f"int8 {backend}"] = lambda packed=packed: ql.quantized_linear(x, packed)
            base = median_ms(runs["fp32 oneDNN"], args.repeats)
            cells = []
            for label, fn in runs.items():
                ms = median_ms(fn, args.repeats)
                err = (fn().double() - ref).abs().max().item() / ref.abs().max().item()
                cells.append(f"{label} {ms:.2f} ({base / ms:.2f}x, rel err {err:.1e})")
            print(f"{name}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
