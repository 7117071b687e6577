// BERT pre-tokenizer fused with the normalizer (HF pre_tokenizers/bert.rs): walks UTF-8 text once,
// normalizes each code point, splits on whitespace, isolates punctuation and CJK ideographs, and
// hands each word (normalized UTF-8 + where its characters came from) to a callback.
#pragma once
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "normalizer.h"
#include "unicode_tables.h"

namespace fastbert {

struct Word {
    const char* data;      // normalized UTF-8
    size_t len;            // bytes
    size_t nchars;         // code points
    const uint32_t* orig;  // per normalized code point: its character index in the original text
                           // (nullptr unless tracking was asked for)
    uint32_t orig_start;   // character span of the word in the original text
    uint32_t orig_end;
};

class PreTokenizer {
 public:
    explicit PreTokenizer(const Normalizer& norm);
    PreTokenizer() = default;

    // Per-call scratch space, one per thread.
    // A growable byte buffer that, unlike std::string::resize, does not zero what it is about to
    // overwrite.
    class Buffer {
     public:
        const char* data() const { return data_.get(); }
        char* data() { return data_.get(); }
        size_t size() const { return size_; }
        size_t capacity() const { return cap_; }
        void clear() { size_ = 0; }
        void reserve(size_t n) {
            if (n <= cap_) return;
            std::unique_ptr<char[]> d(new char[n]);
            if (size_) std::memcpy(d.get(), data_.get(), size_);
            data_ = std::move(d);
            cap_ = n;
        }
        void commit(size_t n) { size_ = n; }
        void push_back(char c) {
            if (size_ == cap_) reserve(cap_ ? 2 * cap_ : 64);
            data_[size_++] = c;
        }

     private:
        std::unique_ptr<char[]> data_;
        size_t size_ = 0, cap_ = 0;
    };

    struct Scratch {
        Buffer word;
        std::vector<uint32_t> orig;
        PendingMarks marks;
    };

    // text[0..len) starts at character index char_base of the original text. Calls emit(const Word&),
    // which returns false to stop early (truncation knows it has enough tokens).
    template <class F>
    void run(const char* text, size_t len, uint32_t char_base, bool track, Scratch& s, F&& emit) const;

 private:
    enum : uint8_t { kWordChar = 0, kSpace = 1, kPunctChar = 2, kDrop = 3 };
    uint8_t ascii_class_[128] = {};
    char ascii_map_[128] = {};
    Normalizer norm_;
};

template <class S>
inline void append_utf8(S& s, uint32_t c) {
    if (c < 0x80) {
        s.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
        s.push_back(static_cast<char>(0xC0 | (c >> 6)));
        s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
        s.push_back(static_cast<char>(0xE0 | (c >> 12)));
        s.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
        s.push_back(static_cast<char>(0xF0 | (c >> 18)));
        s.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
        s.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
        s.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
}

// Decodes one code point of valid UTF-8 (Python guarantees it) and advances p.
inline uint32_t decode_utf8(const unsigned char*& p) {
    uint32_t c = *p++;
    if (c < 0x80) return c;
    if (c < 0xE0) {
        c = ((c & 0x1F) << 6) | (*p++ & 0x3F);
    } else if (c < 0xF0) {
        c = ((c & 0x0F) << 12) | ((p[0] & 0x3F) << 6) | (p[1] & 0x3F);
        p += 2;
    } else {
        c = ((c & 0x07) << 18) | ((p[0] & 0x3F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F);
        p += 3;
    }
    return c;
}

template <class F>
void PreTokenizer::run(const char* text, size_t len, uint32_t char_base, bool track, Scratch& s,
                       F&& emit) const {
    Buffer& w = s.word;
    std::vector<uint32_t>& orig = s.orig;
    w.clear();
    orig.clear();
    size_t nchars = 0;
    uint32_t wstart = 0, wend = 0;
    bool more = true;
    auto flush = [&]() {
        if (nchars) {
            more = emit(Word{w.data(), w.size(), nchars, track ? orig.data() : nullptr, wstart, wend});
            w.clear();
            orig.clear();
            nchars = 0;
        }
    };
    auto add = [&](uint32_t cp, uint32_t ci) {
        if (!nchars) wstart = ci;
        wend = ci + 1;
        append_utf8(w, cp);
        if (track) orig.push_back(ci);
        ++nchars;
    };
    const unsigned char* p = reinterpret_cast<const unsigned char*>(text);
    const unsigned char* end = p + len;
    uint32_t ci = char_base;
    uint32_t out[Normalizer::kMaxOut];
    // Combining marks the normalizer holds back (strip_accents: NFD's canonical ordering) come out
    // of s.marks.ready one per pass, so the code at the bottom that splits what the normalizer
    // gives exists once (a second copy made the ASCII loop slower). Text without such marks runs
    // the ASCII loop and normalize() as before.
    bool held = false;  // marks wait in s.marks
    size_t ready = 0, ready_end = 0;  // s.marks.ready[ready..ready_end) still to split
    while (more) {
        const uint32_t* o = out;
        int n;
        uint32_t at;
        bool isolate = false;
        if (ready < ready_end) {
            const PendingMarks::Out& r = s.marks.ready[ready++];
            o = &r.cp;
            n = 1;
            at = r.at;
            isolate = r.isolate;
        } else {
            if (held && (p == end || (*p < 0x80 && ascii_class_[*p] != kDrop))) {
                // the end, or an ASCII character: a starter (unless clean_text removes it)
                norm_.drain_marks(s.marks);
                held = false;
                ready = 0;
                ready_end = s.marks.ready.size();
                continue;
            }
            if (held) {  // before a non-ASCII character, or an ASCII one clean_text removes
                if (*p < 0x80) {
                    ++p;
                    ++ci;
                    continue;
                }
            } else {
                while (p < end && *p < 0x80 && more) {
                    const unsigned char b = *p;
                    switch (ascii_class_[b]) {
                        case kWordChar: {
                            // a run of ASCII word characters, copied (lowercased) in one go
                            const unsigned char* q = p + 1;
                            while (q < end && *q < 0x80 && ascii_class_[*q] == kWordChar) ++q;
                            const size_t run = static_cast<size_t>(q - p);
                            if (!nchars) wstart = ci;
                            const size_t at = w.size();
                            if (w.capacity() < at + run) w.reserve(2 * (at + run));
                            char* d = w.data() + at;
                            for (size_t k = 0; k < run; ++k) d[k] = ascii_map_[p[k]];
                            w.commit(at + run);
                            if (track)
                                for (size_t k = 0; k < run; ++k) orig.push_back(ci + static_cast<uint32_t>(k));
                            nchars += run;
                            ci += static_cast<uint32_t>(run);
                            wend = ci;
                            p = q;
                            continue;
                        }
                        case kSpace:
                            flush();
                            break;
                        case kPunctChar:
                            flush();
                            add(static_cast<uint32_t>(ascii_map_[b]), ci);
                            flush();
                            break;
                        default:
                            break;
                    }
                    ++p;
                    ++ci;
                }
                if (p == end || !more) break;
            }
            const uint32_t cp = decode_utf8(p);
            at = ci++;
            Normalizer::Result r;
            if (held || (r = norm_.normalize(cp, out)).marks) {
                norm_.feed_marks(cp, at, s.marks);  // marks wait, or cp has one
                held = !s.marks.empty();
                ready = 0;
                ready_end = s.marks.ready.size();
                continue;
            }
            n = r.n;
            isolate = r.isolate;
        }
        if (isolate) flush();
        for (int i = 0; i < n; ++i) {
            const uint16_t f = unicode::flags(o[i]);
            if (f & unicode::kWhitespace) {
                flush();
            } else if (f & unicode::kPunct) {
                flush();
                add(o[i], at);
                flush();
            } else {
                add(o[i], at);
            }
        }
        if (isolate) flush();
    }
    if (more) flush();
    if (held) s.marks.clear();  // stopped early: the next text starts with none
}

}  // namespace fastbert
