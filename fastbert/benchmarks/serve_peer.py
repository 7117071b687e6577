"""The server `fastbert bench --serve` compares `fastbert serve` with: what users write by hand, one
sentence-transformers SentenceTransformer.encode per request inside a FastAPI route (the same
OpenAI-shaped body), no batching across requests.

    python -m fastbert.benchmarks.serve_peer MODEL_DIR PORT
"""
import sys
from typing import List, Optional, Union   # no `from __future__ import annotations`: FastAPI reads them


def handwritten_app(model_dir: str):
    from fastapi import FastAPI
    from pydantic import BaseModel
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(model_dir, device="cpu")
    app = FastAPI()

    class Body(BaseModel):
        input: Union[List[str], str]
        model: Optional[str] = None

    @app.post("/v1/embeddings")
    def embeddings(body: Body):             # a plain def: FastAPI runs it on its thread pool
        texts = [body.input] if isinstance(body.input, str) else body.input
        vectors = model.encode(texts)
        return {"object": "list", "model": body.model,
                "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]}

    return app


if __name__ == "__main__":
    import uvicorn

    if len(sys.argv) != 3:
        sys.exit("usage: python -m fastbert.benchmarks.serve_peer MODEL_DIR PORT")
    uvicorn.run(handwritten_app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning",
                access_log=False)
