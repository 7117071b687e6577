"""`fastbert bench --serve`: `fastbert serve` against the servers users run, over HTTP on 127.0.0.1.

Servers, each in its own process, the same model (all-MiniLM-L6-v2 by default) on the CPU:
- fastbert: `fastbert serve` (token-budget batching, one model thread);
- handwritten: sentence-transformers' SentenceTransformer.encode called once per request inside a
  FastAPI route with the same OpenAI-shaped body (serve_peer.py): what users write by hand, no
  batching across requests;
- infinity: `infinity_emb v2` (infinity-emb, its torch engine) when the command is found (on PATH, or
  named by $FASTBERT_BENCH_INFINITY); else a row saying why not.
Clients: 1, 16 and 64 at a time (asyncio in this process, one keep-alive HTTP/1.1 connection per
client writing a prepared request and reading the answer's status and body: a general client such as
httpx spends about 1 ms of Python a request, as much as a server's own work, and these figures are
the servers'), one English line per request (pydoc lines of mixed length) to POST /v1/embeddings
(infinity: /embeddings), each level for a fixed time after a warm-up. Direct:
fastbert.Encoder.encode([line]) in this process on the same lines: the latency a server adds to,
timed in turn with fastbert's one-client level (a direct call, then the same line to the server, and
so on), so that the two p99s compared by the bar see the same moments of the machine. Servers and
levels are measured in turns, `rounds` times;
each figure is the median over rounds. Every server's vectors are checked against Encoder.encode.

Bars (issue: serve it): fastbert >= 2x the handwritten server's requests/s at 16 clients; fastbert's
p99 at 1 client <= 1.2x the direct call's p99.
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LEVELS = (1, 16, 64)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A server process on 127.0.0.1; `path` is its OpenAI embeddings route."""

    def __init__(self, name: str, argv: list, path: str, port: int, model: str):
        self.name, self.path, self.model = name, path, model
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile("w+")              # its output, shown when it fails
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT)

    def tail(self, lines: int = 5) -> str:
        self.log.seek(0)
        return " | ".join(self.log.read().strip().splitlines()[-lines:])

    def wait(self, health: str, timeout: float = 600):
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            try:
                if httpx.get(self.url + health, timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not answer {health} within {timeout:.0f} s")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def infinity_command(given: str | None = None) -> str | None:
    return given or os.environ.get("FASTBERT_BENCH_INFINITY") or shutil.which("infinity_emb")


def model_name(model_dir) -> str:
    """The model as a name (results name no local paths): the packaged MiniLM's, else the folder's."""
    from fastbert.hub import default_model_dir

    try:
        if Path(model_dir).resolve() == Path(default_model_dir()).resolve():
            return "sentence-transformers/all-MiniLM-L6-v2"
    except FileNotFoundError:
        pass
    return Path(model_dir).name


def infinity_version(command: str | None) -> str | None:
    """infinity-emb's version, read by the Python its command runs on (its own environment)."""
    if not command:
        return None
    try:
        with open(command, encoding="utf-8", errors="replace") as f:
            shebang = f.readline()
        python = shebang[2:].strip() if shebang.startswith("#!") else sys.executable
        out = subprocess.run([python, "-c", "from importlib.metadata import version; print(version('infinity-emb'))"],
                             capture_output=True, text=True, timeout=60)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def start_servers(model_dir: str, infinity: str | None) -> tuple[list, list]:
    """(running servers, rows for those that could not run)."""
    servers, notes = [], []
    port = _free_port()
    servers.append((Server("fastbert", [sys.executable, "-m", "fastbert", "serve", str(model_dir), "--port", str(port),
                                        "--device", "cpu", "--log-level", "warning"], "/v1/embeddings", port, "m"),
                    "/health"))
    port = _free_port()
    servers.append((Server("handwritten", [sys.executable, "-m", "fastbert.benchmarks.serve_peer", str(model_dir),
                                           str(port)], "/v1/embeddings", port, "m"), "/docs"))
    infinity = infinity_command(infinity)
    if infinity:
        port = _free_port()
        servers.append((Server("infinity", [infinity, "v2", "--model-id", str(model_dir), "--port", str(port),
                                            "--engine", "torch", "--device", "cpu", "--log-level", "warning"],
                               "/embeddings", port, str(model_dir)), "/health"))
    else:
        notes.append({"server": "infinity", "note": "infinity-emb is not installed here: its requirements "
                      "(numpy<2, sentence-transformers<4, transformers<5) conflict with fastbert's test "
                      "environment; install it in its own venv and set FASTBERT_BENCH_INFINITY=<its infinity_emb>"})
    ready = []
    for server, health in servers:
        try:
            server.wait(health)
            ready.append(server)
        except RuntimeError as exc:
            notes.append({"server": server.name, "note": str(exc)})
            server.stop()
    return ready, notes


def requests(server, texts: list) -> list:
    """Each text's whole HTTP request to the server's embeddings route, as bytes (made before timing)."""
    head = f"POST {server.path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    out = []
    for text in texts:
        body = json.dumps({"input": [text], "model": server.model}).encode("utf-8")
        out.append(f"{head}Content-Length: {len(body)}\r\n\r\n".encode("ascii") + body)
    return out


class Connection:
    """One keep-alive HTTP/1.1 connection to 127.0.0.1: send a prepared request, read the answer's
    status and body (Content-Length bodies, as these servers send them)."""

    def __init__(self, url: str):
        self.host, self.port = url.rsplit("/", 1)[-1].split(":")
        self.reader = self.writer = None

    async def post(self, request: bytes) -> int:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, int(self.port))
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = re.search(rb"\r\ncontent-length: *(\d+)", head, re.IGNORECASE)
        if length is None:
            raise ConnectionError(f"an answer without Content-Length: {head[:200]!r}")
        await self.reader.readexactly(int(length[1]))
        if re.search(rb"\r\nconnection: *close", head, re.IGNORECASE):
            self.close()
        return int(head.split(b" ", 2)[1])

    def close(self):
        if self.writer is not None:
            self.writer.close()
            self.reader = self.writer = None


async def _level(server, prepared: list, clients: int, seconds: float) -> dict:
    """`clients` concurrent clients, one text per request, for `seconds`: requests/s, p50/p99 ms."""
    latencies, errors = [], {}
    connections = [Connection(server.url) for _ in range(clients)]
    try:
        # warm-up: connections, first calls
        await asyncio.gather(*(c.post(prepared[k]) for k, c in enumerate(connections)))
        stop = time.perf_counter() + seconds

        async def client(k: int):
            i, connection = k, connections[k]
            while time.perf_counter() < stop:
                start = time.perf_counter()
                try:
                    status = await connection.post(prepared[i % len(prepared)])
                    kind = None if status == 200 else f"HTTP {status}"
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                    kind = type(exc).__name__         # a dropped connection: a lost request
                    connection.close()
                if kind is None:
                    latencies.append(time.perf_counter() - start)
                else:
                    errors[kind] = errors.get(kind, 0) + 1
                i += clients
        began = time.perf_counter()
        await asyncio.gather(*(client(k) for k in range(clients)))
        wall = time.perf_counter() - began
    finally:
        for connection in connections:
            connection.close()
    return _summary(latencies, wall, errors)


def _summary(latencies: list, wall: float, errors: dict | None = None) -> dict:
    import numpy as np

    p50, p99 = (np.percentile(latencies, [50, 99]) * 1000).tolist() if latencies else (None, None)
    return {"req/s": len(latencies) / wall if wall else None, "p50 ms": p50, "p99 ms": p99,
            "requests": len(latencies), "errors": sum((errors or {}).values()), "error kinds": errors or {}}


async def _paired(server, prepared: list, call, seconds: float) -> tuple:
    """One client, each request in turn with the direct call on the same line (call(i) runs line i in
    this process): (the server's summary, the direct call's). Both see the machine as it is at that
    moment, so a busy spell on this shared machine lands on both and not on one side's whole run."""
    server_latencies, direct_latencies, errors = [], [], {}
    connection = Connection(server.url)
    try:
        await connection.post(prepared[0])                      # warm-up: the connection, first calls
        for i in range(4):
            call(i)
        stop, i = time.perf_counter() + seconds, 0
        while time.perf_counter() < stop:
            start = time.perf_counter()
            call(i % len(prepared))
            direct_latencies.append(time.perf_counter() - start)
            start = time.perf_counter()
            try:
                status = await connection.post(prepared[i % len(prepared)])
                kind = None if status == 200 else f"HTTP {status}"
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                kind = type(exc).__name__
                connection.close()
            if kind is None:
                server_latencies.append(time.perf_counter() - start)
            else:
                errors[kind] = errors.get(kind, 0) + 1
            i += 1
    finally:
        connection.close()
    # a closed loop of one: requests/s is each side's own time, not the pair's
    return (_summary(server_latencies, sum(server_latencies), errors),
            _summary(direct_latencies, sum(direct_latencies)))


def _check(server, encoder, texts: list) -> float:
    """The smallest cosine between the server's vectors and Encoder.encode's, on a few texts."""
    import httpx
    import numpy as np

    r = httpx.post(server.url + server.path, json={"input": texts, "model": server.model}, timeout=120)
    r.raise_for_status()
    got = np.array([d["embedding"] for d in sorted(r.json()["data"], key=lambda d: d["index"])])
    ref = encoder.encode(texts)
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    return float(cos.min())


def run(model_dir, rounds: int = 3, seconds: float = 8.0, quick: bool = False, infinity: str | None = None,
        progress=print) -> tuple[list, dict]:
    """(figure rows, config): one row per server and client count, and one for the direct call."""
    import fastbert
    from fastbert.benchmarks.corpus import pydoc_lines

    if quick:
        rounds, seconds = min(rounds, 2), min(seconds, 4.0)
    texts = [t for t in pydoc_lines(4000) if t.strip()][:2000]
    encoder = fastbert.Encoder.from_pretrained(model_dir, device="cpu")
    progress(f"starting the servers ({model_dir})")
    servers, rows = start_servers(model_dir, infinity)
    measured = {}
    try:
        checks = {s.name: _check(s, encoder, texts[:16]) for s in servers}
        prepared = {s.name: requests(s, texts) for s in servers}
        for r in range(rounds):
            progress(f"round {r + 1}/{rounds}")
            for server in servers:
                if server.proc.poll() is not None:
                    continue
                for clients in LEVELS:
                    if server.name == "fastbert" and clients == 1:      # in turn with the direct call
                        row, direct = asyncio.run(_paired(server, prepared[server.name],
                                                          lambda i: encoder.encode([texts[i]]), seconds))
                        measured.setdefault(("direct", 1), []).append(direct)
                    else:
                        row = asyncio.run(_level(server, prepared[server.name], clients, seconds))
                    measured.setdefault((server.name, clients), []).append(row)
        for server in servers:
            if server.proc.poll() is not None:
                rows.append({"server": server.name, "note": f"exited with {server.proc.returncode} during the "
                                                            f"run: {server.tail()}"})
    finally:
        for server in servers:
            server.stop()
    medians = {}
    for (name, clients), runs in measured.items():
        row = {"server": name, "clients": clients}
        for key in ("req/s", "p50 ms", "p99 ms"):
            values = [x[key] for x in runs if x[key] is not None]
            row[key] = statistics.median(values) if values else None
            row[key.replace(" ms", "") + " range"] = [min(values), max(values)] if values else None
        row["errors"] = sum(x["errors"] for x in runs)
        kinds = {}
        for x in runs:
            for kind, n in x["error kinds"].items():
                kinds[kind] = kinds.get(kind, 0) + n
        if kinds:
            row["error kinds"] = kinds
        if name in checks:
            row["min cosine vs Encoder"] = checks[name]
        medians[(name, clients)] = row
    for (name, clients), row in medians.items():
        hand = medians.get(("handwritten", clients))
        if name != "direct" and hand and hand["req/s"] and row["req/s"]:
            row["vs handwritten req/s"] = row["req/s"] / hand["req/s"]
    direct = medians.get(("direct", 1))
    fb1 = medians.get(("fastbert", 1))
    if fb1 and direct and fb1["p99 ms"] and direct["p99 ms"]:
        fb1["p99 vs direct"] = fb1["p99 ms"] / direct["p99 ms"]
    config = {"model": model_name(model_dir), "rounds": rounds, "seconds per level": seconds,
              "levels": list(LEVELS), "texts": len(texts), "torch threads": __import__("torch").get_num_threads(),
              "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "quick": quick,
              "infinity-emb": infinity_version(infinity_command(infinity))}
    return list(medians.values()) + rows, config


def bars(rows: list) -> list:
    """The issue's two bars as lines of text, met or not."""
    by = {(r.get("server"), r.get("clients")): r for r in rows}
    out = []
    fb16 = by.get(("fastbert", 16), {})
    if fb16.get("vs handwritten req/s") is not None:
        x = fb16["vs handwritten req/s"]
        out.append(f"16 clients: fastbert {x:.2f}x the handwritten server's requests/s (bar >= 2x): "
                   f"{'met' if x >= 2 else 'NOT met'}")
    fb1 = by.get(("fastbert", 1), {})
    if fb1.get("p99 vs direct") is not None:
        x = fb1["p99 vs direct"]
        out.append(f"1 client: fastbert's p99 {x:.2f}x the direct Encoder.encode call's (bar <= 1.2x): "
                   f"{'met' if x <= 1.2 else 'NOT met'}")
    return out


def table(rows: list) -> str:
    def num(v, fmt):
        return "—" if v is None else format(v, fmt)

    lines = ["| server | clients | req/s | p50 ms | p99 ms | vs handwritten req/s | min cosine | failed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "note" in r:
            lines.append(f"| {r['server']} | — | — | — | — | — | — | {r['note']} |")
            continue
        lines.append(f"| {r['server']} | {r['clients']} | {num(r['req/s'], '.0f')} | {num(r['p50 ms'], '.1f')} | "
                     f"{num(r['p99 ms'], '.1f')} | {num(r.get('vs handwritten req/s'), '.2f')} | "
                     f"{num(r.get('min cosine vs Encoder'), '.6f')} | {r['errors']} |")
    return "\n".join(lines)


def main_bench(model_dir, output_dir, quick: bool = False, rounds: int = 3, command: str | None = None) -> int:
    """`fastbert bench --serve`: measure, print the table and the bars, append a line to serve.jsonl."""
    from fastbert.benchmarks import results
    from fastbert.benchmarks.env import versions

    rows, config = run(model_dir, rounds=rounds, quick=quick, progress=lambda m: print(m, file=sys.stderr, flush=True))
    if command and os.environ.get("OMP_NUM_THREADS"):      # the threads every server ran with
        command = f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']} {command}"
    print(table(rows))
    for line in bars(rows):
        print(line)
    found = versions(("fastbert", "torch", "transformers", "sentence-transformers", "fastapi", "uvicorn", "httpx"))
    found["infinity-emb"] = config["infinity-emb"]        # from its own environment
    row = results.record("serve", rows, variant="quick" if quick else None, config=config, command=command,
                         versions=found)
    path = results.append(row, output_dir)
    print(f"appended to {path}")
    # exit 1 for a wrong result: vectors unlike Encoder.encode's, or requests fastbert lost
    bad = [r for r in rows if r.get("min cosine vs Encoder") is not None and r["min cosine vs Encoder"] < 0.9999]
    return 1 if bad or any(r.get("errors") for r in rows if r.get("server") == "fastbert") else 0

