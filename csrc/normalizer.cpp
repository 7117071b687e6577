#include "normalizer.h"

#include "unicode_tables.h"

namespace fastbert {

using namespace unicode;

Normalizer::Normalizer(const NormalizerConfig& cfg) : cfg_(cfg) {}

Normalizer::Result Normalizer::normalize(uint32_t cp, uint32_t* out) const {
    Result r;
    const uint8_t f = flags(cp);
    if (cfg_.clean_text) {
        if (f & kControl) return r;  // removed
        if (f & kWhitespace) {
            out[r.n++] = ' ';
            return r;
        }
    }
    r.isolate = cfg_.handle_chinese_chars && (f & kCjk);
    uint32_t buf[kMaxOut];
    int n = 0;
    if (cfg_.strip_accents) {
        const Mapping* m = (f & kHasNfd) ? find(kNfd, kNfdSize, cp) : nullptr;
        if (m) {
            for (uint32_t i = 0; i < m->len && n < kMaxOut; ++i) {
                uint32_t c = kNfdPool[m->offset + i];
                if (!(flags(c) & kMark)) buf[n++] = c;
            }
        } else if (!(f & kMark)) {
            buf[n++] = cp;
        }
    } else {
        buf[n++] = cp;
    }
    for (int i = 0; i < n; ++i) {
        uint32_t c = buf[i];
        const Mapping* m = (cfg_.lowercase && (flags(c) & kHasLower)) ? find(kLower, kLowerSize, c) : nullptr;
        if (m) {
            for (uint32_t j = 0; j < m->len && r.n < kMaxOut; ++j) out[r.n++] = kLowerPool[m->offset + j];
        } else if (r.n < kMaxOut) {
            out[r.n++] = c;
        }
    }
    return r;
}

}  // namespace fastbert
