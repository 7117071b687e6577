r"""Generate csrc/unicode_tables.cpp: the Unicode data the BERT normalizer and pre-tokenizer need.

Run from the repository root:
    pip install unicode-age==18.0.0.0 unicodedata2==17.0.1 regex==2026.11.19
    python csrc/gen_unicode_tables.py          # needs Python 3.11 (its unicodedata is Unicode 14.0)

What HF `tokenizers` (the Rust crate behind transformers.BertTokenizerFast) actually uses was
measured by running every code point (0..0x10FFFF, no surrogates) through BertNormalizer and
BertPreTokenizer with each flag alone, and comparing with candidate rules. The rules below give
zero differences with tokenizers 0.23:

* Categories (punctuation P*, control Cc/Cf/Co, nonspacing mark Mn) are Unicode 8.0's: a code
  point assigned after 8.0 (per the Unicode Age property, package `unicode-age`) has no category
  flag at all, even if it is punctuation today (e.g. U+2E56, U+061D). Six code points changed
  category after 8.0; their 8.0 category is listed in CATEGORY_IN_8_0 (from UnicodeData.txt 8.0).
* Unassigned code points (Cn) are NOT removed by clean_text. Cc characters are removed even when
  they are White_Space (U+000B, U+000C, U+0085); only TAB, LF and CR become spaces.
* NFD decompositions (used only for strip_accents) are those of code points assigned by 8.0.
* Canonical combining classes (NFD's canonical ordering, strip_accents only) are those of the code
  points assigned by Unicode 9.0, the version of the tables in HF's `unicode-normalization-alignments`
  crate. Measured: U+08D4 (9.0) is reordered, U+1DF6 (10.0) and U+08D3 (11.0) are not; every code
  point with a class > 0 today (912), between marks of classes 1..230, gives the same ids and
  offsets in BertTokenizerFast and fastbert. A class never changes once assigned (Unicode's
  stability policy), so the table is Python's classes limited to Age <= 9.0. Checked against
  unicodedata2 9.0.0.post4 itself (its sdist builds on Python 3.11 with an empty `ucnhash.h` and
  `Py_SET_TYPE(&UCD_Type, &PyType_Type)`): the same 814 code points and classes; unicodedata2
  17.0.1 agrees on every code point assigned by 9.0. A decomposition is starters, then marks
  (asserted below), and HOLDS_MARK flags the code points whose NFD has a mark that must wait for
  the sort: the normalizer relies on both.
* Lowercasing is Rust's `char::to_lowercase`, full mappings at Unicode 17.0: Python 3.11's
  `str.lower` (Unicode 14) for code points assigned by 14.0; for the code points Unicode 15-17
  added, a capital letter maps to the small letter of the same name (names from unicodedata2 17).
* Whitespace is the White_Space property: Zs, Zl, Zp, U+0009-U+000D, U+0085.
* "Chinese characters" are the CJK ranges listed in CJK_RANGES (HF's `is_chinese_char`).
* Word characters (for single_word added tokens) are the Rust regex crate's \w at Unicode 16.0:
  the `regex` package's \w (Alphabetic, marks, decimal digits, connector punctuation, Join_Control,
  so Other_Alphabetic symbols such as circled letters too) for the code points assigned by 16.0.
  Measured with a single_word added token before every code point: zero differences.
"""
import os
import sys
import unicodedata as ud

from unicode_age.unicode_age_db import iter_spans
import regex
import unicodedata2

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unicode_tables.cpp")
CATEGORY_VERSION = (8, 0)
CCC_VERSION = (9, 0)
CATEGORY_IN_8_0 = {0x166D: "Po", 0x111C9: "Po", 0x1734: "Mn", 0x1885: "Mo", 0x1886: "Mo", 0xA9BD: "Mc"}
CJK_RANGES = [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
              (0x2B740, 0x2B81F), (0x2B920, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)]
WS, CONTROL, PUNCT, MN, CJK, HAS_NFD, HAS_LOWER, WORD, HOLDS_MARK = 1, 2, 4, 8, 16, 32, 64, 128, 256
WORD_VERSION = (16, 0)  # the Unicode version of tokenizers' regex crate (single_word boundaries)
WORD_RE = regex.compile(r"\w")


def main():
    if ud.unidata_version != "14.0.0":
        sys.exit(f"run with Python 3.11 (unicodedata 14.0.0), got {ud.unidata_version}")
    if unicodedata2.unidata_version != "17.0.0":
        sys.exit(f"need unicodedata2==17.0.1 (Unicode 17.0.0), got {unicodedata2.unidata_version}")
    age = {}
    for start, stop, major, minor in iter_spans():
        for cp in range(start, stop + 1):
            age[cp] = (major, minor)

    def old(cp):
        return age.get(cp, (99, 0)) <= CATEGORY_VERSION

    def cat8(cp):
        return CATEGORY_IN_8_0.get(cp) or ud.category(chr(cp))

    def lower(cp):
        ch = chr(cp)
        if ud.category(ch) != "Cn":
            return ch.lower()
        if unicodedata2.category(ch) not in ("Lu", "Lt"):
            return ch
        name = unicodedata2.name(ch, "")
        if " CAPITAL LETTER " in name:
            try:
                return unicodedata2.lookup(name.replace(" CAPITAL LETTER ", " SMALL LETTER "))
            except KeyError:
                pass
        return ch

    flags = [0] * 0x110000
    ccc = [0] * 0x110000
    nfd, low = {}, {}
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        ch = chr(cp)
        cat = ud.category(ch)
        f = 0
        if cat in ("Zs", "Zl", "Zp") or 9 <= cp <= 13 or cp == 0x85:
            f |= WS
        if cp not in (9, 10, 13) and (cp == 0 or cp == 0xFFFD or (old(cp) and cat8(cp) in ("Cc", "Cf", "Co"))):
            f |= CONTROL
        if (33 <= cp < 127 and not ch.isalnum()) or (old(cp) and cat8(cp).startswith("P")):
            f |= PUNCT
        if old(cp) and cat8(cp) == "Mn":
            f |= MN
        if age.get(cp, (99, 0)) <= WORD_VERSION and WORD_RE.match(ch):
            f |= WORD
        if any(a <= cp <= b for a, b in CJK_RANGES):
            f |= CJK
        if age.get(cp, (99, 0)) <= CCC_VERSION:
            ccc[cp] = ud.combining(ch)
        if old(cp):
            d = ud.normalize("NFD", ch)
            if d != ch:
                f |= HAS_NFD
                nfd[cp] = d
        lo = lower(cp)
        if lo != ch:
            f |= HAS_LOWER
            low[cp] = lo
        flags[cp] = f

    # HOLDS_MARK: under strip_accents the NFD of cp has a mark that waits for canonical ordering, one
    # that takes an original position (the first code point) or that strip_accents keeps; a later
    # mark that is stripped (the accent of é) changes nothing wherever it is sorted.
    for cp in range(0x110000):
        d = nfd.get(cp, chr(cp))
        if any(ccc[ord(c)] and (i == 0 or not flags[ord(c)] & MN) for i, c in enumerate(d)):
            flags[cp] |= HOLDS_MARK
    for cp, d in nfd.items():
        classes = [ccc[ord(c)] for c in d]
        first_mark = next((i for i, k in enumerate(classes) if k), len(classes))
        assert not any(k == 0 for k in classes[first_mark:]), f"U+{cp:04X}: a starter after a mark"
    # the normalizer's fixed output buffer (Normalizer::kMaxOut) holds any decomposition, lowercased
    assert max(len(d) for d in nfd.values()) * max(len(v) for v in low.values()) <= 32
    assert max(len(v) for v in low.values()) <= 3
    assert all(ccc[cp] == 0 for cp in range(0x300)), "the normalizer skips the class lookup below U+0300"
    assert not any(ccc[cp] and flags[cp] & (WS | CONTROL | PUNCT | CJK) for cp in range(0x110000))
    # a CJK ideograph normalizes to one code point (the normalizer isolates code points one by one)
    assert all(len(nfd.get(cp, chr(cp))) == 1 and cp not in low for cp in range(0x110000) if flags[cp] & CJK)

    def two_stage(values, end):
        """256-entry blocks of values[0..end), deduplicated: (block index per block, blocks)."""
        blocks, index = {}, []
        for b in range(end // 256):
            key = tuple(values[b * 256:(b + 1) * 256])
            index.append(blocks.setdefault(key, len(blocks)))
        return index, blocks

    index, blocks = two_stage(flags, 0x110000)
    ccc_end = (max(cp for cp in range(0x110000) if ccc[cp]) // 256 + 1) * 256
    ccc_index, ccc_blocks = two_stage(ccc, ccc_end)
    assert len(ccc_blocks) <= 256
    assert not any(next(iter(ccc_blocks))), "combining_class() takes block 0 for all starters"
    lines = [
        "// GENERATED by csrc/gen_unicode_tables.py -- do not edit by hand.",
        "// Regenerate: pip install unicode-age==18.0.0.0 unicodedata2==17.0.1 regex==2026.11.19 &&",
        "//             python3.11 csrc/gen_unicode_tables.py",
        "// Rules (measured against HF tokenizers on every code point): categories and NFD of",
        "// Unicode 8.0, combining classes of 9.0, lowercase of 17.0; see the generator's docstring.",
        '#include "unicode_tables.h"',
        "",
        "namespace fastbert {",
        "namespace unicode {",
        "",
    ]

    def two_stage_arrays(ctype, prefix, index, blocks):
        # {prefix}Stage1: block number per 256 code points; {prefix}Stage2: the distinct blocks
        lines.append(f"const {ctype} {prefix}Stage1[{len(index)}] = {{")
        for i in range(0, len(index), 24):
            lines.append("    " + ",".join(str(v) for v in index[i:i + 24]) + ",")
        lines.append("};")
        lines.append(f"const {ctype} {prefix}Stage2[{len(blocks) * 256}] = {{")
        for key in blocks:
            for i in range(0, 256, 32):
                lines.append("    " + ",".join(str(v) for v in key[i:i + 32]) + ",")
        lines.append("};")

    two_stage_arrays("uint16_t", "k", index, blocks)
    lines.append(f"const uint32_t kCccEnd = {ccc_end:#x};")
    two_stage_arrays("uint8_t", "kCcc", ccc_index, ccc_blocks)

    def mapping(name, table):
        pool, entries = [], []
        for cp in sorted(table):
            entries.append((cp, len(pool), len(table[cp])))
            pool.extend(ord(c) for c in table[cp])
        lines.append(f"const Mapping k{name}[{len(entries)}] = {{")
        for i in range(0, len(entries), 6):
            lines.append("    " + " ".join("{%d,%d,%d}," % e for e in entries[i:i + 6]))
        lines.append("};")
        lines.append(f"const size_t k{name}Size = {len(entries)};")
        lines.append(f"const uint32_t k{name}Pool[{len(pool)}] = {{")
        for i in range(0, len(pool), 16):
            lines.append("    " + ",".join(str(v) for v in pool[i:i + 16]) + ",")
        lines.append("};")

    mapping("Nfd", nfd)
    mapping("Lower", low)
    lines += ["", "}  // namespace unicode", "}  // namespace fastbert", ""]
    with open(OUT, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
    print(f"wrote {OUT}: {len(blocks)} blocks, {len(nfd)} decompositions, {len(low)} lowercase mappings, "
          f"{sum(1 for k in ccc if k)} combining classes in {len(ccc_blocks)} blocks")


if __name__ == "__main__":
    main()
