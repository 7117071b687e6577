"""fastbert.integrations.ray_serve on a local Ray cluster: two replicas of the `fastbert serve` app
behind Ray Serve's proxy answer OpenAI and TEI requests with Encoder.encode's vectors, and both
replicas take requests (slow: a Ray cluster starts, two processes load the model)."""
import concurrent.futures

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ray[serve]')")
httpx = pytest.importorskip("httpx")

import fastbert  # noqa: E402
from fastbert.integrations.ray_serve import deployment  # noqa: E402
from serve_helpers import free_port  # noqa: E402

pytestmark = pytest.mark.slow
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "野口里佳 Noguchi Rika"]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, ignore_reinit_error=True)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def test_two_replicas(cluster, model_dir):
    app = deployment(model_dir, num_replicas=2, num_cpus=0.5, device="cpu", max_concurrent=64).bind()
    serve.run(app, name="fastbert", route_prefix="/")
    reference = fastbert.Encoder.from_pretrained(model_dir, device="cpu").encode(TEXTS)
    with httpx.Client(base_url=cluster, timeout=60) as http:
        body = http.post("/v1/embeddings", json={"input": TEXTS, "model": "m"}).json()
        assert np.abs(np.array([d["embedding"] for d in body["data"]]) - reference).max() <= 1e-6
        assert np.abs(np.array(http.post("/embed", json={"inputs": TEXTS}).json()) - reference).max() <= 1e-6
        bad = http.post("/embed", json={"inputs": ""})
        assert bad.status_code == 422 and bad.json()["field"] == "inputs"
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            workers = set(pool.map(lambda _: httpx.get(cluster + "/info", timeout=60).json()["worker"], range(40)))
    assert len(workers) == 2, workers                     # both replicas answered
    status = serve.status().applications["fastbert"]
    assert status.status == "RUNNING"
    assert status.deployments["fastbert"].replica_states.get("RUNNING") == 2
