"""Long inputs: ModernBERT-base-sized, random weights, fp32, fastbert vs transformers (sdpa) and FlexAttention.

    python bench/bench_long.py [--part attention|model|all] [--layers 22] [--lengths 2048,4096,8192]
                               [--threads 2] [--out DIR]   # a line in DIR/long.jsonl (bench/results/)

Part "attention" (the op level, in this process): one local (sliding-window) attention over one
sequence of each length, 12 heads x 64 (ModernBERT-base), window +-64 (local_attention 128), fp32,
every peer on the same q, k, v in the same run, rounds interleaved, medians:
  fastbert CPU path     sliding_window_attention (blockwise torch: keys within the window only)
  transformers sdpa     torch SDPA under the dense (L, L) window mask, as transformers' sdpa path
                        runs ModernBERT's local layers (the mask is built outside the timed region)
  FlexAttention         torch.nn.attention.flex_attention compiled with torch.compile, with the
                        sliding-window block mask (|q - kv| <= 64; its block sparsity skips the rest)
  fastbert Triton       the varlen flash kernel with its window, and FlexAttention on the GPU: only
                        with a CUDA GPU (a row with the reason otherwise)
Linear cost shows as a flat time per token across 2k / 4k / 8k.

Part "model", two measurements, each case in a fresh subprocess (so one case's peak memory cannot hide another's):
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
import statistics
import subprocess
import sys
import time

import torch
from common import RESULTS, append_run, measure_forward

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


def child(peer: str, length: int, layers: int, local_only: bool, repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    model = build(peer, layers, local_only)
    ids = torch.randint(5, 50000, (1, length), generator=torch.Generator().manual_seed(1))
    seconds, peak_mib, _ = measure_forward(lambda: model(input_ids=ids).last_hidden_state, repeats)
    return {"peer": peer, "tokens": length, "layers": layers, "local_only": local_only,
            "seconds": seconds, "peak_forward_mib": peak_mib}


def parity(length: int, layers: int) -> float:
    import transformers  # noqa: F401
    hf, fast = build("transformers_sdpa", layers, False), build("fastbert", layers, False)
    ids = torch.randint(5, 50000, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        return (hf(input_ids=ids).last_hidden_state - fast(input_ids=ids).last_hidden_state).abs().max().item()


HEADS, HEAD_DIM, WINDOW = 12, 64, 64     # ModernBERT-base: 12 x 64, local_attention 128 -> +-64


def attention_peers(length: int, device: str):
    """name -> zero-argument call, all on the same (length, 12, 64) fp32 q, k, v; and an fp64 reference
    output at a few rows for a correctness check of every peer."""
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from fastbert.ops.attention import sliding_window_attention
    g = torch.Generator().manual_seed(length)
    q, k, v = (torch.randn(length, HEADS, HEAD_DIM, generator=g).to(device) for _ in range(3))
    cu = torch.tensor([0, length], dtype=torch.int32, device=device)
    qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))         # (1, heads, L, dim) views
    pos = torch.arange(length, device=device)
    dense_mask = (pos[:, None] - pos[None, :]).abs() <= WINDOW         # (L, L), as transformers builds it
    block_mask = create_block_mask(lambda b, h, qi, ki: (qi - ki).abs() <= WINDOW, None, None, length, length,
                                   device=device)
    flex = torch.compile(flex_attention)

    def unheads(o):
        return o[0].transpose(0, 1)
    on = "GPU" if device == "cuda" else "CPU"
    peers = {
        f"fastbert {'Triton kernel' if device == 'cuda' else 'CPU path (blockwise)'}":
            lambda: sliding_window_attention(q, k, v, cu, length, WINDOW),
        f"transformers sdpa ({on}, dense window mask)":
            lambda: unheads(F.scaled_dot_product_attention(qh, kh, vh, attn_mask=dense_mask)),
        f"FlexAttention compiled ({on})": lambda: unheads(flex(qh, kh, vh, block_mask=block_mask)),
    }
    return peers, (q, k, v)


def _check_peer(out, q, k, v, rows) -> float:
    """Max abs diff of out at `rows` against fp64 attention over each row's window."""
    err = 0.0
    for i in rows:
        lo, hi = max(0, i - WINDOW), min(q.shape[0], i + WINDOW + 1)
        s = torch.einsum("hd,jhd->hj", q[i].double(), k[lo:hi].double()) / HEAD_DIM ** 0.5
        ref = torch.einsum("hj,jhd->hd", torch.softmax(s, -1), v[lo:hi].double())
        err = max(err, (out[i].double().cpu() - ref.cpu()).abs().max().item())
    return err


def attention_part(args, lengths, meta) -> list:
    devices = ["cpu"]
    if torch.cuda.is_available():
        devices.append("cuda")
    else:
        print("GPU rows skipped: no CUDA GPU on this machine (the Triton kernel's speed and FlexAttention on "
              "a GPU are measured only where one is present)")
    rows = []
    for device in devices:
        for length in lengths:
            peers, (q, k, v) = attention_peers(length, device)
            errs = {}
            with torch.inference_mode():
                for name, call in peers.items():                       # warm-up (FlexAttention compiles here)
                    errs[name] = _check_peer(call(), q, k, v, (0, 1, length // 2, length - 1))
                times = {name: [] for name in peers}
                for _ in range(args.repeats_attention):                # interleaved rounds
                    for name, call in peers.items():
                        if device == "cuda":
                            torch.cuda.synchronize()
                        t0 = time.perf_counter()
                        call()
                        if device == "cuda":
                            torch.cuda.synchronize()
                        times[name].append(time.perf_counter() - t0)
            for name in peers:
                med = statistics.median(times[name])
                rows.append({**meta, "part": "attention", "peer": name, "device": device, "tokens": length,
                             "heads": HEADS, "head_dim": HEAD_DIM, "window": WINDOW, "dtype": "float32",
                             "median_ms": round(med * 1e3, 3), "us_per_token": round(med * 1e6 / length, 3),
                             "repeats": args.repeats_attention, "max_abs_diff_vs_fp64": errs[name]})
                print(f"  {device} {length:5d} tokens  {name:45s} {med * 1e3:9.2f} ms  "
                      f"{med * 1e6 / length:7.2f} us/token  err {errs[name]:.1e}", flush=True)
    print("\nlocal attention, time per token (flat = linear cost) and ratio to FlexAttention, same device:")
    for device in devices:
        for name in dict.fromkeys(r["peer"] for r in rows if r["device"] == device):
            per = {r["tokens"]: r for r in rows if r["peer"] == name and r["device"] == device}
            flex = {r["tokens"]: r for r in rows if r["peer"].startswith("FlexAttention") and r["device"] == device}
            cells = "  ".join(f"{n}: {per[n]['us_per_token']:.2f} us/tok "
                              f"({per[n]['median_ms'] / flex[n]['median_ms']:.2f}x flex)" for n in lengths)
            growth = per[max(lengths)]["median_ms"] / per[min(lengths)]["median_ms"]
            print(f"  {device} {name:45s} {cells}  | time {max(lengths)}/{min(lengths)} = {growth:.2f}x "
                  f"(length x{max(lengths) / min(lengths):.0f})")
    return rows


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
    p.add_argument("--out", default=RESULTS, help="folder of long.jsonl (default bench/results/)")
    p.add_argument("--part", choices=("attention", "model", "all"), default="all")
    p.add_argument("--repeats-attention", type=int, default=7)
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
    if args.part != "model":
        import triton
        meta_a = dict(meta, triton=triton.__version__,
                      cuda=torch.cuda.get_device_name() if torch.cuda.is_available() else None)
        rows = attention_part(args, lengths, meta_a)
        print(f"appended to {append_run('long', rows, args.out, variant='attention', config=meta_a)}")
        if args.part == "attention":
            return
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
    config = dict(meta, parity_max_abs_diff=diff)
    print(f"appended to {append_run('long', rows, args.out, variant='model', config=config)}")


if __name__ == "__main__":
    main()
