// The options of one encode call, by name: what the Python API resolved from its arguments
// (strategies, sides, which outputs). Python builds one per call signature and reuses it
// (fastbert/tokenizer/options.py); C++ reads the fields, never a position in a tuple.
#pragma once
#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "post_processor.h"

namespace fastbert {

enum class Padding : int { kNone = 0, kLongest = 1, kMaxLength = 2 };

struct EncodeOptions {
    // input
    bool split_words = false;  // each item is a list of words (is_split_into_words)
    bool add_special_tokens = true;
    bool split_special_tokens = false;  // special tokens in the text are text (HF's split_special_tokens)
    // truncation (max_length counts the special tokens, as the user gives it)
    Truncation truncation = Truncation::kNone;
    size_t max_length = 0;
    size_t stride = 0;
    bool truncate_left = false;
    // layout: padded rows, or every row back to back (packed: cu_seqlens, position ids)
    Padding padding = Padding::kNone;
    size_t pad_to_multiple_of = 0;  // 0: none
    bool pad_left = false;
    int64_t pad_id = 0;
    bool packed = false;
    // outputs beside input_ids
    bool type_ids = true;
    bool attention_mask = true;
    bool special_tokens_mask = false;
    bool offsets = false;
    bool length = false;
    bool overflow = false;  // keep overflow rows, and say which input each row came from
    bool numpy = false;     // arrays (rows of one length) instead of lists
    bool words = false;     // word index per token and each row's windows: the alignment methods only
    int num_threads = 1;

    // What the alignment methods encode a batch again with: the same rows (truncation, overflow
    // windows, padding) with every per-token output as lists.
    EncodeOptions for_alignment() const {
        EncodeOptions o = *this;
        o.type_ids = o.attention_mask = o.special_tokens_mask = o.offsets = o.overflow = o.words = true;
        o.length = o.numpy = o.packed = false;
        return o;
    }

    // Throws std::invalid_argument for combinations no caller should make.
    void validate() const {
        if (words && !offsets) throw std::invalid_argument("EncodeOptions: words needs offsets");
        if (packed && padding != Padding::kNone) throw std::invalid_argument("EncodeOptions: packed needs padding=none");
        if (packed && (words || attention_mask))
            throw std::invalid_argument("EncodeOptions: packed output has no attention_mask or word ids");
        if (num_threads < 1) throw std::invalid_argument("EncodeOptions: num_threads must be >= 1");
    }

    // tmpl: the tokenizer's template (what goes around A and B), which outlives the call
    PostConfig post(const Template& tmpl) const {
        PostConfig cfg;
        cfg.add_special_tokens = add_special_tokens;
        cfg.tmpl = &tmpl;
        cfg.truncation = truncation;
        cfg.max_length = max_length;
        cfg.stride = stride;
        cfg.truncate_left = truncate_left;
        cfg.offsets = offsets;
        cfg.words = words;
        cfg.overflow = overflow;
        return cfg;
    }
};

}  // namespace fastbert
