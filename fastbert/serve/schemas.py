"""Request bodies of `fastbert serve`, as pydantic models: OpenAI's embeddings request and
text-embeddings-inference's (TEI) /embed, /embed_sparse, /rerank, /predict and /tokenize.

Strict: a field of the wrong JSON type is an error (no "1" for 1, no 1 for true), unknown fields are
errors, and text inputs must be non-empty strings. Each error names its field."""
from __future__ import annotations

from typing import Any, List, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_INPUTS = 2048          # inputs per request (OpenAI's own limit for embeddings)
Direction = Literal["right", "left", "Right", "Left"]   # TEI writes them capitalized


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _texts(value: Any, field: str, allow_ids: bool = False):
    """A str or a non-empty list of str (with allow_ids also a list of token ids or a list of such
    lists), every text non-empty; raises ValueError naming the offending item."""
    if isinstance(value, str):
        if not value:
            raise ValueError(f"{field} is an empty string")
        return value
    kinds = "a string or a list of strings" + (", of token ids, or of lists of token ids" if allow_ids else "")
    if not isinstance(value, list):
        raise ValueError(f"{field} must be {kinds}, got {type(value).__name__}")
    if not value:
        raise ValueError(f"{field} is an empty list")
    if len(value) > MAX_INPUTS:
        raise ValueError(f"{field} holds {len(value)} inputs, at most {MAX_INPUTS} per request")
    if allow_ids and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return value                                     # one input as token ids
    for i, item in enumerate(value):
        if isinstance(item, str):
            if not item:
                raise ValueError(f"{field}[{i}] is an empty string")
        elif allow_ids and isinstance(item, list):
            if not item:
                raise ValueError(f"{field}[{i}] is an empty list of token ids")
            bad = next((j for j, t in enumerate(item) if not isinstance(t, int) or isinstance(t, bool)), None)
            if bad is not None:
                raise ValueError(f"{field}[{i}][{bad}] must be a token id (an integer), got {item[bad]!r}")
        else:
            raise ValueError(f"{field}[{i}] must be a string, got {type(item).__name__}")
    if allow_ids and len({isinstance(v, str) for v in value}) > 1:
        raise ValueError(f"{field} mixes strings and token ids")
    return value


class EmbeddingsRequest(_Strict):
    """OpenAI POST /v1/embeddings."""
    input: Any
    model: Optional[str] = None
    dimensions: Optional[int] = Field(None, ge=1)
    encoding_format: Literal["float", "base64"] = "float"
    user: Optional[str] = None

    @field_validator("input", mode="before")
    @classmethod
    def _input(cls, value):
        return _texts(value, "input", allow_ids=True)


class _Truncation(_Strict):
    truncate: Optional[bool] = False
    truncation_direction: Direction = "right"

    @property
    def direction(self) -> str:
        return self.truncation_direction.lower()


class EmbedRequest(_Truncation):
    """TEI POST /embed."""
    inputs: Any
    normalize: bool = True
    prompt_name: Optional[str] = None
    dimensions: Optional[int] = Field(None, ge=1)

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, value):
        return _texts(value, "inputs")


class EmbedSparseRequest(_Truncation):
    """TEI POST /embed_sparse."""
    inputs: Any
    prompt_name: Optional[str] = None

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, value):
        return _texts(value, "inputs")


class RerankRequest(_Truncation):
    """TEI POST /rerank."""
    query: str = Field(min_length=1)
    texts: List[str] = Field(min_length=1, max_length=MAX_INPUTS)
    raw_scores: bool = False
    return_text: bool = False

    @field_validator("texts")
    @classmethod
    def _texts(cls, value):
        return _texts(value, "texts")


class PredictRequest(_Truncation):
    """TEI POST /predict: `inputs` is a text, a pair [text, text], or a list of texts and pairs
    (a list of exactly two strings is one pair, as TEI reads it)."""
    inputs: Any
    raw_scores: bool = False

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, value):
        if isinstance(value, list) and value and all(isinstance(v, list) for v in value):
            for i, pair in enumerate(value):
                if len(pair) not in (1, 2) or not all(isinstance(t, str) and t for t in pair):
                    raise ValueError(f"inputs[{i}] must be a non-empty text or a pair of them, got {pair!r}")
            if len(value) > MAX_INPUTS:
                raise ValueError(f"inputs holds {len(value)} inputs, at most {MAX_INPUTS} per request")
            return value
        return _texts(value, "inputs")

    def items(self) -> tuple:
        """(single, [(text, pair or None)]): single when the request holds one input."""
        v = self.inputs
        if isinstance(v, str):
            return True, [(v, None)]
        if len(v) == 2 and all(isinstance(t, str) for t in v):
            return True, [(v[0], v[1])]
        return False, [(t, None) if isinstance(t, str) else (t[0], t[1] if len(t) == 2 else None) for t in v]


class TokenizeRequest(_Strict):
    """TEI POST /tokenize."""
    inputs: Any
    add_special_tokens: bool = True
    prompt_name: Optional[str] = None

    @field_validator("inputs", mode="before")
    @classmethod
    def _inputs(cls, value):
        return _texts(value, "inputs")

