"""One tokenizer, many threads and forked processes: same results as serial use, no deadlock, no
crawl, and a thread pool that lets the interpreter exit.

The fork and exit checks run in child processes with a timeout, so a deadlock fails the test
instead of hanging pytest.
"""
import os
import json
import random
import string
import threading
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest

import fastbert
import tokenizer_corpus as tc
import corpora as corpus

CHILD_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def texts():
    lines = corpus.english_lines()[:300] + corpus.multilingual_texts(60_000)
    return [t[:600] for t in lines] + tc.EDGE_STRINGS + tc.GOLDEN


OPTIONS = [
    dict(),
    dict(padding=True, return_offsets_mapping=True),
    dict(truncation=True, max_length=24, stride=4, return_overflowing_tokens=True, padding="max_length",
         return_tensors="np"),
]


def _plain(enc):
    return {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in enc.items()}


def test_16_threads_overlapping_batches_equal_serial(model_dir, texts):
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=4)
    rng = random.Random(0)
    jobs = []
    for j in range(96):  # overlapping slices, pairs on some, every option set
        start = rng.randrange(len(texts) - 40)
        batch = texts[start:start + rng.randint(1, 40)]
        pair = texts[start + 1:start + 1 + len(batch)] if j % 3 == 0 else None
        jobs.append((batch, pair, OPTIONS[j % len(OPTIONS)]))
    serial = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=1)
    want = [_plain(serial(b, p, **o)) for b, p, o in jobs]
    with ThreadPoolExecutor(16) as ex:
        got = list(ex.map(lambda job: _plain(tok(job[0], job[1], **job[2])), jobs))
    for j, (g, w) in enumerate(zip(got, want)):
        assert g == w, f"job {j}: threaded result differs from serial ({jobs[j][2]})"


def test_clear_cache_while_batches_run(model_dir):
    """More distinct words than the word caches hold (so they drop and refill during a batch), four
    callers at once, and clear_cache() from a fifth thread meanwhile: every batch equals transformers."""
    from transformers import BertTokenizerFast

    rng = random.Random(3)
    letters = string.ascii_lowercase + "éßü"
    words = sorted({"".join(rng.choices(letters, k=rng.randint(2, 13))) for _ in range(80_000)})
    rng.shuffle(words)
    texts = [" ".join(words[i:i + 25]) + "." for i in range(0, len(words), 25)]
    batches = [texts[i:i + 200] for i in range(0, len(texts), 200)]
    hf = BertTokenizerFast.from_pretrained(model_dir)
    want = [hf(b)["input_ids"] for b in batches]
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=2)
    assert len(words) > 2 ** 16

    def run_all():  # each batch twice: the second time its words are in the table
        with ThreadPoolExecutor(4) as ex:
            return list(ex.map(lambda b: (tok(b)["input_ids"], tok(b)["input_ids"]), batches))

    got = run_all()
    running = threading.Event()
    running.set()

    def clear_now_and_then():
        while running.is_set():
            tok.clear_cache()
            running.wait(0.002)

    clearer = threading.Thread(target=clear_now_and_then)
    clearer.start()
    try:
        got += run_all()
    finally:
        running.clear()
        clearer.join()
    for j, (first, again) in enumerate(got):
        assert first == want[j % len(want)] and again == want[j % len(want)], f"batch {j} differs from transformers"


WAKE_CHILD = """
import os, sys
import fastbert
from fastbert.benchmarks import corpus

tok = fastbert.BertTokenizer.from_pretrained(sys.argv[1], num_threads=2)
serial = fastbert.BertTokenizer.from_pretrained(sys.argv[1], num_threads=1)
lines = corpus.english_lines()[:400]
want = serial(lines)["input_ids"]
for i in range(50):
    # 8 KB and more of text wakes the pool's worker while the inputs are still read; then an int
    # ends the call before any batch reaches the pool
    try:
        tok(lines + [i])
    except TypeError as e:
        assert "not str" in str(e), e
    else:
        raise AssertionError("an int in the batch was accepted")
    assert tok(lines)["input_ids"] == want, f"round {i}: the batch after a woken pool differs"
pid = os.fork()  # right after a wake: the child makes its own pool
if pid == 0:
    os._exit(0 if tok(lines)["input_ids"] == want else 1)
_, status = os.waitpid(pid, 0)
assert os.waitstatus_to_exitcode(status) == 0, "the forked child's batch differs"
print("ok")
"""


def test_pool_record_of_the_last_batch(model_dir, texts):
    """The pool's record of its last batch (what bench_tokenizer.py --idle-gaps reports): a new record
    for each batch that went to the pool and none for one that did not; the workers ran some of a
    large batch's tasks (each batch here takes milliseconds on one thread), and a worker start time is
    given exactly when they ran any; the time inside tasks is the workers' when they ran any, and no
    more on either side than the whole run."""
    serial = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=1)
    serial(texts)
    assert serial._core.pool_last_run() == {"runs": 0, "tasks": 0, "worker_tasks": 0, "worker_start_us": None,
                                            "caller_cpu": None, "run_us": 0.0, "caller_busy_us": 0.0,
                                            "worker_busy_us": 0.0}
    tok = fastbert.BertTokenizer.from_pretrained(model_dir, num_threads=2)
    records = []
    for i in range(5):
        want = serial([f"{i} {t}" for t in texts])["input_ids"]
        assert tok([f"{i} {t}" for t in texts])["input_ids"] == want
        records.append(tok._core.pool_last_run())
    assert [r["runs"] for r in records] == [1, 2, 3, 4, 5]
    tok(texts[:1])  # one text: no pool
    assert tok._core.pool_last_run()["runs"] == 5
    for r in records:
        assert r["tasks"] >= 2 and 0 <= r["worker_tasks"] <= r["tasks"]
        assert (r["worker_start_us"] is None) == (r["worker_tasks"] == 0)
        assert r["worker_start_us"] is None or 0 <= r["worker_start_us"] < 60e6
        assert (r["worker_busy_us"] > 0) == (r["worker_tasks"] > 0)
        assert 0 < r["caller_busy_us"] + r["worker_busy_us"] and r["run_us"] < 60e6
        assert r["caller_busy_us"] <= r["run_us"] and r["worker_busy_us"] <= r["run_us"]
    assert any(r["worker_tasks"] for r in records), f"the worker ran no task of five batches: {records}"


RECORD_CHILD = """
import sys, threading
import fastbert
from fastbert.benchmarks import corpus

tok = fastbert.BertTokenizer.from_pretrained(sys.argv[1], num_threads=2)
lines = corpus.english_lines(200_000)
done = threading.Event()

def encode():
    for i in range(30):  # lists: the batch takes the GIL back for each chunk while it holds the pool
        tok([f"{i} {t}" for t in lines])
    done.set()

t = threading.Thread(target=encode)
t.start()
reads = 0
while not done.is_set():
    tok._core.pool_last_run()
    reads += 1
t.join()
print("ok", reads)
"""


def test_pool_record_read_while_a_batch_runs(model_dir):
    """Reading the pool's record from one thread while another thread's batch holds the pool and waits
    for the GIL to build its lists: both go on (in a child, so a deadlock fails the test)."""
    assert _run_child(RECORD_CHILD.replace("sys.argv[1]", repr(str(model_dir))), timeout=90).startswith("ok")


def test_pool_woken_for_a_batch_that_never_comes(model_dir):
    """The pool's worker is started while a large batch's inputs are read; a call that fails before
    the batch reaches the pool leaves it spinning for nothing. Later calls, and a fork, still work
    (in a child, so a hang fails the test)."""
    assert _run_child(WAKE_CHILD.replace("sys.argv[1]", repr(str(model_dir)))).strip() == "ok"


AFFINITY_CHILD = """
import json, os, sys
import fastbert

def cores(tid):  # the cores a thread of this process may run on
    with open(f"/proc/self/task/{tid}/status") as f:
        field = next(line for line in f if line.startswith("Cpus_allowed_list:")).split(":")[1]
    out = set()
    for part in field.strip().split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return sorted(out)

tok = fastbert.BertTokenizer.from_pretrained(sys.argv[1], num_threads=3)
serial = fastbert.BertTokenizer.from_pretrained(sys.argv[1], num_threads=1)
before = set(os.listdir("/proc/self/task"))  # the pool starts at the first batch that needs it
texts = [f"{i} the quick brown fox jumps over the lazy dog, tokenized again " * 8 for i in range(1500)]
steps = []
for step, pin in enumerate([None, "one", None]):
    if pin == "one":  # the caller on a single core: the workers may only go there too
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    elif step:
        os.sched_setaffinity(0, ALL)
    else:
        ALL = os.sched_getaffinity(0)
    batch = [f"{step} {t}" for t in texts]
    same = tok(batch)["input_ids"] == serial(batch)["input_ids"]
    workers = sorted(set(os.listdir("/proc/self/task")) - before)
    steps.append({"caller": tok._core.pool_last_run()["caller_cpu"], "workers": [cores(t) for t in workers],
                  "caller_cores": sorted(os.sched_getaffinity(0)), "same": same})
print(json.dumps(steps))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread affinity is set on Linux only")
def test_pool_workers_kept_off_the_callers_core(model_dir):
    """The pool's workers may run on the caller's cores except the one the caller is on, so that a
    scheduler that packs woken threads onto busy cores (a virtual machine's guest kernel) cannot queue
    them behind the caller; a caller limited to one core shares it; a widened caller is followed. The
    results equal one thread's (in a child, whose affinity the test changes)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores to keep the workers off the caller's")
    steps = json.loads(_run_child(AFFINITY_CHILD.replace("sys.argv[1]", repr(str(model_dir)))))
    for step, s in enumerate(steps):
        assert s["same"], f"step {step}: the pool's ids differ from one thread's"
        assert len(s["workers"]) == 2, f"step {step}: expected the pool's 2 worker threads, found {s}"
        assert s["caller"] in s["caller_cores"], f"step {step}: {s}"
        others = [c for c in s["caller_cores"] if c != s["caller"]]
        want = others or s["caller_cores"]
        assert all(w == want for w in s["workers"]), f"step {step}: the workers may run on {s['workers']}, want {want}"


def _run_child(code: str, timeout=CHILD_TIMEOUT_S):
    try:
        proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                              timeout=timeout, env=dict(os.environ, PYTHONFAULTHANDLER="1"))
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"child did not finish within {timeout} s (deadlock?); output:\n{e.stdout}\n{e.stderr}")
    assert proc.returncode == 0, f"child exited with {proc.returncode}:\n{proc.stdout}\n{proc.stderr[-3000:]}"
    return proc.stdout


DATALOADER_CHILD = """
import sys, time
import torch
from torch.utils.data import DataLoader, Dataset
import fastbert
from fastbert.benchmarks import corpus

tok = fastbert.BertTokenizer.from_pretrained(sys.argv[1])  # all cores: the pool exists before fork
lines = [t[:400] for t in corpus.english_lines()[:2048]]
batches = [lines[i:i + 64] for i in range(0, len(lines), 64)]
kw = dict(padding="max_length", truncation=True, max_length=128, return_tensors="pt")

class Batches(Dataset):
    def __len__(self):
        return len(batches)
    def __getitem__(self, i):
        t0 = time.perf_counter()
        enc = tok(batches[i], **kw)
        return enc["input_ids"], torch.tensor(time.perf_counter() - t0)

for _ in range(2):  # parent use first (pool threads running, word caches warm), then timed
    t0 = time.perf_counter()
    want = [tok(b, **kw)["input_ids"] for b in batches]
    parent_s = time.perf_counter() - t0
loader = DataLoader(Batches(), batch_size=None, num_workers=2, multiprocessing_context="fork")
got, worker_s = [], 0.0
for ids, dt in loader:
    got.append(ids)
    worker_s += float(dt)
assert len(got) == len(want) and all(torch.equal(g, w) for g, w in zip(got, want)), "worker results differ"
tok(lines[:64], **kw)  # the parent's pool still works after the workers
print(f"parent {parent_s:.4f} workers {worker_s:.4f}")
"""


def test_dataloader_fork_workers(model_dir):
    """Used in the parent, then in fork-started DataLoader workers: same ids, no deadlock, no crawl."""
    out = _run_child(DATALOADER_CHILD.replace("sys.argv[1]", repr(str(model_dir))))
    parent_s, worker_s = (float(x) for x in out.split()[1::2])
    # Summed time inside the workers' tokenizer calls vs the parent's own calls on the same batches.
    # Two workers share 2 cores with the parent, so a fair ratio is about 1-2; a crawl (a worker
    # spinning on a lock, or a pool that is rebuilt per call) is far above 6.
    assert worker_s < 6 * parent_s + 0.5, f"workers {worker_s:.3f} s vs parent {parent_s:.3f} s"


EXIT_CHILD = """
import threading, sys
import fastbert
from fastbert.benchmarks import corpus

tok = fastbert.BertTokenizer.from_pretrained({path!r}, num_threads=4)
lines = corpus.english_lines()[:4000]
tok(lines[:256], padding=True)  # the pool is running
{tail}
"""


# Python 3.11/3.12 end a daemon thread that asks for the GIL during finalization with pthread_exit;
# that forced unwind used to cross gil_scoped_release's noexcept destructor and abort the process
# (exit -6). fastbert._C released the GIL without RAII since; "daemon_busy" is the regression test.
# The unwind then still released the call's Python objects (the lists built so far) without the GIL
# while the interpreter was torn down: "daemon_busy_lists" crashed (exit -11) in most runs once the
# tokenizer alone no longer imported torch. csrc/py_gil.h's take_gil parks such a thread instead.


@pytest.mark.parametrize("tail", [
    "",                                                    # exit with the tokenizer alive
    "del tok; import gc; gc.collect()",                    # pool destroyed before exit
    # a daemon thread inside one long call (GIL released, pool busy) while the interpreter exits
    # (a loop of padded numpy calls: nearly all its time is in C++ without the GIL)
    pytest.param("def loop():\n    while True:\n        tok(lines, padding=True, truncation=True, max_length=128, "
                 "return_tensors='np')\n"
                 "threading.Thread(target=loop, daemon=True).start(); import time; time.sleep(0.5)"),
    # the same with lists, whose chunks take the GIL back while the pool still encodes
    pytest.param("def loop():\n    while True:\n        tok(lines)\n"
                 "threading.Thread(target=loop, daemon=True).start(); import time; time.sleep(0.5)"),
    # a non-daemon thread finishes its work first; interpreter waits for it, then exits
    "threading.Thread(target=lambda: tok(lines[:1000], return_offsets_mapping=True)).start()",
], ids=["alive", "deleted", "daemon_busy", "daemon_busy_lists", "thread_joined"])
def test_pool_shuts_down_at_exit(model_dir, tail):
    _run_child(EXIT_CHILD.format(path=str(model_dir), tail=tail), timeout=60)
