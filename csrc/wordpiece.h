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

class WordPiece {
 public:
    WordPiece(const Vocab& vocab, int32_t unk_id, const std::string& prefix, size_t max_chars);
    WordPiece() = default;

    // Appends the word's token ids; when spans is given, also each token's [start, end) in the
    // word's normalized character positions.
    void tokenize(const Word& word, std::vector<int32_t>& ids, std::vector<uint32_t>* spans) const;
    int32_t unk_id() const { return unk_id_; }

 private:
    StrMap first_;  // every vocab entry
    StrMap cont_;   // entries that start with the prefix, keyed without it
    int32_t unk_id_ = 0;
    size_t max_chars_ = 100;
};

}  // namespace fastbert
