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


class Aligner:
    """What alignment needs of a tokenizer, and nothing more: its C++ core (to encode a batch again
    with word data; token strings; the normalizer), its added tokens, and its special tokens (the
    tokenizer's own dict, so a pad token set later is seen). The tokenizer owns one; a BatchEncoding
    holds (aligner, texts, pairs, options, flatten_overflow) until its alignment is asked for."""

    __slots__ = ("core", "added", "specials", "_added_by_id", "gaps")

    def __init__(self, core, added: list[dict], specials: dict, gaps=((1,), (1, 1))):
        self.core = core
        self.added = added
        self.specials = specials
        self._added_by_id = None
        # the template's special tokens before $A (single), and before $A and between $A and $B (pair)
        self.gaps = gaps

    def added_by_id(self) -> dict[int, dict]:
        # added tokens are fixed when the tokenizer is made
        if self._added_by_id is None:
            self._added_by_id = {self.core.token_to_id(a["content"]): a for a in self.added}
        return self._added_by_id

    def added_token_string(self, a: dict, i: int, piece: str) -> str:
        """HF's token string for added token `a` (id i): the text it matched, stripped spaces
        included (a token's own leading or trailing space is part of its content: compare both
        stripped). piece: the original text under the token's offsets."""
        core = self.core
        if not a.get("normalized", not a.get("special", False)):
            return piece if piece.strip() == a["content"].strip() else core.id_to_token(i)
        # a normalized token was matched in the normalized text, and its string is cut from there
        text, content = core.normalize(piece), core.normalize(a["content"]).strip()
        if text.strip() == content:
            return text
        # Next to a CJK character the offsets also cover that character: the normalizer put spaces
        # around it, and lstrip / rstrip took the one on the token's side. Cut the content and the
        # spaces that those flags take back out of the normalized text.
        at = text.find(content) if content else -1
        if at < 0:  # an [UNK] made by WordPiece (not found in the text) is just the token
            return core.id_to_token(i)
        start, end = at, at + len(content)
        while a.get("lstrip", False) and start > 0 and text[start - 1].isspace():
            start -= 1
        while a.get("rstrip", False) and end < len(text) and text[end].isspace():
            end += 1
        return text[start:end]

    def encodings(self, texts, pairs, options, flatten_overflow) -> list[Encoding]:
        """The Encoding of every row of a batch encoded with `options` (an EncodeOptions)."""
        out, _ = self.core.encode_batch(texts, pairs, options.for_alignment())
        main: list[Encoding] = []
        flat: list[Encoding] = []
        by_a: dict[int, Encoding] = {}        # this item's rows (A_i, B_0)
        by_b: dict[int, list[Encoding]] = {}  # this item's rows (A_i, B_j), i >= 1, by j
        items = out["overflow_to_sample_mapping"]
        vocab = self.core.tokens()
        for k, item in enumerate(items):
            pair = pairs[item] if pairs is not None else None  # None also for a text in a batch of pairs
            enc = self._row(out, k, texts[item], pair, options, 1 if pair is None else 2, vocab)
            if k == 0 or items[k - 1] != item:
                main.append(enc)
                by_a, by_b = {}, {}
            else:
                main[-1].overflowing.append(enc)
            flat.append(enc)
            # Encoding::merge_with nests one level more when both sequences overflow: (A_i, B_0) holds
            # (A_i, B_j) for j >= 1, and (A_0, B_j) holds (A_i, B_j) for i >= 1 (rows come in that order)
            i, j, _ = out["windows"][k]
            if not j:
                by_a[i] = enc
            elif i:
                by_a[i].overflowing.append(enc)
                by_b.setdefault(j, []).append(enc)
            else:
                enc.overflowing.extend(by_b.get(j, ()))
        return flat if flatten_overflow else main

    def _row(self, out, k, text, pair, options, n_seq, vocab) -> Encoding:
        ids = out["input_ids"][k]
        types = out["token_type_ids"][k]
        special = out["special_tokens_mask"][k]
        attn = out["attention_mask"][k]
        offsets = out["offset_mapping"][k]
        words = out["word_ids"][k]
        # the sequence of each token: A's tokens come first (out["windows"] counts them), then B's;
        # token types cannot tell (MPNet's template gives B type 0)
        count_a = out["windows"][k][2]
        seq, seen = [], 0
        for s in special:
            seq.append(None if s else (0 if seen < count_a else 1))
            seen += not s
        lo = len(ids) - sum(attn) if options.pad_left else 0
        gaps = self.gaps[n_seq - 1] if options.add_special_tokens else (0, 0)
        start_a = lo + gaps[0]
        ranges = {0: range(start_a, start_a + count_a)}
        if n_seq == 2:
            start_b = start_a + count_a + gaps[1]
            ranges[1] = range(start_b, start_b + seen - count_a)
        tokens = self._tokens(ids, offsets, seq, words, attn, text, pair, options.split_words, vocab)
        return Encoding(ids, types, tokens, offsets, attn, special, words, seq, ranges)  # offsets: tuples

    def _tokens(self, ids, offsets, seq, words, attention, text, pair, split_words, vocab) -> list[str]:
        # Encoding.tokens: vocabulary strings, the pad token on padding, and for an added token
        # found in the text the text it matched (as tokenize() gives it)
        added = self.added_by_id()
        pad = self.specials.get("pad_token")
        out = [vocab[i] if m else pad for i, m in zip(ids, attention)]
        for k in [k for k, i in enumerate(ids) if i in added]:
            if seq[k] is None:  # [CLS] / [SEP] of the template
                continue
            source = text if seq[k] == 0 else pair
            if split_words:
                source = source[words[k]]
            out[k] = self.added_token_string(added[ids[k]], ids[k], source[offsets[k][0]:offsets[k][1]])
        return out
