// Post-processing (HF processors/template.rs + utils/truncation.rs): truncation with stride into
// overflowing windows, then the template (BERT's [CLS] A [SEP] (B [SEP]), RoBERTa/MPNet's
// <s> A </s> (</s> B </s>), or any template of single-id specials) with token_type_ids,
// special-token mask and offsets, written as rows of a Rows buffer (a main row, then its overflow rows).
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

// One piece of a template: a special token's id, or the first (kSeqA) or second (kSeqB) sequence,
// each with its token type id.
struct Piece {
    static constexpr int32_t kSeqA = -1, kSeqB = -2;
    int32_t id;
    uint8_t type;
};

// HF's TemplateProcessing, single-id specials only: what goes around one sequence and around a pair.
struct Template {
    std::vector<Piece> single, pair;
    // BERT's: [CLS] A [SEP] and [CLS] A [SEP] B [SEP], B with type 1 (BertProcessing)
    static Template bert(int32_t cls, int32_t sep) {
        return {{{cls, 0}, {Piece::kSeqA, 0}, {sep, 0}},
                {{cls, 0}, {Piece::kSeqA, 0}, {sep, 0}, {Piece::kSeqB, 1}, {sep, 1}}};
    }
    // Throws std::invalid_argument unless single holds A once and no B, and pair holds A then B once each.
    void validate() const;
    size_t specials(bool with_pair) const {
        const std::vector<Piece>& t = with_pair ? pair : single;
        size_t n = 0;
        for (const Piece& p : t) n += p.id >= 0;
        return n;
    }
};

struct PostConfig {
    bool add_special_tokens = true;
    const Template* tmpl = nullptr;  // the tokenizer's; outlives the call
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
    std::vector<uint32_t> window;   // with words: the row's windows of A and B and A's token count, 3 per row
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

void post_process(const Encoded& a, const Encoded* b, const PostConfig& cfg, int32_t item, Rows& out);

}  // namespace fastbert
