"""Facts about where a benchmark runs, shared by every measurement module and bench/ script."""
from __future__ import annotations

import platform
from importlib import metadata
from pathlib import Path


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions(dists) -> dict:
    """{"python": ..., dist: version or None} for the packages a result row depends on."""
    return {"python": platform.python_version(), **{dist: version(dist) for dist in dists}}


def _speedup(work, workers: int):
    """A function that times ``work(i)`` on threads 0 and on threads 0..workers-1 side by side and
    returns how much more work per second the many did (workers x one thread's time / their time)."""
    import threading
    import time

    def timed(n: int) -> float:
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return time.perf_counter() - start

    timed(workers)  # the first pass pays for the first touches of every thread's buffers and the code
    return lambda: workers * timed(1) / timed(workers)


def parallel_ceiling(workers: int, samples: int = 1, nbytes: int = 32 << 20) -> list[float]:
    """How much faster ``workers`` threads do ``workers`` times the work of one, on plain CPU-bound C
    work that releases the GIL (SHA-256 of ``nbytes`` each): the most any thread pool can gain here
    at this moment, ``samples`` times. Below ``workers`` when virtual cores share a physical one or
    the host is busy."""
    import hashlib

    data = b"\x01" * nbytes  # written, so its pages are mapped before anything is timed
    sample = _speedup(lambda i: hashlib.sha256(data).digest(), workers)
    return [sample() for _ in range(samples)]


def lookup_ceiling(workers: int, samples: int = 1, lookups: int = 1 << 22) -> list[float]:
    """The same on work shaped like a tokenizer's: ``lookups`` random reads from a table of 1 MB per
    thread (numpy's take, GIL released), served by the CPU caches. On a virtual machine it can fall
    well below the SHA-256 ceiling for a while (1.06x against 1.85x, medians of one --scaling run,
    bench/results/tokenizer.jsonl, source tokenizer-scaling-20261205T020737.json), when the physical
    cores' caches are shared with other load."""
    import numpy as np

    rng = np.random.default_rng(0)
    tables = [rng.integers(0, 1 << 30, 1 << 18, dtype=np.int32) for _ in range(workers)]
    where = [rng.integers(0, 1 << 18, lookups).astype(np.intp) for _ in range(workers)]
    sample = _speedup(lambda i: tables[i].take(where[i]), workers)
    return [sample() for _ in range(samples)]
