"""`fastbert serve` as a process under load, on 127.0.0.1 only (slow: tens of seconds each).

- 2,000 requests from up to 64 concurrent clients, mixed lengths, both embedding routes: nothing is
  lost, every answer is the right one for its request (Encoder.encode within 1e-5), 429 appears only
  when more requests than --max-concurrent are outstanding (never with fewer clients than the cap),
  and p50 / p99 latency and throughput are reported.
- SIGTERM during load: every request the server had read is answered (200, right values), the
  process exits 0, and the count of answers the clients got equals the count the server gave.
"""
import asyncio
import random
import re
import signal
import threading
import time

import numpy as np
import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn", reason="fastbert serve needs the serve extra (uvicorn)")

import fastbert  # noqa: E402
from serve_helpers import spawned_server  # noqa: E402

pytestmark = pytest.mark.slow
CAP = 48
WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact river bank light music water story city night "
         "paper house market money game line end member law car name business").split()


def texts_pool(n: int = 240, seed: int = 0) -> list:
    """Distinct texts, mostly short (as queries; 2-12 words), a fifth medium, one in twenty long."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words = rng.choice([rng.randint(2, 12)] * 15 + [rng.randint(16, 48)] * 4 + [rng.randint(80, 150)])
        out.append(f"{i} " + " ".join(rng.choice(WORDS) for _ in range(words)))
    return out


@pytest.fixture(scope="module")
def pool(model_dir):
    texts = texts_pool()
    encoder = fastbert.Encoder.from_pretrained(model_dir, device="cpu")
    return texts, {t: v for t, v in zip(texts, encoder.encode(texts, batch_size=64))}


async def drive(url: str, requests: list, clients: int, reference: dict):
    """Send `requests` ((route, texts)) from `clients` concurrent clients, each retrying after a
    429; returns (latencies of the answers, [the most requests outstanding while each 429 was on its
    way], wall seconds). The most, not the count when the 429 arrives: by then other answers may have
    come back, below the count the server saw when it refused."""
    queue = list(enumerate(requests))
    latencies, rejected, outstanding, peaks = [], [], 0, {}
    answered = [None] * len(requests)

    async def client(http):
        nonlocal outstanding
        while queue:
            i, (route, texts) = queue.pop()
            while True:
                body = {"input": texts} if route == "/v1/embeddings" else {"inputs": texts}
                outstanding += 1
                peak = peaks[i] = [outstanding]
                for other in peaks.values():             # each request in flight keeps the most it saw
                    other[0] = max(other[0], outstanding)
                start = time.perf_counter()
                r = await http.post(url + route, json=body)
                del peaks[i]
                outstanding -= 1
                if r.status_code == 429:
                    rejected.append(peak[0])
                    await asyncio.sleep(0.05)              # back off, as a client told Retry-After would
                    continue
                assert r.status_code == 200, r.text
                latencies.append(time.perf_counter() - start)
                data = r.json()
                answered[i] = [d["embedding"] for d in data["data"]] if route == "/v1/embeddings" else data
                break

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    began = time.perf_counter()
    async with httpx.AsyncClient(limits=limits, timeout=120) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    wall = time.perf_counter() - began
    for (_, texts), got in zip(requests, answered):            # each answer is its request's
        assert got is not None and len(got) == len(texts)
        assert np.abs(np.asarray(got) - np.stack([reference[t] for t in texts])).max() <= 1e-5
    return latencies, rejected, wall


def test_load_2000_requests_64_clients(pool):
    texts, reference = pool
    rng = random.Random(1)
    requests = [(rng.choice(["/v1/embeddings", "/embed"]), rng.sample(texts, rng.choice([1, 1, 1, 1, 2, 3])))
                for _ in range(2000)]
    with spawned_server("--max-concurrent", str(CAP)) as (proc, url):
        below = asyncio.run(drive(url, requests[:400], CAP // 2, reference))
        above = asyncio.run(drive(url, requests[400:], 64, reference))
        metrics = httpx.get(url + "/metrics").text
    assert below[1] == []                                           # fewer clients than the cap: no 429
    assert above[1], "64 clients against a cap of 48 never got a 429"
    assert min(above[1]) > CAP                                      # a 429 only with more than CAP outstanding
    served = sum(float(m) for m in re.findall(r'fastbert_requests_total\{route="/[^"]+",status="200"\} (\S+)', metrics))
    assert served == 2000
    for name, (latencies, rejected, wall) in (("24 clients", below), ("64 clients", above)):
        p50, p99 = np.percentile(latencies, [50, 99]) * 1000
        print(f"\nload {name}: {len(latencies)} requests in {wall:.1f} s = {len(latencies) / wall:.0f} req/s, "
              f"p50 {p50:.0f} ms, p99 {p99:.0f} ms, {len(rejected)} answered 429 (then retried)")


def test_sigterm_during_load_loses_no_accepted_request(pool):
    texts, reference = pool
    results, stop = [], threading.Event()

    def client(seed):
        rng = random.Random(seed)
        with httpx.Client(timeout=120) as http:
            while not stop.is_set():
                batch = rng.sample(texts, 4)
                sent = time.monotonic()
                try:
                    r = http.post(url + "/embed", json={"inputs": batch})
                except httpx.TransportError as exc:           # refused / closed: the server had not read it
                    results.append((sent, None, batch, exc))
                    if isinstance(exc, httpx.ConnectError):
                        return
                    continue
                results.append((sent, r.status_code, batch, r.json()))

    with spawned_server() as (proc, url):
        threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:                     # wait until the server holds requests
            line = [x for x in httpx.get(url + "/metrics").text.splitlines()
                    if x.startswith("fastbert_requests_in_flight ")]
            if line and float(line[0].split()[1]) >= 8 and len(results) >= 16:
                break
            time.sleep(0.05)
        terminated = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(90)
        stop.set()
        for t in threads:
            t.join(60)
        log = proc.stdout.read()
    assert code == 0, log
    answered = [r for r in results if r[1] is not None]
    assert {r[1] for r in answered} == {200}
    for _, _, batch, data in answered:
        assert np.abs(np.asarray(data) - np.stack([reference[t] for t in batch])).max() <= 1e-5
    after = [r for r in answered if r[0] > terminated]
    in_drain = [r for r in answered if r[0] <= terminated]
    assert len(in_drain) >= 16
    counted = re.search(r"answered (\d+) requests \(([^)]*)\)", log)
    assert counted, log
    by_status = dict(item.split(": ") for item in counted.group(2).split(", "))
    # the server's count of answers (POST routes only) is the clients' count: none lost on the way
    assert by_status == {"200": str(len(answered))}, (by_status, len(answered), len(after))
