"""Writes the fuzzer's seed corpus: the tokenizer tests' strings (tests/tokenizer/tokenizer_corpus.py) plus a
few harness-specific inputs, each under several control prefixes (see fuzz_tokenizer.cpp for the
layout). Generated at run time, not committed.   Usage: python csrc/fuzz/seeds.py OUT_DIR
"""
import hashlib
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "tokenizer"))
import tokenizer_corpus as tc  # noqa: E402

# Control bytes: flags (config index, pair, offsets, overflow, threads), max_length, stride, mode.
PREFIXES = [
    bytes([0x21, 0, 0, 0x00]),        # uncased, offsets, no truncation
    bytes([0x3F, 12, 2, 0x01]),       # pair + offsets + added tokens, longest_first 12, stride 2
    bytes([0x7B, 8, 3, 0x06]),        # pair, overflow, short max_chars, only_first from the left
    bytes([0xF9, 9, 1, 0x23]),        # threads, overflow, only_second, extra padding
    bytes([0x24, 40, 0, 0x88]),       # cased, pre-split words, left padding
]
SEP_ITEM, SEP_PAIR, SEP_WORD = "\x1f", "\x1e", "\x1d"

HARNESS = [
    SEP_ITEM.join(tc.GOLDEN),
    SEP_PAIR.join(tc.GOLDEN_PAIR),
    "hello <new> world xyz" + SEP_PAIR + "é! é!x xyzz",
    SEP_WORD.join(tc.ASCII_WORDS),
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101,
    SEP_ITEM.join(["x", "", "y z", ""]),
    "\x02\x01 \t\n\x0b\x0c \x02\x01 x",  # chunks that give no token (UBSan: memcpy from null, chunk cache)
    # combining marks the normalizer holds back and sorts (NFD canonical ordering), a long run too
    "a\u08d4\x01\u0316 \u4e00\U0001d16d\U0001d165\u0130\u0f73x " + "\u0301" * 20 + "\U0001e94a" * 20 + "b",
]


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    strings = list(tc.GOLDEN) + list(tc.EDGE_STRINGS) + HARNESS + [
        tc.WHITESPACE, tc.ZERO_WIDTH, tc.CONTROL, tc.COMBINING, tc.ACCENTED, tc.CJK, tc.OTHER_SCRIPTS,
        tc.EMOJI, tc.ASTRAL, tc.PUNCT, " ".join(tc.SPECIAL_IN_TEXT)]
    n = 0
    for s in strings:
        for p in PREFIXES:
            data = p + s.encode("utf-8", "surrogatepass")
            name = hashlib.sha1(data).hexdigest()
            with open(os.path.join(out, name), "wb") as f:
                f.write(data)
            n += 1
    print(f"{n} seeds in {out}")


if __name__ == "__main__":
    main(sys.argv[1])
