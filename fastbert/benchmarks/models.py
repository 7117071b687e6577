"""Model forward throughput on CPU: fastbert.AutoModel vs transformers' AutoModel (sdpa), plus
torch.compile(transformers) and ONNX Runtime (with its BERT fusions) when installed.

Workload: 128 real English sentences from CPython's pydoc topics, chosen
deterministically so that padded to the longest (33 tokens) about half the slots are padding
(about 2,070 real tokens of 4,224). Every peer gets the same tokenized batch (tokenized outside the
timed region), runs under torch.inference_mode, and is timed `repeats` times interleaved with the
others; the best time counts. Throughput is real (non-padding) tokens per second. Each output is
checked against transformers' last_hidden_state on the real tokens in the same run (fp32:
max abs diff <= 1e-4). torch.compile's compile time (first call) is reported separately.
The timed call takes token ids, never text: no tokenizer (nor its caches) runs inside it, so repeating
the same batch measures the same work every time.
"""
from __future__ import annotations

import os
import re
import tempfile
import time

import torch

BATCH, MAX_TOKENS, TARGET_REAL = 128, 33, 2066
TOLERANCE = {"float32": 1e-4, "float16": 2e-2, "bfloat16": 5e-2}


def sentences(texts=None) -> list[str]:
    """Sentence-sized lines of the English corpus (paragraphs split after . ! ?)."""
    if texts is None:
        from fastbert.benchmarks.corpus import english_lines
        texts = english_lines()
    out = []
    for text in texts:
        out.extend(s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if s.strip())
    return out


def pick_batch(lines, count_tokens, batch=BATCH, max_tokens=MAX_TOKENS, target_real=TARGET_REAL,
               tolerance=6):
    """`batch` lines in corpus order, at most `max_tokens` each (one of exactly that length), keeping
    the running total of real tokens near `target_real * k / batch`: about half of the padded slots
    are padding, with lengths spread from short to long as in real traffic."""
    mean = target_real / batch
    lengths = [count_tokens(line) for line in lines]
    longest = next(i for i, n in enumerate(lengths) if n == max_tokens)
    chosen, total = [longest], max_tokens
    for i, n in enumerate(lengths):
        if len(chosen) == batch:
            break
        if i == longest or n < 4 or n > max_tokens:
            continue
        if abs(total + n - mean * (len(chosen) + 1)) <= tolerance:
            chosen.append(i)
            total += n
    if len(chosen) < batch:
        raise ValueError(f"only {len(chosen)} of {batch} lines fit the workload")
    return [lines[i] for i in chosen]


def workload(model_dir, texts=None, batch=BATCH, max_tokens=MAX_TOKENS):
    """-> (tokenizer encoding of the batch, lines).

    Other sizes (`fastbert bench --batch-sizes/--seq-lens`) keep the same shape of traffic: one line
    of `max_tokens`, about half the padded slots real; longer lines come from whole paragraphs (and
    runs of four) cut at `max_tokens` by truncation."""
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    lines = sentences(texts)[:4000]
    custom = (batch, max_tokens) != (BATCH, MAX_TOKENS)
    if custom and max_tokens > MAX_TOKENS:
        from fastbert.benchmarks.corpus import english_lines
        paragraphs = list(texts) if texts is not None else english_lines()
        lines += paragraphs + [" ".join(paragraphs[i:i + 4]) for i in range(0, len(paragraphs), 4)]
    counts = tok(lines, add_special_tokens=True)["input_ids"]
    by_line = {line: min(len(ids), max_tokens) if custom else len(ids) for line, ids in zip(lines, counts)}
    if custom:
        target = TARGET_REAL * batch * max_tokens / (BATCH * MAX_TOKENS)
        chosen = pick_batch(lines, by_line.__getitem__, batch, max_tokens, target,
                            tolerance=max(6, round(6 * max_tokens / MAX_TOKENS)))
    else:
        chosen = pick_batch(lines, by_line.__getitem__)
    enc = tok(chosen, padding=True, truncation=custom, max_length=max_tokens if custom else None,
              return_tensors="pt")
    return dict(enc), chosen


def _timed(fn, inputs):
    start = time.perf_counter()
    out = fn(**inputs)
    return time.perf_counter() - start, out


def _last_hidden(out):
    if isinstance(out, torch.Tensor):
        return out
    return out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state


def _onnx_peer(hf_model, inputs, workdir):
    """transformers model -> ONNX (TorchScript exporter) -> ORT's BERT optimizer -> session."""
    import onnxruntime as ort

    names = list(inputs)
    path = os.path.join(workdir, "model.onnx")
    dynamic = {n: {0: "batch", 1: "seq"} for n in names}
    wrapped = _OnnxWrapper(hf_model, names).eval()  # export restores the wrapper's mode: keep it eval
    torch.onnx.export(wrapped, tuple(inputs[n] for n in names), path, input_names=names,
                      output_names=["last_hidden_state"], dynamic_axes=dynamic, opset_version=17, dynamo=False)
    note = "ORT graph optimizations"
    try:
        from onnxruntime.transformers.optimizer import optimize_model
        cfg = hf_model.config
        opt = optimize_model(path, model_type="bert", num_heads=cfg.num_attention_heads,
                             hidden_size=cfg.hidden_size)
        path = os.path.join(workdir, "model.opt.onnx")
        opt.save_model_to_file(path)
        note = "ORT transformers optimizer (fused attention, GELU, LayerNorm)"
    except Exception as exc:  # the plain export still runs with ORT's own graph optimizations
        note = f"ORT graph optimizations only ({type(exc).__name__})"
    options = ort.SessionOptions()
    options.intra_op_num_threads = torch.get_num_threads()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feeds = {n: inputs[n].numpy() for n in names}

    def run(**_):
        return torch.from_numpy(session.run(["last_hidden_state"], feeds)[0])
    return run, note


class _OnnxWrapper(torch.nn.Module):
    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *args):
        return self.model(**dict(zip(self.names, args))).last_hidden_state


def run(model_dir, texts=None, quick: bool = False, device: str = "cpu", dtype: str = "float32",
        repeats: int | None = None, threads: int | None = 2, compile: bool | None = None,
        onnx: bool = True, progress=None, batch_size: int | None = None, seq_len: int | None = None,
        smoke: bool = False, **_ignored) -> list[dict]:
    """Rows: name, case, tokens/s (real tokens), seconds (best), max_abs_diff vs transformers, ok,
    vs_hf_sdpa, note. threads: torch threads for this run (restored after); smoke: one repeat, no
    torch.compile or ONNX (the CLI's own tests)."""
    previous = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    if smoke:
        repeats, compile, onnx = 1, False, False
    try:
        return _run(model_dir, texts, quick, device, dtype, repeats, compile, onnx, progress, batch_size,
                    seq_len)
    finally:
        torch.set_num_threads(previous)


def _run(model_dir, texts, quick, device, dtype, repeats, compile, onnx, progress, batch_size, seq_len):
    import transformers

    import fastbert

    say = progress or (lambda message: None)
    repeats = repeats or (3 if quick else 7)
    compile = (not quick) if compile is None else compile
    torch_dtype = getattr(torch, dtype)
    say("tokenizing the workload")
    inputs, _ = workload(model_dir, texts, batch_size or BATCH, seq_len or MAX_TOKENS)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    mask = inputs["attention_mask"].bool()
    real, slots = int(mask.sum()), mask.numel()
    case = (f"{mask.shape[0]} lines padded to {mask.shape[1]} ({real} real of {slots} tokens), {dtype}, "
            f"{torch.get_num_threads()} threads")
    say("loading models")
    hf = transformers.AutoModel.from_pretrained(str(model_dir), attn_implementation="sdpa",
                                                dtype=torch_dtype).to(device).eval()
    fast = fastbert.AutoModel.from_pretrained(model_dir, dtype=torch_dtype, device=device)
    peers = {"fastbert.AutoModel": (fast, ""), "transformers AutoModel (sdpa)": (hf, "")}
    rows = {}
    with torch.inference_mode():
        reference = _last_hidden(hf(**inputs)).float()
        if compile:
            say("torch.compile(transformers)")
            try:
                compiled = torch.compile(hf)
                t0 = time.perf_counter()
                compiled(**inputs)
                peers["torch.compile(transformers)"] = (compiled, f"compile {time.perf_counter() - t0:.1f} s")
            except Exception as exc:
                rows["torch.compile(transformers)"] = {"error": f"{type(exc).__name__}: {exc}"}
        else:
            rows["torch.compile(transformers)"] = {
                "note": "skipped (quick run)" if quick else "skipped (compile=False)", "skipped": True}
        if onnx and device == "cpu" and dtype == "float32":
            say("ONNX export")
            try:
                workdir = tempfile.mkdtemp(prefix="fastbert-onnx-")
                session, note = _onnx_peer(hf, inputs, workdir)
                hf.eval()
                peers["ONNX Runtime"] = (session, note)
            except ImportError as exc:
                rows["ONNX Runtime"] = {"note": f"skipped: {exc}", "skipped": True}
            except Exception as exc:
                rows["ONNX Runtime"] = {"error": f"{type(exc).__name__}: {exc}"}
        times = {name: [] for name in peers}
        outputs = {}
        for name, (fn, _) in peers.items():  # warm-up, and the output check
            outputs[name] = _last_hidden(fn(**inputs)).float()
        for i in range(repeats):
            say(f"timing, repeat {i + 1} of {repeats}")
            for name, (fn, _) in peers.items():
                seconds, _out = _timed(fn, inputs)
                times[name].append(seconds)
    out = []
    tolerance = TOLERANCE.get(dtype, 1e-4)
    for name, (_fn, note) in peers.items():
        diff = (outputs[name][mask] - reference[mask]).abs().max().item()
        best = min(times[name])
        out.append({"name": name, "case": case, "tokens/s": real / best, "seconds": best,
                    "max_abs_diff": diff, "ok": diff <= tolerance, "note": note, "real_tokens": real,
                    "slots": slots, "repeats": repeats})
    for name, extra in rows.items():
        out.append({"name": name, "case": case, "tokens/s": None, "ok": None, **extra})
    base = next(r for r in out if r["name"] == "transformers AutoModel (sdpa)")["tokens/s"]
    for r in out:
        if r.get("tokens/s"):
            r["vs_hf_sdpa"] = r["tokens/s"] / base
    return out
