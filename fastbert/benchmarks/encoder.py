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
  Timing: every engine runs in a process of its own (EngineProcess: spawned, built there alone, as
  its users run it; in one process, the others' thread pools and allocations beside it cost
  CTranslate2 int8 0.6x its speed alone, ONNX Runtime 0.9x). The texts in chunks of 8 batches; in
  each round every engine encodes each chunk, one engine at a time, in a Latin-square order per round
  (tokenizer.round_orders), so load from other processes hits all alike; the seconds are the child's
  own, around its encode call. sentences/s: the median over rounds of texts / that round's seconds; "vs fastbert": the
  median over every (round, chunk) of fastbert's seconds / the engine's ("x fastbert": above 1 the
  engine is faster; fp32 rows against fastbert fp32, int8 rows against fastbert int8).
  GEMM rate: the machine's sustained fp32 torch.mm rate on this model's four GEMM shapes (1,024
  tokens) with the same threads, measured in every round; an engine's "% GEMM" is its useful
  GFLOP/s (the model's FLOPs on real tokens: GEMMs and attention, no padding) over that rate.
  Batch 1 (batch1_latency; run_batch1 for this block alone): one short text (5-12 words) per call
  (`encode([text])`, tokenization included), the way a user runs it, in the same engine processes.
  Every engine encodes the same BATCH1_WARMUP texts untimed, then the same BATCH1_CALLS texts, each
  under a new tag, in interleaved rounds: in each round every engine, in that round's Latin-square
  order, takes the round's slice of BATCH1_SLICE texts, after BATCH1_SETTLE seconds of quiet (the
  engine before it has stopped spinning: OpenMP and TBB pools spin after each op, OpenMP's default
  up to 200 ms) and BATCH1_LEAD untimed calls (its caches refilled after the others: the first calls
  after a switch ran up to 1.6x the median). p50 and p99 ms over all
  the calls; "b1 x fastbert": the median over rounds of fastbert's slice p50 / the engine's (above
  1 the engine is faster), so load from other processes hits every engine alike.
  Agreement: min cosine of every text's vector to sentence-transformers' fp32 (fastbert fp32's
  without it); int8 rows also give fastbert's batch independence (a text alone vs in a batch).
Table 2 (`run_lines`): the older workload, 2,000 short pydoc lines (many one or two words beside
  long ones: more padding per batch), fastbert against sentence-transformers only.
"""
from __future__ import annotations

import dataclasses
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
BATCH1_CALLS, QUICK_BATCH1_CALLS, BATCH1_WARMUP, BATCH1_MAX_WORDS = 200, 80, 10, 12
# per engine per round: BATCH1_LEAD untimed calls, then BATCH1_SLICE timed; BATCH1_SETTLE seconds of quiet before
BATCH1_SLICE, BATCH1_LEAD, BATCH1_SETTLE = 40, 3, 0.25
FASTBERT_FP32, FASTBERT_INT8 = "fastbert Encoder.encode", "fastbert Encoder.encode int8"
ST_PLAIN, ST_OPTIMIZED = "sentence-transformers (torch sdpa)", "sentence-transformers + fastbert.optimize"
PEERS = ("ONNX Runtime", "OpenVINO", "CTranslate2")   # fastbert.benchmarks.peers; their int8 forms add " int8"


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


def _quantile(values, q: float) -> float:
    """The q-quantile of values, interpolated between the two nearest ranks."""
    values = sorted(values)
    at = q * (len(values) - 1)
    low = int(at)
    high = min(low + 1, len(values) - 1)
    return values[low] + (at - low) * (values[high] - values[low])


def batch1_texts(pool, tags, calls: int) -> tuple[list, list]:
    """(timed, untimed) texts for batch 1: the pool's texts of at most BATCH1_MAX_WORDS words, each
    under a new tag (unseen_each); untimed: BATCH1_WARMUP to warm up with, then BATCH1_LEAD to lead each
    round's slice of BATCH1_SLICE timed texts."""
    short = [t for t in pool if len(t.split()) <= BATCH1_MAX_WORDS]
    untimed = BATCH1_WARMUP + BATCH1_LEAD * -(-calls // BATCH1_SLICE)
    if len(short) < calls + untimed:
        raise ValueError(f"batch 1 needs {calls + untimed} texts of at most {BATCH1_MAX_WORDS} words; "
                         f"the pool has {len(short)}")
    return unseen_each(short[:calls], tags), unseen_each(short[calls:calls + untimed], tags)


def run_batch1(model_dir, names=(FASTBERT_FP32, *PEERS), quick: bool = False,
               calls: int | None = None, progress=None) -> list[dict]:
    """The batch-1 block of table 1 alone (CPU, fp32 or int8 names, the current torch threads): one
    row per engine with its p50 and p99 ms and its interleaved ratio to fastbert; an engine that cannot
    be built gets its reason instead."""
    import tempfile

    say = progress or (lambda message: None)
    threads = torch.get_num_threads()
    calls = calls or (QUICK_BATCH1_CALLS if quick else BATCH1_CALLS)
    pool = paragraphs()
    texts, untimed = batch1_texts(pool, itertools.count(1), calls)         # the texts run() times
    options = dict(device="cpu", dtype="float32", peers=True, int8=any("int8" in n for n in names), smoke=False,
                   calibration=pool[FULL_LINES:][:300])
    engines, absent = {}, {}
    with tempfile.TemporaryDirectory() as workdir:
        try:
            start_engines(names, model_dir, threads, {**options, "workdir": workdir}, engines, absent, say)
            latency = batch1_latency(engines, texts, untimed, say)
        finally:
            for engine in engines.values():
                engine.close()
    case = f"one English text ({MIN_WORDS}-{BATCH1_MAX_WORDS} words) per call, {len(texts)} calls, {threads} threads"
    base = {name: FASTBERT_INT8 if "int8" in name else FASTBERT_FP32 for name in names}
    return [{"name": name, "case": case, "threads": threads, "ok": None,
             **(_batch1_columns(latency[name], latency.get(base[name])) if name in latency
                else _batch1_columns(absent[name]))} for name in names]


def _batch1_columns(rounds, reference=None) -> dict:
    """rounds: an engine's seconds per timed call, by round (or why it could not be built); reference:
    its fastbert's, for "batch1 x fastbert"."""
    if not isinstance(rounds, list):
        return {"batch1 p50 ms": None, "batch1 p99 ms": None, "batch1 x fastbert": None, "batch1 note": rounds}
    calls = [s for one in rounds for s in one]
    ratio = None if reference is None else _median([_median(f) / _median(e) for f, e in zip(reference, rounds)])
    return {"batch1 p50 ms": 1e3 * _median(calls), "batch1 p99 ms": 1e3 * _quantile(calls, 0.99),
            "batch1 x fastbert": ratio}


def batch1_latency(engines: dict, texts: list, untimed: list, say=lambda message: None) -> dict:
    """{engine name: the seconds of each timed call encode([text]), by round} for the EngineProcesses
    `engines`, interleaved as the module docstring's Batch 1 says; texts and untimed from batch1_texts."""
    names = list(engines)
    slices = [texts[i:i + BATCH1_SLICE] for i in range(0, len(texts), BATCH1_SLICE)]
    warmup, leads = untimed[:BATCH1_WARMUP], untimed[BATCH1_WARMUP:]
    if len(leads) < BATCH1_LEAD * len(slices):
        raise ValueError(f"batch 1 needs {BATCH1_WARMUP + BATCH1_LEAD * len(slices)} untimed texts, got "
                         f"{len(untimed)}")
    for name in names:
        say(f"batch-1 latency: warming up {name}")
        engines[name].each(warmup, clear=True)
    out = {name: [] for name in names}
    for r, (order, timed) in enumerate(zip(round_orders(names, len(slices)), slices)):
        say(f"batch-1 latency: round {r + 1}/{len(slices)}")
        for name in order:
            time.sleep(BATCH1_SETTLE)
            lead = leads[BATCH1_LEAD * r:BATCH1_LEAD * (r + 1)]
            out[name].append(engines[name].each([*lead, *timed])[len(lead):])
    return out


class EngineProcess:
    """One engine of table 1 built and run in a spawned process of its own (build_engines(**options),
    that name only), as its users run it: no other engine's thread pools (OpenMP, TBB: they spin after
    each op), allocator or caches beside it. `absent` is why it could not be built (None: it was);
    calling it with texts gives (the child's seconds around its encode, the vectors or None)."""

    BUILD_TIMEOUT, CALL_TIMEOUT = 1800.0, 900.0     # seconds: a child that hangs is an error, not a hang

    def __init__(self, name: str, model_dir, threads: int, options: dict):
        import multiprocessing

        self.name = name
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_engine_child, args=(child, name, str(model_dir), threads, options),
                                        daemon=True)
        self._process.start()
        child.close()
        kind, *rest = self._receive(self.BUILD_TIMEOUT, "building it")
        self.absent = rest[0] if kind == "absent" else None
        self.precision, self.note = (rest if kind == "ready" else (None, ""))
        if self.absent is not None:
            self.close()

    def __call__(self, texts: list, keep: bool = True):
        self._conn.send(("batch", list(texts), keep))
        kind, *rest = self._receive(self.CALL_TIMEOUT, "encoding")
        seconds, vectors = rest
        return seconds, None if vectors is None else torch.from_numpy(vectors)

    def each(self, texts: list, clear: bool = False) -> list:
        """The child's seconds around encode([text]) for each text in turn (batch 1); clear: its
        tokenizers' caches first."""
        self._conn.send(("each", list(texts), clear))
        return self._receive(self.CALL_TIMEOUT, "encoding one text per call")[1]

    def _receive(self, timeout: float, doing: str):
        if not self._conn.poll(timeout):
            self.close()
            raise RuntimeError(f"{self.name}'s process did not answer within {timeout:.0f} s while {doing}")
        try:
            message = self._conn.recv()
        except EOFError:
            raise RuntimeError(f"{self.name}'s process ended while {doing} (exit code "
                               f"{self._process.exitcode})") from None
        if message[0] == "error":
            self.close()
            raise RuntimeError(f"{self.name} failed while {doing}:\n{message[1]}")
        return message

    def close(self) -> None:
        if self._process.is_alive():
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
        self._conn.close()


def start_engines(names, model_dir, threads: int, options: dict, engines: dict, absent: dict, say) -> None:
    """An EngineProcess for each name, one at a time (the builds share workdir's conversions), into
    engines, or why it could not be built into absent; the caller closes them (engines is filled as
    they start, so a failed build leaves the others to close)."""
    for name in names:
        say(f"building {name} in its own process")
        engine = EngineProcess(name, model_dir, threads, options)
        if engine.absent is None:
            engines[name] = engine
        else:
            absent[name] = engine.absent


def _engine_child(conn, name, model_dir, threads, options):
    import traceback

    torch.set_num_threads(threads)
    try:
        built = build_engines(model_dir, threads=threads, only={name}, **options)
    except Exception:
        conn.send(("error", traceback.format_exc()))
        return
    if name not in built.engines:
        conn.send(("absent", built.absent.get(name, "not built here")))
        return
    conn.send(("ready", built.precision[name], built.notes.get(name, "")))
    encode = built.engines[name]
    clears = [clear for enc in built.encoders.values() if (clear := getattr(enc.tokenizer, "clear_cache", None))]
    while (message := conn.recv()) is not None:
        kind, texts, option = message    # option: "batch": keep the vectors; "each": clear the caches first
        if kind == "batch" or option:    # fastbert's tokenizer caches words: nothing kept from a batch call
            for clear in clears:
                clear()
        try:
            if kind == "each":
                conn.send(("done", _seconds_each(encode, texts)))
                continue
            start = time.perf_counter()
            out = encode(texts)
            seconds = time.perf_counter() - start
        except Exception:
            conn.send(("error", traceback.format_exc()))
            return
        conn.send(("done", seconds, out.float().cpu().numpy() if option else None))


def _seconds_each(encode, texts: list) -> list:
    seconds = []
    for text in texts:
        start = time.perf_counter()
        encode([text])
        seconds.append(time.perf_counter() - start)
    return seconds


def engine_names(device: str, dtype: str, peers: bool, int8: bool, smoke: bool) -> tuple[list, dict]:
    """Table 1's engine names in their order, and {what is left out: why}."""
    on_cpu = device == "cpu" and dtype == "float32"
    names = [FASTBERT_FP32, ST_PLAIN, ST_OPTIMIZED] + ([FASTBERT_INT8] if int8 and on_cpu else [])
    absent = {}
    if peers and smoke:
        absent["peers"] = "not built in a smoke run"
    elif peers and not on_cpu:
        absent["peers"] = "the peers run on the CPU in float32 only"
    elif peers:
        names += list(PEERS) + ([f"{peer} int8" for peer in PEERS] if int8 else [])
    return names, absent


def batch_independence(encoder, texts: list[str]) -> dict:
    """A text's vector alone against the same text inside a batch of all of `texts`."""
    together = encoder.encode(texts, batch_size=len(texts), convert_to_tensor=True)
    alone = torch.stack([encoder.encode([t], convert_to_tensor=True)[0] for t in texts])
    cos = torch.nn.functional.cosine_similarity(alone, together, dim=1)
    return {"alone_vs_batched_min_cosine": float(cos.min()),
            "alone_vs_batched_max_abs": float((alone - together).abs().max())}


@dataclasses.dataclass
class Engines:
    """Table 1's engines by name: texts -> (len, dim) tensor, "fp32" or "int8", a note; the absent ones
    with why; fastbert's Encoders by engine name (their tokenizers cache words)."""
    engines: dict = dataclasses.field(default_factory=dict)
    precision: dict = dataclasses.field(default_factory=dict)
    notes: dict = dataclasses.field(default_factory=dict)
    absent: dict = dataclasses.field(default_factory=dict)
    encoders: dict = dataclasses.field(default_factory=dict)

    def add(self, name, fn, kind, note=""):
        self.engines[name], self.precision[name], self.notes[name] = fn, kind, note


def build_engines(model_dir, device: str, dtype: str, threads: int, peers: bool, int8: bool, smoke: bool,
                  workdir, calibration: list, say=lambda message: None, only=None) -> Engines:
    """Every engine of table 1 that can run here (only: just these names; a batch-1 child builds
    its own engine alone)."""
    import fastbert
    from fastbert.benchmarks import peers as peer_lib

    out = Engines()
    wanted = (lambda name: True) if only is None else (lambda name: name in only)

    def encoder_engine(name, kind, **options):
        say(f"loading {name}")
        enc = out.encoders[name] = fastbert.Encoder.from_pretrained(model_dir, **options)
        out.add(name, lambda x: enc.encode(x, batch_size=BATCH_SIZE, convert_to_tensor=True), kind)

    if wanted(FASTBERT_FP32):
        encoder_engine(FASTBERT_FP32, "fp32", device=device, dtype=getattr(torch, dtype))
    if wanted(ST_PLAIN) or wanted(ST_OPTIMIZED):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            out.absent[ST_PLAIN] = out.absent[ST_OPTIMIZED] = f"sentence-transformers is not installed: {exc}"
        else:
            say("loading sentence-transformers")
            for name, wrap in ((ST_PLAIN, lambda m: m), (ST_OPTIMIZED, fastbert.optimize)):
                if wanted(name):
                    model = wrap(SentenceTransformer(str(model_dir), device=device))
                    out.add(name, lambda x, m=model: m.encode(x, batch_size=BATCH_SIZE, convert_to_tensor=True),
                            "fp32")
    on_cpu = device == "cpu" and dtype == "float32"
    if int8 and on_cpu and wanted(FASTBERT_INT8):
        encoder_engine(FASTBERT_INT8, "int8", device="cpu", quantize="int8")
    if peers and on_cpu and not smoke:
        built, missing = peer_lib.build(model_dir, workdir, threads, BATCH_SIZE, calibration,
                                        ("fp32", "int8") if int8 else ("fp32",), say, names=only)
        out.absent.update(missing)
        for peer in built:
            out.add(peer.name, peer.encode, peer.precision, peer.note)
    elif peers and not smoke:
        out.absent["peers"] = "the peers run on the CPU in float32 only"
    if smoke and peers:
        out.absent["peers"] = "not built in a smoke run"
    return out


def run(model_dir, texts=None, quick: bool = False, device: str = "cpu", dtype: str = "float32",
        repeats: int | None = None, progress=None, lines: int | None = None, peers: bool = True,
        int8: bool = True, workdir=None, smoke: bool = False) -> list[dict]:
    """Table 1 (see the module docstring): one row per engine, plus a "machine" row (GEMM rate).
    smoke: the code paths only (no peers: building them takes minutes)."""
    import tempfile

    import transformers

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
    tmp = tempfile.TemporaryDirectory() if workdir is None else None
    workdir = workdir or tmp.name
    options = dict(device=device, dtype=dtype, peers=peers, int8=int8, smoke=smoke, workdir=str(workdir),
                   calibration=calibration)
    candidates, absent = engine_names(device, dtype, peers, int8, smoke)
    engines = {}
    try:
        start_engines(candidates, model_dir, threads, options, engines, absent, say)
        precision = {name: e.precision for name, e in engines.items()}
        notes = {name: e.note for name, e in engines.items()}
        tags = itertools.count(1)
        rounds = Rounds(texts, tags)
        say("warm-up and agreement")
        outputs = {name: engine(rounds(0))[1] for name, engine in engines.items()}
        ref_name = ST_PLAIN if ST_PLAIN in outputs else FASTBERT_FP32
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
                    took, _ = engines[name](chunk, keep=False)
                    totals[name] += took
                    chunk_seconds[name].append(took)
            for name in names:
                seconds[name].append(totals[name])
        texts1, untimed1 = batch1_texts(pool, tags, QUICK_BATCH1_CALLS if quick else BATCH1_CALLS)
        latency = batch1_latency(engines, texts1, untimed1, say)
    finally:
        for engine in engines.values():
            engine.close()
    rate = _median(rates)
    import fastbert

    encoder = fastbert.Encoder.from_pretrained(model_dir, device=device, dtype=getattr(torch, dtype))
    token_counts = [len(ids) for ids in encoder._tokenize(texts)]
    flops = useful_flops(token_counts, config)
    del encoder

    independence = None
    if FASTBERT_INT8 in engines:
        independence = batch_independence(fastbert.Encoder.from_pretrained(model_dir, device="cpu", quantize="int8"),
                                          texts[:16])
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
               **_batch1_columns(latency[name], latency.get(ref)), "min_cosine": float(cos.min()),
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
