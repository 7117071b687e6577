#include "added_tokens.h"

#include <algorithm>
#include <cstring>

#include "pre_tokenizer.h"
#include "unicode_tables.h"

namespace fastbert {

AddedTokens::AddedTokens(std::vector<AddedToken> tokens) {
    for (AddedToken& t : tokens)
        if (!t.content.empty()) tokens_.push_back(std::move(t));
    std::stable_sort(tokens_.begin(), tokens_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    for (const AddedToken& t : tokens_) first_byte_[static_cast<unsigned char>(t.content[0])] = true;
    int distinct = 0;
    for (int b = 0; b < 256; ++b)
        if (first_byte_[b]) {
            ++distinct;
            single_first_ = b;
        }
    if (distinct != 1) single_first_ = -1;
}

namespace {

// The code point ending at byte i (exclusive) / starting at byte i.
uint32_t cp_before(const char* s, size_t i) {
    size_t j = i;
    while (j > 0 && (static_cast<unsigned char>(s[j - 1]) & 0xC0) == 0x80) --j;
    if (j > 0) --j;
    const unsigned char* p = reinterpret_cast<const unsigned char*>(s + j);
    return decode_utf8(p);
}
uint32_t cp_at(const char* s, size_t i) {
    const unsigned char* p = reinterpret_cast<const unsigned char*>(s + i);
    return decode_utf8(p);
}
bool is_space(uint32_t c) { return unicode::flags(c) & unicode::kWhitespace; }
bool is_word_char(uint32_t c) { return unicode::flags(c) & unicode::kWordChar; }

}  // namespace

void AddedTokens::find(const char* s, size_t n, std::vector<Match>& out) const {
    out.clear();
    size_t prev_end = 0;
    for (size_t i = 0; i < n; ++i) {
        if (single_first_ >= 0) {
            const void* hit = std::memchr(s + i, single_first_, n - i);
            if (!hit) break;
            i = static_cast<size_t>(static_cast<const char*>(hit) - s);
        } else if (!first_byte_[static_cast<unsigned char>(s[i])]) {
            continue;
        }
        for (const AddedToken& t : tokens_) {
            const size_t m = t.content.size();
            if (m > n - i || std::memcmp(s + i, t.content.data(), m) != 0) continue;
            // HF takes the leftmost-longest match, then moves on past it (not past the whitespace
            // rstrip takes, so the next match may start in that whitespace); a match that fails
            // single_word is skipped whole: no shorter token, no match starting inside it.
            size_t begin = i, end = i + m;
            i = end - 1;
            if (t.single_word) {
                const bool left_ok = begin == 0 || !is_word_char(cp_before(s, begin));
                const bool right_ok = end == n || !is_word_char(cp_at(s, end));
                if (!left_ok || !right_ok) break;
            }
            if (t.lstrip && begin < prev_end)  // lstrip never reaches into the previous match
                begin = std::min(prev_end, end);
            else if (t.lstrip)
                while (begin > prev_end && is_space(cp_before(s, begin))) {
                    size_t j = begin - 1;
                    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
                    begin = j;
                }
            if (t.rstrip)
                while (end < n && is_space(cp_at(s, end))) {
                    ++end;
                    while (end < n && (static_cast<unsigned char>(s[end]) & 0xC0) == 0x80) ++end;
                }
            out.push_back(Match{begin, end, t.id});
            prev_end = end;
            break;
        }
    }
}

}  // namespace fastbert
