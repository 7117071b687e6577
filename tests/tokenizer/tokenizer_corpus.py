"""Hand-picked tokenizer inputs and hypothesis strategies shared by the tokenizer tests.

Real text (English, multilingual) comes from corpora.py (the benchmarks' corpus); this module holds the
small adversarial pieces: HF's golden strings, characters that stress each normalizer step, and
the hypothesis strategies built from them.
"""
import sys

from hypothesis import strategies as st

# Hugging Face's own tokenizer test strings.
GOLDEN = ["UNwant\u00E9d,running", "野口里佳 Noguchi Rika", "\ufeffHello"]
GOLDEN_PAIR = ("My name is John", "pair")

# Unicode whitespace of every kind: Zs, the ASCII controls Python and HF treat as space, line/para sep.
WHITESPACE = (" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005"
              "\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")
ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u180e"
CONTROL = "\x00\x01\x07\x08\x1b\x7f\x80\x9f\ufffd\U000e0001"
COMBINING = "\u0300\u0301\u0308\u0327\u0338\u036f\u0483\u0591\u05bc\u0654\u093c\u0951\u0e31\u20dd\ufe20"
ACCENTED = "éÉñÑÅåçÇøØßẞœŒǅǄĳİıŉ\u1e9eΆΐΰάЁёЙй"
CJK = "野口里佳中文字\u3400\u4dbf\u4e00\u9fff\uf900\ufaff\U00020000\U0002a700\U0002f800\U00030000"
OTHER_SCRIPTS = "한국어\u1100\u1161ไทยភាសាעבריתعربيहिन्दीதமிழ்ქართულიՀայերենΣΟΦΙΑ ΟΔΟΣ"
EMOJI = "\U0001f600\U0001f44d\U0001f3fd\u2764\ufe0f\U0001f1fa\U0001f1f8\U0001f468\u200d\U0001f469"
ASTRAL = "\U0001d518\U0001d52b\U00010400\U00010428\U0001e900\U0001e922\U00016e40\U0001f130\U000f0000"
PUNCT = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~¡¿«»—–…、。「」『』【】〜・‐‘’“”•†‰′″※"
ASCII_WORDS = ["running", "unwanted", "UN", "want", "##ed", "the", "John", "a", "123", "x1y2",
               "don't", "e-mail", "U.S.A.", "hello", "Rika", "Noguchi"]
SPECIAL_IN_TEXT = ["[MASK]", "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[mask]", "[ MASK ]", "[MASK"]

# Single strings, each aimed at one corner of normalize -> pre-tokenize -> WordPiece -> offsets.
EDGE_STRINGS = [
    "", " ", "\t\n ", "a", "A", ".", "...", "a.b", "ab" * 60,
    "a" * 100, "a" * 101, "é" * 100, "é" * 101, "e\u0301" * 60,      # max_input_chars_per_word = 100
    "hello[MASK]world", "[CLS] x [SEP]", "[mask] [MASK] [Mask]", "x[UNK]y", "[PAD][PAD]",
    "İstanbul İI", "ΟΔΟΣ Σ ΣΑΣ", "Straße STRASSE ẞ", "ﬁnance ﬀ Ⅻ ①", "Ǆemal ǅ ǆ",
    "x\u200dy\u200bz", "a\x00b\ufffdc\x7fd", "a\u00a0b\u3000c\u2028d", "a\rb\r\nc",
    "한국어 \u1100\u1161", "e\u0301 \u00e9 \u0065\u0308\u0301", "\u0301start", "end\u0301",
    "\U0001f44d\U0001f3fd \U0001f468\u200d\U0001f469\u200d\U0001f467 \u2764\ufe0f",
    "\U0001d518\U0001d52b\U0001d526 \U00010400\U00010428", "\U00020000\U0002a6df\U0002f800x",
    "ไทย ภาษา", "مرحبا بالعالم", "नमस्ते दुनिया", "Привет, мир!", "ελληνικά", "中文,日本語。",
    "$100.00 (50%) #tag @user a&b", "C++ i.e. e.g. ¿Qué? ¡Sí!", "«quoted» “quote” ‘single’",
    "\ufeff\ufeffHello", "tab\there", "x" + "\u0300" * 200,
    "don't won't O'Neil", "http://example.com/path?q=1&r=2",
]

_POOLS = [WHITESPACE, ZERO_WIDTH, CONTROL, COMBINING, ACCENTED, CJK, OTHER_SCRIPTS, EMOJI, ASTRAL,
          PUNCT, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"]
_PIECES = sorted({ch for pool in _POOLS for ch in pool}) + ASCII_WORDS + SPECIAL_IN_TEXT

# Any scalar value except surrogates (a lone surrogate is an error, tested in test_tokenizer_errors).
any_char = st.characters(min_codepoint=0, max_codepoint=sys.maxunicode, exclude_categories=("Cs",))
piece = st.one_of(st.sampled_from(_PIECES), any_char)
texts = st.lists(piece, max_size=40).map("".join)
batches = st.lists(texts, min_size=1, max_size=6)
