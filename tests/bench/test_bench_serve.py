"""`fastbert bench --serve`'s client: one keep-alive connection, prepared requests, the answer's
status and whole body read, a level's latencies and errors counted (against a small Starlette app
under uvicorn in a thread; the bench itself starts real servers and is not run here)."""
import asyncio
import json
import socket
import threading
import time

import pytest

uvicorn = pytest.importorskip("uvicorn", reason="the serve bench needs uvicorn (the bench extra)")
pytest.importorskip("starlette", reason="the serve bench needs starlette (the bench extra)")

from fastbert.benchmarks import serve as serve_bench  # noqa: E402


def _app(seen: list):
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def embeddings(request):
        body = await request.json()
        seen.append(body["input"][0])
        if body["input"][0] == "refused":
            return Response(b'{"error": "full"}', status_code=429, media_type="application/json")
        headers = {"Connection": "close"} if body["input"][0] == "last" else None
        return Response(json.dumps({"echo": body["input"][0] * 1000}).encode(), media_type="application/json",
                        headers=headers)
    return Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])


@pytest.fixture
def server():
    """(a Server-like object for the app on a free port, the texts the app received)."""
    seen = []
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    live = uvicorn.Server(uvicorn.Config(_app(seen), log_level="warning", access_log=False))
    thread = threading.Thread(target=live.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not live.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the test server did not start"
        time.sleep(0.02)

    class Target:
        url, path, model = f"http://127.0.0.1:{sock.getsockname()[1]}", "/v1/embeddings", "m"
    try:
        yield Target, seen
    finally:
        live.should_exit = True
        thread.join(30)
        sock.close()


def test_connection_keeps_alive_and_reads_whole_answers(server):
    target, seen = server
    texts = ["héllo", "world " * 50, "refused", "last", "again"]
    prepared = serve_bench.requests(target, texts)

    async def main():
        connection = serve_bench.Connection(target.url)
        statuses = [await connection.post(request) for request in prepared]
        connection.close()
        return statuses
    # a 6 kB answer read whole (else the next status line would be garbage); "last" closes the
    # connection, and the next request opens a new one
    assert asyncio.run(main()) == [200, 200, 429, 200, 200]
    assert seen == texts


def test_level_counts_latencies_and_errors(server):
    target, seen = server
    prepared = serve_bench.requests(target, ["a", "b", "refused", "c"])
    row = asyncio.run(serve_bench._level(target, prepared, 2, 0.5))
    assert row["requests"] > 0 and row["errors"] > 0 and set(row["error kinds"]) == {"HTTP 429"}
    assert row["p50 ms"] > 0 and row["req/s"] > 0


def test_paired_level_takes_turns_with_the_direct_call(server):
    target, seen = server
    texts = ["a", "b", "refused", "c"]
    prepared = serve_bench.requests(target, texts)
    order = []

    def call(i):
        order.append(("direct", texts[i]))
        time.sleep(0.002)
    row, direct = asyncio.run(serve_bench._paired(target, prepared, call, 0.5))
    # after the warm-up (one request, four direct calls) each direct call on line i is followed by
    # the server's request for the same line
    served = seen[1:]
    timed = order[4:]
    assert len(timed) == len(served) and [t for _, t in timed] == served
    assert row["requests"] + row["errors"] == direct["requests"] > 4
    assert set(row["error kinds"]) == {"HTTP 429"} and direct["errors"] == 0
    assert direct["p50 ms"] >= 2.0 and row["p50 ms"] > 0
