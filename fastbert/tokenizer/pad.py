"""BertTokenizer.pad: pads encodings made earlier (without padding) to one length, as transformers'
tokenizer.pad does. transformers' DataCollatorWithPadding (and so Trainer's default collator for
text classification) calls it on a list of dataset rows, so it follows HF's rules exactly: the
padding strategy and max_length of __call__, pad_to_multiple_of, padding_side, an attention mask
made when missing; keys it does not know (labels, ...) pass through and become tensors too."""
from collections.abc import Mapping

import numpy as np

from fastbert.tokenizer.encoding import BatchEncoding, as_tensor
from fastbert.tokenizer.options import enum_value, resolve_strategies

# the keys padded, and their padding value (None: the tokenizer's pad/pad-type id)
_PAD_VALUES = {"input_ids": None, "token_type_ids": None, "attention_mask": 0, "special_tokens_mask": 1}


def _py(value):
    """torch tensors and numpy arrays (or lists of them) as Python lists, as HF's to_py_obj."""
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_py(v) for v in value]
    return value


def _as_dict_of_lists(encoded_inputs) -> dict:
    if isinstance(encoded_inputs, (list, tuple)):
        if not encoded_inputs or not isinstance(encoded_inputs[0], Mapping):
            raise TypeError("pad() takes an encoding (a dict of lists) or a list of encodings (dicts), got a "
                            f"{type(encoded_inputs).__name__} of "
                            f"{type(encoded_inputs[0]).__name__ if encoded_inputs else 'nothing'}")
        keys = list(encoded_inputs[0].keys())
        out = {}
        for key in keys:
            column = []
            for i, example in enumerate(encoded_inputs):
                if not isinstance(example, Mapping) or key not in example:
                    raise ValueError(f"pad(): encoding {i} has no {key!r} (encoding 0 has keys {keys})")
                column.append(example[key])
            out[key] = column
        return out
    if isinstance(encoded_inputs, Mapping):
        return dict(encoded_inputs)  # a copy: the caller's encoding is not padded in place
    raise TypeError("pad() takes an encoding (a dict of lists) or a list of encodings (dicts), got "
                    f"{type(encoded_inputs).__name__}")


def _pad_one(tok, example: dict, max_length, strategy, multiple, side, want_mask) -> dict:
    """HF's _pad for one sequence's dict of lists."""
    main = tok.model_input_names[0]
    ids = example[main]
    if strategy == "longest":
        max_length = len(ids)
    if max_length is not None and multiple is not None and max_length % multiple != 0:
        max_length = (max_length // multiple + 1) * multiple
    if want_mask and "attention_mask" not in example:
        example["attention_mask"] = [1] * len(ids)
    if strategy == "do_not_pad" or len(ids) == max_length:
        return example
    extra = max_length - len(ids)
    for key, value in _PAD_VALUES.items():
        if key not in example or (key == "attention_mask" and not want_mask):
            continue
        if value is None:
            value = tok.pad_token_id if key == main else tok.pad_token_type_id
        fill = [value] * extra
        example[key] = list(example[key]) + fill if side == "right" else fill + list(example[key])
    return example


def _tensor(key, value, kind):
    if kind is None or key in _PAD_VALUES:
        return as_tensor(key, value, kind)
    try:
        if kind == "np":
            return np.asarray(value)
        import torch
        return torch.tensor(value)  # dtype inferred, as HF: int labels int64, float labels float32
    except (ValueError, TypeError) as e:  # a key pad() does not pad, with rows of different lengths
        raise ValueError(
            "Unable to create tensor, you should probably activate truncation and/or padding with "
            "'padding=True' 'truncation=True' to have batched tensors with the same length. "
            f"Perhaps your features (`{key}` in this case) have excessive nesting (inputs type `list` where "
            f"type `int` is expected). ({e})") from e


def pad(tok, encoded_inputs, padding=True, max_length=None, pad_to_multiple_of=None, padding_side=None,
        return_attention_mask=None, return_tensors=None, verbose: bool = True):
    """tokenizer.pad(...) for `tok` (what it reads of it: model_input_names, pad_token(_id),
    pad_token_type_id, padding_side, model_max_length)."""
    inputs = _as_dict_of_lists(encoded_inputs)
    main = tok.model_input_names[0]
    if main not in inputs:
        raise ValueError("You should supply an encoding or a list of encodings to this method that includes "
                         f"{main}, but you provided {list(inputs.keys())}")
    want_mask = ("attention_mask" in tok.model_input_names if return_attention_mask is None
                 else bool(return_attention_mask))
    required = inputs[main]
    if required is None or (hasattr(required, "__len__") and len(required) == 0):
        if want_mask:
            inputs["attention_mask"] = []
        return BatchEncoding(inputs)

    # tensors in: lists to pad, and tensors of the same kind out unless asked otherwise
    first = required[0]
    if isinstance(first, (list, tuple)):
        first = next((row[0] for row in required if len(row)), first)
    if not isinstance(first, (int, list, tuple)):
        if hasattr(first, "detach"):
            return_tensors = "pt" if return_tensors is None else return_tensors
        elif isinstance(first, (np.ndarray, np.integer)):
            return_tensors = "np" if return_tensors is None else return_tensors
        else:
            raise ValueError(f"type of {first} unknown: {type(first)}. Should be one of a python, numpy, or "
                             "pytorch object.")
        inputs = {k: _py(v) for k, v in inputs.items()}
    kind = enum_value(return_tensors)
    if kind not in (None, "np", "pt"):
        raise ValueError(f"return_tensors must be None, 'np' or 'pt', got {kind!r}")

    strategy, _, max_length = resolve_strategies(padding, None, max_length, pad_to_multiple_of,
                                             tok.model_max_length,
                                             tok.pad_token is not None and tok.pad_token_id is not None)
    side = padding_side if padding_side is not None else tok.padding_side
    if side not in ("left", "right"):
        raise ValueError(f"padding_side must be 'left' or 'right', got {side!r}")

    required = inputs[main]
    if not isinstance(required[0], (list, tuple)):  # one sequence
        out = _pad_one(tok, inputs, max_length, strategy, pad_to_multiple_of, side, want_mask)
        return BatchEncoding({k: _tensor(k, v, kind) for k, v in out.items()})

    batch = len(required)
    for key, value in inputs.items():
        if not hasattr(value, "__len__") or len(value) != batch:
            raise ValueError(f"pad(): {key!r} has {len(value) if hasattr(value, '__len__') else 'no'} rows, "
                             f"{main!r} has {batch}")
    if strategy == "longest":
        max_length, strategy = max(len(row) for row in required), "max_length"
    columns: dict = {}
    for i in range(batch):
        row = _pad_one(tok, {k: v[i] for k, v in inputs.items()}, max_length, strategy, pad_to_multiple_of,
                       side, want_mask)
        for key, value in row.items():
            columns.setdefault(key, []).append(value)
    return BatchEncoding({k: _tensor(k, v, kind) for k, v in columns.items()})
