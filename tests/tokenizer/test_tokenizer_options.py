"""The named options struct shared by Python and C++ (fastbert._C.EncodeOptions) and the per-tokenizer
cache that builds one per call signature: every field reaches C++ under its own name."""
import inspect

import pytest

from fastbert import _C
from fastbert.tokenizer.options import PADDING, TRUNCATION, OptionsCache

FLAGS = ["split_words", "add_special_tokens", "split_special_tokens", "truncate_left", "pad_left", "packed",
         "type_ids", "attention_mask", "special_tokens_mask", "offsets", "length", "overflow", "numpy"]
SIZES = ["max_length", "stride", "pad_to_multiple_of"]


def test_defaults_and_names():
    o = _C.EncodeOptions()
    assert o.add_special_tokens and o.type_ids and o.attention_mask
    assert not any(getattr(o, f) for f in FLAGS if f not in ("add_special_tokens", "type_ids", "attention_mask"))
    assert o.truncation == _C.Truncation.none and o.padding == _C.Padding.none and o.num_threads == 1
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_lenght'"):
        _C.EncodeOptions(max_lenght=5)
    with pytest.raises(TypeError, match="must be a bool"):
        _C.EncodeOptions(offsets=1)
    with pytest.raises(AttributeError):
        o.offsets = True  # read-only: a cached object is shared by many calls and their BatchEncodings
    with pytest.raises(ValueError, match="words needs offsets"):
        _C.EncodeOptions(words=True)
    with pytest.raises(ValueError, match="packed"):
        _C.EncodeOptions(packed=True, padding=_C.Padding.longest)


@pytest.mark.parametrize("name", FLAGS + SIZES + ["truncation", "padding", "pad_id", "num_threads"])
def test_each_cache_parameter_reaches_its_own_field(name):
    # A swapped pair of parameters would change output silently: each one, set alone, must change
    # exactly its own field of the C++ struct.
    cache = OptionsCache()
    default = cache.get()
    value = {"truncation": "only_second", "padding": "max_length", "pad_id": 7, "num_threads": 3}.get(
        name, 9 if name in SIZES else not getattr(default, name))
    if name == "packed":
        changed = cache.get(packed=True, attention_mask=False)
    else:
        changed = cache.get(**{name: value})
    expected = {"truncation": TRUNCATION, "padding": PADDING}.get(name, {}).get(value, value)
    assert getattr(changed, name) == expected
    fields = [f for f in FLAGS + SIZES + ["truncation", "padding", "pad_id", "num_threads"]
              if f != name and not (name == "packed" and f == "attention_mask")]
    assert [getattr(changed, f) for f in fields] == [getattr(default, f) for f in fields]


def test_cache_returns_the_same_object_per_signature():
    cache = OptionsCache()
    assert cache.get(max_length=128, truncation="longest_first") is cache.get(truncation="longest_first",
                                                                             max_length=128)
    assert cache.get(max_length=128) is not cache.get(max_length=129)
    params = list(inspect.signature(OptionsCache.get).parameters)[1:]
    assert sorted(params) == sorted(FLAGS + SIZES + ["truncation", "padding", "pad_id", "num_threads"])


def test_for_alignment_keeps_the_rows_and_asks_for_everything():
    o = OptionsCache().get(truncation="longest_first", max_length=12, stride=2, padding="longest", pad_left=True,
                           numpy=True, length=True)
    a = o.for_alignment()
    assert (a.truncation, a.max_length, a.stride, a.padding, a.pad_left) == (o.truncation, 12, 2, o.padding, True)
    assert a.words and a.offsets and a.overflow and a.special_tokens_mask and not a.numpy and not a.length
