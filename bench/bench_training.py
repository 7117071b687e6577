"""Training-step time: fastbert vs transformers (forward + backward + AdamW step), same batch, one run.

    python bench/bench_training.py [--quick] [--batch-size 32] [--threads 2]   # table + a line in
                                                                                # bench/results/training.jsonl
    pytest bench/bench_training.py --benchmark-only                             # pytest-benchmark

CPU, fp32, 2 threads by default: the all-MiniLM-L6-v2 checkpoint under a 2-label classification head,
a batch of real English sentences padded to its longest. The measurement and the gradient check live
in training.py beside this file (not part of `fastbert bench`); this file only wraps it.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import training as tb
from common import RESULTS, append_run, model_dir, pytest, say

# ---- pytest-benchmark ---------------------------------------------------------------------------------

if pytest is not None:
    @pytest.fixture(scope="module")
    def setup():
        torch.set_num_threads(2)
        inputs = tb.workload(model_dir())
        hf, fast = tb.load_pair(model_dir(), "cpu")
        check = tb.compare(hf, fast, inputs, "cpu", "float32")
        assert check["ok"], f"fastbert's loss/gradients differ from transformers': {check}"
        return inputs, {"transformers": hf, "fastbert": fast}

    @pytest.mark.parametrize("library", ["transformers", "fastbert"])
    def test_training_step(benchmark, setup, library):
        inputs, models = setup
        model = models[library].train()
        opt = torch.optim.AdamW(model.parameters(), lr=tb.LR)

        def step():
            opt.zero_grad(set_to_none=True)
            model(**inputs).loss.backward()
            opt.step()

        benchmark.extra_info["real_tokens"] = int(inputs["attention_mask"].sum())
        benchmark.pedantic(step, rounds=5, iterations=1, warmup_rounds=1)


# ---- script -------------------------------------------------------------------------------------------

def table(rows) -> str:
    lines = [f"{'library':<22}{'median ms/step':>16}{'best ms/step':>14}{'real tokens/s':>15}  check"]
    for r in rows:
        check = "" if "ok" not in r else (
            f"{'ok' if r['ok'] else 'FAIL'} vs HF fp32: loss {r['loss_rel_err']:.1e}, grads {r['grad_rel_err']:.1e} "
            f"(worst parameter {r['max_grad_rel_err']:.1e}) relative")
        lines.append(f"{r['name']:<22}{r['ms/step']:>16.1f}{r['best ms/step']:>14.1f}{r['tokens/s']:>15,.0f}  {check}")
    fast = next(r for r in rows if r["name"] == "fastbert")
    lines.append(f"fastbert speed-up: {fast['speedup']:.2f}x  ({rows[0]['case']})")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 timed steps instead of 10")
    parser.add_argument("--repeats", type=int, default=None, help="timed steps per library")
    parser.add_argument("--batch-size", type=int, default=tb.BATCH)
    parser.add_argument("--threads", type=int, default=2, help="CPU threads (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--dtype", default="float32", choices=sorted(tb.TOLERANCE),
                        help="float16/bfloat16 train under torch.autocast (GPU)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of training.jsonl")
    args = parser.parse_args(argv)
    rows = tb.run(model_dir(), quick=args.quick, repeats=args.repeats, batch_size=args.batch_size,
                  threads=args.threads, device=args.device, dtype=args.dtype,
                  progress=say)
    print(f"{rows[0]['device_name']} ({rows[0]['device']}); versions {rows[0]['versions']}")
    print(table(rows))
    config = {k: v for k, v in vars(args).items() if k != "out"}
    path = append_run("training", rows, args.out, variant="quick" if args.quick else None, device=args.device,
                      config=config)
    print(f"appended to {path}")
    return 0 if all(r.get("ok", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
