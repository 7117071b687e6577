"""Work, not time: the instructions fastbert's C++ tokenizer executes per batch at each thread
count, counted by valgrind's cachegrind. A busy machine changes wall-clock ratios from run to run;
it does not change instruction counts. "vs 1 thread" here is how much more work the same batches
take on n threads: what a thread pool can never win back (each thread's own caches meet the same new
words again, chunks cost their hand-off).

Each count runs in a child process under cachegrind: it loads the tokenizer, encodes round 0 (the
pool, caches and buffers are made), then ``batches`` rounds of text new to it, caches cleared before
each, as the scaling bench does. A second child stops after round 0, and the difference is the
rounds' work. Only the extension's own functions are counted (fastbert::..., the binding), without
the thread pool's waiting loops; Python's own work (the list objects of the ids path) is not.
"""
from __future__ import annotations

import datetime as _dt
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

from fastbert.benchmarks import corpus
from fastbert.benchmarks import tokenizer as tb

_CHILD = """
import itertools, sys
from fastbert.benchmarks import tokenizer as tb
model_dir, text, path, threads, batches, quick = sys.argv[1:7]
peer = tb.FastbertPeer(model_dir, int(threads))
rounds = tb.Rounds(tb.default_texts(quick=quick == "1")[text], itertools.count(1))
texts = [rounds(r) for r in range(int(batches) + 1)]  # all made before any is encoded
encode = getattr(peer, tb.PATHS[path])
encode(texts[0])
for t in texts[1:]:
    peer.clear_cache()
    encode(t)
"""
_WAITING = ("ThreadPool", "spin_until")  # the pool's waits: their count depends on timing


def extension_instructions(cachegrind_out: str) -> dict[str, int]:
    """Instructions per function of fastbert's extension in a cachegrind output file (events: Ir),
    without the thread pool's waiting loops."""
    counts: dict[str, int] = defaultdict(int)
    fn = None
    with open(cachegrind_out, encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.startswith("fn="):
                name = line[3:].strip()
                ours = ("fastbert::" in name or "PyTokenizer" in name) and not any(w in name for w in _WAITING)
                fn = name if ours else None
            elif fn is not None and line[:1].isdigit():
                parts = line.split()
                if len(parts) >= 2:
                    counts[fn] += int(parts[1])
    return dict(counts)


def _valgrind() -> str:
    path = shutil.which("valgrind")
    if path is None:
        raise RuntimeError("counting work needs valgrind (its cachegrind tool counts the instructions): "
                           "install it, e.g. `apt-get install valgrind`")
    return path


def _count(valgrind, model_dir, text, path, threads, batches, quick) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "cachegrind.out")
        cmd = [valgrind, "--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}", sys.executable,
               "-c", _CHILD, str(model_dir), text, path, str(threads), str(batches), "1" if quick else "0"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the cachegrind child failed ({text}, {path}, {threads} threads): "
                               f"{done.stderr.strip()[-2000:]}")
        return sum(extension_instructions(out).values())


def thread_work(model_dir, texts=("english", "multilingual"), paths=("padded128",), threads=(1, 2), batches=6,
                quick=False, progress=None) -> list[dict]:
    """One row per text, path and thread count: the extension's instructions per batch and "vs 1
    thread", that count over the first thread count's. The two children of a count run at once."""
    say = progress or (lambda message: None)
    valgrind = _valgrind()
    threads = tb.resolve_threads(threads)
    for path in paths:
        if path not in tb.PATHS:
            raise ValueError(f"path must be one of {sorted(tb.PATHS)}, got {path!r}")
    known = tb.default_texts(quick=quick)
    for text in texts:
        if text not in known:
            raise ValueError(f"text must be one of {sorted(known)}, got {text!r}")
    if batches < 1:
        raise ValueError(f"batches must be at least 1, got {batches}")
    common = {"device": tb.device(), "versions": tb.versions(), "batches": batches,
              "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    rows = []
    for text in texts:
        nbytes = corpus.total_bytes(tb.Rounds(known[text], itertools.count(1))(0))  # one round's text
        for path in paths:
            first = None
            for n in threads:
                say(f"{text}: {path}, {n} threads under cachegrind (minutes)")
                with ThreadPoolExecutor(2) as ex:
                    full, base = ex.map(lambda b: _count(valgrind, model_dir, text, path, n, b, quick),
                                        (batches, 0))
                per_batch = (full - base) / batches
                first = per_batch if first is None else first
                rows.append({"name": "fastbert", "text": text, "path": path, "threads": n, **common,
                             "instructions per batch": per_batch, "instructions per byte": per_batch / nbytes,
                             "vs 1 thread": per_batch / first})
    return rows


def format_work(rows: list[dict]) -> str:
    """Plain-text table of thread_work's rows."""
    head = f"{'text':<13}{'path':<10}{'thr':>4}{'instructions/batch':>20}{'per byte':>10}{'vs 1 thread':>13}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['text']:<13}{r['path']:<10}{r['threads']:>4}{r['instructions per batch']:>20,.0f}"
                     f"{r['instructions per byte']:>10.1f}{r['vs 1 thread']:>12.3f}x")
    return "\n".join(lines)
