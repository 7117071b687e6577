// WordPiece model (HF models/wordpiece): greedy longest-match-first over one word, continuation
// pieces looked up with the "##" prefix; a word with no full cover, or longer than
// max_input_chars_per_word characters, becomes a single unknown token.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "pre_tokenizer.h"
#include "str_map.h"
#include "vocab.h"

namespace fastbert {

// Recent words of several pieces, per thread: frequent ones skip WordPiece's probes (a word that is
// one vocabulary entry takes one probe of the vocabulary, and is not kept here). Direct-mapped, 32-byte entries (two per cache line); words up to 16 bytes, up to 2 pieces.
struct WordCache {
    static constexpr size_t kSlots = 8192, kMaxKey = 16, kMaxIds = 2;
    struct Entry {
        uint32_t tag;              // low hash bits
        uint8_t len;               // 0: empty
        uint8_t n;                 // pieces
        uint8_t nchars[kMaxIds];   // characters per piece
        char key[kMaxKey];
        int32_t ids[kMaxIds];
    };
    std::vector<Entry> slots = std::vector<Entry>(kSlots, Entry{});
    std::vector<uint32_t> spans;  // scratch: piece spans of a missed word (no allocation per miss)
};

class WordPiece {
 public:
    WordPiece(const Vocab& vocab, int32_t unk_id, const std::string& prefix, size_t max_chars);
    WordPiece() = default;

    // Appends the word's token ids; when spans is given, also each token's [start, end) in the
    // word's normalized character positions.
    void tokenize(const Word& word, std::vector<int32_t>& ids, std::vector<uint32_t>* spans) const {
        tokenize(word, ids, spans, hash_bytes(word.data, word.len));
    }
    // word_hash: hash_bytes of the whole word (its first probe); whole_absent: that probe was
    // made already and missed
    void tokenize(const Word& word, std::vector<int32_t>& ids, std::vector<uint32_t>* spans,
                  uint64_t word_hash, bool whole_absent = false) const;
    // The same, through a word cache.
    void tokenize(const Word& word, std::vector<int32_t>& ids, std::vector<uint32_t>* spans, WordCache& cache) const;
    int32_t unk_id() const { return unk_id_; }

 private:
    StrMap first_;  // every vocab entry
    StrMap cont_;   // entries that start with the prefix, keyed without it
    int32_t unk_id_ = 0;
    size_t max_chars_ = 100;
};

}  // namespace fastbert
