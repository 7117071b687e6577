"""Text to embeddings on the CPU: fastbert against the engines a user would pick, in one run.

Table 1 (`run`, the `fastbert bench` encoder part): real English text, the way a user batches it.
  Workload: `paragraphs()`: CPython's pydoc paragraphs of 5-120 words (longer ones cut into 60-word
  pieces), shuffled with a fixed seed; the first 2,000 (500 with quick) are timed, the rest calibrate
  OpenVINO's NNCF int8 (never timed). Batch 32, every engine sorts by length as its users do
  (fastbert by token count inside Encoder.encode, the others by characters, as sentence-transformers),
  tokenization inside the timed call. Each round's texts carry a tag no earlier call used
  (tokenizer.Rounds), so no whole-text or word cache carries over.
  Engines: fastbert Encoder.encode (fp32, int8), sentence-transformers (torch sdpa) as is and after
  fastbert.optimize, and the peers of fastbert.benchmarks.peers (ONNX Runtime with its BERT
  fusions, OpenVINO, CTranslate2, and their int8 forms), each skipped with its reason when missing.
  Timing: the texts in chunks of 8 batches; in each round every engine encodes each chunk, in a
  Latin-square order per round (tokenizer.round_orders), so load from other processes hits all
  alike. sentences/s: the median over rounds of texts / that round's seconds; "vs fastbert": the
  median over every (round, chunk) of fastbert's seconds / the engine's ("x fastbert": above 1 the
  engine is faster; fp32 rows against fastbert fp32, int8 rows against fastbert int8).
  GEMM rate: the machine's sustained fp32 torch.mm rate on this model's four GEMM shapes (1,024
  tokens) with the same threads, measured in every round; an engine's "% GEMM" is its useful
  GFLOP/s (the model's FLOPs on real tokens: GEMMs and attention, no padding) over that rate.
  Batch 1: one short text (5-12 words) per call, every engine on the same text in turn; p50 ms.
  Agreement: min cosine of every text's vector to sentence-transformers' fp32 (fastbert fp32's
  without it); int8 rows also give fastbert's batch independence (a text alone vs in a batch).
Table 2 (`run_lines`): the older workload, 2,000 short pydoc lines (many one or two words beside
  long ones: more padding per batch), fastbert against sentence-transformers only.
"""
from __future__ import annotations

import datetime as _dt
import itertools
import os
import time

import torch

from fastbert.benchmarks import env
from fastbert.benchmarks.corpus import pydoc_lines
from fastbert.benchmarks.tokenizer import Rounds, round_orders

FULL_LINES, QUICK_LINES = 2000, 500
BATCH_SIZE = 32


def device_name(device: str) -> str:
    if device == "cuda":
        return f"cuda: {torch.cuda.get_device_name(0)}"
    return f"cpu: {env.cpu_model()} ({os.cpu_count()} cores, {torch.get_num_threads()} torch threads)"


def versions() -> dict:
    return env.versions(("fastbert", "torch", "transformers", "sentence-transformers"))


def run_lines(model_dir, texts=None, quick: bool = False, device: str = "cpu", dtype: str = "float32",
        repeats: int | None = None, progress=None, lines: int | None = None) -> list[dict]:
    """One row per implementation: lines/s (best of `repeats`), and for fastbert the output check.

    Peers: sentence-transformers as it is, and the same SentenceTransformer after fastbert.optimize
    (its own tokenizer and character-length batching, fastbert's encoder). texts: the lines to
    embed (default corpus.pydoc_lines()); lines: how many (default 2,000; 500 with quick)."""
    import fastbert

    n = lines or (QUICK_LINES if quick else FULL_LINES)  # lines: a smaller workload (CLI smoke tests)
    texts = list(texts[:n]) if texts is not None else pydoc_lines(n)
    repeats = repeats or (2 if quick else 3)
    torch_dtype = getattr(torch, dtype)
    say = progress or (lambda message: None)
    case = f"{len(texts)} lines, batch {BATCH_SIZE}, {dtype}, {torch.get_num_threads()} threads"
    stamp = {"device": device_name(device), "versions": versions(),
             "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}

    say("loading fastbert.Encoder")
    encoder = fastbert.Encoder.from_pretrained(model_dir, device=device, dtype=torch_dtype)
    runs = {"fastbert Encoder.encode":
            lambda lines: encoder.encode(lines, batch_size=BATCH_SIZE, convert_to_tensor=True)}
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        SentenceTransformer = None
    if SentenceTransformer is not None:
        say("loading sentence-transformers")
        plain = SentenceTransformer(str(model_dir), device=device).to(torch_dtype)
        optimized = fastbert.optimize(SentenceTransformer(str(model_dir), device=device).to(torch_dtype))
        runs = {"sentence-transformers encode":
                lambda lines: plain.encode(lines, batch_size=BATCH_SIZE, convert_to_tensor=True),
                "sentence-transformers + fastbert.optimize":
                lambda lines: optimized.encode(lines, batch_size=BATCH_SIZE, convert_to_tensor=True),
                **runs}

    models = [encoder] + ([plain, optimized] if SentenceTransformer is not None else [])

    def clear_caches():  # the tokenizers that cache words (fastbert's): nothing kept from a round
        for model in models:
            clear = getattr(getattr(model, "tokenizer", None), "clear_cache", None)
            if clear is not None:
                clear()

    rounds = Rounds(texts, itertools.count(1))  # round r: the same lines for all, new to every tokenizer
    say("warm-up and output check")
    outputs = {name: fn(rounds(0)).float() for name, fn in runs.items()}
    times = {name: [] for name in runs}
    for i in range(1, repeats + 1):                    # interleaved: outside load hits all alike
        say(f"timing {i}/{repeats}")
        lines_i = rounds(i)
        for name, fn in runs.items():
            clear_caches()
            start = time.perf_counter()
            fn(lines_i)
            times[name].append(time.perf_counter() - start)

    ref_name = "sentence-transformers encode"
    ref = outputs.get(ref_name)
    threshold = 0.99999 if torch_dtype == torch.float32 else 0.999
    rows = []
    for name in runs:
        best = min(times[name])
        row = {"name": name, "case": case, "lines/s": len(texts) / best, "seconds": best,
               "all_seconds": times[name], "ok": None, **stamp}
        if ref is None:
            row["note"] = "sentence-transformers not installed: no reference to check against"
        elif name != ref_name:
            cosine = torch.nn.functional.cosine_similarity(outputs[name], ref.to(outputs[name].device), dim=1)
            speedup = min(times[ref_name]) / best
            row.update(speedup=speedup, min_cosine=float(cosine.min()), ok=float(cosine.min()) >= threshold,
                       note=f"{speedup:.2f}x sentence-transformers, min cosine {float(cosine.min()):.6f}")
        rows.append(row)
    return rows


# ---- table 1: real text, sorted batches, every engine ------------------------------------------------

CHUNK = 8 * BATCH_SIZE          # texts per timing unit
PIECE_WORDS, MIN_WORDS, MAX_WORDS = 60, 5, 120
BATCH1_CALLS, QUICK_BATCH1_CALLS = 40, 16
FASTBERT_FP32, FASTBERT_INT8 = "fastbert Encoder.encode", "fastbert Encoder.encode int8"
ST_PLAIN, ST_OPTIMIZED = "sentence-transformers (torch sdpa)", "sentence-transformers + fastbert.optimize"


def paragraphs(seed: int = 0) -> list[str]:
    """English paragraphs of MIN_WORDS-MAX_WORDS words (longer ones cut into PIECE_WORDS-word pieces),
    in a fixed shuffled order so that every slice mixes topics."""
    import random

    from fastbert.benchmarks.corpus import english_lines

    out = []
    for text in english_lines():
        words = text.split()
        pieces = [words] if len(words) <= MAX_WORDS else [words[s:s + PIECE_WORDS]
                                                          for s in range(0, len(words), PIECE_WORDS)]
        out += [" ".join(p) for p in pieces if len(p) >= MIN_WORDS]
    random.Random(seed).shuffle(out)
    return out


def gemm_shapes(config, tokens: int = 1024) -> list[tuple[int, int, int]]:
    """(m, k, n) of one layer's GEMMs: QKV, attention output, FFN in, FFN out."""
    h, i = config.hidden_size, config.intermediate_size
    return [(tokens, h, 3 * h), (tokens, h, h), (tokens, h, i), (tokens, i, h)]


def gemm_rate(shapes, repeats: int = 5) -> float:
    """Sustained fp32 torch.mm GFLOP/s over `shapes` (the current torch threads): median of repeats."""
    mats = [(torch.randn(m, k), torch.randn(k, n)) for m, k, n in shapes]
    flops = sum(2 * m * k * n for m, k, n in shapes)
    for a, b in mats:
        torch.mm(a, b)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(3):
            for a, b in mats:
                torch.mm(a, b)
        rates.append(3 * flops / (time.perf_counter() - start) / 1e9)
    return sorted(rates)[len(rates) // 2]


def useful_flops(token_counts, config) -> float:
    """FLOPs of the encoder on real tokens only: per layer 2n(4h^2 + 2hi) for the GEMMs and 4n^2 h for
    attention's two products (embeddings, LayerNorm and GELU are not counted)."""
    h, i, layers = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    return float(sum(layers * (2 * n * (4 * h * h + 2 * h * i) + 4 * n * n * h) for n in token_counts))


def _median(values):
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else 0.5 * (values[mid - 1] + values[mid])


def batch_independence(encoder, texts: list[str]) -> dict:
    """A text's vector alone against the same text inside a batch of all of `texts`."""
    together = encoder.encode(texts, batch_size=len(texts), convert_to_tensor=True)
    alone = torch.stack([encoder.encode([t], convert_to_tensor=True)[0] for t in texts])
    cos = torch.nn.functional.cosine_similarity(alone, together, dim=1)
    return {"alone_vs_batched_min_cosine": float(cos.min()),
            "alone_vs_batched_max_abs": float((alone - together).abs().max())}


def run(model_dir, texts=None, quick: bool = False, device: str = "cpu", dtype: str = "float32",
        repeats: int | None = None, progress=None, lines: int | None = None, peers: bool = True,
        int8: bool = True, workdir=None, smoke: bool = False) -> list[dict]:
    """Table 1 (see the module docstring): one row per engine, plus a "machine" row (GEMM rate).
    smoke: the code paths only (no peers: building them takes minutes)."""
    import tempfile

    import transformers

    import fastbert
    from fastbert.benchmarks import peers as peer_lib
    from fastbert.encoder import read_sentence_config

    say = progress or (lambda message: None)
    threads = torch.get_num_threads()
    n = lines or (QUICK_LINES if quick else FULL_LINES)
    pool = paragraphs() if texts is None else list(texts)
    texts, calibration = pool[:n], pool[n:][:300]
    repeats = repeats or (2 if quick else 3)
    case = f"{len(texts)} English paragraphs ({MIN_WORDS}-{MAX_WORDS} words), batch {BATCH_SIZE} sorted, " \
           f"{threads} threads"
    stamp = {"device": device_name(device), "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), "versions": env.versions(("fastbert", "torch", "transformers", "sentence-transformers",
                                                       "onnxruntime", "openvino", "nncf", "ctranslate2"))}
    config = transformers.AutoConfig.from_pretrained(str(read_sentence_config(model_dir)["model_dir"]))
    engines, precision, notes, absent = {}, {}, {}, {}

    def add(name, fn, kind, note=""):
        engines[name], precision[name], notes[name] = fn, kind, note

    say("loading fastbert.Encoder")
    encoder = fastbert.Encoder.from_pretrained(model_dir, device=device, dtype=getattr(torch, dtype))
    add(FASTBERT_FP32, lambda x: encoder.encode(x, batch_size=BATCH_SIZE, convert_to_tensor=True), "fp32")
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        absent[ST_PLAIN] = absent[ST_OPTIMIZED] = f"sentence-transformers is not installed: {exc}"
    else:
        say("loading sentence-transformers")
        plain = SentenceTransformer(str(model_dir), device=device)
        optimized = fastbert.optimize(SentenceTransformer(str(model_dir), device=device))
        add(ST_PLAIN, lambda x: plain.encode(x, batch_size=BATCH_SIZE, convert_to_tensor=True), "fp32")
        add(ST_OPTIMIZED, lambda x: optimized.encode(x, batch_size=BATCH_SIZE, convert_to_tensor=True), "fp32")
    on_cpu = device == "cpu" and dtype == "float32"
    int8_encoder = None
    if int8 and on_cpu:
        int8_encoder = fastbert.Encoder.from_pretrained(model_dir, device="cpu", quantize="int8")
        add(FASTBERT_INT8, lambda x: int8_encoder.encode(x, batch_size=BATCH_SIZE, convert_to_tensor=True), "int8")
    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    if peers and on_cpu and not smoke:
        built, missing = peer_lib.build(model_dir, workdir or tmp.name, threads, BATCH_SIZE, calibration,
                                        ("fp32", "int8") if int8 else ("fp32",), say)
        absent.update(missing)
        for peer in built:
            add(peer.name, peer.encode, peer.precision, peer.note)
    elif peers and not smoke:
        absent["peers"] = "the peers run on the CPU in float32 only"
    if smoke and peers:
        absent["peers"] = "not built in a smoke run"

    models = [m for m in (encoder, int8_encoder) if m is not None]

    def clear_caches():  # fastbert's tokenizer caches words: nothing kept from a round
        for model in models:
            clear = getattr(model.tokenizer, "clear_cache", None)
            if clear is not None:
                clear()

    tags = itertools.count(1)
    rounds = Rounds(texts, tags)
    say("warm-up and agreement")
    outputs = {name: fn(rounds(0)).float().cpu() for name, fn in engines.items()}
    ref_name = ST_PLAIN if ST_PLAIN in outputs else FASTBERT_FP32
    token_counts = [len(ids) for ids in encoder._tokenize(texts)]
    flops = useful_flops(token_counts, config)
    shapes = gemm_shapes(config)

    names = list(engines)
    seconds = {name: [] for name in names}                   # per round, all chunks
    chunk_seconds = {name: [] for name in names}             # per (round, chunk)
    rates = []
    for r, order in enumerate(round_orders(names, repeats), start=1):
        say(f"timing round {r}/{repeats}")
        rates.append(gemm_rate(shapes))
        lines_r = rounds(r)
        totals = dict.fromkeys(names, 0.0)
        for c in range(0, len(lines_r), CHUNK):
            chunk = lines_r[c:c + CHUNK]
            for name in order:
                clear_caches()
                start = time.perf_counter()
                engines[name](chunk)
                took = time.perf_counter() - start
                totals[name] += took
                chunk_seconds[name].append(took)
        for name in names:
            seconds[name].append(totals[name])
    rate = _median(rates)

    say("batch-1 latency")
    short = [t for t in pool if len(t.split()) <= 12][:QUICK_BATCH1_CALLS if quick else BATCH1_CALLS]
    latency = {name: [] for name in names}
    for i, text in enumerate(unseen_each(short, tags)):
        for name in names[i % len(names):] + names[:i % len(names)]:
            start = time.perf_counter()
            engines[name]([text])
            latency[name].append(time.perf_counter() - start)

    independence = batch_independence(int8_encoder, texts[:16]) if int8_encoder is not None else None
    base = {"fp32": FASTBERT_FP32, "int8": FASTBERT_INT8}
    rows = [{"name": "machine: sustained fp32 GEMM rate", "case": case, "GFLOP/s": rate,
             "all_GFLOP/s": rates, "ok": None, "note": f"torch.mm on {shapes}, {threads} threads", **stamp}]
    for name in names:
        mid = _median(seconds[name])
        cos = torch.nn.functional.cosine_similarity(outputs[name], outputs[ref_name], dim=1)
        ref = base[precision[name]]
        ratio = _median([a / b for a, b in zip(chunk_seconds[ref], chunk_seconds[name])]) if ref in engines else None
        row = {"name": name, "case": case, "precision": precision[name], "sentences/s": len(texts) / mid,
               "lines/s": len(texts) / mid, "seconds": mid, "all_seconds": seconds[name],
               "x fastbert": ratio,     # the engine's speed over fastbert's (same precision)
               "useful GFLOP/s": flops / mid / 1e9, "GEMM fraction": flops / mid / 1e9 / rate,
               "batch1 p50 ms": 1e3 * _median(latency[name]), "min_cosine": float(cos.min()),
               "reference": ref_name, "ok": None, "note": notes[name], **stamp}
        if name in (FASTBERT_FP32, ST_OPTIMIZED):   # fastbert's fp32 outputs, checked against the reference
            row["ok"] = row["min_cosine"] >= 0.99999
        if name == FASTBERT_INT8:
            row.update(independence)
            row["ok"] = row["min_cosine"] >= 0.99 and independence["alone_vs_batched_min_cosine"] >= 0.99999
        rows.append(row)
    for name, why in absent.items():
        rows.append({"name": name, "case": case, "ok": None, "note": f"skipped: {why}", **stamp})
    if tmp is not None:
        tmp.cleanup()
    return rows


def unseen_each(texts: list[str], tags) -> list[str]:
    """Each text under its own new tag: no call finds a text (or its first word) cached."""
    return [f"{next(tags)} {t}" for t in texts]
