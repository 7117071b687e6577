"""Encode options: HF's padding / truncation arguments resolved to strategies (transformers' rules
and messages), and the named C++ options struct (`fastbert._C.EncodeOptions`) of a call, built once
per call signature and then shared (it is read-only)."""
from __future__ import annotations

import operator
import warnings

from fastbert import _C

VERY_LARGE_INTEGER = int(1e30)  # transformers' "no maximum length"
LARGE_INTEGER = int(1e20)
MAX_SIZE = 2**62  # a length C++ takes as "no limit" (an int64 holds it, a size never reaches it)
SIDES = ("left", "right")
TRUNCATION = {"longest_first": _C.Truncation.longest_first, "only_first": _C.Truncation.only_first,
              "only_second": _C.Truncation.only_second, "do_not_truncate": _C.Truncation.none}
PADDING = {"longest": _C.Padding.longest, "max_length": _C.Padding.max_length, "do_not_pad": _C.Padding.none}


def enum_value(v):
    """transformers' PaddingStrategy / TruncationStrategy / TensorType members as their strings."""
    return getattr(v, "value", v)


def count(name: str, value) -> int | None:
    """max_length / stride / pad_to_multiple_of as a size for C++: a float or a negative value is an
    error (as in transformers), never a silent round or a wrapped-around size; beyond MAX_SIZE all
    sizes mean the same (no limit) and fit C++'s int64."""
    if value is None or (type(value) is int and 0 <= value <= MAX_SIZE):  # the common case, cheaply
        return value
    try:
        n = operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None
    if n < 0:
        raise ValueError(f"{name} must be >= 0, got {n}")
    return min(n, MAX_SIZE)


def resolve_strategies(padding, truncation, max_length, pad_to_multiple_of, model_max_length: int,
                       has_pad_token: bool) -> tuple[str, str, int | None]:
    """(padding strategy, truncation strategy, max_length) as transformers'
    _get_padding_truncation_strategies gives them, with its warnings and errors."""
    padding, truncation = enum_value(padding), enum_value(truncation)
    if max_length is not None and padding is False and truncation is None:
        truncation = "longest_first"
    if padding is True:
        if max_length is not None and truncation in (None, False, "do_not_truncate"):
            warnings.warn("`max_length` is ignored when `padding`=`True` and there is no truncation "
                          "strategy. To pad to max length, use `padding='max_length'`.", stacklevel=3)
        pad = "longest"
    elif padding is False or padding is None:
        pad = "do_not_pad"
    elif padding in PADDING:
        pad = padding
    else:
        raise ValueError(f"{padding!r} is not a valid PaddingStrategy, please select one of {list(PADDING)}")
    if truncation is True:
        trunc = "longest_first"
    elif truncation is False or truncation is None:
        trunc = "do_not_truncate"
    elif truncation in TRUNCATION:
        trunc = truncation
    else:
        raise ValueError(f"{truncation!r} is not a valid TruncationStrategy, please select one of "
                         f"{list(TRUNCATION)}")
    if max_length is None:
        # No max_length and no model_max_length: transformers 5 then neither pads nor truncates, and
        # says nothing. One warning per calling line (Python's default filter), not one per call:
        # inside a pipeline this ran on every batch.
        if pad == "max_length":
            if model_max_length > LARGE_INTEGER:
                warnings.warn("Asking to pad to max_length but no maximum length is provided and the model "
                              "has no predefined maximum length. Default to no padding.", stacklevel=3)
                pad = "do_not_pad"
            else:
                max_length = count("model_max_length", model_max_length)
        if trunc != "do_not_truncate":
            if model_max_length > LARGE_INTEGER:
                warnings.warn("Asking to truncate to max_length but no maximum length is provided and the "
                              "model has no predefined maximum length. Default to no truncation.", stacklevel=3)
                trunc = "do_not_truncate"
            else:
                max_length = count("model_max_length", model_max_length)
    if pad != "do_not_pad" and not has_pad_token:
        raise ValueError("Asking to pad but the tokenizer does not have a padding token. Please select a "
                         "token to use as `pad_token` `(tokenizer.pad_token = tokenizer.eos_token e.g.)` "
                         "or add a new pad token via `tokenizer.add_special_tokens({'pad_token': '[PAD]'})`.")
    if (trunc != "do_not_truncate" and pad != "do_not_pad" and pad_to_multiple_of is not None
            and max_length is not None and max_length % pad_to_multiple_of != 0):
        raise ValueError("Truncation and padding are both activated but truncation length "
                         f"({max_length}) is not a multiple of pad_to_multiple_of ({pad_to_multiple_of}).")
    return pad, trunc, max_length


class OptionsCache:
    """A tokenizer's EncodeOptions by call signature. `get` takes every field by name (the names and
    defaults are EncodeOptions'); equal fields give the same, shared, read-only object."""

    __slots__ = ("_by_key",)
    _LIMIT = 512  # signatures kept (a loop over many max_length values must not grow it forever)

    def __init__(self):
        self._by_key: dict[tuple, _C.EncodeOptions] = {}

    def get(self, *, split_words=False, add_special_tokens=True, split_special_tokens=False,
            truncation="do_not_truncate", max_length=0,
            stride=0, truncate_left=False, padding="do_not_pad", pad_to_multiple_of=0, pad_left=False, pad_id=0,
            packed=False, type_ids=True, attention_mask=True, special_tokens_mask=False, offsets=False,
            length=False, overflow=False, numpy=False, num_threads=1) -> _C.EncodeOptions:
        # the key: every parameter, in signature order (locals() would do, at four times the cost)
        key = (split_words, add_special_tokens, split_special_tokens, truncation, max_length, stride, truncate_left,
               padding, pad_to_multiple_of, pad_left, pad_id, packed, type_ids, attention_mask, special_tokens_mask,
               offsets, length, overflow, numpy, num_threads)
        options = self._by_key.get(key)
        if options is None:
            options = _C.EncodeOptions(
                split_words=split_words, add_special_tokens=add_special_tokens,
                split_special_tokens=split_special_tokens, truncation=TRUNCATION[truncation],
                max_length=max_length, stride=stride, truncate_left=truncate_left, padding=PADDING[padding],
                pad_to_multiple_of=pad_to_multiple_of, pad_left=pad_left, pad_id=pad_id, packed=packed,
                type_ids=type_ids, attention_mask=attention_mask, special_tokens_mask=special_tokens_mask,
                offsets=offsets, length=length, overflow=overflow, numpy=numpy, num_threads=num_threads)
            if len(self._by_key) >= self._LIMIT:
                self._by_key.clear()
            self._by_key[key] = options
        return options
