// libFuzzer harness for the whole C++ tokenizer: added tokens -> normalizer + pre-tokenizer ->
// WordPiece -> post-processor (pairs, truncation, stride, overflow) -> padding, on one thread or
// on the pool. Built with ASan + UBSan by csrc/fuzz/build.sh.
//
// Input layout: 4 control bytes, then text. The text is made valid UTF-8 first (Python only ever
// hands the core valid UTF-8 without surrogates), then split into batch items at 0x1F and, when
// the pair bit is set, each item into (first, second) at 0x1E.
// Besides memory errors, the harness checks invariants and traps when one breaks: ids inside
// the vocabulary, type ids 0/1, offsets ordered and inside the item, truncated rows no longer
// than max_length, padded buffers equal to the rows.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "output_layout.h"
#include "tokenizer.h"

using namespace fastbert;

namespace {

#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "invariant failed: %s (line %d)\n", #cond, __LINE__); \
            __builtin_trap();                                              \
        }                                                                  \
    } while (0)

// A small vocabulary when no vocab.txt is given: specials, ASCII letters and digits as words and
// "##" pieces, a few words, accented and CJK characters.
std::vector<std::string> small_vocab() {
    std::vector<std::string> v = {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"};
    for (char c = 33; c < 127; ++c) {
        v.push_back(std::string(1, c));
        v.push_back("##" + std::string(1, c));
    }
    for (const char* w : {"un", "##want", "##ed", "want", "runn", "##ing", "hello", "world", "the",
                          "é", "##é", "野", "口", "里", "佳", "ñ", "ß", "##ß", "α", "##β"})
        v.push_back(w);
    return v;
}

std::vector<std::string> load_vocab() {
    if (const char* path = std::getenv("FASTBERT_FUZZ_VOCAB")) return Vocab::from_file(path).tokens();
    return small_vocab();
}

// Tokenizers built once: the config varies by control byte, not per input (loading a 30k vocab
// per input would be most of the time).
std::vector<std::unique_ptr<Tokenizer>> g_toks;

std::unique_ptr<Tokenizer> make(const std::vector<std::string>& vocab, bool lower, bool strip, bool cjk,
                                bool clean, size_t max_chars, bool added) {
    TokenizerConfig cfg;
    cfg.normalizer = NormalizerConfig{clean, cjk, strip, lower};
    cfg.max_input_chars_per_word = max_chars;
    std::vector<AddedToken> toks;
    for (const char* s : {"[CLS]", "[SEP]", "[PAD]", "[MASK]", "[UNK]"}) {
        AddedToken t;
        t.content = s;
        toks.push_back(t);
    }
    if (added) {  // added tokens with every flag, one not in the vocab, one non-ASCII
        AddedToken a;
        a.content = "<new>";
        a.lstrip = true;
        toks.push_back(a);
        AddedToken b;
        b.content = "xyz";
        b.single_word = true;
        b.rstrip = true;
        toks.push_back(b);
        AddedToken c;
        c.content = "é!";
        c.lstrip = c.rstrip = true;
        toks.push_back(c);
    }
    Vocab v(vocab);
    for (AddedToken& t : toks) t.id = v.id(t.content);
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(v), cfg, std::move(toks)));
}

// Valid UTF-8 in, valid UTF-8 out: each invalid byte, overlong form, surrogate or value above
// U+10FFFF becomes U+FFFD.
std::string to_valid_utf8(const uint8_t* p, size_t n) {
    std::string s;
    s.reserve(n);
    size_t i = 0;
    while (i < n) {
        const uint8_t b = p[i];
        size_t len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        bool ok = len && i + len <= n;
        uint32_t cp = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
        for (size_t k = 1; ok && k < len; ++k) {
            ok = (p[i + k] & 0xC0) == 0x80;
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
        ok = ok && cp >= kMin[len] && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
        if (ok) {
            s.append(reinterpret_cast<const char*>(p + i), len);
            i += len;
        } else {
            s += "\xEF\xBF\xBD";
            ++i;
        }
    }
    return s;
}

size_t count_chars(std::string_view s) {
    size_t c = 0;
    for (unsigned char b : s) c += (b & 0xC0) != 0x80;
    return c;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
    const std::vector<std::string> vocab = load_vocab();
    // index = control bits: lowercase/strip, chinese chars, clean_text, short max_chars, added tokens
    for (int k = 0; k < 16; ++k) {
        const bool lower = k & 1, cjk = k & 2, clean = k & 4, added = k & 8;
        g_toks.push_back(make(vocab, lower, lower, cjk, clean, (k & 3) == 3 ? 5 : 100, added));
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size < 4 || size > 1 << 16) return 0;
    const uint8_t flags = data[0], max_len_b = data[1], stride_b = data[2], mode = data[3];
    Tokenizer& tok = *g_toks[flags & 15];
    const bool pair = flags & 16, offsets = flags & 32, overflow = flags & 64, threads = flags & 128;
    const std::string text = to_valid_utf8(data + 4, size - 4);

    // Items at 0x1F, their pair halves at 0x1E; a pre-split item (mode bit 3) splits words at 0x1D.
    BatchInput in;
    std::vector<std::string_view> firsts, seconds;
    size_t start = 0;
    for (size_t i = 0; i <= text.size(); ++i) {
        if (i < text.size() && text[i] != '\x1f') continue;
        std::string_view item(text.data() + start, i - start);
        size_t cut = pair ? item.find('\x1e') : std::string_view::npos;
        firsts.push_back(item.substr(0, cut));
        seconds.push_back(cut == std::string_view::npos ? std::string_view() : item.substr(cut + 1));
        start = i + 1;
    }
    const bool split = mode & 8;
    auto add_segs = [&](std::string_view s) {
        if (!split) {
            in.segs.push_back(s);
            return;
        }
        size_t b = 0;
        for (size_t i = 0; i <= s.size(); ++i)
            if (i == s.size() || s[i] == '\x1d') {
                in.segs.push_back(s.substr(b, i - b));
                b = i + 1;
            }
    };
    for (std::string_view f : firsts) {
        add_segs(f);
        in.a.push_back(static_cast<uint32_t>(in.segs.size()));
    }
    if (pair) {
        in.b.push_back(static_cast<uint32_t>(in.segs.size()));
        for (std::string_view s : seconds) {
            add_segs(s);
            in.b.push_back(static_cast<uint32_t>(in.segs.size()));
        }
    }

    EncodeOptions cfg;
    cfg.split_words = split;
    cfg.add_special_tokens = !(mode & 16);
    cfg.truncation = static_cast<Truncation>(mode & 3);
    cfg.max_length = max_len_b % 64;
    cfg.stride = stride_b % 16;
    cfg.truncate_left = mode & 4;
    cfg.offsets = offsets;
    cfg.overflow = overflow;
    cfg.num_threads = threads ? 2 : 1;
    tok.set_specials(tok.token_id("[CLS]"), tok.token_id("[SEP]"));
    const ParallelFor run = [&](size_t n, const std::function<void(size_t)>& fn) {
        tok.parallel(n, cfg.num_threads, fn);
    };

    std::vector<Rows> rows;
    try {
        tok.encode_batch(in, cfg, rows);
    } catch (const TruncationError&) {
        return 0;  // HF raises here too (bad stride, only_second without a pair)
    }

    // Invariants on every row.
    const size_t vsize = tok.vocab().size();
    size_t widest = 0, nrows = 0;
    int32_t last_item = -1;
    for (const Rows& rs : rows) {
        CHECK(rs.start.size() == rs.rows() + 1);
        CHECK(rs.ids.size() == rs.start.back() && rs.type_ids.size() == rs.ids.size());
        CHECK(rs.special.size() == rs.ids.size());
        if (offsets) CHECK(rs.offsets.size() == 2 * rs.ids.size());
        for (size_t r = 0; r < rs.rows(); ++r, ++nrows) {
            const int32_t item = rs.item[r];
            CHECK(item >= 0 && static_cast<size_t>(item) < in.size());
            CHECK(item >= last_item);  // input order
            if (rs.main[r]) CHECK(item > last_item);
            last_item = item;
            const size_t len = rs.len(r);
            widest = std::max(widest, len);
            if (cfg.truncation != Truncation::kNone && cfg.max_length >= 5) CHECK(len <= cfg.max_length);
            for (size_t t = rs.start[r]; t < rs.start[r + 1]; ++t) {
                CHECK(rs.ids[t] >= 0 && static_cast<size_t>(rs.ids[t]) < vsize);
                CHECK(rs.type_ids[t] <= 1 && rs.special[t] <= 1);
                if (!pair) CHECK(rs.type_ids[t] == 0);
                if (offsets && !rs.special[t]) {
                    const uint32_t b = rs.offsets[2 * t], e = rs.offsets[2 * t + 1];
                    const std::string_view src = rs.type_ids[t] ? seconds[item] : firsts[item];
                    CHECK(b < e && e <= count_chars(src));
                }
            }
        }
    }
    if (!overflow) CHECK(nrows == in.size());

    // The caches (chunks, whole texts) answer only without offsets: the same input again (cached
    // now), and with offsets (never cached), must give the same ids.
    if (!offsets) {
        for (bool with_offsets : {false, true}) {
            EncodeOptions again = cfg;
            again.offsets = with_offsets;
            std::vector<Rows> rows2;
            tok.encode_batch(in, again, rows2);
            std::vector<int32_t> a, b;
            for (const Rows& rs : rows) a.insert(a.end(), rs.ids.begin(), rs.ids.end());
            for (const Rows& rs : rows2) b.insert(b.end(), rs.ids.begin(), rs.ids.end());
            CHECK(a == b);
        }
    }

    // Padding into flat buffers must reproduce the rows.
    EncodeOptions padded = cfg;
    padded.padding = Padding::kMaxLength;
    padded.max_length = widest + (mode >> 5);
    padded.pad_left = mode & 0x80;
    const Layout layout = plan_layout(rows, padded);
    CHECK(layout.rect && layout.rows == nrows && layout.widest == widest);
    const size_t W = layout.width;
    std::vector<int64_t> ids(nrows * W), tt(nrows * W), att(nrows * W), sp(nrows * W), off(2 * nrows * W);
    PadOut out{ids.data(), tt.data(), att.data(), sp.data(), offsets ? off.data() : nullptr};
    fill_padded(rows, layout, padded, out, run);
    // Packing must reproduce them back to back.
    std::vector<int64_t> pids(layout.tokens), ppos(layout.tokens);
    std::vector<int32_t> cu(nrows + 1);
    PackedOut packed;
    packed.ids = pids.data();
    packed.position_ids = ppos.data();
    packed.cu_seqlens = cu.data();
    fill_packed(rows, packed, run);
    CHECK(cu[0] == 0 && static_cast<size_t>(cu[nrows]) == layout.tokens);
    size_t row = 0;
    for (const Rows& rs : rows)
        for (size_t r = 0; r < rs.rows(); ++r, ++row) {
            const size_t len = rs.len(r), lo = padded.pad_left ? W - len : 0;
            CHECK(static_cast<size_t>(cu[row + 1] - cu[row]) == len);
            for (size_t t = 0; t < len; ++t)
                CHECK(pids[cu[row] + t] == rs.ids[rs.start[r] + t] && ppos[cu[row] + t] == static_cast<int64_t>(t));
            size_t real = 0;
            for (size_t k = 0; k < W; ++k) real += att[row * W + k];
            CHECK(real == len);
            for (size_t t = 0; t < len; ++t) CHECK(ids[row * W + lo + t] == rs.ids[rs.start[r] + t]);
        }
    return 0;
}
