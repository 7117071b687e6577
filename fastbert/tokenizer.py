"""HF-compatible BERT tokenizer over the C++ WordPiece core (fastbert._C).

`BertTokenizer` behaves like `transformers.BertTokenizerFast` (same ids, type ids, masks, offsets,
overflow windows, padding), with the batch work done in C++ on a thread pool without the GIL.
"""
from __future__ import annotations

import copy
import json
import logging
import operator
import os
import warnings
from typing import Any, Iterable

import numpy as np

from fastbert import _C
from fastbert.alignment import AlignmentSource, CharSpan, Encoding, TokenSpan

logger = logging.getLogger(__name__)

VERY_LARGE_INTEGER = int(1e30)  # transformers' "no maximum length"
LARGE_INTEGER = int(1e20)
_MAX_THREADS = max(1024, 4 * (os.cpu_count() or 1))  # a pool this size still starts; 10**6 threads do not
_MAX_SIZE = 2**62  # a length C++ takes as "no limit" (an int64 holds it, a size never reaches it)
SPECIAL_ATTRS = ("unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
DEFAULT_SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                    "cls_token": "[CLS]", "mask_token": "[MASK]"}
_TRUNCATION = {"longest_first": 1, "only_first": 2, "only_second": 3, "do_not_truncate": 0}
_PADDING = {"longest": 1, "max_length": 2, "do_not_pad": 0}
_SIDES = ("left", "right")
# encode_batch's options for one text without padding or truncation, by (add_special_tokens,
# token_type_ids, attention_mask); the sides, pad id and thread count play no part there
_ONE_TEXT_OPTIONS = {(special, types, attn): (False, special, 0, 0, 0, False, 0, 0, False, 0, 1, types, attn,
                                              False, False, False, False, False, False)
                     for special in (False, True) for types in (False, True) for attn in (False, True)}
_UNSET = object()


def _cleanup(text: str) -> str:
    # transformers' clean_up_tokenization and the WordPiece decoder's cleanup (same replacements)
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                 (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def _decoder_cleanup(token: str) -> str:
    return _cleanup(token).replace(" do not", " don't")


def _enum_value(v):
    return getattr(v, "value", v)


def _token_str(v) -> str | None:
    if v is None:
        return None
    if isinstance(v, dict):
        return v.get("content")
    return str(v)


class BatchEncoding(dict):
    """Model inputs as a dict with attribute access, like transformers.BatchEncoding, with the
    alignment methods of a fast tokenizer's output (word_ids, sequence_ids, tokens, char_to_token,
    ...), computed on first use (fastbert/alignment.py)."""

    # _source: AlignmentSource arguments (how to encode this batch again with alignment data);
    # _encodings: list[Encoding] once computed. Slots: setting them on every call stays cheap.
    __slots__ = ("_source", "_encodings", "_n_sequences", "__dict__")
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

    # ------------------------------------------------------------------------------ alignment
    @property
    def n_sequences(self) -> int | None:
        if self._n_sequences is None and self._source is not None:
            return 1 if self._source[2] is None else 2
        return self._n_sequences

    @property
    def is_fast(self) -> bool:
        return self._encodings is not None or self._source is not None

    @property
    def encodings(self) -> list[Encoding] | None:
        if self._encodings is None and self._source is not None:
            self._n_sequences = self.n_sequences
            self._encodings = AlignmentSource(*self._source).encodings()
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

    def to(self, device, non_blocking: bool = False) -> "BatchEncoding":
        for k, v in self.items():
            if hasattr(v, "to"):
                self[k] = v.to(device=device, non_blocking=non_blocking)
        return self

    def convert_to_tensors(self, tensor_type=None) -> "BatchEncoding":
        for k, v in list(self.items()):
            self[k] = _as_tensor(k, v, tensor_type)
        return self


def _as_tensor(key, value, kind):
    kind = _enum_value(kind)
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


def _count(name: str, value) -> int | None:
    # max_length / stride / pad_to_multiple_of reach C++ as sizes: a float or a negative value
    # is an error here (as in transformers), never a silent round or a wrapped-around size; beyond
    # _MAX_SIZE all sizes mean the same (no limit) and fit C++'s int64
    if value is None or (type(value) is int and 0 <= value <= _MAX_SIZE):  # the common case, cheaply
        return value
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return min(n, _MAX_SIZE)


def _token_id(value, position: int) -> int:
    # an id for decode / convert_ids_to_tokens: no silent int() of 101.5, no negative id dropped
    try:
        i = operator.index(value)
    except TypeError:
        raise TypeError(f"token id at position {position} must be an int, got {type(value).__name__} {value!r}") \
            from None
    if i < 0:
        raise ValueError(f"token id at position {position} is negative: {i}")
    return i


def _kind(value) -> str:
    # a type name for error messages, with the fix for array-likes (numpy, pandas)
    name = type(value).__name__
    return f"{name} (convert it with .tolist())" if hasattr(value, "tolist") else name


def _freeze(texts, split_words):
    # str is immutable; the lists holding them (and pre-split words) may change after the call
    if texts is None:
        return None
    if split_words:
        return tuple(tuple(words) for words in texts)
    return texts if isinstance(texts, tuple) else tuple(texts)


def _read_json(path):
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (ValueError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot parse {path}: {e}") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _vocab_list(vocab: dict, where: str) -> list[str]:
    # tokenizer.json ids may have gaps, which HF keeps (a gap id decodes to nothing). A gap slot
    # holds the token of the highest id: a repeated token maps to its last position, so the slot
    # has no token of its own, as a line repeated in vocab.txt. Shared ids are ambiguous: refused.
    by_id: dict[int, str] = {}
    for t, i in vocab.items():
        if isinstance(i, bool) or not isinstance(i, int):
            raise TypeError(f"{where}: the id of token {t!r} must be an int, got {type(i).__name__} {i!r}")
        if i < 0:
            raise ValueError(f"{where}: token {t!r} has a negative id {i}")
        if i in by_id:
            raise ValueError(f"{where}: tokens {by_id[i]!r} and {t!r} have the same id {i}")
        by_id[i] = t
    if not by_id:
        return []
    top = max(by_id)
    if top >= 2 * len(by_id) + 1024:
        raise ValueError(f"{where}: token {by_id[top]!r} has id {top}, far beyond the {len(by_id)} tokens")
    tokens = [by_id[top]] * (top + 1)
    for i, t in by_id.items():
        tokens[i] = t
    return tokens


def _added_entry(a, where: str, i=None) -> dict:
    # an added token from tokenizer.json / added_tokens_decoder: a dict with a str content and an int id
    i = a.get("id") if i is None and isinstance(a, dict) else i
    try:
        i = int(i)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: an added token needs an int id, got {a!r}") from None
    if not isinstance(a, dict) or not isinstance(a.get("content"), str):
        raise ValueError(f"{where}: added token {i} needs a str 'content', got {a!r}")
    return dict(a, id=i)


def _config_value(key: str, value, where: str):
    # tokenizer_config.json values, typed as transformers reads them: bool("no") would be True
    if key in ("do_lower_case", "tokenize_chinese_chars", "clean_up_tokenization_spaces", "strip_accents",
               "clean_text"):
        if not isinstance(value, bool):
            raise ValueError(f"{where}: {key} must be true or false, got {value!r}")
    elif key == "model_max_length":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}: model_max_length must be an int, got {value!r}")
    return value


def _rebuild(cls, state):
    return cls(**state)


class BertTokenizer:
    """A WordPiece BERT tokenizer with `transformers.BertTokenizerFast`'s behaviour and API."""

    vocab_files_names = {"vocab_file": "vocab.txt"}
    model_input_names = ["input_ids", "token_type_ids", "attention_mask"]
    is_fast = True
    pad_token_type_id = 0

    def __init__(self, vocab_file: str | None = None, do_lower_case: bool = True, unk_token="[UNK]",
                 sep_token="[SEP]", pad_token="[PAD]", cls_token="[CLS]", mask_token="[MASK]",
                 tokenize_chinese_chars: bool = True, strip_accents: bool | None = None, *,
                 vocab: list[str] | dict[str, int] | None = None, model_max_length: int | None = None,
                 padding_side: str = "right", truncation_side: str = "right",
                 clean_up_tokenization_spaces: bool = False, added_tokens: Iterable[dict] | None = None,
                 additional_special_tokens: Iterable | None = None, num_threads: int | None = None,
                 clean_text: bool = True, name_or_path: str = "", **kwargs):
        if vocab is None:
            if vocab_file is None:
                raise ValueError("BertTokenizer needs a vocab_file (vocab.txt) or a vocab")
            vocab_file = os.fspath(vocab_file)
            if not os.path.isfile(vocab_file):
                raise OSError(f"vocabulary file not found: {vocab_file}")
            source: Any = vocab_file
        elif isinstance(vocab, dict):
            source = _vocab_list(vocab, kwargs.get("_source_path") or "vocab")
        else:
            source = list(vocab)
        self.do_lower_case = bool(do_lower_case)
        self.tokenize_chinese_chars = bool(tokenize_chinese_chars)
        self.clean_text = bool(clean_text)
        self.strip_accents = strip_accents
        self.model_max_length = VERY_LARGE_INTEGER if model_max_length is None else int(model_max_length)
        if padding_side not in ("right", "left"):
            raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
        if truncation_side not in ("right", "left"):
            raise ValueError(f"truncation_side must be 'right' or 'left', got {truncation_side!r}")
        self.padding_side = padding_side
        self.truncation_side = truncation_side
        self.clean_up_tokenization_spaces = bool(clean_up_tokenization_spaces)
        self.name_or_path = name_or_path
        source_path = kwargs.pop("_source_path", None)  # tokenizer.json, for error messages
        self.init_kwargs = dict(kwargs)
        specials = {"unk_token": unk_token, "sep_token": sep_token, "pad_token": pad_token,
                    "cls_token": cls_token, "mask_token": mask_token}
        self._special = {k: _token_str(v) for k, v in specials.items()}
        self.additional_special_tokens = [_token_str(t) for t in (additional_special_tokens or [])]

        # Added tokens: never split. Flags come from the files (added_tokens_decoder / tokenizer.json)
        # or the special token values; specials not in the vocab get new ids, as in HF.
        entries: dict[str, dict] = {}
        for a in sorted(added_tokens or [], key=lambda a: a.get("id", 0)):
            entries[a["content"]] = a
        for v in list(specials.values()) + list(additional_special_tokens or []):
            content = _token_str(v)
            if content is None or content in entries:
                continue
            flags = v if isinstance(v, dict) else {}
            entries[content] = {"content": content, "special": True, "lstrip": flags.get("lstrip", False),
                                "rstrip": flags.get("rstrip", False),
                                "single_word": flags.get("single_word", False), "normalized": False}
        self._added = list(entries.values())
        self._special_contents = {a["content"] for a in self._added if a.get("special", False)}
        self._num_threads = self._resolve_threads(num_threads)
        resolved_strip = self.do_lower_case if strip_accents is None else bool(strip_accents)
        source_name = vocab_file if vocab is None else (source_path or "the vocabulary")
        try:
            self._core = self._make_core(source, resolved_strip, clean_text, unk_token)
        except ValueError as e:
            if "unknown token" in str(e):
                raise ValueError(f"{source_name}: {e}") from None
            raise
        self._base_size = self._core.base_size()
        self._normalized_ids = {self._core.token_to_id(a["content"]) for a in self._added
                                if a.get("normalized", not a.get("special", False))}
        self._core.set_specials(self._id_or(self.cls_token, 0), self._id_or(self.sep_token, 0))
        self._warned_long = False

    def _make_core(self, source, resolved_strip, clean_text, unk_token):
        return _C.Tokenizer(
            source, self.do_lower_case, resolved_strip, self.tokenize_chinese_chars, bool(clean_text),
            _token_str(unk_token) or "[UNK]", "##", 100,
            [(a["content"], bool(a.get("lstrip", False)), bool(a.get("rstrip", False)),
              bool(a.get("single_word", False)), bool(a.get("normalized", not a.get("special", False))))
             for a in self._added])

    # ----------------------------------------------------------------------------------- loading
    @classmethod
    def from_pretrained(cls, path, **overrides) -> "BertTokenizer":
        """Loads vocab.txt / tokenizer.json, tokenizer_config.json and special_tokens_map.json
        from a local directory (or a vocab.txt / tokenizer.json file). Keyword arguments override
        the files (do_lower_case, strip_accents, tokenize_chinese_chars, model_max_length, special
        tokens, num_threads, ...)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            directory, file = path, None
        elif os.path.isfile(path):
            directory, file = os.path.dirname(path) or ".", path
        else:
            raise OSError(f"tokenizer path not found: {path} (expected a directory with vocab.txt or "
                          "tokenizer.json, or one of those files)")
        config_path = os.path.join(directory, "tokenizer_config.json")
        config = _read_json(config_path) or {}
        special_map = _read_json(os.path.join(directory, "special_tokens_map.json")) or {}
        kwargs: dict[str, Any] = {}
        for k in ("do_lower_case", "tokenize_chinese_chars", "strip_accents", "model_max_length",
                  "padding_side", "truncation_side", "clean_up_tokenization_spaces", "clean_text"):
            if k in config and config[k] is not None:
                kwargs[k] = _config_value(k, config[k], config_path)
        if "strip_accents" in config:
            kwargs["strip_accents"] = config["strip_accents"]
        for k in SPECIAL_ATTRS:
            v = special_map.get(k, config.get(k))
            if v is not None:
                kwargs[k] = v
        extra = special_map.get("additional_special_tokens", config.get("additional_special_tokens"))
        if not extra:  # transformers >= 5 saves them as extra_special_tokens (a list, or named tokens)
            extra = special_map.get("extra_special_tokens", config.get("extra_special_tokens"))
            if isinstance(extra, dict):
                extra = list(extra.values())
        if extra:
            kwargs["additional_special_tokens"] = extra
        added: dict[int, dict] = {}
        tok_json_path = file if file and file.endswith(".json") else os.path.join(directory, "tokenizer.json")
        vocab_path = file if file and not file.endswith(".json") else os.path.join(directory, "vocab.txt")
        tj = _read_json(tok_json_path) if (file is None or file == tok_json_path) else None
        if tj is not None:
            model = tj.get("model") or {}
            if not isinstance(model, dict) or model.get("type", "WordPiece") != "WordPiece" or "vocab" not in model:
                kind = model.get("type") if isinstance(model, dict) else type(model).__name__
                raise ValueError(f"{tok_json_path}: not a WordPiece tokenizer (model type {kind!r})")
            vocab = model["vocab"]
            kwargs["vocab"] = vocab if isinstance(vocab, dict) else [v[0] if isinstance(v, list) else v for v in vocab]
            kwargs["_source_path"] = tok_json_path
            for a in tj.get("added_tokens") or []:
                a = _added_entry(a, tok_json_path)
                added[a["id"]] = a
        elif os.path.isfile(vocab_path):
            kwargs["vocab_file"] = vocab_path
        else:
            raise OSError(f"no vocab.txt or tokenizer.json in {directory}")
        for id_str, a in (config.get("added_tokens_decoder") or {}).items():
            a = _added_entry(a, config_path, id_str)
            added[a["id"]] = a
        kwargs["added_tokens"] = [dict(a, id=i) for i, a in sorted(added.items())]
        kwargs["name_or_path"] = path
        kwargs.update(overrides)
        return cls(**kwargs)

    @staticmethod
    def _resolve_threads(n):
        if n is None:
            try:
                return max(1, len(os.sched_getaffinity(0)))
            except AttributeError:
                return max(1, os.cpu_count() or 1)
        try:
            n = operator.index(n)
        except TypeError:
            raise TypeError(f"num_threads must be an int or None, got {type(n).__name__} {n!r}") from None
        if not 1 <= n <= _MAX_THREADS:
            raise ValueError(f"num_threads must be between 1 and {_MAX_THREADS}, got {n}")
        return n

    def _id_or(self, token, default):
        if token is None:
            return default
        i = self._core.token_to_id(token)
        return default if i is None else i

    def __reduce__(self):
        # the C++ core is rebuilt from the vocabulary and the settings (pickle, copy.deepcopy)
        state = dict(vocab=list(self._core.tokens()[:self._core.base_ids()]), do_lower_case=self.do_lower_case,
                     tokenize_chinese_chars=self.tokenize_chinese_chars, strip_accents=self.strip_accents,
                     model_max_length=self.model_max_length, padding_side=self.padding_side,
                     truncation_side=self.truncation_side, clean_text=self.clean_text,
                     clean_up_tokenization_spaces=self.clean_up_tokenization_spaces,
                     added_tokens=[dict(a, id=self._core.token_to_id(a["content"])) for a in self._added],
                     additional_special_tokens=list(self.additional_special_tokens),
                     num_threads=self._num_threads, name_or_path=self.name_or_path,
                     **{k: self._special[k] for k in SPECIAL_ATTRS}, **self.init_kwargs)
        return (_rebuild, (type(self), state))

    def clear_cache(self) -> None:
        """Forgets the per-thread word caches (results never depend on them; timings do)."""
        self._core.clear_cache()

    # ------------------------------------------------------------------------------ attributes
    @property
    def num_threads(self) -> int:
        return self._num_threads

    @num_threads.setter
    def num_threads(self, n):
        self._num_threads = self._resolve_threads(n)

    @property
    def vocab_size(self) -> int:
        """Size of the base vocabulary (without added tokens), like HF."""
        return self._base_size

    def __len__(self) -> int:
        return len(self._core)

    def get_vocab(self) -> dict[str, int]:
        # a token repeated in vocab.txt keeps its last id, as in HF
        return {t: i for i, t in enumerate(self._core.tokens())}

    @property
    def vocab(self) -> dict[str, int]:
        return self.get_vocab()

    @property
    def added_tokens_encoder(self) -> dict[str, int]:
        return {a["content"]: self._core.token_to_id(a["content"]) for a in self._added}

    def _special_token(name):  # noqa: N805  (property factory)
        def get(self):
            return self._special.get(name)

        def set_(self, value):
            self._special[name] = _token_str(value)
        return property(get, set_)

    unk_token = _special_token("unk_token")
    sep_token = _special_token("sep_token")
    pad_token = _special_token("pad_token")
    cls_token = _special_token("cls_token")
    mask_token = _special_token("mask_token")
    bos_token = property(lambda self: None)
    eos_token = property(lambda self: None)

    def _special_id(name):  # noqa: N805
        return property(lambda self: None if self._special.get(name) is None
                        else self.convert_tokens_to_ids(self._special[name]))

    unk_token_id = _special_id("unk_token")
    sep_token_id = _special_id("sep_token")
    pad_token_id = _special_id("pad_token")
    cls_token_id = _special_id("cls_token")
    mask_token_id = _special_id("mask_token")
    bos_token_id = property(lambda self: None)
    eos_token_id = property(lambda self: None)

    @property
    def special_tokens_map(self) -> dict[str, str]:
        # the named tokens only, as in transformers >= 5; the others are extra_special_tokens
        return {k: v for k, v in self._special.items() if v is not None}

    @property
    def extra_special_tokens(self) -> list[str]:
        return list(self.additional_special_tokens)

    @property
    def all_special_tokens(self) -> list[str]:
        seen = []
        for t in list(self._special.values()) + list(self.additional_special_tokens):
            if t is not None and t not in seen:
                seen.append(t)
        return seen

    @property
    def all_special_ids(self) -> list[int]:
        return [self.convert_tokens_to_ids(t) for t in self.all_special_tokens]

    def num_special_tokens_to_add(self, pair: bool = False) -> int:
        return 3 if pair else 2

    def __repr__(self) -> str:
        return (f"fastbert.BertTokenizer(name_or_path={self.name_or_path!r}, vocab_size={self.vocab_size}, "
                f"model_max_length={self.model_max_length}, do_lower_case={self.do_lower_case}, "
                f"num_threads={self.num_threads})")

    # ---------------------------------------------------------------------------- conversions
    def convert_tokens_to_ids(self, tokens):
        if tokens is None:
            return None
        if isinstance(tokens, str):
            try:
                i = self._core.token_to_id(tokens)
            except TypeError:  # pybind11 could not make UTF-8 of it: say which character
                tokens.encode("utf-8")
                raise
            return self._core.token_to_id(self.unk_token) if i is None else i
        if not isinstance(tokens, Iterable):
            raise TypeError(f"tokens must be a str or a list of str, got {_kind(tokens)}")
        tokens = list(tokens)
        for k, t in enumerate(tokens):
            if not isinstance(t, str):
                raise TypeError(f"token {k} is {type(t).__name__}, not str")
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if isinstance(ids, int):  # also a numpy or 0-d torch scalar
            return self._id_to_token(_token_id(ids, 0))
        skip = set(self.all_special_ids) if skip_special_tokens else set()
        ids = [i if type(i) is int and i >= 0 else _token_id(i, k) for k, i in enumerate(ids)]
        return [self._id_to_token(i) for i in ids if i not in skip]

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        for k, t in enumerate(tokens):
            if not isinstance(t, str):
                raise TypeError(f"token {k} is {type(t).__name__}, not str")
        return self._decode_tokens(tokens)

    @staticmethod
    def _decode_tokens(tokens) -> str:
        # HF's WordPiece decoder: "##" pieces glue to the previous token, others get a space;
        # its cleanup runs on each piece
        parts = []
        for i, t in enumerate(tokens):
            if i:
                t = t[2:] if t.startswith("##") else " " + t
            parts.append(_decoder_cleanup(t))
        return "".join(parts)

    def decode(self, token_ids, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None, **kwargs) -> str:
        if isinstance(token_ids, dict):
            token_ids = token_ids["input_ids"]
        if hasattr(token_ids, "tolist"):
            token_ids = token_ids.tolist()
        if isinstance(token_ids, int):
            token_ids = [token_ids]
        if isinstance(token_ids, (list, tuple)):
            if token_ids and isinstance(token_ids[0], (list, tuple)):
                # a batch of sequences: transformers' decode gives one string per sequence
                return self.batch_decode(token_ids, skip_special_tokens, clean_up_tokenization_spaces)
        elif isinstance(token_ids, str) or not isinstance(token_ids, Iterable):
            raise TypeError(f"token_ids must be an int or a sequence of ints, got {_kind(token_ids)}")
        skip = {self._core.token_to_id(t) for t in self._special_contents} if skip_special_tokens else set()
        tokens = []
        for k, i in enumerate(token_ids):
            if type(i) is not int or i < 0:  # the checks and messages, off the common path
                i = _token_id(i, k)
            if i in skip:
                continue
            t = self._id_to_token(i)
            if t is not None:
                tokens.append(t)
        text = self._decode_tokens(tokens)
        if clean_up_tokenization_spaces is None:
            clean_up_tokenization_spaces = self.clean_up_tokenization_spaces
        return _cleanup(text) if clean_up_tokenization_spaces else text

    def batch_decode(self, sequences, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None, **kwargs) -> list[str]:
        if hasattr(sequences, "tolist"):
            sequences = sequences.tolist()
        if isinstance(sequences, (list, tuple)) and sequences and isinstance(sequences[0], (int, np.integer)):
            # one flat sequence: transformers decodes it as a single sequence (with a deprecation warning)
            return [self.decode(sequences, skip_special_tokens, clean_up_tokenization_spaces)]
        return [self.decode(s, skip_special_tokens, clean_up_tokenization_spaces) for s in sequences]

    # -------------------------------------------------------------------------------- encoding
    def tokenize(self, text: str, pair: str | None = None, add_special_tokens: bool = False, **kwargs) -> list[str]:
        kwargs.pop("return_offsets_mapping", None)
        enc = self(text, pair, add_special_tokens=add_special_tokens, return_offsets_mapping=True, **kwargs)
        if pair is not None:  # an added token's text may come from either sequence: the alignment knows which
            return enc.tokens()
        ids, offsets = enc["input_ids"], enc["offset_mapping"]
        if ids and isinstance(ids[0], list):
            ids, offsets = ids[0], offsets[0]
        added = self._added_by_id()
        out = []
        for k, i in enumerate(ids):
            a = added.get(i)
            if a is None:
                out.append(self._core.id_to_token(i))
                continue
            out.append(self._added_token_string(a, i, text[offsets[k][0]:offsets[k][1]]))
        return out

    def _alignment_tokens(self, ids, offsets, seq, words, attention, text, pair, split_words, tables) -> list[str]:
        # Encoding.tokens: vocabulary strings, the pad token on padding, and for an added token
        # found in the text the text it matched (as tokenize() gives it). tables: _token_tables()
        vocab, added, pad = tables
        out = [vocab[i] if m else pad for i, m in zip(ids, attention)]
        for k in [k for k, i in enumerate(ids) if i in added]:
            if seq[k] is None:  # [CLS] / [SEP] of the template
                continue
            source = text if seq[k] == 0 else pair
            if split_words:
                source = source[words[k]]
            out[k] = self._added_token_string(added[ids[k]], ids[k], source[offsets[k][0]:offsets[k][1]])
        return out

    def _token_tables(self):
        # once per batch: id -> token string, added tokens by id, the pad token
        return self._core.tokens(), self._added_by_id(), self.pad_token

    def _added_token_string(self, a, i, piece):
        # HF's token string for an added token is the matched text, stripped spaces included
        # (a token's own leading or trailing space is part of its content: compare both stripped).
        # piece: the original text under the token's offsets
        if not a.get("normalized", not a.get("special", False)):
            return piece if piece.strip() == a["content"].strip() else self._core.id_to_token(i)
        # a normalized token was matched in the normalized text, and its string is cut from there
        text, content = self._core.normalize(piece), self._core.normalize(a["content"]).strip()
        if text.strip() == content:
            return text
        # Next to a CJK character the offsets also cover that character: the normalizer put spaces
        # around it, and lstrip / rstrip took the one on the token's side. Cut the content and the
        # spaces that those flags take back out of the normalized text.
        at = text.find(content) if content else -1
        if at < 0:  # an [UNK] made by WordPiece (not found in the text) is just the token
            return self._core.id_to_token(i)
        start, end = at, at + len(content)
        while a.get("lstrip", False) and start > 0 and text[start - 1].isspace():
            start -= 1
        while a.get("rstrip", False) and end < len(text) and text[end].isspace():
            end += 1
        return text[start:end]

    def _id_to_token(self, i: int):
        # HF gives a normalized added token back in its normalized form (the core's normalizer)
        t = self._core.id_to_token(i) if i <= _MAX_SIZE else None  # beyond the vocabulary, as HF
        if t is not None and self._normalized_ids and i in self._normalized_ids:
            return self._core.normalize(t)
        return t

    def _added_by_id(self):
        return {self._core.token_to_id(a["content"]): a for a in self._added}

    def encode(self, text, text_pair=None, add_special_tokens: bool = True, padding=False, truncation=None,
               max_length: int | None = None, stride: int = 0, return_tensors=None, **kwargs):
        if (type(text) is str and text_pair is None and padding is False and truncation is None
                and max_length is None and stride == 0 and return_tensors is None and not kwargs):
            out, _ = self._encode_one_raw(text, add_special_tokens, False, False, True)
            return out["input_ids"][0]
        enc = self(text, text_pair, add_special_tokens=add_special_tokens, padding=padding,
                   truncation=truncation, max_length=max_length, stride=stride,
                   return_tensors=return_tensors, **kwargs)
        return enc["input_ids"]

    def _strategies(self, padding, truncation, max_length, pad_to_multiple_of):
        padding, truncation = _enum_value(padding), _enum_value(truncation)
        if max_length is not None and padding is False and truncation is None:
            truncation = "longest_first"
        if padding is True:
            if max_length is not None and truncation in (None, False, "do_not_truncate"):
                warnings.warn("`max_length` is ignored when `padding`=`True` and there is no truncation "
                              "strategy. To pad to max length, use `padding='max_length'`.")
            pad = "longest"
        elif padding is False or padding is None:
            pad = "do_not_pad"
        elif padding in _PADDING:
            pad = padding
        else:
            raise ValueError(f"{padding!r} is not a valid PaddingStrategy, please select one of "
                             f"{list(_PADDING)}")
        if truncation is True:
            trunc = "longest_first"
        elif truncation is False or truncation is None:
            trunc = "do_not_truncate"
        elif truncation in _TRUNCATION:
            trunc = truncation
        else:
            raise ValueError(f"{truncation!r} is not a valid TruncationStrategy, please select one of "
                             f"{list(_TRUNCATION)}")
        if max_length is None:
            if pad == "max_length":
                if self.model_max_length > LARGE_INTEGER:
                    logger.warning("Asking to pad to max_length but no maximum length is provided and the model "
                                   "has no predefined maximum length. Default to no padding.")
                    pad = "do_not_pad"
                else:
                    max_length = _count("model_max_length", self.model_max_length)
            if trunc != "do_not_truncate":
                if self.model_max_length > LARGE_INTEGER:
                    logger.warning("Asking to truncate to max_length but no maximum length is provided and the "
                                   "model has no predefined maximum length. Default to no truncation.")
                    trunc = "do_not_truncate"
                else:
                    max_length = _count("model_max_length", self.model_max_length)
        if pad != "do_not_pad" and (self.pad_token is None or self.pad_token_id is None):
            raise ValueError("Asking to pad but the tokenizer does not have a padding token. Please select a "
                             "token to use as `pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` "
                             "or add a new pad token via `tokenizer.add_special_tokens({'pad_token': '[PAD]'})`.")
        if (trunc != "do_not_truncate" and pad != "do_not_pad" and pad_to_multiple_of is not None
                and max_length is not None and max_length % pad_to_multiple_of != 0):
            raise ValueError("Truncation and padding are both activated but truncation length "
                             f"({max_length}) is not a multiple of pad_to_multiple_of ({pad_to_multiple_of}).")
        return pad, trunc, max_length

    def __call__(self, text=None, text_pair=None, add_special_tokens: bool = True, padding=False,
                 truncation=None, max_length: int | None = None, stride: int = 0,
                 is_split_into_words: bool = False, pad_to_multiple_of: int | None = None,
                 padding_side: str | None = None, return_tensors=None, return_token_type_ids=None,
                 return_attention_mask=None, return_overflowing_tokens: bool = False,
                 return_special_tokens_mask: bool = False, return_offsets_mapping: bool = False,
                 return_length: bool = False, verbose: bool = True, **kwargs) -> BatchEncoding:
        if (type(text) is str and text_pair is None and padding is False and truncation is None
                and max_length is None and stride == 0 and not is_split_into_words and pad_to_multiple_of is None
                and padding_side is None and return_tensors is None and not kwargs
                and not (return_overflowing_tokens or return_special_tokens_mask or return_offsets_mapping
                         or return_length)
                and self.padding_side in _SIDES and self.truncation_side in _SIDES):
            return self._encode_one(text, add_special_tokens, return_token_type_ids, return_attention_mask, verbose)
        if text is None:
            raise ValueError("You need to specify `text`.")
        max_length, stride = _count("max_length", max_length), _count("stride", stride) or 0
        pad_to_multiple_of = _count("pad_to_multiple_of", pad_to_multiple_of)
        pad, trunc, max_length = self._strategies(padding, truncation, max_length, pad_to_multiple_of)
        if is_split_into_words:
            batched = isinstance(text, (list, tuple)) and bool(text) and isinstance(text[0], (list, tuple))
        else:
            batched = isinstance(text, (list, tuple))
            if not batched and not isinstance(text, str):
                raise TypeError(f"text must be a str or a list of str, got {_kind(text)}")
        if batched:
            if isinstance(text_pair, str):
                raise TypeError("when tokenizing batches of text, `text_pair` must be a list or tuple with the "
                                "same length as `text`.")
            if text_pair is not None and not isinstance(text_pair, (list, tuple)):
                raise TypeError("text_pair must be a list or tuple with the same length as text, got "
                                f"{_kind(text_pair)}")
            if text_pair is not None and len(text) != len(text_pair):
                raise ValueError(f"batch length of `text`: {len(text)} does not match batch length of "
                                 f"`text_pair`: {len(text_pair)}.")
            texts, pairs = text, text_pair
        else:
            wanted = (list, tuple) if is_split_into_words else str
            if text_pair is not None and not isinstance(text_pair, wanted):
                raise TypeError(f"text_pair must be {'a list of words' if is_split_into_words else 'a str'} "
                                f"like text, got {_kind(text_pair)}")
            texts = [text]
            pairs = [text_pair] if text_pair else None
        side = padding_side if padding_side is not None else self.padding_side
        if side not in _SIDES:
            raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")
        if self.truncation_side not in _SIDES:
            raise ValueError(f"truncation_side must be 'left' or 'right', got {self.truncation_side!r}")
        kind = _enum_value(return_tensors)
        if kind not in (None, "np", "pt"):
            raise ValueError(f"return_tensors must be None, 'np' or 'pt', got {kind!r}")
        has_pair = pairs is not None
        if trunc != "do_not_truncate":
            # tokenizers' own check, made with the single-sequence special count whatever the input;
            # a max_length below that count wraps around in Rust and means "no truncation"
            effective = max_length - self.num_special_tokens_to_add(False)
            if effective >= 0 and stride > effective:
                raise ValueError(f"tokenizer stride set to {stride}, which is greater than or equal to its "
                                 f"effective max length of {effective} (= {max_length} original max length - "
                                 f"{self.num_special_tokens_to_add(False)} added special tokens), ")
        want_types, want_attn = self._wanted_outputs(return_token_type_ids, return_attention_mask)
        options = (
            bool(is_split_into_words), bool(add_special_tokens), _TRUNCATION[trunc], max_length or 0, stride,
            self.truncation_side == "left", _PADDING[pad], pad_to_multiple_of or 0, side == "left",
            int(self.pad_token_id or 0), self._num_threads, want_types, want_attn,
            bool(return_special_tokens_mask), bool(return_offsets_mapping), bool(return_length),
            bool(return_overflowing_tokens), kind is not None, False)
        out, longest = self._core.encode_batch(texts, pairs, options)
        if max_length is None and verbose:
            self._warn_if_long(longest)
        enc = BatchEncoding(out)
        if kind is not None:
            if "offset_mapping" in enc and not isinstance(enc["offset_mapping"], np.ndarray):
                enc["offset_mapping"] = [[list(p) for p in row] for row in enc["offset_mapping"]]
            enc.convert_to_tensors(kind)
        else:
            numpy_keys = [k for k, v in enc.items() if isinstance(v, np.ndarray)]
            for k in numpy_keys:  # padded numpy rows -> lists (only when the C++ side made arrays)
                enc[k] = enc[k].tolist()
            if not batched and not return_overflowing_tokens:
                enc = BatchEncoding({k: (v[0] if v and isinstance(v[0], list) else v) for k, v in enc.items()})
        if texts:
            # alignment (word_ids() ...) is computed on first use, from the input as it is now: the
            # caller's lists (and pre-split words) may change, the str in them cannot
            if batched or is_split_into_words:
                texts, pairs = _freeze(texts, is_split_into_words), _freeze(pairs, is_split_into_words)
            enc._source = (self, texts, pairs, options, return_overflowing_tokens)
        return enc

    def _encode_one(self, text: str, add_special_tokens, return_token_type_ids, return_attention_mask,
                    verbose) -> BatchEncoding:
        """__call__ on one str with no padding, truncation or extra outputs: what a loop over single
        texts calls. The same result as the general path, without its per-call argument handling."""
        want_types, want_attn = self._wanted_outputs(return_token_type_ids, return_attention_mask)
        out, options = self._encode_one_raw(text, add_special_tokens, want_types, want_attn, verbose)
        enc = BatchEncoding({k: v[0] for k, v in out.items()})
        enc._source = (self, [text], None, options, False)
        return enc

    def _encode_one_raw(self, text: str, add_special_tokens, want_types: bool, want_attn: bool, verbose):
        # the C++ output (rows of one) and the options it was made with
        options = _ONE_TEXT_OPTIONS[bool(add_special_tokens), want_types, want_attn]
        out, longest = self._core.encode_batch((text,), None, options)
        if verbose:
            self._warn_if_long(longest)
        return out, options

    def _wanted_outputs(self, return_token_type_ids, return_attention_mask) -> tuple[bool, bool]:
        # token_type_ids / attention_mask: as asked, else as the model's inputs say
        want_types = "token_type_ids" in self.model_input_names if return_token_type_ids is None \
            else bool(return_token_type_ids)
        want_attn = "attention_mask" in self.model_input_names if return_attention_mask is None \
            else bool(return_attention_mask)
        return want_types, want_attn

    def _warn_if_long(self, longest: int) -> None:
        # transformers' notice, once per tokenizer, for a sequence longer than the model takes
        if self._warned_long or longest <= self.model_max_length:
            return
        logger.warning("Token indices sequence length is longer than the specified maximum sequence length "
                       f"for this model ({longest} > {self.model_max_length}). Running this sequence through "
                       "the model will result in indexing errors")
        self._warned_long = True

    # ---------------------------------------------------------------------------------- saving
    def pad(self, encoded_inputs, padding=True, max_length: int | None = None,
            pad_to_multiple_of: int | None = None, padding_side: str | None = None,
            return_attention_mask: bool | None = None, return_tensors=None, verbose: bool = True) -> BatchEncoding:
        """Pads encodings made without padding (one dict of lists, or a list of dicts such as dataset
        rows) as transformers' tokenizer.pad does; DataCollatorWithPadding calls this."""
        from fastbert.tokenizer_pad import pad
        return pad(self, encoded_inputs, padding, max_length, pad_to_multiple_of, padding_side,
                   return_attention_mask, return_tensors, verbose)

    def save_pretrained(self, save_directory, **kwargs) -> tuple[str, ...]:
        """Writes vocab.txt, tokenizer_config.json and special_tokens_map.json (loadable by fastbert
        and by transformers)."""
        save_directory = os.fspath(save_directory)
        if os.path.isfile(save_directory):
            raise OSError(f"save_pretrained needs a directory, {save_directory} is a file")
        os.makedirs(save_directory, exist_ok=True)
        tokens = self._core.tokens()
        vocab_path = os.path.join(save_directory, "vocab.txt")
        with open(vocab_path, "w", encoding="utf-8", newline="\n") as f:
            for t in tokens[:self._core.base_ids()]:
                f.write(t + "\n")
        decoder = {}
        for a in self._added:
            i = self._core.token_to_id(a["content"])
            decoder[str(i)] = {"content": a["content"], "lstrip": bool(a.get("lstrip", False)),
                               "normalized": bool(a.get("normalized", False)),
                               "rstrip": bool(a.get("rstrip", False)),
                               "single_word": bool(a.get("single_word", False)),
                               "special": bool(a.get("special", False))}
        config = {"tokenizer_class": "BertTokenizer", "do_lower_case": self.do_lower_case,
                  "strip_accents": self.strip_accents, "tokenize_chinese_chars": self.tokenize_chinese_chars,
                  "model_max_length": self.model_max_length, "padding_side": self.padding_side,
                  "truncation_side": self.truncation_side,
                  "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
                  **({} if self.clean_text else {"clean_text": False}),  # fastbert's own option
                  "added_tokens_decoder": dict(sorted(decoder.items(), key=lambda kv: int(kv[0])))}
        specials = dict(self.special_tokens_map)
        if self.additional_special_tokens:  # the key every transformers version reads
            specials["additional_special_tokens"] = list(self.additional_special_tokens)
        config.update(specials)
        config_path = os.path.join(save_directory, "tokenizer_config.json")
        with open(config_path, "w", encoding="utf-8") as f:
            json.dump(config, f, indent=2, ensure_ascii=False)
        map_path = os.path.join(save_directory, "special_tokens_map.json")
        with open(map_path, "w", encoding="utf-8") as f:
            json.dump(specials, f, indent=2, ensure_ascii=False)
        return vocab_path, config_path, map_path
