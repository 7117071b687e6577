"""`fastbert serve MODEL --ray ADDRESS --replicas 2` end to end on a local Ray cluster: the command
in a child process deploys fastbert.integrations.ray_serve's app as two replicas behind Ray Serve's
proxy; they answer OpenAI and TEI requests with Encoder.encode's vectors and the single server's
errors, both take requests, a second command on the cluster (found by --ray auto through
$RAY_ADDRESS) is refused, and SIGTERM takes Ray Serve down: requests sent meanwhile are answered 200
or 503, never the proxy's 404; then no replica, proxy or controller is left, the port is free, and the
command exits 0 (slow: a Ray cluster starts, two processes load the model)."""
import concurrent.futures
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

ray = pytest.importorskip("ray")
serve = pytest.importorskip("ray.serve", reason="Ray Serve is not installed (pip install 'ray[serve]')")
httpx = pytest.importorskip("httpx")

import fastbert  # noqa: E402
from serve_helpers import free_port  # noqa: E402

pytestmark = pytest.mark.slow
TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "野口里佳 Noguchi Rika"]
SERVE_PROCESSES = ("ray::ServeReplica", "ray::ProxyActor", "ray::ServeController")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster started by this process (its raylet is our child, so ray.shutdown() stops
    it all); yields its address. Ray turns token authentication on for a new local cluster, but this
    process read RAY_AUTH_MODE when it imported ray, and a command given an explicit address only
    sends a token when told to: the test cluster, local and short-lived, runs without."""
    if ray.is_initialized():
        pytest.skip("a Ray session is already running in this process")
    env = pytest.MonkeyPatch()
    env.setenv("RAY_AUTH_MODE", "disabled")       # for the cluster's processes and the command
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()
        env.undo()


def serve_processes() -> list:
    """Ray Serve's processes among this process's descendants (other Ray clusters on the machine do not count)."""
    rows = [line.split(None, 2) for line in subprocess.run(["ps", "-eo", "pid=,ppid=,args="], capture_output=True,
                                                            text=True, check=True).stdout.splitlines()]
    children = {}
    for pid, ppid, *args in rows:
        children.setdefault(int(ppid), []).append((int(pid), args[0] if args else ""))
    found, todo = [], [os.getpid()]
    while todo:
        for pid, args in children.get(todo.pop(), ()):
            todo.append(pid)
            if args.startswith(SERVE_PROCESSES):
                found.append(args)
    return found


def test_cli_two_replicas(cluster, model_dir):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    # MODEL relative to the command's directory: the replicas, in Ray's working directory, still find it
    proc = subprocess.Popen([sys.executable, "-m", "fastbert", "serve", os.path.basename(model_dir), "--ray", cluster,
                             "--replicas", "2", "--port", str(port), "--device", "cpu", "--max-concurrent", "64"],
                            cwd=os.path.dirname(model_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(600, proc.kill)      # a command that hangs ends its output, and the test
    watchdog.start()
    try:
        lines = [""]
        for line in proc.stdout:               # the command says so once the application is RUNNING
            lines.append(line)
            if "replica(s) on Ray" in line:
                break
        assert "replica(s) on Ray" in lines[-1], "".join(lines)
        reference = fastbert.Encoder.from_pretrained(model_dir, device="cpu").encode(TEXTS)
        with httpx.Client(base_url=url, timeout=60) as http:
            assert http.get("/health").json() == {"status": "ok"}
            body = http.post("/v1/embeddings", json={"input": TEXTS, "model": "m"}).json()
            assert np.abs(np.array([d["embedding"] for d in body["data"]]) - reference).max() <= 1e-6
            assert np.abs(np.array(http.post("/embed", json={"inputs": TEXTS}).json()) - reference).max() <= 1e-6
            bad = http.post("/embed", json={"inputs": ""})
            assert bad.status_code == 422 and bad.json()["field"] == "inputs"
            bad = http.post("/v1/embeddings", json={"input": ["x"], "model": "m", "bogus": 1})
            assert bad.status_code == 422 and bad.json()["error"]["param"] == "bogus"
            bad = http.post("/embed", json={"inputs": "word " * 300})
            assert bad.status_code == 413 and "limit of 256" in bad.json()["error"]
            assert http.post("/rerank", json={"query": "q", "texts": ["t"]}).status_code == 400
            info = http.get("/info").json()
            assert info["model_type"] == "embedding" and info["max_concurrent_requests"] == 64
            metrics = http.get("/metrics")          # the replica that took the request counts its own
            assert metrics.status_code == 200 and "fastbert_requests_total" in metrics.text
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            workers = set(pool.map(lambda _: httpx.get(url + "/info", timeout=60).json()["worker"], range(40)))
        assert len(workers) == 2, workers                     # both replicas answered
        status = serve.status().applications["fastbert"]
        assert status.status == "RUNNING"
        assert status.deployments["fastbert"].replica_states.get("RUNNING") == 2
        # a second command on the same cluster is refused: Serve's proxy would keep the first one's port
        second = subprocess.run([sys.executable, "-m", "fastbert", "serve", model_dir, "--ray", "auto", "--port",
                                 str(free_port())], capture_output=True, text=True, timeout=300,
                                env={**os.environ, "RAY_ADDRESS": cluster})
        assert second.returncode == 1 and "Ray Serve already runs on the cluster" in second.stderr, second.stderr

        # requests during the shutdown: until the port closes, or a few 503s in a row once the stand-in answers
        answers, unclear = [], []

        def keep_asking():
            with httpx.Client(base_url=url, timeout=60) as http:
                while answers[-5:] != [503] * 5 and time.monotonic() < deadline:
                    try:
                        r = http.post("/embed", json={"inputs": TEXTS})
                    except httpx.TransportError:
                        return
                    answers.append(r.status_code)
                    if r.status_code == 503 and not (r.headers.get("retry-after") == "1"
                                                     and "shutting down" in r.json()["error"]):
                        unclear.append(r.text)
        deadline = time.monotonic() + 120
        asker = threading.Thread(target=keep_asking)
        asker.start()
        while not answers and asker.is_alive():
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        asker.join(150)
        out, _ = proc.communicate(timeout=120)
        assert answers and set(answers) <= {200, 503} and 503 in answers and not unclear, (answers, unclear, out)
        assert proc.returncode == 0 and "stopped; Ray Serve shut down" in out, out
        assert not [a for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == "serve"]
        with pytest.raises(httpx.ConnectError):            # the proxy let go of the port
            httpx.get(url + "/health", timeout=5)
        deadline = time.monotonic() + 30                    # a killed actor's process exits shortly after
        while serve_processes() and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not serve_processes()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
