#include "normalizer.h"

#include <algorithm>

#include "unicode_tables.h"

namespace fastbert {

using namespace unicode;

Normalizer::Normalizer(const NormalizerConfig& cfg) : cfg_(cfg) {}

int Normalizer::finish(uint32_t c, uint32_t* out) const {
    const uint16_t f = flags(c);
    if (cfg_.strip_accents && (f & kMark)) return 0;
    const Mapping* m = (cfg_.lowercase && (f & kHasLower)) ? find(kLower, kLowerSize, c) : nullptr;
    if (!m) {
        out[0] = c;
        return 1;
    }
    for (uint32_t j = 0; j < m->len; ++j) out[j] = kLowerPool[m->offset + j];
    return static_cast<int>(m->len);
}

Normalizer::Result Normalizer::normalize(uint32_t cp, uint32_t* out) const {
    Result r;
    const uint16_t f = flags(cp);
    if (cfg_.clean_text) {
        if (f & kControl) return r;  // removed
        if (f & kWhitespace) {
            out[r.n++] = ' ';
            return r;
        }
    }
    r.isolate = cfg_.handle_chinese_chars && (f & kCjk);
    if (!cfg_.strip_accents) {
        r.n = finish(cp, out);
        return r;
    }
    if (f & kHoldsMark) {
        r.marks = true;
        return r;
    }
    const Mapping* m = (f & kHasNfd) ? find(kNfd, kNfdSize, cp) : nullptr;
    if (!m) {
        r.n = finish(cp, out);
        return r;
    }
    for (uint32_t i = 0; i < m->len; ++i) r.n += finish(kNfdPool[m->offset + i], out + r.n);
    return r;
}

void Normalizer::feed_marks(uint32_t cp, uint32_t at, PendingMarks& pending) const {
    pending.ready.clear();
    uint32_t out[kMaxOut];
    const uint16_t f = flags(cp);
    if (cfg_.clean_text && (f & (kControl | kWhitespace))) {
        if (f & kControl) return;  // removed: the marks around it stay one run
        release_marks(pending);
        pending.ready.push_back({' ', at, false});
        return;
    }
    const Mapping* m = (cfg_.strip_accents && (f & kHasNfd)) ? find(kNfd, kNfdSize, cp) : nullptr;
    const uint32_t* d = m ? kNfdPool + m->offset : &cp;
    const uint32_t len = m ? m->len : 1;
    // a decomposition is starters, then marks (the generator checks it): the starters go out now,
    // after the marks that waited
    const bool isolate = cfg_.handle_chinese_chars && (f & kCjk);  // a single code point (generator)
    uint32_t i = 0;
    for (; i < len && combining_class(d[i]) == 0; ++i) {
        if (i == 0) release_marks(pending);
        for (int k = 0, n = finish(d[i], out); k < n; ++k) pending.ready.push_back({out[k], at, isolate});
    }
    for (; i < len; ++i) {
        if (dropped_mark(d[i], i)) continue;
        pending.marks.push_back({d[i], at, combining_class(d[i]), i == 0});
        if (i == 0) pending.starts.push_back(at);
    }
}

void Normalizer::release_marks(PendingMarks& pending) const {
    std::vector<PendingMarks::Mark>& m = pending.marks;
    if (m.empty()) return;
    // HF (NormalizedString::transform): in the sorted order, a mark that was the first code point of
    // its character takes the next original position, any other the last one taken (at first: its
    // own character's, whose starter went out just before the run).
    uint32_t last = m[0].at;
    // stable sort by class; runs are short (no allocation then), a long one is not quadratic
    auto by_class = [](const PendingMarks::Mark& a, const PendingMarks::Mark& b) { return a.ccc < b.ccc; };
    if (m.size() > 16) {
        std::stable_sort(m.begin(), m.end(), by_class);
    } else {
        for (size_t j = 1; j < m.size(); ++j)
            for (size_t k = j; k > 0 && by_class(m[k], m[k - 1]); --k) std::swap(m[k - 1], m[k]);
    }
    size_t next = 0;
    uint32_t out[kMaxOut];
    for (const PendingMarks::Mark& x : m) {
        if (x.first) last = pending.starts[next++];
        for (int k = 0, n = finish(x.cp, out); k < n; ++k) pending.ready.push_back({out[k], last, false});
    }
    pending.clear();
}

}  // namespace fastbert
