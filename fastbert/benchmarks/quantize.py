"""int8 on CPU: fastbert.quantize'd embeddings against fp32, speed and agreement, in one run.

Workload: the encoder part's English lines (2,000; 500 with quick), batch 32, all-MiniLM-L6-v2.
Rows, each timed `repeats` times interleaved (best counts):
  fastbert Encoder int8            Encoder.from_pretrained(path, quantize="int8")
  fastbert Encoder fp32            the same Encoder without quantize
  sentence-transformers fp32       SentenceTransformer(path).encode
  sentence-transformers + fastbert.quantize   its transformers model through fastbert.quantize
  sentence-transformers ONNX int8  export_dynamic_quantized_onnx_model("avx2"), when it can run
Agreement of each int8 row with fastbert's fp32 embeddings: min cosine over every line, and the
mean top-10 overlap of a retrieval over the corpus (queries: the first half of every 10th line).
The check passes at min cosine >= 0.95 and overlap >= 0.85 (a broken quantization fails); the
targets for int8, min cosine >= 0.99 and overlap >= 0.9, are reported beside it as met or not.
"""
from __future__ import annotations

import datetime as _dt
import time

import torch

from fastbert.benchmarks import env
from fastbert.benchmarks.corpus import pydoc_lines as english_lines
from fastbert.benchmarks.encoder import BATCH_SIZE, FULL_LINES, QUICK_LINES, device_name

CHECK_COSINE, TARGET_COSINE, CHECK_OVERLAP, TARGET_OVERLAP, TOP_K = 0.95, 0.99, 0.85, 0.9, 10
INT8_ROWS = ("fastbert Encoder int8", "sentence-transformers + fastbert.quantize",
             "sentence-transformers ONNX int8")


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
    """sentence-transformers' own ONNX int8 export, loaded back; raises with the reason if it cannot."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.backend import export_dynamic_quantized_onnx_model

    try:
        import optimum.onnxruntime  # noqa: F401  (the export runs through optimum's ORTQuantizer)
    except ImportError as exc:
        raise RuntimeError("not available: sentence-transformers' ONNX export needs optimum[onnxruntime] "
                           f"({exc}); its current release pins transformers<5") from exc
    onnx_model = SentenceTransformer(str(model_dir), device="cpu", backend="onnx")
    export_dynamic_quantized_onnx_model(onnx_model, "avx2", str(tmp))
    return SentenceTransformer(str(tmp), device="cpu", backend="onnx",
                               model_kwargs={"file_name": "onnx/model_qint8_avx2.onnx"})


def run(model_dir, texts=None, quick: bool = False, device: str = "cpu", repeats: int | None = None,
        progress=None, lines: int | None = None, onnx: bool = True) -> list[dict]:
    import tempfile

    import fastbert

    say = progress or (lambda message: None)
    n = lines or (QUICK_LINES if quick else FULL_LINES)
    texts = list(texts[:n]) if texts is not None else english_lines(n)
    queries = queries_from(texts)
    repeats = repeats or (2 if quick else 3)
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
        for name in ("sentence-transformers fp32", "sentence-transformers + fastbert.quantize",
                     "sentence-transformers ONNX int8"):
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
                st_onnx = _onnx_int8(model_dir, tmp.name)
                runs["sentence-transformers ONNX int8"] = lambda data: torch.as_tensor(
                    st_onnx.encode(data, batch_size=BATCH_SIZE))
            except Exception as exc:
                errors["sentence-transformers ONNX int8"] = str(exc) if "not available" in str(exc) \
                    else f"{type(exc).__name__}: {exc}"
        else:
            errors["sentence-transformers ONNX int8"] = "skipped in this run (no ONNX export)"

    say("warm-up and agreement")
    corpus = {name: fn(texts).float().cpu() for name, fn in runs.items()}
    asked = {name: fn(queries).float().cpu() for name, fn in runs.items()}
    times = {name: [] for name in runs}
    for i in range(repeats):
        say(f"timing {i + 1}/{repeats}")
        for name, fn in runs.items():
            start = time.perf_counter()
            fn(texts)
            times[name].append(time.perf_counter() - start)

    ref = "fastbert Encoder fp32"
    rows = []
    for name in ("fastbert Encoder int8", "fastbert Encoder fp32", "sentence-transformers fp32",
                 "sentence-transformers + fastbert.quantize", "sentence-transformers ONNX int8"):
        row = {"name": name, "case": case, "ok": None, **stamp}
        if name in errors:
            row["error" if name == "fastbert Encoder int8" else "note"] = errors[name]
        if name in runs:
            best = min(times[name])
            row.update({"lines/s": len(texts) / best, "seconds": best, "all_seconds": times[name]})
            if name != ref:
                cos = torch.nn.functional.cosine_similarity(corpus[name], corpus[ref], dim=1)
                overlap = top_k_overlap(asked[ref], corpus[ref], asked[name], corpus[name])
                row.update(min_cosine=float(cos.min()), mean_cosine=float(cos.mean()), top10_overlap=overlap,
                           speedup_vs_fastbert_fp32=min(times[ref]) / best)
                if name in INT8_ROWS:
                    row["ok"] = row["min_cosine"] >= CHECK_COSINE and overlap >= CHECK_OVERLAP
                    met = "met" if row["min_cosine"] >= TARGET_COSINE else "NOT met"
                    met_overlap = "met" if overlap >= TARGET_OVERLAP else "NOT met"
                    row["note"] = (f"{row['speedup_vs_fastbert_fp32']:.2f}x fastbert fp32; min cosine "
                                   f"{row['min_cosine']:.4f} (target {TARGET_COSINE}: {met}), mean "
                                   f"{row['mean_cosine']:.4f}, top-{TOP_K} overlap {overlap:.3f} "
                                   f"(target {TARGET_OVERLAP}: {met_overlap})")
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
