"""Shared by tests/serve: tiny checkpoints of each kind a server runs, an in-process client, a live
server on 127.0.0.1 in a thread, and a runner whose batches wait for the test."""
import asyncio
import contextlib
import copy
import json
import os
import socket
import threading
import time

import httpx

import tiny_bert


def tiny_checkpoints(root) -> dict:
    """kind -> checkpoint directory: a reranker (one label), a 3-label classifier, and a SPLADE
    SparseEncoder folder (modules.json: MLM transformer + SpladePooling) as sentence-transformers saves it."""
    out = {
        "reranker": tiny_bert.save(root, "BertForSequenceClassification", name="reranker", num_labels=1),
        "classifier": tiny_bert.save(root, "BertForSequenceClassification", name="classifier",
                                     labels=["contradiction", "neutral", "entailment"]),
        "sparse": tiny_bert.save(root, "BertForMaskedLM", name="splade"),
    }
    modules = [{"idx": 0, "name": "0", "path": "",
                "type": "sentence_transformers.sparse_encoder.modules.mlm_transformer.MLMTransformer"},
               {"idx": 1, "name": "1", "path": "1_SpladePooling",
                "type": "sentence_transformers.sparse_encoder.modules.splade_pooling.SpladePooling"}]
    with open(os.path.join(out["sparse"], "modules.json"), "w") as f:
        json.dump(modules, f)
    with open(os.path.join(out["sparse"], "config_sentence_transformers.json"), "w") as f:
        json.dump({"model_type": "SparseEncoder", "prompts": {}, "default_prompt_name": None}, f)
    os.makedirs(os.path.join(out["sparse"], "1_SpladePooling"))
    with open(os.path.join(out["sparse"], "1_SpladePooling", "config.json"), "w") as f:
        json.dump({"pooling_strategy": "max", "activation_function": "relu",
                   "word_embedding_dimension": len(tiny_bert.VOCAB)}, f)
    return out


def call(app, *requests):
    """Run requests (method, path, json or bytes, headers) against the app in-process, concurrently;
    returns the httpx responses in order."""
    async def main():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://serve", timeout=60) as client:
            async def one(method, path, body=None, headers=None):
                kwargs = {"content": body} if isinstance(body, (bytes, str)) else {"json": body}
                return await client.request(method, path, headers=headers, **({} if body is None else kwargs))
            return await asyncio.gather(*(one(*r) for r in requests))
    return asyncio.run(main())


def post(app, path, body, headers=None):
    return call(app, ("POST", path, body, headers))[0]


def gated(runner):
    """A copy of `runner` whose batches wait for `copy.gate` (a threading.Event) and are recorded
    in `copy.batches` (lists of token id rows)."""
    out = copy.copy(runner)
    out.gate, out.batches = threading.Event(), []

    def run(seqs):
        out.batches.append([list(s.ids) for s in seqs])
        if not out.gate.wait(60):
            raise TimeoutError("the test never opened the gate")
        return runner.run(seqs)
    out.run = run
    return out


@contextlib.contextmanager
def live_server(app):
    """uvicorn serving `app` on 127.0.0.1 (a free port) in a thread; yields the base URL."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def spawned_server(*args, timeout: float = 120):
    """`fastbert serve ARGS` in a child process on a free port of 127.0.0.1; yields (process, base
    URL) once /health answers; kills the process if the test left it running."""
    import subprocess
    import sys

    port = free_port()
    # one torch thread: these tests check behaviour, and on a shared machine OpenMP threads waiting for
    # a descheduled partner made one forward 30x slower (1.2 s instead of 40 ms on 2 busy cores)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fastbert", "serve", "--port", str(port), "--log-level",
                             "warning", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"fastbert serve exited with {proc.returncode}: {proc.stdout.read()}")
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("fastbert serve did not start in time")
            time.sleep(0.2)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
