"""fastbert on Ray Serve: the `fastbert serve` app (same routes, same token-budget batcher), one per
replica, behind Ray Serve's HTTP proxy.

    from ray import serve
    from fastbert.integrations.ray_serve import deployment

    app = deployment("path/or/hub-id", num_replicas=2, num_gpus=1).bind()
    serve.run(app, route_prefix="/")                    # POST /v1/embeddings, /embed, ... on :8000

or, from the shell, `fastbert serve MODEL --ray auto --replicas 2` (run() below: it starts Ray Serve
on --port and shuts it down on SIGTERM / SIGINT, answering 503 meanwhile). Replicas: a fixed `num_replicas`, or Ray's
`autoscaling_config` (e.g. {"min_replicas": 1, "max_replicas": 8, "target_ongoing_requests": 64});
`num_gpus` / `num_cpus` per replica. Each replica loads the model once (in its own process) and
batches the requests Ray routes to it; Ray sends a replica at most `max_concurrent` requests at a time
(its `max_ongoing_requests`) and queues the rest at its proxy, without limit unless the deployment's
`max_queued_requests` is set (`deployment(...).options(max_queued_requests=...)`). On shutdown a
replica's app drains its batcher as `fastbert serve` does.
"""
from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Optional


def deployment(model=None, *, num_replicas: int = 1, autoscaling_config: Optional[dict] = None,
               num_gpus: float = 0, num_cpus: Optional[float] = None, max_concurrent: int = 512,
               name: str = "fastbert", **options):
    """A Ray Serve deployment (call .bind() for the application) serving `model` (a directory or
    hub id every replica can read; None: the packaged all-MiniLM-L6-v2). options: those of
    fastbert.serve.server.build (device, dtype, quantize, model_name, max_batch_tokens,
    max_batch_requests, api_key)."""
    from ray import serve

    actor = {"num_gpus": num_gpus, **({} if num_cpus is None else {"num_cpus": num_cpus})}
    scale = {"autoscaling_config": autoscaling_config} if autoscaling_config else {"num_replicas": num_replicas}

    @serve.deployment(name=name, ray_actor_options=actor, max_ongoing_requests=max_concurrent, **scale)
    @serve.ingress()
    class FastbertServer:
        def __init__(self):
            from fastbert.serve.server import build
            self._app = build(model, max_concurrent=max_concurrent, **options)

        def __serve_build_asgi_app__(self):
            return self._app

    return FastbertServer


def _draining(name: str):
    """The stand-in `run` deploys at shutdown in the app's place: every request (any route, /health
    too, so that load balancers look elsewhere) gets a 503 with Retry-After while the replicas finish
    what they hold. No CPU of its own: it starts on a cluster the replicas fill."""
    from ray import serve

    async def app(scope, receive, send):
        from fastbert.serve.app import ApiError, _error_response

        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        error = ApiError(503, "fastbert serve is shutting down; retry on another server", kind="Unhealthy")
        await _error_response(error, scope["path"].startswith("/v1/"))(scope, receive, send)

    @serve.deployment(name=f"{name}-draining", ray_actor_options={"num_cpus": 0})
    @serve.ingress()
    class Draining:
        def __serve_build_asgi_app__(self):
            return app

    return Draining


def _init_address(address: str) -> Optional[str]:
    """What ray.init gets for --ray ADDRESS: None for "auto" (ray.init's own search: $RAY_ADDRESS, a
    cluster `ray start` started on this machine, else a new local one), "local" as it is, else the
    address, once something listens there (Ray itself retries an address where nothing answers for
    minutes). A cluster address from $RAY_ADDRESS is checked alike."""
    if address == "local":
        return address
    target = os.environ.get("RAY_ADDRESS") if address == "auto" else address
    if target and target not in ("auto", "local"):
        scheme, _, hostport = target.rpartition("://")
        host, _, port = hostport.rpartition(":")
        if not port.isdigit() and scheme == "ray":          # Ray Client's default port
            host, port = hostport, "10001"
        if not host or not port.isdigit():
            raise ConnectionError(f"{target!r} is not a Ray cluster address: give 'auto', 'local', host:port "
                                  "or ray://host:port")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
        except OSError as exc:
            raise ConnectionError(f"no Ray cluster answers at {target} ({exc})") from None
    return None if address == "auto" else address


def run(model=None, address: str = "auto", host: str = "127.0.0.1", port: int = 8000, num_replicas: int = 1,
        num_gpus: float = 0, **options) -> int:
    """`fastbert serve --ray ADDRESS`: connect to the cluster ("auto": as ray.init() finds one, else
    a new local one; "local": a new one in this process; host:port or ray://host:port), start Ray
    Serve's proxy on host:port, deploy the app, serve until SIGTERM / SIGINT, then shut Serve down:
    a stand-in answers 503 at the app's route while the replicas finish what they hold, then the
    proxy and controller stop (the port is free) and the cluster keeps running. Raises
    ConnectionError when the cluster cannot be reached, RuntimeError when Ray Serve already runs
    there or the app fails to deploy."""
    import ray
    from ray import serve

    if model is not None and Path(model).exists():   # replicas run in Ray's working directory, not ours
        model = str(Path(model).resolve())
    try:
        ray.init(address=_init_address(address), ignore_reinit_error=True)
    except ConnectionError as exc:     # the reason (e.g. a missing auth token) ends the cause's traceback text
        reason = str(exc.__cause__ or "").strip().splitlines()
        raise ConnectionError(f"{exc}: {reason[-1]}" if reason else str(exc)) from None
    # Serve is one instance per cluster, and a running one keeps its HTTP port: deploying into it
    # would ignore --port and could replace another app. This command starts Serve and stops it.
    running = serve.status()
    if running.proxies or running.applications:
        apps = ", ".join(running.applications) or "none"
        raise RuntimeError(f"Ray Serve already runs on the cluster at {address} (applications: {apps}); "
                           "stop it (`serve shutdown -y`, or ray.serve.shutdown() in Python) or deploy with "
                           "fastbert.integrations.ray_serve.deployment into it")

    def interrupt(*_):                 # SIGTERM as Ctrl-C: it also ends a serve.run still waiting for replicas
        raise KeyboardInterrupt
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, interrupt)
    deployed = False
    try:
        serve.start(http_options={"host": host, "port": port})
        serve.run(deployment(model, num_replicas=num_replicas, num_gpus=num_gpus, **options).bind(),
                  name="fastbert", route_prefix="/")
        deployed = True
        print(f"fastbert serve: {num_replicas} replica(s) on Ray at {address}, http://{host}:{port}",
              file=sys.stderr, flush=True)
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):     # a second signal does not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        # the app first, behind a live proxy: deleting it would take its route away (the proxy answered
        # 404 meanwhile); deploying the stand-in in its place keeps the route, answers new requests 503,
        # and stops the replicas gracefully (each answers what it holds). Then the proxy and controller.
        try:
            if deployed:
                serve.run(_draining("fastbert").bind(), name="fastbert", route_prefix="/")
                deadline = time.monotonic() + 120
                while "fastbert" in serve.status().applications["fastbert"].deployments and time.monotonic() < deadline:
                    time.sleep(0.2)
            elif "fastbert" in serve.status().applications:
                serve.delete("fastbert")
        finally:
            serve.shutdown()
    print("fastbert serve: stopped; Ray Serve shut down", file=sys.stderr, flush=True)
    return 0
