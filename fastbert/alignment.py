"""Token <-> word <-> character alignment, as `tokenizers.Encoding` gives it to `transformers`'
BatchEncoding (word_ids, sequence_ids, tokens, char_to_token, ...).

The default encode paths never compute any of this: a BatchEncoding keeps what it needs to encode
its batch again (`AlignmentSource`), and the first alignment call re-encodes it in C++ with word
tracking and offsets. Encoding is deterministic, so the rows (truncation windows, overflow rows,
padding) are the ones the user already holds. The methods follow tokenizers' encoding.rs.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple


class TokenSpan(NamedTuple):
    start: int
    end: int


class CharSpan(NamedTuple):
    start: int
    end: int


class Encoding:
    """One row of a batch: ids, tokens, offsets, word and sequence indices, like tokenizers.Encoding."""

    def __init__(self, ids, type_ids, tokens, offsets, attention_mask, special_tokens_mask, word_ids,
                 sequence_ids, ranges, overflowing=()):
        self.ids = ids
        self.type_ids = type_ids
        self.tokens = tokens
        self.offsets = offsets
        self.attention_mask = attention_mask
        self.special_tokens_mask = special_tokens_mask
        self.word_ids = word_ids
        self.sequence_ids = sequence_ids
        self._ranges = ranges  # sequence index -> range of its tokens (never empty: BERT's template sets it)
        self.overflowing = list(overflowing)

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        return (f"Encoding(num_tokens={len(self.ids)}, attributes=[ids, type_ids, tokens, offsets, "
                "attention_mask, special_tokens_mask, overflowing])")

    @property
    def n_sequences(self) -> int:
        return len(self._ranges)

    @property
    def words(self):
        warnings.warn("Encoding.words is deprecated, please use Encoding.word_ids instead.", DeprecationWarning,
                      stacklevel=2)
        return self.word_ids

    def _range(self, sequence_index: int) -> range:
        return self._ranges.get(sequence_index, range(len(self.ids)))

    def token_to_sequence(self, token_index: int):
        _check_index("token_index", token_index)
        for s, r in self._ranges.items():
            if token_index in r:
                return s
        return None

    def token_to_word(self, token_index: int):
        if self.token_to_sequence(token_index) is None or token_index >= len(self.ids):
            return None
        return self.word_ids[token_index]

    def token_to_chars(self, token_index: int):
        if self.token_to_sequence(token_index) is None or token_index >= len(self.ids):
            return None
        return tuple(self.offsets[token_index])

    def word_to_tokens(self, word_index: int, sequence_index: int = 0):
        _check_index("word_index", word_index)
        _check_index("sequence_index", sequence_index)
        r = self._range(sequence_index)
        start = end = None
        # tokenizers stops at the first word index above the one asked for (None sorts below all)
        for i in r:
            w = self.word_ids[i]
            if w is not None and w > word_index:
                break
            if w == word_index:
                if start is None:
                    start = i
                end = i + 1
        return None if start is None else (start, end)

    def word_to_chars(self, word_index: int, sequence_index: int = 0):
        span = self.word_to_tokens(word_index, sequence_index)
        if span is None or span[1] == 0:
            return None
        return (self.offsets[span[0]][0], self.offsets[span[1] - 1][1])

    def char_to_token(self, char_pos: int, sequence_index: int = 0):
        _check_index("char_pos", char_pos)
        _check_index("sequence_index", sequence_index)
        for i in self._range(sequence_index):
            a, b = self.offsets[i]
            if a <= char_pos < b:
                return i
        return None

    def char_to_word(self, char_pos: int, sequence_index: int = 0):
        t = self.char_to_token(char_pos, sequence_index)
        return None if t is None else self.token_to_word(t)


def _check_index(name: str, value) -> None:
    # tokenizers takes these as unsigned integers; Python ints only (bool is an int there too)
    if not isinstance(value, int) and not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise OverflowError(f"{name} must be >= 0, got {value}")


class AlignmentSource:
    """What a BatchEncoding needs to encode its batch again with alignment data."""

    __slots__ = ("tokenizer", "texts", "pairs", "options", "split_words", "flatten_overflow")

    def __init__(self, tokenizer, texts, pairs, options, flatten_overflow):
        self.tokenizer = tokenizer
        self.texts = texts
        self.pairs = pairs
        self.options = options  # the encode_batch options of the call
        self.split_words = bool(options[0])
        self.flatten_overflow = bool(flatten_overflow)

    def encodings(self) -> list[Encoding]:
        tok = self.tokenizer
        opts = list(self.options)
        # types, attention, special mask, offsets on; length off; overflow rows kept; lists; words
        opts[11:19] = [True, True, True, True, False, True, False, True]
        out, _ = tok._core.encode_batch(self.texts, self.pairs, tuple(opts))
        pad_left = bool(opts[8])
        n_seq = 1 if self.pairs is None else 2
        main: list[Encoding] = []
        flat: list[Encoding] = []
        by_a: dict[int, Encoding] = {}        # this item's rows (A_i, B_0)
        by_b: dict[int, list[Encoding]] = {}  # this item's rows (A_i, B_j), i >= 1, by j
        items = out["overflow_to_sample_mapping"]
        tables = tok._token_tables()
        for k, item in enumerate(items):
            enc = self._row(out, k, item, pad_left, n_seq, opts[1], tables)
            if k == 0 or items[k - 1] != item:
                main.append(enc)
                by_a, by_b = {}, {}
            else:
                main[-1].overflowing.append(enc)
            flat.append(enc)
            # Encoding::merge_with nests one level more when both sequences overflow: (A_i, B_0) holds
            # (A_i, B_j) for j >= 1, and (A_0, B_j) holds (A_i, B_j) for i >= 1 (rows come in that order)
            i, j = out["windows"][k]
            if not j:
                by_a[i] = enc
            elif i:
                by_a[i].overflowing.append(enc)
                by_b.setdefault(j, []).append(enc)
            else:
                enc.overflowing.extend(by_b.get(j, ()))
        return flat if self.flatten_overflow else main

    def _row(self, out, k, item, pad_left, n_seq, specials, tables) -> Encoding:
        tok = self.tokenizer
        ids = out["input_ids"][k]
        types = out["token_type_ids"][k]
        special = out["special_tokens_mask"][k]
        attn = out["attention_mask"][k]
        offsets = out["offset_mapping"][k]
        words = out["word_ids"][k]
        seq = [None if s else t for s, t in zip(special, types)]
        counts = [seq.count(0), seq.count(1)]
        lo = len(ids) - sum(attn) if pad_left else 0
        # BERT's template: [CLS] A [SEP] (B [SEP]); without specials A B
        start_a = lo + (1 if specials else 0)
        ranges = {0: range(start_a, start_a + counts[0])}
        if n_seq == 2:
            start_b = start_a + counts[0] + (1 if specials else 0)
            ranges[1] = range(start_b, start_b + counts[1])
        tokens = tok._alignment_tokens(ids, offsets, seq, words, attn, self._text(item, 0),
                                       self._text(item, 1) if n_seq == 2 else None, self.split_words, tables)
        return Encoding(ids, types, tokens, offsets, attn, special, words, seq, ranges)  # offsets: tuples

    def _text(self, item, sequence):
        texts = self.texts if sequence == 0 else self.pairs
        return texts[item]
