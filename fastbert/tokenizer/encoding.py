"""BatchEncoding: the tokenizer's output, a dict with attribute access that is a transformers.BatchEncoding,
with the alignment methods of a fast tokenizer's output computed on first use (alignment.py)."""
from __future__ import annotations

import copy
import logging
import warnings
from typing import Any

import numpy as np
from transformers.tokenization_utils_base import BatchEncoding as _HFBatchEncoding

from fastbert.tokenizer.alignment import Aligner, CharSpan, Encoding, TokenSpan
from fastbert.tokenizer.options import enum_value

logger = logging.getLogger(__name__)


class BatchEncoding(dict, _HFBatchEncoding):
    """Model inputs as a dict with attribute access, a transformers.BatchEncoding (code that checks
    for one takes it), with the alignment methods of a fast tokenizer's output (word_ids,
    sequence_ids, tokens, char_to_token, ...), computed on first use (alignment.py). dict comes
    first: its storage and methods are the ones used; every method transformers' class defines is
    defined here too, and `data` is this dict itself."""

    # _source: Aligner.encodings arguments (how to encode this batch again with alignment data);
    # _encodings: list[Encoding] once computed. Slots: setting them on every call stays cheap.
    __slots__ = ("_source", "_encodings", "_n_sequences")
    _ALIGNMENT_SLOTS = frozenset(("_source", "_encodings", "_n_sequences"))

    def __getattr__(self, name: str) -> Any:
        if name in BatchEncoding._ALIGNMENT_SLOTS:  # not set: nothing to align
            return None
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, item):
        if isinstance(item, str):
            return dict.__getitem__(self, item)
        if self.encodings is not None and isinstance(item, (int, slice)):
            return self._encodings[item]
        if isinstance(item, slice):
            return {k: v[item] for k, v in self.items()}
        raise KeyError("Invalid key. Only three types of key are available: (1) string, (2) integers for "
                       "backend Encoding, and (3) slices for data subsetting.")

    def __getstate__(self):
        # the re-encoding source holds the tokenizer: alignment data travels only once computed
        return {"data": dict(self), "encodings": self._encodings,
                "n_sequences": self._n_sequences if self._encodings is not None else None}

    def __setstate__(self, state):
        self.update(state["data"])
        self._encodings = state.get("encodings")
        self._n_sequences = state.get("n_sequences")

    def __copy__(self):
        new = BatchEncoding(self)
        new._source, new._encodings, new._n_sequences = self._source, self._encodings, self._n_sequences
        return new

    def __deepcopy__(self, memo):
        new = BatchEncoding({k: copy.deepcopy(v, memo) for k, v in self.items()})
        # the source is the tokenizer and immutable input: shared, not copied
        new._source, new._n_sequences = self._source, self._n_sequences
        new._encodings = copy.deepcopy(self._encodings, memo)
        return new

    @property
    def data(self) -> "BatchEncoding":
        """The dict of outputs (transformers' BatchEncoding.data): this BatchEncoding itself, a dict, so
        that a change made through it is seen here too."""
        return self

    # ------------------------------------------------------------------------------ alignment
    @property
    def n_sequences(self) -> int | None:
        if self._n_sequences is None and self._source is not None:
            return 1 if self._source[2] is None else 2  # (aligner, texts, pairs, ...)
        return self._n_sequences

    @property
    def is_fast(self) -> bool:
        return self._encodings is not None or self._source is not None

    @property
    def encodings(self) -> list[Encoding] | None:
        if self._encodings is None and self._source is not None:
            self._n_sequences = self.n_sequences
            self._encodings = Aligner.encodings(*self._source)
            self._source = None
        return self._encodings

    def _row(self, method: str, batch_index: int) -> Encoding:
        if self.encodings is None:
            raise ValueError(f"{method}() is not available: this BatchEncoding was not made by "
                             "fastbert.BertTokenizer.__call__ (or was unpickled before its alignment was computed)")
        return self._encodings[batch_index]

    def _split(self, method: str, first: int, second: int | None) -> tuple[int, int]:
        # transformers' (batch_index, index) / (index) forms; it has no negative indices here
        batch_index, index = (0, first) if second is None else (first, second)
        if batch_index < 0 or index < 0:
            raise AttributeError(f"{method}(): negative indices are not supported (as in transformers), got "
                                 f"batch index {batch_index}, index {index}")
        return batch_index, index

    def tokens(self, batch_index: int = 0) -> list[str]:
        return self._row("tokens", batch_index).tokens

    def sequence_ids(self, batch_index: int = 0) -> list[int | None]:
        return self._row("sequence_ids", batch_index).sequence_ids

    def word_ids(self, batch_index: int = 0) -> list[int | None]:
        return self._row("word_ids", batch_index).word_ids

    def words(self, batch_index: int = 0) -> list[int | None]:
        warnings.warn("`BatchEncoding.words()` property is deprecated and should be replaced with the identical, "
                      "but more self-explanatory `BatchEncoding.word_ids()` property.", FutureWarning, stacklevel=2)
        return self.word_ids(batch_index)

    def token_to_sequence(self, batch_or_token_index: int, token_index: int | None = None) -> int:
        self._row("token_to_sequence", 0)
        b, t = self._split("token_to_sequence", batch_or_token_index, token_index)
        return self._encodings[b].token_to_sequence(t)

    def token_to_word(self, batch_or_token_index: int, token_index: int | None = None) -> int:
        self._row("token_to_word", 0)
        b, t = self._split("token_to_word", batch_or_token_index, token_index)
        return self._encodings[b].token_to_word(t)

    def word_to_tokens(self, batch_or_word_index: int, word_index: int | None = None,
                       sequence_index: int = 0) -> TokenSpan | None:
        self._row("word_to_tokens", 0)
        b, w = self._split("word_to_tokens", batch_or_word_index, word_index)
        span = self._encodings[b].word_to_tokens(w, sequence_index)
        return TokenSpan(*span) if span is not None else None

    def token_to_chars(self, batch_or_token_index: int, token_index: int | None = None) -> CharSpan | None:
        b, t = (0, batch_or_token_index) if token_index is None else (batch_or_token_index, token_index)
        span = self._row("token_to_chars", b).token_to_chars(t)
        return CharSpan(*span) if span is not None else None

    def char_to_token(self, batch_or_char_index: int, char_index: int | None = None, sequence_index: int = 0) -> int:
        b, c = (0, batch_or_char_index) if char_index is None else (batch_or_char_index, char_index)
        return self._row("char_to_token", b).char_to_token(c, sequence_index)

    def word_to_chars(self, batch_or_word_index: int, word_index: int | None = None,
                      sequence_index: int = 0) -> CharSpan:
        b, w = (0, batch_or_word_index) if word_index is None else (batch_or_word_index, word_index)
        span = self._row("word_to_chars", b).word_to_chars(w, sequence_index)
        if span is None:  # transformers fails here too (CharSpan(*None)), with a less clear message
            raise TypeError(f"word_to_chars(): word {w} of sequence {sequence_index} has no tokens in row {b}")
        return CharSpan(*span)

    def char_to_word(self, batch_or_char_index: int, char_index: int | None = None, sequence_index: int = 0) -> int:
        b, c = (0, batch_or_char_index) if char_index is None else (batch_or_char_index, char_index)
        return self._row("char_to_word", b).char_to_word(c, sequence_index)

    def to(self, device, *, non_blocking: bool = False) -> "BatchEncoding":
        """Every tensor to `device` (a str, torch.device or index). A dtype (APEX and others call .to on
        every input) is refused with transformers' warning and changes nothing: cast ids to half and
        they are no longer ids."""
        import torch

        if not isinstance(device, (str, int, torch.device)) or isinstance(device, bool):
            logger.warning(f"Attempting to cast a BatchEncoding to type {device}. This is not supported.")
            return self
        for k, v in self.items():
            if hasattr(v, "to"):
                self[k] = v.to(device=device, non_blocking=non_blocking)
        return self

    def convert_to_tensors(self, tensor_type=None) -> "BatchEncoding":
        for k, v in list(self.items()):
            self[k] = as_tensor(k, v, tensor_type)
        return self


def as_tensor(key, value, kind):
    """One output as return_tensors asks (None, \"np\", \"pt\"), as transformers converts it."""
    kind = enum_value(kind)
    if kind is None:
        return value
    if kind not in ("np", "pt"):
        raise ValueError(f"return_tensors must be None, 'np' or 'pt', got {kind!r}")
    if not isinstance(value, np.ndarray):
        if value and isinstance(value[0], list) and len({len(r) for r in value}) > 1:
            if kind == "np":  # HF: an object array of int64 rows
                rows = np.empty(len(value), dtype=object)
                rows[:] = [np.asarray(r, dtype=np.int64) for r in value]
                return rows
            raise ValueError(
                "Unable to create tensor, you should probably activate truncation and/or padding with "
                "'padding=True' 'truncation=True' to have batched tensors with the same length. "
                f"Perhaps your features (`{key}` in this case) have excessive nesting (inputs type `list` where "
                "type `int` is expected).")
        value = np.asarray(value, dtype=np.int64)
    if kind == "np":
        return value
    import torch
    return torch.from_numpy(value)
