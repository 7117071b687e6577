#include "wordpiece.h"

#include <cstring>

namespace fastbert {

WordPiece::WordPiece(const Vocab& vocab, int32_t unk_id, const std::string& prefix, size_t max_chars)
    : unk_id_(unk_id), max_chars_(max_chars) {
    first_.reserve(vocab.size());
    cont_.reserve(vocab.size() / 4 + 16);
    for (size_t i = 0; i < vocab.size(); ++i) {
        const std::string& t = vocab.token(i);
        const int32_t id = vocab.id(t);  // a repeated line: the id the vocab settled on
        first_.insert(t, id, false);
        if (!prefix.empty() && t.size() >= prefix.size() && t.compare(0, prefix.size(), prefix) == 0)
            cont_.insert(std::string_view(t).substr(prefix.size()), id, false);
    }
}

static inline bool is_cont_byte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

void WordPiece::tokenize(const Word& word, std::vector<int32_t>& ids, std::vector<uint32_t>* spans,
                         uint64_t word_hash, bool whole_absent) const {
    const char* s = word.data;
    const size_t n = word.len;
    if (word.nchars > max_chars_) {
        ids.push_back(unk_id_);
        if (spans) {
            spans->push_back(0);
            spans->push_back(static_cast<uint32_t>(word.nchars));
        }
        return;
    }
    const size_t mark = ids.size();
    const size_t span_mark = spans ? spans->size() : 0;
    const bool ascii = word.nchars == n;
    size_t start = 0;
    uint32_t start_char = 0;
    while (start < n) {
        const StrMap& map = start ? cont_ : first_;
        size_t end = n;
        if (end - start > map.max_len()) {
            end = start + map.max_len();
            while (end > start && is_cont_byte(s[end])) --end;
        }
        int32_t id = -1;
        while (end > start) {
            if (start == 0 && end == n) id = whole_absent ? -1 : map.find_in_table(s, n, word_hash);
            else id = map.find(s + start, end - start);
            if (id >= 0) break;
            --end;
            while (end > start && is_cont_byte(s[end])) --end;
        }
        if (id < 0) {
            ids.resize(mark);
            ids.push_back(unk_id_);
            if (spans) {
                spans->resize(span_mark);
                spans->push_back(0);
                spans->push_back(static_cast<uint32_t>(word.nchars));
            }
            return;
        }
        ids.push_back(id);
        uint32_t end_char = start_char;
        if (ascii) {
            end_char = static_cast<uint32_t>(end);
        } else {
            for (size_t i = start; i < end; ++i) end_char += !is_cont_byte(s[i]);
        }
        if (spans) {
            spans->push_back(start_char);
            spans->push_back(end_char);
        }
        start = end;
        start_char = end_char;
    }
}

void WordPiece::tokenize(const Word& word, std::vector<int32_t>& ids, std::vector<uint32_t>* spans,
                         WordCache& cache) const {
    const uint64_t h = hash_bytes(word.data, word.len);
    if (word.len > WordCache::kMaxKey) {
        tokenize(word, ids, spans, h);
        return;
    }
    // most words are one vocabulary entry: that probe answers them, and the cache (a second memory
    // access, and a write on a miss) is left to words of several pieces
    if (word.nchars <= max_chars_) {
        const int32_t id = first_.find_in_table(word.data, word.len, h);
        if (id >= 0) {
            ids.push_back(id);
            if (spans) {
                spans->push_back(0);
                spans->push_back(static_cast<uint32_t>(word.nchars));
            }
            return;
        }
    }
    WordCache::Entry& e = cache.slots[(h >> 40) & (WordCache::kSlots - 1)];
    if (e.len == word.len && e.tag == static_cast<uint32_t>(h) && equal_bytes(e.key, word.data, word.len)) {
        ids.insert(ids.end(), e.ids, e.ids + e.n);
        if (spans) {
            uint32_t at = 0;
            for (uint8_t i = 0; i < e.n; ++i) {
                spans->push_back(at);
                at += e.nchars[i];
                spans->push_back(at);
            }
        }
        return;
    }
    const size_t first = ids.size();
    std::vector<uint32_t>* sp = spans;
    if (!sp) {
        cache.spans.clear();
        sp = &cache.spans;
    }
    const size_t span_first = sp->size();
    tokenize(word, ids, sp, h, /*whole_absent=*/word.nchars <= max_chars_);
    const size_t n = ids.size() - first;
    if (n > WordCache::kMaxIds) return;
    e.tag = static_cast<uint32_t>(h);
    e.len = static_cast<uint8_t>(word.len);
    e.n = static_cast<uint8_t>(n);
    std::memcpy(e.key, word.data, word.len);
    for (size_t i = 0; i < n; ++i) {
        e.ids[i] = ids[first + i];
        e.nchars[i] = static_cast<uint8_t>((*sp)[span_first + 2 * i + 1] - (*sp)[span_first + 2 * i]);
    }
}

}  // namespace fastbert
