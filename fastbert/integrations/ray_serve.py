"""fastbert on Ray Serve: the `fastbert serve` app (same routes, same token-budget batcher), one per
replica, behind Ray Serve's HTTP proxy.

    from ray import serve
    from fastbert.integrations.ray_serve import deployment

    app = deployment("path/or/hub-id", num_replicas=2, num_gpus=1).bind()
    serve.run(app, route_prefix="/")                    # POST /v1/embeddings, /embed, ... on :8000

or, from the shell, `fastbert serve MODEL --ray auto --replicas 2`. Replicas: a fixed `num_replicas`,
or Ray's `autoscaling_config` (e.g. {"min_replicas": 1, "max_replicas": 8,
"target_ongoing_requests": 64}); `num_gpus` / `num_cpus` per replica. Each replica loads the model
once (in its own process) and batches the requests Ray routes to it; Ray sends a replica at most
`max_concurrent` requests at a time (its `max_ongoing_requests`) and queues the rest in its router.
On shutdown a replica's app drains its batcher as `fastbert serve` does.
"""
from __future__ import annotations

import signal
import sys
import threading
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


def run(model=None, address: str = "auto", host: str = "127.0.0.1", port: int = 8000, num_replicas: int = 1,
        num_gpus: float = 0, **options) -> int:
    """`fastbert serve --ray ADDRESS`: connect to the cluster ("local" starts one in this process),
    serve until SIGTERM / SIGINT, then take the application down."""
    import ray
    from ray import serve

    ray.init(address=None if address == "local" else address, ignore_reinit_error=True)
    serve.start(http_options={"host": host, "port": port})
    serve.run(deployment(model, num_replicas=num_replicas, num_gpus=num_gpus, **options).bind(),
              name="fastbert", route_prefix="/")
    print(f"fastbert serve: {num_replicas} replica(s) on Ray at {address}, http://{host}:{port}",
          file=sys.stderr, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.delete("fastbert")           # replicas drain what they hold, then stop
    return 0
