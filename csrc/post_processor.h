// BERT post-processing (HF processors/template.rs + utils/truncation.rs): truncation with stride
// into overflowing windows, then [CLS] A [SEP] (B [SEP]) with token_type_ids, special-token mask
// and offsets, written as rows of a Rows buffer (a main row, then its overflow rows).
#pragma once
#include <cstdint>
#include <stdexcept>
#include <vector>

namespace fastbert {

// One sequence after WordPiece: ids and (optionally) character offsets, 2 per token, and word
// indices, 1 per token (HF's word_ids: the pre-token, added token or given word it came from).
struct Encoded {
    std::vector<int32_t> ids;
    std::vector<uint32_t> offsets;
    std::vector<int32_t> words;
    void clear() {
        ids.clear();
        offsets.clear();
        words.clear();
    }
};

enum class Truncation : int { kNone = 0, kLongestFirst = 1, kOnlyFirst = 2, kOnlySecond = 3 };

struct PostConfig {
    bool add_special_tokens = true;
    int32_t cls_id = 0, sep_id = 0;
    Truncation truncation = Truncation::kNone;
    size_t max_length = 0;  // including special tokens, as the user gives it
    size_t stride = 0;
    bool truncate_left = false;
    bool offsets = false;
    bool words = false;     // word indices too (needs offsets: only the offset paths track words)
    bool overflow = false;  // keep the overflow rows (return_overflowing_tokens)
};

// Flat storage for many rows; row r is [start[r], start[r+1]).
struct Rows {
    std::vector<int32_t> ids;
    std::vector<uint8_t> type_ids;
    std::vector<uint8_t> special;
    std::vector<uint32_t> offsets;  // 2 per token when asked for
    std::vector<int32_t> words;     // 1 per token when asked for, -1 for special tokens
    std::vector<size_t> start{0};
    std::vector<int32_t> item;      // input index of each row
    std::vector<uint8_t> main;      // 1 for the first row of an input, 0 for overflow rows
    std::vector<uint32_t> window;   // with words: the row's windows of A and B, 2 per row (0: main)
    size_t rows() const { return item.size(); }
    void clear() {  // keeps the memory
        ids.clear();
        type_ids.clear();
        special.clear();
        offsets.clear();
        words.clear();
        start.assign(1, 0);
        item.clear();
        main.clear();
        window.clear();
    }
    size_t len(size_t r) const { return start[r + 1] - start[r]; }
};

// Raised where HF raises (e.g. only_second without a pair); the message is HF's.
struct TruncationError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// Number of special tokens added for a single sequence or a pair.
inline size_t num_special_tokens(bool pair) { return pair ? 3 : 2; }

void post_process(const Encoded& a, const Encoded* b, const PostConfig& cfg, int32_t item, Rows& out);

}  // namespace fastbert
