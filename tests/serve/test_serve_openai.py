"""The official `openai` client, unchanged, against `fastbert serve` on 127.0.0.1: embeddings equal
fastbert.Encoder.encode within 1e-6 (floats, and base64, the client's own default), `dimensions`,
token-id input, and errors raised as the client's exception classes."""
import numpy as np
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("uvicorn", reason="fastbert serve needs the serve extra (uvicorn)")

from fastbert.serve.app import create_app  # noqa: E402
from fastbert.serve.runner import load  # noqa: E402
from serve_helpers import live_server  # noqa: E402

TEXTS = ["hello world", "The quick brown fox jumps over the lazy dog.", "野口里佳 Noguchi Rika",
         "a " * 200 + "end"]


@pytest.fixture(scope="module")
def served(model_dir):
    runner = load(model_dir, device="cpu")
    with live_server(create_app(runner, model_name="all-MiniLM-L6-v2", api_key="k")) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=60), runner.encoder


def test_embeddings_float_and_base64(served):
    client, encoder = served
    reference = encoder.encode(TEXTS)
    floats = client.embeddings.create(input=TEXTS, model="all-MiniLM-L6-v2", encoding_format="float")
    assert [d.index for d in floats.data] == [0, 1, 2, 3] and floats.model == "all-MiniLM-L6-v2"
    assert np.abs(np.array([d.embedding for d in floats.data]) - reference).max() <= 1e-6
    default = client.embeddings.create(input=TEXTS, model="all-MiniLM-L6-v2")   # the client asks for base64
    assert np.abs(np.array([d.embedding for d in default.data]) - reference).max() <= 1e-6
    tokens = sum(len(ids) for ids in encoder.tokenizer(TEXTS)["input_ids"])
    assert default.usage.prompt_tokens == default.usage.total_tokens == tokens


def test_dimensions_and_token_ids(served):
    client, encoder = served
    short = client.embeddings.create(input=TEXTS[1], model="m", dimensions=128, user="someone")
    vector = np.array(short.data[0].embedding)
    assert vector.shape == (128,) and abs(np.linalg.norm(vector) - 1) < 1e-6
    assert np.abs(vector - encoder.encode(TEXTS[1], truncate_dim=128, normalize_embeddings=True)).max() <= 1e-6
    ids = encoder.tokenizer(TEXTS[:2])["input_ids"]
    by_ids = client.embeddings.create(input=ids, model="m")
    assert np.abs(np.array([d.embedding for d in by_ids.data]) - encoder.encode(TEXTS[:2])).max() <= 1e-6


def test_errors_are_the_clients_exceptions(served):
    client, _ = served
    with pytest.raises(openai.UnprocessableEntityError, match="input is an empty string"):
        client.embeddings.create(input="", model="m")
    with pytest.raises(openai.APIStatusError, match="more than the model's limit of 256") as info:
        client.embeddings.create(input="word " * 400, model="m")
    assert info.value.status_code == 413
    with pytest.raises(openai.UnprocessableEntityError, match="dimensions 999"):
        client.embeddings.create(input="a", model="m", dimensions=999)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0).embeddings.create(
            input="a", model="m")
