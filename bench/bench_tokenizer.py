"""Tokenizer throughput: fastbert vs nanotoken, HF tokenizers and BertTokenizerFast, same text, one run.

    pytest bench/bench_tokenizer.py --benchmark-only      # pytest-benchmark (FASTBERT_BENCH_QUICK=1: less text)
    python bench/bench_tokenizer.py [--quick] [--repeated] # table with ratios, then one text per call
                                                            # (tokenizer_latency); both in bench/results/tokenizer.jsonl
    python bench/bench_tokenizer.py --peers nanotoken       # the same table with fastbert and these peers only
                                                            # ('none': fastbert alone, both thread counts)
    python bench/bench_tokenizer.py --scaling [--threads 1,2]  # fastbert alone, thread counts interleaved:
                                                            # "vs 1 thread" per text and path (+ JSONL)
    python bench/bench_tokenizer.py --idle-gaps 0,1,3,10,30,100 --threads 1,2  # the same, each call after
                                                            # the machine idled that many ms (+ JSONL)
    python bench/bench_tokenizer.py --after BertTokenizerFast --idle-gaps 0 --threads 1,2  # each call right
                                                            # after that peer's call on other text (+ JSONL);
                                                            # nanotoken/1: the peer serial before every call
    python bench/bench_tokenizer.py --work [ids,padded128] [--threads 1,2]  # instructions per batch at
                                                            # each count, under valgrind (+ JSONL)

--scaling also reports each stage's CPU time per call and the GIL-held (serial) share when the
extension was built with the stage timers (a bench build: `FASTBERT_STAGE_TIMES=1 pip install
--no-build-isolation -e .`, in a copy of the tree to keep the product build; the table says when they are missing).
CPU time does not depend on other load on the machine, so the serial share holds on a busy machine
where the wall-clock ratios do not. The pool's idle workers spin for up to 100 us after each
parallel step before they sleep (csrc/thread_pool.h), and the process CPU of a parallel stage
counts that spin too (also a spin left over from another tokenizer's call): read those stages, and
the Amdahl bound built on them, as upper bounds. Lists of ids are built on the calling thread while
the pool encodes the later chunks, so their building counts in "encode" there, not in "output";
so do arrays padded to max_length with truncation, which each thread fills right after the chunk it
encoded (their shape is known before encoding).
--work counts work instead of time (bench/tokenizer_work.py): the C++ tokenizer's
instructions per batch of new text at each thread count, under valgrind's cachegrind, which no other
load on the machine changes; "vs 1 thread" there is the extra work that threads bring. It takes
minutes (Python runs 20-50x slower under valgrind) and needs valgrind installed.
--scaling ends with the machine's own ceiling, measured in the same run: how much more plain C work
(SHA-256, GIL released) 2 threads did than one; a virtual machine whose cores share a physical one,
or a busy host, keeps it below 2x, and no thread pool gains more than it; and a second ceiling on
work shaped more like a tokenizer's (random reads from a 1 MB table per thread, served by the CPU
caches), which on this kind of guest falls for a while far below the first. Beside the pool it times,
in the same rounds, as many separate 1-thread tokenizers each on its own slice of the batch, side by
side ("separate" rows): the same cores on the same text with no pool, no shared cache, no hand-offs.
The pool's rows also carry its own record of each call: "tasks ms", the time its threads spent
inside tasks together, and "busy", that over threads x the run. The tasks are the same instructions
on any count (--work): tasks ms above the one-thread ms/call is the threads running the same work
slower; busy below 100% is a thread waiting (on lists, the caller builds them between tasks).

Every round encodes text new to every tokenizer (fastbert.benchmarks.tokenizer: a fresh tag before
each document, caches cleared); --repeated adds the same text encoded again, the cache-lookup figure.
The measurement logic lives in fastbert.benchmarks.tokenizer (also behind `fastbert bench`); this
file only wraps it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import itertools
import os
import sys
from pathlib import Path

import tokenizer_idle_gaps as ig  # noqa: E402  (bench/ research tooling, beside this file)
import tokenizer_work as tw  # noqa: E402
from common import QUICK, RESULTS, append_run, model_dir, pytest, say

from fastbert.benchmarks import tokenizer as tb
from fastbert.benchmarks import tokenizer_latency as tl

# ---- pytest-benchmark ---------------------------------------------------------------------------------

if pytest is not None:
    _THREADS = sorted({1, os.cpu_count() or 1})
    _TAGS = itertools.count(1)  # every round of every test: text no tokenizer has met

    @pytest.fixture(scope="module")
    def texts():
        return tb.default_texts(quick=QUICK)

    @pytest.fixture(scope="module")
    def reference():
        """BertTokenizerFast, whose output on the same texts every peer must reproduce."""
        ref = tb.TransformersPeer(model_dir(), 1)
        ref.before_repeat()
        return ref

    @pytest.fixture(scope="module")
    def peers():
        return {}  # (peer class, threads) -> Peer, built once per module

    @pytest.mark.parametrize("threads", _THREADS, ids=lambda t: f"{t}thr")
    @pytest.mark.parametrize("peer_cls", tb.PEERS, ids=lambda c: c.name)
    @pytest.mark.parametrize("path", list(tb.PATHS))
    @pytest.mark.parametrize("text", ["english", "multilingual"])
    def test_tokenizer_throughput(benchmark, texts, reference, peers, text, path, peer_cls, threads):
        key = (peer_cls, threads)
        if key not in peers:
            try:
                peers[key] = peer_cls(model_dir(), threads)
            except ImportError as exc:
                if peer_cls is tb.FastbertPeer:
                    raise
                pytest.skip(f"{peer_cls.name} is not installed: {exc}")
        peer = peers[key]
        fn = getattr(peer, tb.PATHS[path])
        last = []

        def setup():  # outside the timed region: thread setting, cold caches, text no one has seen
            peer.before_repeat()
            peer.clear_cache()
            last[:] = tb.unseen(texts[text], next(_TAGS))
            return (last,), {}

        out = benchmark.pedantic(fn, setup=setup, rounds=3 if QUICK else 5, warmup_rounds=1)
        seconds = benchmark.stats.stats.median
        docs = list(last)
        nbytes = tb.corpus.total_bytes(docs)
        want = getattr(reference, tb.PATHS[path])(docs)
        match = tb.same_output(path, out, want)
        benchmark.extra_info.update({
            "name": peer_cls.name, "path": path, "text": text, "threads": threads, "text seen": "new each round",
            "MB/s": nbytes / seconds / 1e6, "tokens/s": tb.count_tokens(path, out) / seconds,
            "ids_match": match, "device": tb.device(), "versions": tb.versions(),
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")})
        assert match, f"{peer_cls.name} differs from BertTokenizerFast: " + \
            tb.first_difference(path, out, want, docs)


# ---- script -------------------------------------------------------------------------------------------

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 KB of each text, fewer repeats")
    parser.add_argument("--repeated", action="store_true",
                        help="also time the same text encoded again every round, caches kept (cache lookups)")
    parser.add_argument("--threads", default="1,all",
                        help="comma-separated thread counts; 'all' = every core (default 1,all)")
    parser.add_argument("--evict-caches", action="store_true",
                        help="write 64 MB before every timed call, so each starts on cold CPU caches")
    parser.add_argument("--no-latency", action="store_true",
                        help="skip the one-text-per-call latency table (fastbert.benchmarks.tokenizer_latency)")
    parser.add_argument("--scaling", action="store_true",
                        help="fastbert alone at each --threads count, interleaved: the 'vs 1 thread' ratios")
    parser.add_argument("--idle-gaps", metavar="MS,...",
                        help="fastbert alone at each --threads count, each call after the machine idled this "
                             "many ms (e.g. 0,1,3,10,30,100): what an idle core costs a thread pool")
    parser.add_argument("--after", metavar="PEER,...",
                        help="like --idle-gaps, each call right after one of these peers' calls on other new text "
                             "(nanotoken, tokenizers, BertTokenizerFast, fastbert; serial for 1 thread, parallel for "
                             "more; NAME/THREADS: at that count before every call, e.g. nanotoken/1): what another "
                             "call's work costs the next call")
    parser.add_argument("--work", nargs="?", const="padded128", metavar="PATH,...",
                        help="instructions per batch at each --threads count, counted under valgrind, for these "
                             "paths (ids, padded128; default padded128)")
    parser.add_argument("--peers", metavar="PEER,...",
                        help="the tokenizers timed beside fastbert in the peers' table (nanotoken, tokenizers, "
                             "BertTokenizerFast; 'none': fastbert alone; default: all)")
    parser.add_argument("--out", type=Path, default=RESULTS, help="folder of tokenizer.jsonl")
    args = parser.parse_args(argv)
    if args.peers is not None and (args.scaling or args.idle_gaps or args.after or args.work):
        parser.error("--peers chooses the peers' table's tokenizers; --scaling, --idle-gaps, --after and --work "
                     "time fastbert alone")
    try:
        peers = tb.PEERS if args.peers is None else tb.peer_classes(args.peers.split(","))
    except ValueError as exc:
        parser.error(str(exc))
    threads = tuple(None if t == "all" else int(t) for t in args.threads.split(","))
    config = {k: v for k, v in vars(args).items() if k != "out"}  # the settings, not where they were written
    if args.idle_gaps or args.after:
        gaps = tuple(float(g) if "." in g else int(g) for g in args.idle_gaps.split(",")) if args.idle_gaps else ()
        after = tuple(args.after.split(",")) if args.after else ()
        rows = ig.idle_gaps(model_dir(), gaps_ms=gaps, threads=threads, quick=args.quick, progress=say, after=after)
        print(f"{tb.device()}; versions {rows[0]['versions'] if rows else {}}")
        print(ig.format_idle_gaps(rows))
        print(f"appended to {append_run('tokenizer', rows, args.out, variant='idle_gaps', config=config)}")
        return 0
    if args.work:
        rows = tw.thread_work(model_dir(), paths=tuple(args.work.split(",")), threads=threads, quick=args.quick,
                              progress=say)
        print(f"{tb.device()}; versions {rows[0]['versions'] if rows else {}}")
        print(tw.format_work(rows))
        print(f"appended to {append_run('tokenizer', rows, args.out, variant='work', config=config)}")
        return 0
    if args.scaling:
        rows = tb.thread_scaling(model_dir(), quick=args.quick, threads=threads, progress=say)
        print(f"{tb.device()}; versions {rows[0]['versions'] if rows else {}}")
        print(tb.format_scaling(rows))
        print(f"appended to {append_run('tokenizer', rows, args.out, variant='scaling', config=config)}")
        return 1 if any(r.get("error") for r in rows) else 0
    rows = tb.run(model_dir(), quick=args.quick, threads=threads, repeated=args.repeated, progress=say, peers=peers,
                  evict_caches=args.evict_caches)
    print(f"{tb.device()}; versions {rows[0]['versions'] if rows else {}}")
    print(tb.format_table(rows))
    print(f"appended to {append_run('tokenizer', rows, args.out, variant='peers', config=config)}")
    if not args.no_latency:
        latency = tl.run(model_dir(), quick=args.quick, progress=say)
        print("\nOne text per call (serial; every round new text, caches cleared):")
        print(tl.format_table(latency))
        print(f"appended to {append_run('tokenizer', latency, args.out, variant='latency', config=config)}")
        rows = rows + latency
    return 1 if any(r.get("ids_match") is False for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
