"""int8 on CPU: fastbert.quantize'd embeddings against fp32, speed and agreement, in one run.

Workload: the encoder part's English lines (2,000; 500 with quick), batch 32, all-MiniLM-L6-v2.
Rows, timed `repeats` times over the corpus in chunks of 4 batches, every row on a chunk before the
next chunk (lines/s: the median repeat; speedups: the median over every (repeat, chunk) of the ratio
to fastbert fp32 on that chunk, so a noisy stretch of a shared machine hits both sides):
  fastbert Encoder int8            Encoder.from_pretrained(path, quantize="int8")
  fastbert Encoder fp32            the same Encoder without quantize
  sentence-transformers fp32       SentenceTransformer(path).encode
  sentence-transformers + fastbert.quantize   its transformers model through fastbert.quantize
  ONNX Runtime int8 (torch.onnx.export + quantize_dynamic)   the peer sentence-transformers' ONNX
      int8 export builds, built directly: its export_dynamic_quantized_onnx_model needs optimum,
      whose releases pin transformers < 5 (pip resolves optimum[onnxruntime] 2.1 with
      transformers 4.57). The transformers BertModel is exported with torch.onnx.export, quantized
      by onnxruntime.quantization.quantize_dynamic (int8 weights per channel, uint8 activations),
      run by onnxruntime with the checkpoint's tokenizer and mean pooling + normalize; needs the
      "onnx" extra and is skipped with the reason when onnxruntime is absent.
Agreement of each int8 row with fastbert's fp32 embeddings: min cosine over every line, and the
mean top-10 overlap of a retrieval over the corpus (queries: the first half of every 10th line).
The fastbert int8 rows pass at min cosine >= 0.99 and overlap >= 0.9 (issue 17's bars); the peer's
figures are reported as they are.
"""
from __future__ import annotations

import datetime as _dt
import statistics
import time

import torch

from fastbert.benchmarks import env
from fastbert.benchmarks.corpus import pydoc_lines as english_lines
from fastbert.benchmarks.encoder import BATCH_SIZE, FULL_LINES, QUICK_LINES, device_name
from fastbert.benchmarks.peers import INPUT_NAMES, export_onnx

MIN_COSINE, MIN_OVERLAP, TOP_K = 0.99, 0.9, 10
CHUNK_BATCHES = 4  # timing unit: 4 batches of 32 lines, every row in turn
ONNX_ROW = "ONNX Runtime int8 (torch.onnx.export + quantize_dynamic)"
FASTBERT_INT8_ROWS = ("fastbert Encoder int8", "sentence-transformers + fastbert.quantize")


def queries_from(lines: list[str]) -> list[str]:
    """A small query set built from the corpus: the first half of the words of every 10th line."""
    out = []
    for line in lines[::10]:
        words = line.split()
        if len(words) >= 4:
            out.append(" ".join(words[: len(words) // 2]))
    return out


def top_k_overlap(q_ref, c_ref, q, c, k: int = TOP_K) -> float:
    """Mean |top-k(ref) & top-k(candidate)| / k over the queries (cosine similarity, unit vectors)."""
    k = min(k, c_ref.shape[0])
    norm = torch.nn.functional.normalize
    ref = (norm(q_ref.float(), dim=1) @ norm(c_ref.float(), dim=1).T).topk(k, dim=1).indices
    got = (norm(q.float(), dim=1) @ norm(c.float(), dim=1).T).topk(k, dim=1).indices
    return sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(ref, got)) / (k * len(ref))


def _onnx_int8(model_dir, tmp):
    """The ONNX int8 peer (see the module docstring): texts -> normalized mean-pooled embeddings."""
    try:
        import onnxruntime as ort
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as exc:
        raise RuntimeError(f"not available: needs onnxruntime (pip install fastbert[onnx]): {exc}") from exc
    import os

    import numpy as np
    import transformers

    tok = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    model = transformers.AutoModel.from_pretrained(str(model_dir)).eval()
    fp32_path, int8_path = os.path.join(tmp, "model.onnx"), os.path.join(tmp, "model_int8.onnx")
    sample = tok(["an example sentence", "a second"], padding=True, return_tensors="pt")
    export_onnx(model, sample, fp32_path)
    quantize_dynamic(fp32_path, int8_path, weight_type=QuantType.QInt8, per_channel=True)
    session = ort.InferenceSession(int8_path, providers=["CPUExecutionProvider"])

    def encode(texts):
        out = []
        for i in range(0, len(texts), BATCH_SIZE):
            enc = tok(texts[i:i + BATCH_SIZE], padding=True, truncation=True, return_tensors="np")
            feed = {name: enc[name].astype(np.int64) for name in INPUT_NAMES}
            h = torch.from_numpy(session.run(None, feed)[0])
            m = torch.from_numpy(enc["attention_mask"]).unsqueeze(-1).float()
            out.append(torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1), dim=1))
        return torch.cat(out)
    return encode


def run(model_dir, texts=None, quick: bool = False, device: str = "cpu", repeats: int | None = None,
        progress=None, lines: int | None = None, onnx: bool = True) -> list[dict]:
    import tempfile

    import fastbert

    say = progress or (lambda message: None)
    n = lines or (QUICK_LINES if quick else FULL_LINES)
    texts = list(texts[:n]) if texts is not None else english_lines(n)
    queries = queries_from(texts)
    repeats = repeats or (5 if quick else 7)  # medians of interleaved repeats: the machine may be shared
    case = f"{len(texts)} lines, batch {BATCH_SIZE}, {torch.get_num_threads()} threads"
    stamp = {"device": device_name("cpu"), "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(
        timespec="seconds"), "versions": env.versions(("fastbert", "torch", "transformers",
                                                         "sentence-transformers", "onnxruntime"))}
    if device != "cpu":
        return [{"name": "fastbert Encoder int8", "case": case, "ok": None, **stamp,
                 "note": "int8 is a CPU path: run with --device cpu"}]

    def encoder_run(enc):
        return lambda data: enc.encode(data, batch_size=BATCH_SIZE, convert_to_tensor=True)

    runs, errors = {}, {}
    say("loading fastbert.Encoder fp32 and int8")
    runs["fastbert Encoder fp32"] = encoder_run(fastbert.Encoder.from_pretrained(model_dir, device="cpu"))
    try:
        int8 = fastbert.Encoder.from_pretrained(model_dir, device="cpu", quantize="int8")
        int8.encode(texts[:2])
        runs["fastbert Encoder int8"] = encoder_run(int8)
    except AttributeError as exc:  # layers that read nn.Linear weights instead of calling the module
        errors["fastbert Encoder int8"] = (f"not available: this fastbert model's layers read Linear "
                                           f"weights directly ({exc})")
    tmp = tempfile.TemporaryDirectory()
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        SentenceTransformer = None
        for name in ("sentence-transformers fp32", "sentence-transformers + fastbert.quantize"):
            errors[name] = f"not available: {exc}"
    if SentenceTransformer is not None:
        say("loading sentence-transformers")
        st = SentenceTransformer(str(model_dir), device="cpu")
        runs["sentence-transformers fp32"] = lambda data: st.encode(data, batch_size=BATCH_SIZE,
                                                                    convert_to_tensor=True)
        st_q = fastbert.quantize(SentenceTransformer(str(model_dir), device="cpu"), "int8")
        runs["sentence-transformers + fastbert.quantize"] = lambda data: st_q.encode(
            data, batch_size=BATCH_SIZE, convert_to_tensor=True)
    if onnx:
        say("exporting ONNX int8")
        try:
            runs[ONNX_ROW] = _onnx_int8(model_dir, tmp.name)
        except Exception as exc:
            errors[ONNX_ROW] = str(exc) if "not available" in str(exc) else f"{type(exc).__name__}: {exc}"
    else:
        errors[ONNX_ROW] = "skipped in this run (no ONNX export)"

    say("warm-up and agreement")
    corpus = {name: fn(texts).float().cpu() for name, fn in runs.items()}
    asked = {name: fn(queries).float().cpu() for name, fn in runs.items()}
    # every row encodes the same chunk of CHUNK_BATCHES batches back to back, chunk after chunk: the
    # rows of one chunk see the same load, and each chunk gives one ratio per row
    step = CHUNK_BATCHES * BATCH_SIZE
    chunks = [texts[i:i + step] for i in range(0, len(texts), step)]
    times = {name: [] for name in runs}          # seconds per repeat (the whole corpus)
    chunk_times = {name: [] for name in runs}    # seconds per (repeat, chunk)
    for i in range(repeats):
        say(f"timing {i + 1}/{repeats}")
        totals = dict.fromkeys(runs, 0.0)
        for chunk in chunks:
            for name, fn in runs.items():
                start = time.perf_counter()
                fn(chunk)
                took = time.perf_counter() - start
                totals[name] += took
                chunk_times[name].append(took)
        for name in runs:
            times[name].append(totals[name])

    ref = "fastbert Encoder fp32"
    rows = []
    for name in ("fastbert Encoder int8", "fastbert Encoder fp32", "sentence-transformers fp32",
                 "sentence-transformers + fastbert.quantize", ONNX_ROW):
        row = {"name": name, "case": case, "ok": None, **stamp}
        if name in errors:
            row["error" if name == "fastbert Encoder int8" else "note"] = errors[name]
        if name in runs:
            mid = statistics.median(times[name])
            row.update({"lines/s": len(texts) / mid, "seconds": mid, "all_seconds": times[name]})
            if name != ref:
                cos = torch.nn.functional.cosine_similarity(corpus[name], corpus[ref], dim=1)
                overlap = top_k_overlap(asked[ref], corpus[ref], asked[name], corpus[name])
                speedup = statistics.median(r / t for r, t in zip(chunk_times[ref], chunk_times[name]))
                row.update(min_cosine=float(cos.min()), mean_cosine=float(cos.mean()), top10_overlap=overlap,
                           speedup_vs_fastbert_fp32=speedup)
                if name in FASTBERT_INT8_ROWS or name == ONNX_ROW:
                    met = row["min_cosine"] >= MIN_COSINE and overlap >= MIN_OVERLAP
                    if name in FASTBERT_INT8_ROWS:
                        row["ok"] = met
                    row["note"] = (f"{speedup:.2f}x fastbert fp32 (median of {len(chunk_times[name])} interleaved "
                                   f"chunk ratios); min cosine {row['min_cosine']:.4f}, mean {row['mean_cosine']:.4f}, "
                                   f"top-{TOP_K} overlap {overlap:.3f} (bars {MIN_COSINE} / {MIN_OVERLAP}: "
                                   f"{'met' if met else 'NOT met'})")
        rows.append(row)
    tmp.cleanup()
    return rows


def results(section, rows):
    """Table lines: the int8 fastbert Encoder is the fastbert row; everything else is its peer."""
    from fastbert.benchmarks.report import ERROR, FAIL, OK, SKIPPED, Result

    out = []
    for row in rows:
        fast = row["name"] == "fastbert Encoder int8"
        check = SKIPPED if row.get("ok") is None else (OK if row["ok"] else FAIL)
        if fast and row.get("error"):
            check = SKIPPED if str(row["error"]).startswith("not available") else ERROR
        detail = ""
        if row.get("min_cosine") is not None:
            detail = f"min cosine {row['min_cosine']:.4f}, top-{TOP_K} {row['top10_overlap']:.2f}"
        out.append(Result(section, row["name"], row.get("case", ""), row.get("lines/s"), "lines/s",
                          fastbert=fast, check=check, note=str(row.get("error") or row.get("note") or ""),
                          detail=detail))
    return out
