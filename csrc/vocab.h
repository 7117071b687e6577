// Vocabulary: token strings by id and the token -> id map (vocab.txt or a list from tokenizer.json).
#pragma once
#include <string>
#include <vector>

#include "str_map.h"

namespace fastbert {

class Vocab {
 public:
    // Reads vocab.txt as HF tokenizers' WordPiece does: one token per \n-separated line with its
    // trailing whitespace trimmed, id = line number; a repeated token keeps its last line's id (the
    // earlier id then has no token). Throws std::runtime_error naming the path.
    static Vocab from_file(const std::string& path);
    explicit Vocab(std::vector<std::string> tokens);
    Vocab() = default;

    int32_t id(std::string_view token) const { return map_.find(token.data(), token.size()); }
    const std::string& token(size_t id) const { return tokens_[id]; }
    // false for an id whose token reappears later in vocab.txt
    bool has_id(size_t id) const { return id < tokens_.size() && id_of_line_[id]; }
    size_t size() const { return tokens_.size(); }  // ids in use: lines + added tokens
    size_t distinct() const { return distinct_; }
    const std::vector<std::string>& tokens() const { return tokens_; }
    // Appends a token that is not yet in the vocab (an added/special token); returns its id.
    int32_t add(const std::string& token);

 private:
    std::vector<std::string> tokens_;
    std::vector<bool> id_of_line_;
    size_t distinct_ = 0;
    StrMap map_;
};

}  // namespace fastbert
