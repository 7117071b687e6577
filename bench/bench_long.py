"""Long inputs on CPU: ModernBERT-base-sized, random weights, fp32, fastbert vs transformers (sdpa).

    python bench/bench_long.py [--layers 22] [--lengths 2048,4096,8192] [--threads 2] [--out FILE.json]

Two measurements, each case in a fresh subprocess (so one case's peak memory cannot hide another's):
1. the whole model (global layer every 3rd, local_attention 128) on one sequence of the longest length;
2. a model of local (sliding-window) layers only at each length: fastbert's local attention is
   blockwise (keys within the window only), so its time and memory grow linearly with length, while
   transformers' sdpa path runs dense attention under an (L, L) window mask.
Peak memory is the forward's own: the process's resident-set high-water mark (VmHWM, reset through
/proc/self/clear_refs just before the forward) minus the resident set before it. Time: best of
`--repeats` forwards under torch.inference_mode. The outputs of both peers are compared at the
shortest length first (max abs diff, fp32) so the figures are for equal work.
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))


def base_config(layers: int, local_only: bool, attn: str):
    import transformers
    kw = dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_attention_heads=12,
              num_hidden_layers=layers, local_attention=128, max_position_embeddings=8192,
              global_attn_every_n_layers=3, attn_implementation=attn)
    if local_only:
        kw["layer_types"] = ["sliding_attention"] * layers
    return transformers.ModernBertConfig(**kw)


def build(peer: str, layers: int, local_only: bool):
    import transformers
    from fastbert.models.modernbert import ModernBertModel
    torch.manual_seed(0)
    hf = transformers.ModernBertModel(base_config(layers, local_only, "sdpa")).eval()
    if peer == "transformers_sdpa":
        return hf
    fast = ModernBertModel(base_config(layers, local_only, "sdpa")).eval()
    fast.load_state_dict(hf.state_dict(), strict=True)
    return fast


def _rss_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(peer: str, length: int, layers: int, local_only: bool, repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    model = build(peer, layers, local_only)
    ids = torch.randint(5, 50000, (1, length), generator=torch.Generator().manual_seed(1))
    times, peak = [], 0
    for _ in range(repeats):
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")                                   # reset the RSS high-water mark
        before = _rss_kb("VmRSS")
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model(input_ids=ids).last_hidden_state
        times.append(time.perf_counter() - t0)
        peak = max(peak, _rss_kb("VmHWM") - before)
        del out
    return {"peer": peer, "tokens": length, "layers": layers, "local_only": local_only,
            "seconds": min(times), "peak_forward_mib": round(peak / 1024, 1)}


def parity(length: int, layers: int) -> float:
    import transformers  # noqa: F401
    hf, fast = build("transformers_sdpa", layers, False), build("fastbert", layers, False)
    ids = torch.randint(5, 50000, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        return (hf(input_ids=ids).last_hidden_state - fast(input_ids=ids).last_hidden_state).abs().max().item()


def run_case(args, peer, length, layers, local_only) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", peer, str(length), str(layers),
           str(int(local_only)), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"case {peer} {length} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=22, help="layers of the whole model (ModernBERT-base: 22)")
    p.add_argument("--local-layers", type=int, default=3, help="layers of the local-only scaling model")
    p.add_argument("--lengths", default="2048,4096,8192")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None)
    p.add_argument("--child", nargs=4, metavar=("PEER", "TOKENS", "LAYERS", "LOCAL_ONLY"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        peer, length, layers, local_only = args.child
        print(json.dumps(child(peer, int(length), int(layers), bool(int(local_only)), args.repeats, args.threads)))
        return
    import transformers
    lengths = [int(x) for x in args.lengths.split(",")]
    meta = {"device": "cpu", "cpu": platform.processor() or platform.machine(), "threads": args.threads,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    torch.set_num_threads(args.threads)
    diff = parity(min(lengths), 3)
    print(f"max abs diff fastbert vs transformers sdpa, 3 layers, {min(lengths)} tokens: {diff:.2e}")
    rows = []
    for peer in ("fastbert", "transformers_sdpa"):
        rows.append(run_case(args, peer, max(lengths), args.layers, False))
        print(rows[-1], flush=True)
    for length in lengths:
        for peer in ("fastbert", "transformers_sdpa"):
            rows.append(run_case(args, peer, length, args.local_layers, True))
            print(rows[-1], flush=True)
    for r in rows:
        r.update(meta)
    by = {(r["peer"], r["tokens"], r["local_only"]): r for r in rows}
    print(f"\nwhole model, {args.layers} layers, {max(lengths)} tokens:")
    f, h = by[("fastbert", max(lengths), False)], by[("transformers_sdpa", max(lengths), False)]
    print(f"  fastbert {f['seconds']:.2f} s, peak {f['peak_forward_mib']} MiB | transformers sdpa "
          f"{h['seconds']:.2f} s, peak {h['peak_forward_mib']} MiB | speedup {h['seconds'] / f['seconds']:.2f}x, "
          f"memory ratio {h['peak_forward_mib'] / max(f['peak_forward_mib'], 1e-9):.1f}x")
    print(f"local layers only ({args.local_layers}), per length:")
    for length in lengths:
        f, h = by[("fastbert", length, True)], by[("transformers_sdpa", length, True)]
        print(f"  {length:5d} tokens: fastbert {f['seconds']:.2f} s / {f['peak_forward_mib']} MiB, "
              f"transformers {h['seconds']:.2f} s / {h['peak_forward_mib']} MiB")
    out = args.out or os.path.join(HERE, "results", f"long-cpu-{datetime.datetime.now(datetime.timezone.utc):%Y%m%dT%H%M%S}.json")
    with open(out, "w") as fh:
        json.dump({"parity_max_abs_diff": diff, "rows": rows}, fh, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
