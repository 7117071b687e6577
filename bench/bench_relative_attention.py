"""DeBERTa-v3-base-sized relative attention: fastbert vs transformers vs FlexAttention, on CPU (GPU rows skip
with a reason when no GPU is present).

    python bench/bench_relative_attention.py [--layers 2] [--tokens 2048] [--batch 8x256] [--threads 2]
                                             # a line in bench/results/relative_attention.jsonl

Config: hidden 768, 12 heads, intermediate 3072, position_buckets 256, max_relative_positions 512,
share_att_key, pos_att_type c2p|p2c, norm_rel_ebd layer_norm, position_biased_input false; random
weights, the same in every peer (fastbert loads transformers' state dict, strict). fp32.

Rows:
1. long: `--layers` layers on one `--tokens`-token sequence, each peer in a fresh subprocess. Peak
   memory is the forward's own: the process's resident-set high-water mark (VmHWM, reset through
   /proc/self/clear_refs just before the forward) minus the resident set before it; time is the best
   of `--repeats` forwards under torch.inference_mode. transformers' DeBERTa-v2 has no sdpa path, so
   its peer is eager (its only implementation).
2. flex: the attention alone at `--tokens` (q, k, v, pos_key, pos_query of one layer): fastbert's
   disentangled_attention vs torch.nn.attention.flex_attention compiled with torch.compile, with a
   score_mod adding the same c2p / p2c terms (gathered from (heads, L, 2 span) products through the
   same distance table); same subprocess method, compile time excluded (a warm-up call first).
3. interleaved: the time ratios of rows 1 and 2 again, both peers in this process, calls alternating,
   medians (the subprocess rows run one after the other, so load from other processes can tilt them).
4. batch: a padded batch (`--batch` B x L, random lengths in [L/8, L], seed 0), fastbert vs transformers
   in one process, interleaved, median of `--repeats` (x3) forwards each.
5. train_batch: one training step on that batch (sequence classification: forward, backward, AdamW),
   transformers vs fastbert.optimize() of the same model, interleaved, median of `--repeats` (x3) steps.
Outputs are compared (max abs diff on real tokens) so the figures are for equal work.
GPU rows (fp16 on CUDA: the Triton kernel in the model vs transformers, the attention vs compiled
FlexAttention, flashdeberta if installed) run only where CUDA is present; elsewhere they are written as
skipped with the reason. They have not been run yet (no GPU where this was written).
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


def hf_config(layers: int):
    import transformers
    return transformers.DebertaV2Config(
        vocab_size=128100, hidden_size=768, num_hidden_layers=layers, num_attention_heads=12,
        intermediate_size=3072, max_position_embeddings=512, relative_attention=True, position_buckets=256,
        max_relative_positions=512, share_att_key=True, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm",
        position_biased_input=False, type_vocab_size=0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def build(layers: int):
    """(transformers model, fastbert model) with the same weights, eval mode."""
    import transformers

    import fastbert
    torch.manual_seed(0)
    config = hf_config(layers)
    hf = transformers.DebertaV2Model(config).eval()
    fast = fastbert.DebertaV2Model.from_hf_config(config)
    fast.load_state_dict(hf.state_dict(), strict=True)
    return hf, fast.eval()


def attention_inputs(tokens: int):
    """One layer's q, k, v (tokens, 12, 64) and pos_key / pos_query (512, 12, 64), fp32, seed 0."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(tokens, 12, 64, generator=g) for _ in range(3))
    pk, pq = (torch.randn(512, 12, 64, generator=g) * 0.5 for _ in range(2))
    return q, k, v, pk, pq


def flex_peer(q, k, v, pk, pq):
    """A compiled flex_attention callable computing DeBERTa's c2p + p2c attention of one sequence."""
    from torch.nn.attention.flex_attention import flex_attention

    from fastbert.ops import relative_attention as R
    lut, radius = R.deberta_lut(256, 256, 512, q.device)
    lut = lut.long()
    scale = 1.0 / (64 * 3) ** 0.5                              # scale_factor 3: c2p and p2c
    compiled = torch.compile(flex_attention)

    def run():
        qh, kh, vh = (t.transpose(0, 1)[None] for t in (q, k, v))          # (1, heads, L, d)
        c2p = torch.matmul(qh[0], pk.permute(1, 2, 0))                     # (heads, L, 2 span)
        p2c = torch.matmul(kh[0], pq.permute(1, 2, 0))

        def score_mod(score, b, h, i, j):
            d = lut[torch.clamp(i - j, -radius, radius) + radius]
            return score + (c2p[h, i, d] + p2c[h, j, d]) * scale
        return compiled(qh, kh, vh, score_mod=score_mod, scale=scale)[0].transpose(0, 1)
    return run


def child(case: str, tokens: int, layers: int, repeats: int, threads: int) -> dict:
    torch.set_num_threads(threads)
    if case in ("fastbert", "transformers_eager"):
        hf, fast = build(layers)
        model = fast if case == "fastbert" else hf
        del hf, fast
        ids = torch.randint(5, 128000, (1, tokens), generator=torch.Generator().manual_seed(1))
        seconds, peak, out = measure_forward(lambda: model(input_ids=ids).last_hidden_state, repeats)
        return {"row": "long", "peer": case, "tokens": tokens, "layers": layers, "seconds": seconds,
                "peak_forward_mib": peak, "checksum": float(out.double().abs().sum())}
    from fastbert.ops import relative_attention as R
    q, k, v, pk, pq = attention_inputs(tokens)
    cu = torch.tensor([0, tokens], dtype=torch.int32)
    positions = torch.arange(tokens)
    if case == "fastbert_attention":
        table = R.deberta_lut(256, 256, 512, q.device)         # built once, as a model holds it

        def fn():
            return R.disentangled_attention(q, k, v, cu, tokens, positions, pk, pq, span=256, position_buckets=256,
                                            max_relative_positions=512, scale_factor=3, distances=table)
    else:
        fn = flex_peer(q, k, v, pk, pq)
        with torch.inference_mode():
            fn()                                               # compile outside the measurement
    seconds, peak, out = measure_forward(fn, repeats)
    return {"row": "flex", "peer": case, "tokens": tokens, "seconds": seconds, "peak_forward_mib": peak,
            "checksum": float(out.double().abs().sum())}


def run_case(args, case) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", case, "--tokens", str(args.tokens),
           "--layers", str(args.layers), "--repeats", str(args.repeats), "--threads", str(args.threads)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        return {"row": "long" if case in ("fastbert", "transformers_eager") else "flex", "peer": case,
                "error": done.stderr.strip().splitlines()[-1][-300:] if done.stderr.strip() else f"rc {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def parity(layers: int, tokens: int) -> float:
    hf, fast = build(layers)
    ids = torch.randint(5, 128000, (1, tokens), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        return (hf(input_ids=ids).last_hidden_state - fast(input_ids=ids).last_hidden_state).abs().max().item()


def attention_parity(tokens: int) -> float:
    """fastbert's disentangled_attention vs the plain reference (one sequence, fp32)."""
    from fastbert.ops import relative_attention as R
    q, k, v, pk, pq = attention_inputs(tokens)
    cu, positions = torch.tensor([0, tokens], dtype=torch.int32), torch.arange(tokens)
    opts = dict(span=256, position_buckets=256, max_relative_positions=512, scale_factor=3)
    with torch.inference_mode():
        return (R.disentangled_attention(q, k, v, cu, tokens, positions, pk, pq, **opts)
                - R.disentangled_attention_ref(q, k, v, cu, tokens, positions, pk, pq, **opts)).abs().max().item()


def _interleaved(fns: dict, repeats: int) -> dict:
    """Median seconds of each callable, calls alternating between them (shared noise), after a warm-up."""
    times = {name: [] for name in fns}
    with torch.inference_mode():
        for fn in fns.values():
            fn()
        for _ in range(repeats):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(t) for name, t in times.items()}


def interleaved_rows(args) -> list:
    """Time ratios from interleaved runs in this process: the long row's models and the attention alone."""
    hf, fast = build(args.layers)
    ids = torch.randint(5, 128000, (1, args.tokens), generator=torch.Generator().manual_seed(1))
    med = _interleaved({"transformers_eager": lambda hf=hf: hf(input_ids=ids),
                        "fastbert": lambda fast=fast: fast(input_ids=ids)},
                       args.repeats + 1)
    rows = [{"row": "long_interleaved", "tokens": args.tokens, "layers": args.layers, "median_seconds": med,
             "speedup_vs_transformers": med["transformers_eager"] / med["fastbert"]}]
    del hf, fast
    from fastbert.ops import relative_attention as R
    q, k, v, pk, pq = attention_inputs(args.tokens)
    cu, positions = torch.tensor([0, args.tokens], dtype=torch.int32), torch.arange(args.tokens)
    flex = flex_peer(q, k, v, pk, pq)
    table = R.deberta_lut(256, 256, 512, q.device)             # built once, as a model holds it
    with torch.inference_mode():
        ours = R.disentangled_attention(q, k, v, cu, args.tokens, positions, pk, pq, span=256, position_buckets=256,
                                        max_relative_positions=512, scale_factor=3, distances=table)
        diff = (flex() - ours).abs().max().item()
    med = _interleaved({"flex_attention": flex, "fastbert_attention": lambda: R.disentangled_attention(
        q, k, v, cu, args.tokens, positions, pk, pq, span=256, position_buckets=256, max_relative_positions=512,
        scale_factor=3, distances=table)}, 2 * args.repeats + 1)
    rows.append({"row": "flex_interleaved", "tokens": args.tokens, "max_abs_diff_vs_fastbert": diff,
                 "median_seconds": med, "speedup_vs_flex": med["flex_attention"] / med["fastbert_attention"]})
    return rows


def padded_batch(spec: str):
    """(lengths, input_ids, attention_mask) of a B x L batch, random lengths in [L/8, L], seed 0."""
    b, n = (int(x) for x in spec.split("x"))
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(n // 8, n + 1, (b,), generator=g)
    ids = torch.randint(5, 128000, (b, n), generator=g)
    return lengths, ids, (torch.arange(n)[None] < lengths[:, None]).long()


def batch_row(args) -> dict:
    """Padded batch, both peers in this process, interleaved; medians."""
    hf, fast = build(args.layers)
    lengths, ids, mask = padded_batch(args.batch)
    real = mask.bool()
    with torch.inference_mode():
        outs = [m(input_ids=ids, attention_mask=mask).last_hidden_state for m in (hf, fast)]   # warm-up
        diff = (outs[0][real] - outs[1][real]).abs().max().item()
        times = {"transformers_eager": [], "fastbert": []}
        for _ in range(3 * args.repeats):
            for name, m in (("transformers_eager", hf), ("fastbert", fast)):
                t0 = time.perf_counter()
                m(input_ids=ids, attention_mask=mask)
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"row": "batch", "batch": args.batch, "lengths": lengths.tolist(), "layers": args.layers,
            "max_abs_diff": diff, "median_seconds": med,
            "speedup_vs_transformers": med["transformers_eager"] / med["fastbert"]}


def train_row(args) -> dict:
    """One training step on the padded batch (sequence classification, 2 labels: forward, backward,
    AdamW), transformers' DeBERTa-v2 vs fastbert.optimize() of an identical copy, interleaved; medians.
    The first step's logits are compared (same weights, dropout 0)."""
    import transformers

    import fastbert
    torch.manual_seed(0)
    config = hf_config(args.layers)
    config.num_labels = 2
    hf = transformers.DebertaV2ForSequenceClassification(config)
    fast = fastbert.optimize(transformers.DebertaV2ForSequenceClassification(config))
    fast.load_state_dict(hf.state_dict(), strict=True)
    lengths, ids, mask = padded_batch(args.batch)
    labels = torch.arange(len(lengths)) % 2
    peers = {"transformers_eager": hf.train(), "fastbert": fast.train()}
    optims = {name: torch.optim.AdamW(m.parameters(), lr=1e-5) for name, m in peers.items()}
    times, first_logits = {name: [] for name in peers}, {}
    for step in range(3 * args.repeats + 1):                    # step 0: the warm-up, not timed
        for name, m in peers.items():
            t0 = time.perf_counter()
            out = m(input_ids=ids, attention_mask=mask, labels=labels)
            out.loss.backward()
            optims[name].step()
            optims[name].zero_grad()
            if step:
                times[name].append(time.perf_counter() - t0)
            else:
                first_logits[name] = out.logits.detach()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"row": "train_batch", "batch": args.batch, "lengths": lengths.tolist(), "layers": args.layers,
            "logits_max_abs_diff": (first_logits["fastbert"] - first_logits["transformers_eager"]).abs().max().item(),
            "median_seconds": med,
            "speedup_vs_transformers": med["transformers_eager"] / med["fastbert"]}


def gpu_rows(args):
    """On CUDA, fp16, one --tokens sequence: forward time (triton.testing.do_bench median) and peak
    allocated memory of fastbert (the Triton kernel) vs transformers eager, compiled FlexAttention on
    the attention alone, and flashdeberta when it is installed. Each row records its error if it fails."""
    import triton

    def timed(fn):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        with torch.inference_mode():
            ms = triton.testing.do_bench(fn, warmup=5, rep=50)
        return {"ms": ms, "peak_mib": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1),
                "gpu": torch.cuda.get_device_name()}

    rows = []
    ids = torch.randint(5, 128000, (1, args.tokens), generator=torch.Generator().manual_seed(1)).cuda()
    try:
        hf, fast = (m.cuda().half() for m in build(args.layers))
        rows.append({"row": "gpu_kernel_vs_transformers", "layers": args.layers, "tokens": args.tokens,
                     "fastbert": timed(lambda: fast(input_ids=ids)),
                     "transformers_eager": timed(lambda: hf(input_ids=ids))})
    except Exception as e:                                       # noqa: BLE001 - recorded in the row
        rows.append({"row": "gpu_kernel_vs_transformers", "error": repr(e)[:300]})
    try:
        from fastbert.ops import relative_attention as R
        q, k, v, pk, pq = (t.cuda().half() for t in attention_inputs(args.tokens))
        cu, positions = torch.tensor([0, args.tokens], dtype=torch.int32).cuda(), torch.arange(args.tokens).cuda()
        table = R.deberta_lut(256, 256, 512, q.device)
        fastbert_fn = (lambda: R.disentangled_attention(q, k, v, cu, args.tokens, positions, pk, pq, span=256,
                                                        position_buckets=256, max_relative_positions=512,
                                                        scale_factor=3, distances=table))
        rows.append({"row": "gpu_flex_attention", "tokens": args.tokens, "fastbert_attention": timed(fastbert_fn),
                     "flex_attention": timed(flex_peer(q, k, v, pk, pq))})
    except Exception as e:                                       # noqa: BLE001
        rows.append({"row": "gpu_flex_attention", "error": repr(e)[:300]})
    try:
        import flashdeberta  # noqa: F401
        rows.append({"row": "gpu_flashdeberta", "skipped": "flashdeberta is installed but not wired here yet"})
    except ImportError:
        rows.append({"row": "gpu_flashdeberta", "skipped": "flashdeberta is not installed"})
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--tokens", type=int, default=2048)
    p.add_argument("--batch", default="8x256")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=RESULTS, help="folder of relative_attention.jsonl (default bench/results/)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.tokens, args.layers, args.repeats, args.threads)))
        return
    import transformers
    torch.set_num_threads(args.threads)
    meta = {"device": "cpu", "cpu": platform.processor() or platform.machine(), "threads": args.threads,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    checks = {"model_max_abs_diff_256_tokens": parity(args.layers, 256),
              "attention_max_abs_diff_vs_reference": attention_parity(args.tokens)}
    print(checks, flush=True)
    rows = [run_case(args, c) for c in ("fastbert", "transformers_eager", "fastbert_attention", "flex_attention")]
    for r in rows:
        print(r, flush=True)
    rows.extend(interleaved_rows(args))
    print(rows[-2], rows[-1], sep="\n", flush=True)
    rows.append(batch_row(args))
    print(rows[-1], flush=True)
    rows.append(train_row(args))
    print(rows[-1], flush=True)
    skipped = []
    if torch.cuda.is_available():
        rows.extend(gpu_rows(args))
        for r in rows[-3:]:
            print(r, flush=True)
    else:
        skipped = [{"row": name, "skipped": "no CUDA GPU on this machine: the Triton kernel (and flashdeberta, a "
                                           "CUDA package) are timed on a GPU only"}
                   for name in ("gpu_kernel_vs_transformers", "gpu_flashdeberta", "gpu_flex_attention")]
        for s in skipped:
            print(s)
    for r in rows:
        r.update(meta)
    by = {(r["row"], r["peer"]): r for r in rows if "peer" in r and "seconds" in r}
    f, h = by.get(("long", "fastbert")), by.get(("long", "transformers_eager"))
    if f and h:
        print(f"\nDeBERTa-v3-base-sized, {args.layers} layer(s), {args.tokens} tokens: fastbert {f['seconds']:.2f} s, "
              f"peak {f['peak_forward_mib']} MiB | transformers eager {h['seconds']:.2f} s, peak "
              f"{h['peak_forward_mib']} MiB | speedup {h['seconds'] / f['seconds']:.2f}x, memory ratio "
              f"{h['peak_forward_mib'] / max(f['peak_forward_mib'], 1e-9):.1f}x")
    fa, fl = by.get(("flex", "fastbert_attention")), by.get(("flex", "flex_attention"))
    if fa and fl:
        print(f"attention alone, {args.tokens} tokens: fastbert {fa['seconds']:.3f} s / {fa['peak_forward_mib']} MiB,"
              f" flex_attention (compiled) {fl['seconds']:.3f} s / {fl['peak_forward_mib']} MiB")
    for r in rows:
        if r["row"] in ("long_interleaved", "flex_interleaved"):
            print(f"{r['row']} (medians, interleaved): {r['median_seconds']}, "
                  f"speedup {r.get('speedup_vs_transformers', r.get('speedup_vs_flex')):.2f}x")
    b = next((r for r in rows if r["row"] == "batch"), None)
    if b:
        print(f"padded batch {b['batch']}: speedup vs transformers {b['speedup_vs_transformers']:.2f}x "
              f"(medians {b['median_seconds']})")
    t = next((r for r in rows if r["row"] == "train_batch"), None)
    if t:
        print(f"training step, padded batch {t['batch']}: speedup vs transformers "
              f"{t['speedup_vs_transformers']:.2f}x (medians {t['median_seconds']}; first-step logits max abs diff "
              f"{t['logits_max_abs_diff']:.1e})")
    path = append_run("relative_attention", rows + skipped, args.out, config=dict(meta, **checks))
    print(f"appended to {path}")


if __name__ == "__main__":
    main()
