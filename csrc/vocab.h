// Vocabulary: token strings by id and the token -> id map (vocab.txt or a list from tokenizer.json).
#pragma once
#include <string>
#include <vector>

#include "str_map.h"

namespace fastbert {

class Vocab {
 public:
    // Reads vocab.txt like transformers' load_vocab: one token per line (\n, \r\n or \r),
    // id = line number; a repeated token keeps its last id. Throws std::runtime_error("open: path").
    static Vocab from_file(const std::string& path);
    explicit Vocab(std::vector<std::string> tokens);
    Vocab() = default;

    int32_t id(std::string_view token) const { return map_.find(token.data(), token.size()); }
    const std::string& token(size_t id) const { return tokens_[id]; }
    size_t size() const { return tokens_.size(); }
    const std::vector<std::string>& tokens() const { return tokens_; }
    // Appends a token that is not yet in the vocab (an added/special token); returns its id.
    int32_t add(const std::string& token);

 private:
    std::vector<std::string> tokens_;
    StrMap map_;
};

}  // namespace fastbert
