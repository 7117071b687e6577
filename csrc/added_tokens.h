// Added (special) tokens that are never split (HF added_vocabulary.rs): found in the raw text,
// leftmost then longest match, before normalization; lstrip/rstrip swallow the whitespace beside
// a match and single_word requires word boundaries around it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace fastbert {

struct AddedToken {
    std::string content;
    int32_t id = -1;
    bool lstrip = false;
    bool rstrip = false;
    bool single_word = false;
    bool normalized = false;  // matched in the normalized text (content normalized the same way)
    bool special = false;     // split_special_tokens: not matched, the text is tokenized as any other
};

class AddedTokens {
 public:
    explicit AddedTokens(std::vector<AddedToken> tokens);
    AddedTokens() = default;

    struct Match {
        size_t begin, end;  // bytes, including stripped whitespace
        int32_t id;
    };
    // Matches in text, left to right; a match may begin inside the whitespace the one before it
    // took with rstrip (begin < the previous end), as in HF.
    void find(const char* text, size_t len, std::vector<Match>& out) const;
    bool empty() const { return tokens_.empty(); }

 private:
    std::vector<AddedToken> tokens_;  // longest first
    bool first_byte_[256] = {};
    int single_first_ = -1;  // the one first byte all tokens share, if so (memchr path)
};

}  // namespace fastbert
