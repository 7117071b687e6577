"""fastbert's own small-M GEMM (fastbert._C.linear_f32) against MKL's packed GEMM, the two paths of
fastbert.ops.packed_linear for a few dozen tokens: where OWN_MAX_TOKENS comes from.

One forward's GEMMs of all-MiniLM-L6-v2 (6 layers x QKV 384->1152, attention out 384->384 + residual,
FFN1 384->1536 + erf GELU, FFN2 1536->384 + residual; 24 distinct weights, as in the model) over
`--tokens` rows, through packed_linear as a lean layer calls it. Each path runs in a process of its
own (two thread pools in one process, MKL's OpenMP one and fastbert's, slow each other down while
the other's threads still spin), the two alternating `--rounds` times per configuration; each
process prints the median and 10th percentile of `--iters` forwards' GEMMs, 0.5 ms apart.

    python bench/bench_linear.py [--tokens 1 9 26 40 64] [--threads 1 2] [--iters 150] [--rounds 2]
"""
import argparse
import statistics
import subprocess
import sys
import time

import torch

from fastbert.ops import linear as L

SHAPES = [(1152, 384, None), (384, 384, "residual"), (1536, 384, "gelu"), (384, 1536, "residual")]  # out, in


def child(path: str, threads: int, tokens: int, iters: int) -> None:
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    L.PackedWeight.uses_own = lambda self, tokens: path == "own"   # at every token and thread count measured
    calls = []
    for _ in range(6):
        for n_out, n_in, epilogue in SHAPES:
            w, b = torch.randn(n_out, n_in) / 20, torch.randn(n_out)
            calls.append((torch.randn(tokens, n_in), L.pack_weight(w), b, epilogue))
    residual = torch.randn(tokens, 384)

    def forward():
        for x, packed, b, epilogue in calls:
            L.packed_linear(x, packed, b, activation="gelu" if epilogue == "gelu" else None,
                            residual=residual if epilogue == "residual" else None)
    times = []
    with torch.inference_mode():
        for i in range(iters + 20):                    # the first 20: copies made, caches and pools warm
            start = time.perf_counter()
            forward()
            if i >= 20:
                times.append(1e3 * (time.perf_counter() - start))
            time.sleep(0.0005)
    times.sort()
    print(f"{statistics.median(times)} {times[len(times) // 10]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 9, 26, 40, 64])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--iters", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, threads, tokens, iters = args.child
        return child(path, int(threads), int(tokens), int(iters))
    if not L._OWN:
        sys.exit("fastbert's own GEMM needs a CPU with AVX-512 (fastbert._C.linear_f32_available())")
    if L._MKL is None:
        sys.exit("this torch build has no MKL packed GEMM")
    print(f"torch {torch.__version__}; 24 GEMMs of all-MiniLM-L6-v2, ms: median (10th percentile) per round, "
          f"own / MKL of the medians; OWN_MAX_TOKENS = {L.OWN_MAX_TOKENS}")
    for threads in args.threads:
        for tokens in args.tokens:
            got = {"mkl": [], "own": []}
            for _ in range(args.rounds):
                for path in got:
                    out = subprocess.run([sys.executable, __file__, "--child", path, str(threads), str(tokens),
                                          str(args.iters)], check=True, capture_output=True, text=True).stdout
                    got[path].append(tuple(map(float, out.split())))
            row = {p: ", ".join(f"{m:.2f} ({q:.2f})" for m, q in v) for p, v in got.items()}
            ratios = ", ".join(f"{o[0] / m[0]:.2f}" for o, m in zip(got["own"], got["mkl"]))
            print(f"{threads} threads, {tokens:3d} tokens: MKL {row['mkl']} | own {row['own']} | own/MKL {ratios}")


if __name__ == "__main__":
    main()
