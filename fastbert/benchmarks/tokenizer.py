"""Tokenizer throughput: fastbert vs nanotoken, HF `tokenizers` and transformers.BertTokenizerFast.

Every peer encodes the same documents in one process, on two paths:
  "ids"        ragged Python lists of ids (list[list[int]]), special tokens added, no padding;
  "padded128"  truncated and padded to 128 as int64 numpy arrays (input_ids, token_type_ids,
               attention_mask).
MB/s = UTF-8 bytes of the input documents / median seconds; tokens/s counts real (non-pad) tokens.
On padded128 the bytes past a document's 128th token count too, though a tokenizer may stop before them
(fastbert does; nanotoken and HF do not): about 10% of the English and 8% of the multilingual characters.

The headline is text new to every tokenizer. The tokenizers cache: fastbert whole texts and
whitespace-delimited chunks, nanotoken chunks, so a benchmark that encodes one corpus again and
again measures cache lookups. Here every round (and the untimed first pass) gets the corpus under a
tag no earlier call of the run used (``unseen``: a number and a space before each document, built
outside the timed region), so no whole text repeats, and the word caches are cleared before each
round (``Peer.clear_cache``), so no word is remembered from an earlier round either: each round reads
like a first pass over text the tokenizer has never met. Every row carries the first pass's MB/s
(a fresh tokenizer's first call on the corpus, after a one-line warm-up) as the check: "vs first pass"
near 1x says the rounds found nothing cached. ``repeated=True`` also measures the same text encoded
again and again without clearing (rows whose "text seen" is "repeated"): the cache-lookup figure.
Before a figure counts, its output (round 1's) is compared with BertTokenizerFast's on the same texts:
a faster wrong answer is a failure row (ids_match False).
"""
from __future__ import annotations

import bisect
import datetime as _dt
import functools
import gc
import itertools
import os
import statistics
import time

import numpy as np

from fastbert.benchmarks import corpus, env
from fastbert.benchmarks.env import cpu_model

PATHS = {"ids": "ids", "padded128": "padded"}  # path name -> Peer method
MAX_LENGTH = 128
REFERENCE = "BertTokenizerFast"
BASELINE = "nanotoken"
_VERSIONED = ("fastbert", "nanotoken", "tokenizers", "transformers", "numpy")


def device() -> str:
    return f"cpu: {cpu_model()} ({os.cpu_count()} cores)"


def versions() -> dict:
    return env.versions(_VERSIONED)


def default_texts(quick: bool = False, smoke: bool = False) -> dict[str, list[str]]:
    """English (pydoc topics paragraphs, ~0.45 MB) and multilingual (Django translations, 1 MB)."""
    size = _text_bytes(quick, smoke)
    return {"english": corpus.english_lines(size),
            "multilingual": corpus.multilingual_texts(size or 1_000_000)}


def _text_bytes(quick: bool, smoke: bool) -> int | None:
    return 20_000 if smoke else 200_000 if quick else None


# ---- peers: each gives one callable per path, taking the prepared list of documents --------------

class Peer:
    """A tokenizer under test. ``ids(texts)`` -> list[list[int]]; ``padded(texts)`` -> dict of arrays."""

    name = "?"

    def __init__(self, model_dir: str, threads: int):
        self.model_dir, self.threads = str(model_dir), threads

    def before_repeat(self) -> None:
        """Called outside the timed region before each repeat."""

    def clear_cache(self) -> None:
        """Forget cached words (if the tokenizer has such a cache)."""

    def before_call(self, keep_caches: bool = False) -> None:
        """What runs outside the timed region before each timed call: before_repeat(), then
        clear_cache() unless the case keeps the caches (repeated text)."""
        self.before_repeat()
        if not keep_caches:
            self.clear_cache()


def _parallel_env(threads: int) -> None:
    # HF tokenizers reads TOKENIZERS_PARALLELISM at every batch call: false runs on the calling thread.
    os.environ["TOKENIZERS_PARALLELISM"] = "false" if threads == 1 else "true"


class FastbertPeer(Peer):
    name = "fastbert"

    def __init__(self, model_dir, threads):
        super().__init__(model_dir, threads)
        self.tok = self._load()
        self._pool_runs, self._last_run = [], 0  # the pool's records of the calls since pool_summary()

    def _load(self):
        import fastbert

        return fastbert.BertTokenizer.from_pretrained(self.model_dir, num_threads=self.threads)

    def _keep_pool_run(self):
        record = self.tok._core.pool_last_run()
        if record["runs"] != self._last_run:  # the call before went to the pool
            self._last_run = record["runs"]
            self._pool_runs.append(record)

    def before_repeat(self):
        # outside the timed region, before each call: keep the pool's record of the call before
        self._keep_pool_run()

    def pool_summary(self) -> dict:
        """The pool's own record of the calls since the last summary (medians): "tasks ms", the time
        its threads spent inside tasks together (encoding and, padded, filling the arrays; not the
        lists, which the calling thread builds between tasks), and "busy", that over threads x the
        run's duration; None for both when no call went to the pool."""
        self._keep_pool_run()  # the last call's
        inside = [(r["caller_busy_us"] + r["worker_busy_us"], r["run_us"]) for r in self._pool_runs
                  if r["run_us"] > 0]
        self._pool_runs = []
        if not inside:
            return {"tasks ms": None, "busy": None}
        return {"tasks ms": statistics.median(us / 1e3 for us, _ in inside),
                "busy": statistics.median(us / (self.threads * run) for us, run in inside)}

    def clear_cache(self):
        # fastbert keeps word caches between calls; without a clear_cache() a fresh tokenizer
        # (built here, outside the timed region) starts cold, as nanotoken does after clear_cache().
        clear = getattr(self.tok, "clear_cache", None)
        if clear is not None:
            clear()
        else:
            self.tok = self._load()

    def ids(self, texts):
        return self.tok(texts, return_token_type_ids=False, return_attention_mask=False)["input_ids"]

    def padded(self, texts):
        return self.tok(texts, padding="max_length", truncation=True, max_length=MAX_LENGTH,
                        return_tensors="np")


class NanotokenPeer(Peer):
    """nanotoken's fastest calls per path: encode_batch_list (lists) and encode_batch_padded (numpy);
    ``parallel`` is its thread control (a rayon pool over all cores, or the calling thread)."""

    name = "nanotoken"

    def __init__(self, model_dir, threads):
        super().__init__(model_dir, threads)
        import nanotoken as nt

        self.tok = nt.Tokenizer(self.model_dir)
        self.parallel = threads != 1

    def clear_cache(self):
        self.tok.clear_cache()

    def ids(self, texts):
        return self.tok.encode_batch_list(texts, parallel=self.parallel)

    def padded(self, texts):
        return self.tok.encode_batch_padded(texts, max_length=MAX_LENGTH, padding="max_length",
                                            truncation=True, parallel=self.parallel)


class TokenizersPeer(Peer):
    """HF `tokenizers`: Tokenizer.from_file(tokenizer.json) + encode_batch."""

    name = "tokenizers"

    def __init__(self, model_dir, threads):
        super().__init__(model_dir, threads)
        from tokenizers import Tokenizer

        path = os.path.join(self.model_dir, "tokenizer.json")
        self.plain = Tokenizer.from_file(path)
        self.plain.no_truncation()  # the shipped tokenizer.json turns both on; the ids path wants neither
        self.plain.no_padding()
        self.fixed = Tokenizer.from_file(path)
        self.fixed.enable_truncation(MAX_LENGTH)
        self.fixed.enable_padding(length=MAX_LENGTH, pad_id=self.fixed.token_to_id("[PAD]"))

    def before_repeat(self):
        _parallel_env(self.threads)

    def ids(self, texts):
        return [e.ids for e in self.plain.encode_batch(texts)]

    def padded(self, texts):
        encs = self.fixed.encode_batch(texts)
        return {"input_ids": np.array([e.ids for e in encs], dtype=np.int64),
                "token_type_ids": np.array([e.type_ids for e in encs], dtype=np.int64),
                "attention_mask": np.array([e.attention_mask for e in encs], dtype=np.int64)}


class TransformersPeer(Peer):
    name = REFERENCE

    def __init__(self, model_dir, threads):
        super().__init__(model_dir, threads)
        from transformers import BertTokenizerFast

        self.tok = BertTokenizerFast.from_pretrained(self.model_dir)

    def before_repeat(self):
        _parallel_env(self.threads)

    def ids(self, texts):
        return self.tok(texts, return_token_type_ids=False, return_attention_mask=False)["input_ids"]

    def padded(self, texts):
        return self.tok(texts, padding="max_length", truncation=True, max_length=MAX_LENGTH,
                        return_tensors="np")


class SlicedPeer(Peer):
    """fastbert without its thread pool: ``threads`` separate 1-thread tokenizers, each encoding its
    own contiguous slice of the batch (equal characters) on its own Python thread, side by side.
    Nothing is shared between them (no cache, no hand-off of tasks) and each slice's output stays
    apart (joining them would cost more copying): what more cores give a batch of this text on this
    machine with no pool at all. ``--scaling`` times it beside the pool."""

    name = "fastbert, separate tokenizers"

    def __init__(self, model_dir, threads):
        from concurrent.futures import ThreadPoolExecutor

        super().__init__(model_dir, threads)
        self.parts = [FastbertPeer(model_dir, 1) for _ in range(threads)]
        self._threads = ThreadPoolExecutor(threads - 1, thread_name_prefix="fastbert-slice")

    def clear_cache(self):
        for part in self.parts:
            part.clear_cache()

    def _slices(self, texts):
        ends = list(itertools.accumulate(len(t) for t in texts))
        total = ends[-1] if ends else 0
        k = len(self.parts)
        cuts = [0] + [bisect.bisect_left(ends, total * i // k) for i in range(1, k)] + [len(texts)]
        return list(zip(cuts, cuts[1:]))

    def _run(self, method, texts):
        (lo, hi), *rest = self._slices(texts)
        futures = [self._threads.submit(getattr(part, method), texts[a:b])
                   for part, (a, b) in zip(self.parts[1:], rest)]
        first = getattr(self.parts[0], method)(texts[lo:hi])
        return [first] + [f.result() for f in futures]

    def ids(self, texts):
        return self._run("ids", texts)

    def padded(self, texts):
        return self._run("padded", texts)


PEERS = (FastbertPeer, NanotokenPeer, TokenizersPeer, TransformersPeer)
PEERS_BY_NAME = {cls.name: cls for cls in PEERS}


# ---- output checks ----------------------------------------------------------------------------------

_PADDED_KEYS = ("input_ids", "token_type_ids", "attention_mask")


def count_tokens(path: str, out) -> int:
    if path == "ids":
        return sum(len(row) for row in out)
    return int(np.asarray(out["attention_mask"]).sum())


def same_output(path: str, out, ref) -> bool:
    """True when ``out`` equals the reference output exactly (ids and, padded, every array)."""
    if path == "ids":
        return len(out) == len(ref) and all(list(a) == b for a, b in zip(out, ref))
    return all(np.array_equal(np.asarray(out[k]), np.asarray(ref[k])) for k in _PADDED_KEYS)


def first_difference(path: str, out, ref, texts) -> str:
    """A short description of the first document whose output differs, for the failure note."""
    for i, text in enumerate(texts):
        if path == "ids":
            a, b = list(out[i]) if i < len(out) else None, ref[i]
        else:
            a = [np.asarray(out[k])[i].tolist() for k in _PADDED_KEYS]
            b = [np.asarray(ref[k])[i].tolist() for k in _PADDED_KEYS]
        if a != b:
            return f"document {i} ({text[:60]!r}...): got {str(a)[:120]}, expected {str(b)[:120]}"
    return "outputs differ in length or shape"


# ---- timing -------------------------------------------------------------------------------------------

_SCRATCH = None


def evict_cpu_caches(mb: int = 64) -> None:
    """Writes a buffer larger than the CPU's caches, so the next call starts as cold as any other.
    Without it, whichever tokenizer runs right after BertTokenizerFast (the slowest, with the largest
    working set) starts each round on caches that one evicted, and pays for it alone."""
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = np.empty(mb << 20, dtype=np.uint8)
    _SCRATCH.fill(1)


def unseen(docs: list[str], tag) -> list[str]:
    """``docs`` with ``tag`` and a space before each: the same text to read, but no document is one a
    tokenizer has met before, as long as no earlier call used that tag (whole-text caches miss)."""
    prefix = f"{tag} "
    return [prefix + doc for doc in docs]


class Rounds:
    """The texts of each round: round r's are the documents under a tag taken from ``tags`` the first
    time round r is asked for, so every tokenizer gets the same list in round r, and no two rounds (nor
    two cases sharing ``tags``) share a text. ``repeated=True``: one tagged list for every round."""

    def __init__(self, docs: list[str], tags, repeated: bool = False):
        self.docs, self.tags, self.repeated, self._lists = docs, tags, repeated, {}

    def __call__(self, r: int) -> list[str]:
        key = 0 if self.repeated else r
        if key not in self._lists:
            self._lists[key] = unseen(self.docs, next(self.tags))
        return self._lists[key]


def primer(docs: list[str]) -> list[str]:
    """``docs`` with every word spelled backwards: as much text, but (nearly) none of its words. Encoded
    before the first pass, with the caches cleared after it, it pays a tokenizer's one-time costs
    (lazy state, threads, cache memory mapped) without leaving anything of the real text behind."""
    return [" ".join(word[::-1] for word in doc.split()) for doc in docs]


def round_orders(names: list, rounds: int) -> list[list]:
    """The order of ``names`` in each of ``rounds`` rounds: rows of a balanced Latin square (Williams
    design), so every name comes first equally often and, within the rounds, right after each other name
    equally often (a round's first call follows the last round's last, which the design does not balance).

    What a call finds in the CPU caches depends on the call before it: after BertTokenizerFast's large
    working set they are cold, and right after a tokenizer that read the same texts, the texts are warm.
    Rotating one order keeps every name after the same one round after round (the first rotated to the
    end still follows the last). The design repeats after len(names) rounds, 2 * len(names) when odd."""
    n = len(names)
    first, low, high = [0], 1, n - 1
    while low <= high:  # 0, 1, n-1, 2, n-2, ...: the steps between neighbours are all different mod n
        first.append(low)
        low += 1
        if low <= high:
            first.append(high)
            high -= 1
    square = [[names[(i + shift) % n] for i in first] for shift in range(n)]
    if n % 2:  # odd n: the mirrored rows give each ordered pair its second half
        square += [row[::-1] for row in square]
    return [square[r % len(square)] for r in range(rounds)] if n else [[] for _ in range(rounds)]


class GcClock:
    """Seconds the cyclic garbage collector ran while this is entered (gc.callbacks): the part of a
    timed call that was a collection. settle() (before each timed call) puts every object made so far
    out of the collector's reach (gc.freeze, undone on exit), so that the collections a call sets off
    walk only what that call makes, as in a long-running program whose older objects have left the
    young generation. Without it, each call's collection walked the lists the tokenizer before it had
    returned (the harness keeps them until the next call returns): 0.15 ms of every fastbert lists
    call on English in the peers' table, and more or less for each peer after another one's lists."""

    def __init__(self):
        self.seconds, self._start, self._freezes = 0.0, None, False

    def _on_gc(self, phase, info):
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None

    def __enter__(self):
        gc.callbacks.append(self._on_gc)
        self._freezes = gc.get_freeze_count() == 0  # a program that froze objects itself keeps them so
        return self

    def __exit__(self, *exc):
        gc.callbacks.remove(self._on_gc)
        if self._freezes:
            gc.unfreeze()

    def settle(self):
        if self._freezes:
            gc.freeze()


def time_interleaved(calls, rounds, repeats=3, evict=False):
    """Median seconds of each ``fn(rounds(r))`` in ``calls`` ({name: (fn, before)}), timed in rounds that
    take every tokenizer in turn, so that load from elsewhere on the machine falls on all of them alike.

    Each first encodes ``primer`` of round 0's texts and then, timed once, round 0's texts: the first
    pass of a tokenizer that has met as much text but none of these words. Then ``repeats`` timed
    rounds (1, 2, ...), every tokenizer in each (a fast one given more rounds than the slow ones would
    time its later calls right after each other's, on warmer caches than the calls between the peers').
    ``before`` runs outside the timed region ahead of each call (cache clearing, thread settings).
    Returns {name: (median, repeats, round 1's output, first-pass seconds, median seconds of the timed
    calls spent in garbage collection)} or {name: exception} for a tokenizer that raised. Each round
    takes them in the order round_orders gives (each one after every other equally often); with evict
    every timed call also starts on evicted CPU caches (evict_cpu_caches)."""
    times = {name: [] for name in calls}
    collecting = {name: [] for name in calls}
    outs, first, failed = {}, {}, {}
    clock = GcClock()

    def timed(name, r):
        fn, before = calls[name]
        texts = rounds(r)
        if before:
            before()
        if evict:
            evict_cpu_caches()
        clock.settle()
        collected = clock.seconds
        start = time.perf_counter()
        out = fn(texts)
        seconds = time.perf_counter() - start
        if r:  # round 0, the first pass, is not among the timed calls
            collecting[name].append(clock.seconds - collected)
        return seconds, out

    warm_up = primer(rounds(0))
    with clock:
        for name, (fn, before) in calls.items():
            try:
                if before:
                    before()
                fn(warm_up)
                first[name], _ = timed(name, 0)
            except Exception as exc:
                failed[name] = exc

        for r, order in enumerate(round_orders(list(calls), repeats), start=1):
            for name in order:
                if name in failed:
                    continue
                try:
                    seconds, out = timed(name, r)
                    times[name].append(seconds)
                    if r == 1:
                        outs[name] = out
                except Exception as exc:
                    failed[name] = exc
    return {name: failed[name] if name in failed else
            (statistics.median(times[name]), len(times[name]), outs[name], first[name],
             statistics.median(collecting[name])) for name in calls}


def resolve_threads(threads) -> list[int]:
    """Thread counts as ints, None meaning every core, without repeats."""
    cores = os.cpu_count() or 1
    return list(dict.fromkeys(cores if t is None else int(t) for t in threads))


def _reps(quick: bool, smoke: bool) -> dict:
    # Quick: a call of 200 KB takes fastbert 2-4 ms, so the 3-7 rounds of earlier versions were some
    # 20 ms of measurement, and one burst of load on this kind of shared machine moved the median by
    # 10-20%. Every tokenizer at every thread count gets the same rounds (time_interleaved): 16 is a
    # whole number of times through the orders of round_orders for four peers at one or two counts.
    return dict(repeats=1 if smoke else 16)


def run(model_dir, texts=None, quick=False, threads=(1, None), progress=None, *, smoke=False,
        repeated=False, peers=PEERS, evict_caches=False) -> list[dict]:
    """Measure every peer on every text, path and thread count; returns one dict per measurement.

    texts: None for the default English + multilingual corpora; a list replaces the English
    documents (`fastbert bench` passes corpus.english_lines(), the default); or {name: documents}
    to measure exactly those. threads: 1 = serial; None = all cores
    (the rayon peers can only run on 1 thread or on all cores; other counts measure fastbert alone);
    every tokenizer at every count is timed in the same rounds.
    repeated: also measure each case on one text encoded again every round, caches kept (rows whose
    "text seen" is "repeated"; the headline rows' is "new each round"): True for every thread count,
    or the thread counts to do it at (1 for serial only; None = all cores), False for none.
    fastbert's rows above one thread also carry its pool's record of the calls
    (FastbertPeer.pool_summary). evict_caches: every timed call starts on evicted CPU caches."""
    say = progress or (lambda message: None)
    if not isinstance(texts, dict):
        say("loading text")
        english = texts
        texts = default_texts(quick=quick, smoke=smoke)
        if english is not None:
            texts["english"] = corpus.take(list(english), _text_bytes(quick, smoke))
    reps = _reps(quick, smoke)
    cores = os.cpu_count() or 1
    stamp = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    common = {"device": device(), "versions": versions(), "timestamp": stamp,
              "cpu_caches": "evicted before each call" if evict_caches else "not evicted"}
    tags = itertools.count(1)  # one counter for the whole run: no two calls share a text
    counts = resolve_threads(threads)
    if repeated is True:
        repeated_counts = counts
    else:
        again = set(resolve_threads(repeated)) if isinstance(repeated, (tuple, list)) else set()
        repeated_counts = [n for n in counts if n in again]
    rows: list[dict] = []
    for text_name, docs in texts.items():
        say(f"{text_name}: reference output ({REFERENCE})")
        ref_peer = TransformersPeer(model_dir, 1)
        ref_peer.before_repeat()
        # every tokenizer at every thread count, timed in the same rounds: "vs 1 thread" then compares
        # calls made minutes apart on this kind of shared machine no more than any other ratio does
        built, base = {}, {}
        for n_threads in counts:
            base[n_threads] = {"text": text_name, "threads": n_threads, "docs": len(docs), **common}
            for peer_cls in peers:
                if peer_cls is not FastbertPeer and n_threads not in (1, cores):
                    continue  # rayon pools are sized once per process: 1 thread or all cores only
                try:
                    built[peer_cls.name, n_threads] = peer_cls(model_dir, n_threads)
                except Exception as exc:  # an unavailable peer is a row with a note, not a crash
                    rows.extend({**base[n_threads], "name": peer_cls.name, "path": path, "text seen": seen,
                                 "MB/s": None, "tokens/s": None, "ids_match": None,
                                 "error": f"{type(exc).__name__}: {exc}"}
                                for path in PATHS for seen in ("new each round", "repeated")
                                if seen == "new each round" or n_threads in repeated_counts)
        kinds = [("new each round", False, counts)]
        if repeated_counts:
            kinds.append(("repeated", True, repeated_counts))
        for seen, keep_caches, kind_counts in kinds:
            for path, method in PATHS.items():
                in_kind = {key: peer for key, peer in built.items() if key[1] in kind_counts}
                say(f"{text_name}: {path}, {seen}, thread(s) {', '.join(map(str, kind_counts))}: "
                    f"{', '.join(dict.fromkeys(name for name, _ in in_kind))}")
                rounds = Rounds(docs, tags, repeated=keep_caches)
                reference = getattr(ref_peer, method)(rounds(1))
                nbytes = corpus.total_bytes(rounds(1))

                calls = {key: (getattr(peer, method), functools.partial(peer.before_call, keep_caches))
                         for key, peer in in_kind.items()}
                for (name, n_threads), result in time_interleaved(calls, rounds, **reps,
                                                                  evict=evict_caches).items():
                    row = {**base[n_threads], "name": name, "path": path, "text seen": seen, "bytes": nbytes}
                    peer = in_kind[name, n_threads]
                    if isinstance(peer, FastbertPeer) and n_threads > 1:
                        row.update(peer.pool_summary())
                    if isinstance(result, Exception):
                        rows.append({**row, "MB/s": None, "tokens/s": None, "ids_match": None,
                                     "error": f"{type(result).__name__}: {result}"})
                        continue
                    seconds, repeats, out, first_pass, collecting = result
                    match = same_output(path, out, reference)
                    row.update({"MB/s": nbytes / seconds / 1e6, "tokens/s": count_tokens(path, out) / seconds,
                                "ids_match": match, "seconds": seconds, "repeats": repeats,
                                "tokens": count_tokens(path, out), "first pass MB/s": nbytes / first_pass / 1e6,
                                "vs first pass": first_pass / seconds, "gc ms": 1e3 * collecting})
                    if not match:
                        row["error"] = "output differs from BertTokenizerFast: " + \
                            first_difference(path, out, reference, rounds(1))
                    rows.append(row)
    order = {cls.name: i for i, cls in enumerate(peers)}
    texts_order = {name: i for i, name in enumerate(texts)}
    seen_order = ["new each round", "repeated"]
    rows.sort(key=lambda r: (seen_order.index(r["text seen"]), texts_order[r["text"]], r["threads"],
                             order.get(r["name"], 99), list(PATHS).index(r["path"])))
    add_ratios(rows)
    return rows


def add_ratios(rows: list[dict]) -> None:
    """Adds "vs nanotoken" / "vs BertTokenizerFast": this row's MB/s over the peer's, same case;
    and "vs 1 thread": this row's MB/s over the same tokenizer's serial MB/s (thread scaling)."""
    def key(r):
        return r.get("text seen"), r["text"], r["path"], r["threads"]

    by_case = {(key(r), r["name"]): r.get("MB/s") for r in rows}
    for r in rows:
        for peer, field in ((BASELINE, "vs nanotoken"), (REFERENCE, "vs BertTokenizerFast")):
            other = by_case.get((key(r), peer))
            r[field] = r["MB/s"] / other if r.get("MB/s") and other else None
        serial = by_case.get(((r.get("text seen"), r["text"], r["path"], 1), r["name"]))
        r["vs 1 thread"] = r["MB/s"] / serial if r.get("MB/s") and serial else None


def format_table(rows: list[dict]) -> str:
    """Plain-text table of the rows, with the ratios against nanotoken and BertTokenizerFast, and each
    row's speed over its own first pass (about 1x when the rounds found nothing cached)."""
    head = (f"{'text seen':<16}{'text':<13}{'path':<10}{'thr':>4}  {'tokenizer':<18}{'MB/s':>9}{'Mtok/s':>9}"
            f"{'ids':>6}{'vs nanotoken':>14}{'vs BertTokFast':>16}{'vs 1 thread':>13}{'vs 1st pass':>13}")
    lines = [head, "-" * len(head)]

    def num(x, fmt, width, suffix=""):
        text = format(x, fmt) + suffix if isinstance(x, (int, float)) else "-"
        return f"{text:>{width}}"

    for r in rows:
        ok = {True: "ok", False: "FAIL", None: "-"}[r.get("ids_match")]
        tok = r["tokens/s"] / 1e6 if r.get("tokens/s") else None
        lines.append(f"{r.get('text seen', ''):<16}{r['text']:<13}{r['path']:<10}{r['threads']:>4}  {r['name']:<18}"
                     f"{num(r.get('MB/s'), '.2f', 9)}{num(tok, '.2f', 9)}{ok:>6}"
                     f"{num(r.get('vs nanotoken'), '.2f', 14, 'x')}"
                     f"{num(r.get('vs BertTokenizerFast'), '.2f', 16, 'x')}"
                     f"{num(r.get('vs 1 thread'), '.2f', 13, 'x')}"
                     f"{num(r.get('vs first pass'), '.2f', 13, 'x')}")
        if r.get("error"):
            lines.append(f"{'':<45}{r['error'][:200]}")
    return "\n".join(lines)


def thread_scaling(model_dir, texts=None, threads=(1, 2), quick=False, progress=None, *, smoke=False) -> list[dict]:
    """fastbert alone at each thread count, timed interleaved (every round runs each count in turn, so
    load from elsewhere falls on all alike) on text new to it every round: one row per text, path and
    count, with "vs 1 thread" (median MB/s over the first count's). When the extension was built with
    -DFASTBERT_STAGE_TIMES, each row also carries "stages": CPU ms per call of each stage of the C++ call
    (GIL-held stages: the calling thread's CPU; "encode" and "output_threads": every thread's), and
    "serial": the GIL-held share of that CPU time, which bounds the speedup as Amdahl's law says.
    Every row carries "machine ceiling": the median of env.parallel_ceiling samples for the largest
    count, taken after each text and path (what independent threads of plain C work gained meanwhile),
    and "machine ceiling range"; and "lookup ceiling" / "lookup ceiling range", the same from
    env.lookup_ceiling (random reads from a cached table, work shaped more like a tokenizer's). For
    the largest count above 1, rows with "sliced": True time SlicedPeer in the same rounds: that many
    separate 1-thread tokenizers on slices of the batch, side by side (what the same cores give this
    text with no pool at all); "vs 1 thread" as for the pool.
    Rows of the pool carry its own record of the calls, "tasks ms" and "busy"
    (FastbertPeer.pool_summary). The tasks are the same instructions on any count (--work), so tasks
    ms above the one-thread call's ms is the threads running the same work slower, and busy below
    100% is threads waiting."""
    say = progress or (lambda message: None)
    texts = texts if isinstance(texts, dict) else default_texts(quick=quick, smoke=smoke)
    reps = _reps(quick, smoke)
    threads = resolve_threads(threads)
    tags = itertools.count(1)
    common = {"device": device(), "versions": versions(),
              "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    rows = []
    ceiling, lookups = [], []  # env.parallel_ceiling and env.lookup_ceiling samples, after each case
    peers = {n: FastbertPeer(model_dir, n) for n in threads}
    if max(threads) > 1:
        peers["sliced"] = SlicedPeer(model_dir, max(threads))
    for text_name, docs in texts.items():
        for path, method in PATHS.items():
            say(f"{text_name}: {path}, threads {threads}")
            calls = {key: (getattr(p, method), p.before_call) for key, p in peers.items()}
            for n in threads:
                peers[n].tok._core.stage_times()  # drop what loading and earlier calls summed
            rounds = Rounds(docs, tags)
            results = time_interleaved(calls, rounds, **reps)
            if max(threads) > 1:
                # three samples also in a smoke run: one 4 MB sample can land on a core that was asleep
                ceiling += env.parallel_ceiling(max(threads), 3, 4 << 20 if smoke else 32 << 20)
                lookups += env.lookup_ceiling(max(threads), 3, 1 << 18 if smoke else 1 << 22)
            nbytes = corpus.total_bytes(rounds(1))
            for key, result in results.items():
                sliced = key == "sliced"
                row = {"name": peers[key].name, "text": text_name, "path": path, "threads": peers[key].threads,
                       "sliced": sliced, **common}
                if isinstance(result, Exception):
                    rows.append({**row, "MB/s": None, "error": f"{type(result).__name__}: {result}"})
                    continue
                seconds, repeats, _, _, collecting = result
                row.update({"MB/s": nbytes / seconds / 1e6, "seconds": seconds, "repeats": repeats,
                            "gc ms": 1e3 * collecting})
                if not sliced and key > 1:
                    row.update(peers[key].pool_summary())
                stages = {} if sliced else peers[key].tok._core.stage_times()
                if stages:  # summed over the primer, the first pass and every round
                    calls_made = repeats + 2
                    ms = {k: 1e3 * v / calls_made for k, v in stages.items()}
                    held = sum(v for k, v in ms.items() if k not in ("encode", "output_threads"))
                    row.update({"stages": ms, "serial": held / sum(ms.values())})
                rows.append(row)
    ceilings = {}
    for key, samples in (("machine ceiling", ceiling), ("lookup ceiling", lookups)):
        if samples:
            ceilings.update({key: statistics.median(samples), f"{key} range": [min(samples), max(samples)]})
    for r in rows:
        r.update(ceilings)
        first = next((o for o in rows if (o["text"], o["path"], o["threads"], o["sliced"]) ==
                      (r["text"], r["path"], threads[0], False)), None)
        r["vs 1 thread"] = r["MB/s"] / first["MB/s"] if r.get("MB/s") and first and first.get("MB/s") else None
        if "stages" in r and first and "stages" in first:
            # Amdahl: the first count's CPU per call over this count's GIL-held CPU plus its parallel CPU
            # shared by the threads (what an otherwise idle machine with that many cores could reach)
            par = r["stages"]["encode"] + r["stages"]["output_threads"]
            held = sum(r["stages"].values()) - par
            r["amdahl bound"] = sum(first["stages"].values()) / (held + par / r["threads"])
    return rows


def format_scaling(rows: list[dict]) -> str:
    """Plain-text table of thread_scaling's rows."""
    head = (f"{'text':<13}{'path':<10}{'thr':>4}  {'how':<14}{'MB/s':>9}{'vs 1 thread':>13}{'ms/call':>9}"
            f"{'tasks ms':>10}{'busy':>6}{'serial CPU':>12}{'Amdahl bound':>14}  stages (CPU ms/call)")
    lines = [head, "-" * len(head)]
    for r in rows:
        how = "separate" if r.get("sliced") else "pool" if r["threads"] > 1 else "-"
        vs = f"{r['vs 1 thread']:.2f}x" if r.get("vs 1 thread") else "-"
        serial = f"{r['serial']:.1%}" if "serial" in r else "-"
        bound = f"{r['amdahl bound']:.2f}x" if "amdahl bound" in r else "-"
        stages = " ".join(f"{k} {v:.3f}" for k, v in r.get("stages", {}).items()) or r.get("error", "")
        mbs = f"{r['MB/s']:.2f}" if r.get("MB/s") else "-"
        ms = f"{r['seconds'] * 1e3:.2f}" if r.get("seconds") else "-"
        tasks = f"{r['tasks ms']:.2f}" if r.get("tasks ms") else "-"
        busy = f"{r['busy']:.0%}" if r.get("busy") else "-"
        lines.append(f"{r['text']:<13}{r['path']:<10}{r['threads']:>4}  {how:<14}{mbs:>9}{vs:>13}{ms:>9}{tasks:>10}"
                     f"{busy:>6}{serial:>12}{bound:>14}  {stages}")
    if rows and not any("stages" in r for r in rows):
        lines.append("stages, serial CPU, Amdahl bound: not measured, this build of the extension has no stage timers "
                     "(a bench build has them: FASTBERT_STAGE_TIMES=1 pip install --no-build-isolation -e .)")
    top = max((r for r in rows if "machine ceiling" in r), key=lambda r: r["threads"], default=None)
    if top:
        low, high = top["machine ceiling range"]
        lines.append(f"machine ceiling: {top['threads']} threads of plain C work (SHA-256, GIL released) did "
                     f"{top['machine ceiling']:.2f}x the work of one in the same time (median; {low:.2f}-{high:.2f}x), "
                     "the most any thread pool could gain here meanwhile")
        low, high = top["lookup ceiling range"]
        lines.append(f"lookup ceiling: {top['threads']} threads of random reads from a 1 MB table each (numpy take) "
                     f"did {top['lookup ceiling']:.2f}x the work of one (median; {low:.2f}-{high:.2f}x)")
    return "\n".join(lines)


def peer_classes(names) -> tuple[type, ...]:
    """The peers' table's tokenizers for these peer names: fastbert first, then the named peers in
    PEERS' order ("none" or no names: fastbert alone). An unknown name is refused, with the known ones."""
    names = [n.strip() for n in names if n.strip() and n.strip() != "none"]
    unknown = [n for n in names if n not in PEERS_BY_NAME]
    if unknown:
        raise ValueError(f"peers: unknown {', '.join(map(repr, unknown))}; the peers are {list(PEERS_BY_NAME)} "
                         "or 'none'")
    return (FastbertPeer, *(cls for cls in PEERS if cls is not FastbertPeer and cls.name in names))
