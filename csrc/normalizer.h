// BERT normalizer, one code point at a time (HF normalizers/bert.rs): clean_text, then
// handle_chinese_chars, then strip_accents (NFD, drop Mn), then lowercase. Every step maps one
// input code point to zero or more output code points, so it runs fused with the pre-tokenizer;
// only NFD's canonical ordering looks further, and holds combining marks back (PendingMarks).
#pragma once
#include <cstdint>
#include <vector>

#include "unicode_tables.h"

namespace fastbert {

struct NormalizerConfig {
    bool clean_text = true;
    bool handle_chinese_chars = true;
    bool strip_accents = true;  // resolved: None -> lowercase
    bool lowercase = true;
};

// Combining marks (class > 0) of the NFD stream waiting for the next starter, one per thread.
struct PendingMarks {
    struct Mark {
        uint32_t cp;
        uint32_t at;     // index of the original character it came from
        uint8_t ccc;     // canonical combining class
        bool first;      // first code point of that character's decomposition
    };
    struct Out {
        uint32_t cp;
        uint32_t at;
        bool isolate;
    };
    std::vector<Mark> marks;
    std::vector<uint32_t> starts;  // `at` of the marks that are first, in arrival order
    std::vector<Out> ready;        // what the last feed or drain of marks gave, in order
    bool empty() const { return marks.empty(); }
    void clear() {
        marks.clear();
        starts.clear();
    }
};

class Normalizer {
 public:
    static constexpr int kMaxOut = 32;
    struct Result {
        int n = 0;             // output code points in out[0..n)
        bool isolate = false;  // a CJK ideograph: its own word (handle_chinese_chars)
        bool marks = false;    // strip_accents, and cp's NFD has a mark that must wait for
                               // canonical ordering (kHoldsMark): out is not filled, see feed
    };
    explicit Normalizer(const NormalizerConfig& cfg);
    Normalizer() : Normalizer(NormalizerConfig{}) {}

    // Normalizes one code point (any value, ASCII included) on its own; r.marks says it cannot be.
    Result normalize(uint32_t cp, uint32_t* out) const;

    // Normalizes cp, the character at index `at` of the original text, as part of a stream: calls
    // emit(const uint32_t* out, int n, uint32_t at, bool isolate) with what is ready, in order.
    // Under strip_accents, NFD sorts every run of combining marks (class > 0) by class, and HF's
    // alignments do not travel with the marks: they are handed out again in the new order
    // (release_marks). So marks wait in `pending` until the next starter. A character removed by
    // clean_text does not end a run: the marks on either side of it meet.
    template <class F>
    void feed(uint32_t cp, uint32_t at, PendingMarks& pending, F&& emit) const {
        if (pending.empty()) {  // the common case: nothing waits, cp has no mark
            uint32_t out[kMaxOut];
            const Result r = normalize(cp, out);
            if (!r.marks) {
                emit(out, r.n, at, r.isolate);
                return;
            }
        }
        feed_marks(cp, at, pending);
        emit_ready(pending, emit);
    }
    // Emits the waiting marks, at the end of the text (or piece of text: HF normalizes the pieces
    // between added tokens apart).
    template <class F>
    void drain(PendingMarks& pending, F&& emit) const {
        if (pending.empty()) return;
        drain_marks(pending);
        emit_ready(pending, emit);
    }

    // For a caller that emits pending.ready itself (the pre-tokenizer's loop): feed, for when
    // marks wait or normalize() said r.marks, and drain, also before a starter it does not feed
    // (ASCII). Both leave in pending.ready what is ready.
    void feed_marks(uint32_t cp, uint32_t at, PendingMarks& pending) const;
    void drain_marks(PendingMarks& pending) const {
        pending.ready.clear();
        release_marks(pending);
    }
    const NormalizerConfig& config() const { return cfg_; }

 private:
    template <class F>
    static void emit_ready(const PendingMarks& pending, F& emit) {
        for (const PendingMarks::Out& o : pending.ready) emit(&o.cp, 1, o.at, o.isolate);
    }
    // A mark that is not the first code point of its character's decomposition (the accent of é)
    // and that strip_accents removes neither takes an original position nor gives output: where
    // NFD sorts it changes nothing, so it need not wait (Latin text stays on the fast path).
    bool dropped_mark(uint32_t c, uint32_t index_in_decomposition) const {
        return index_in_decomposition > 0 && (unicode::flags(c) & unicode::kMark);
    }
    // sorts the waiting marks, appends them to pending.ready
    void release_marks(PendingMarks& pending) const;
    // strip_accents and lowercase of one NFD code point: out[0..returned), at most 3 code points
    // (the generator checks that a decomposition times that fits in kMaxOut)
    int finish(uint32_t c, uint32_t* out) const;
    NormalizerConfig cfg_;
};

}  // namespace fastbert
