#include "pre_tokenizer.h"

#include "unicode_tables.h"

namespace fastbert {

PreTokenizer::PreTokenizer(const Normalizer& norm) : norm_(norm) {
    // ASCII fast path: each byte's fate under this normalizer configuration, computed once.
    uint32_t out[Normalizer::kMaxOut];
    for (uint32_t c = 0; c < 128; ++c) {
        Normalizer::Result r = norm_.normalize(c, out);
        if (r.n == 0) {
            ascii_class_[c] = kDrop;
            continue;
        }
        const uint16_t f = unicode::flags(out[0]);
        ascii_map_[c] = static_cast<char>(out[0]);
        ascii_class_[c] = (f & unicode::kWhitespace) ? kSpace : (f & unicode::kPunct) ? kPunctChar : kWordChar;
    }
}

}  // namespace fastbert
