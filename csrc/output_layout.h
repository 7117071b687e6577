// Output layout: the shape of a batch's outputs (padded rows or packed sequences) and the loops
// that write the rows into flat buffers. Pure C++; py_outputs.cpp allocates the buffers.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <vector>

#include "encode_options.h"
#include "post_processor.h"

namespace fastbert {

// Runs fn(0..n-1), perhaps on several threads (Tokenizer::parallel with the call's thread count).
using ParallelFor = std::function<void(size_t n, const std::function<void(size_t)>& fn)>;

struct Layout {
    size_t rows = 0;     // every row, overflow rows included
    size_t tokens = 0;   // real tokens in all rows
    size_t width = 0;    // the padded width; without padding, the widest row
    size_t widest = 0;   // the longest row (max_seqlen of packed output, the long-sequence notice)
    bool rect = false;   // every row has `width` tokens once padded: a 2-D array holds them
};

// rows x width cells that could never be allocated (padding="max_length" with max_length=2**40).
struct LayoutTooLarge : std::length_error {
    using std::length_error::length_error;
};

// The layout of `rows` under the options' padding (HF's rules: "longest" pads to the longest main
// row, "max_length" to max_length, then up to a multiple of pad_to_multiple_of). Throws LayoutTooLarge.
Layout plan_layout(const std::vector<Rows>& rows, const EncodeOptions& o);

// The padded width with padding "longest" (the longest main row given) or "max_length".
size_t padded_width(const EncodeOptions& o, size_t longest);
// Throws LayoutTooLarge when rows x width cells could never be allocated.
void check_cells(size_t rows, size_t width);

// Padded outputs, row-major rows x width (offsets rows x width x 2); any may be null. The layout
// must be rect.
struct PadOut {
    int64_t* ids = nullptr;
    int64_t* type_ids = nullptr;
    int64_t* attention = nullptr;
    int64_t* special = nullptr;
    int64_t* offsets = nullptr;
    // Written past the CPU caches (non-temporal stores, x86-64): for outputs too large to stay in a
    // core's cache anyway, whose stores would otherwise evict the vocabulary and word caches that the
    // threads still encoding need (see kStreamBytes).
    bool stream = false;
};
// Padded outputs of at least this many bytes in all are streamed (PadOut::stream): a core's L2.
constexpr size_t kStreamBytes = size_t{1} << 20;
void fill_padded(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, const PadOut& out,
                 const ParallelFor& run);
// One chunk's rows as output rows row0, row0 + 1, ... of width W; a row longer than W is left
// unwritten (plan_layout's rect says whether any is).
void fill_padded_rows(const Rows& rs, size_t row0, size_t W, const EncodeOptions& o, const PadOut& out);

// Packed outputs: all real tokens back to back (offsets tokens x 2), position 0..len-1 within each
// row, cu_seqlens[r] the first token of row r (rows + 1 entries). Any but cu_seqlens may be null.
struct PackedOut {
    int64_t* ids = nullptr;
    int64_t* type_ids = nullptr;
    int64_t* position_ids = nullptr;
    int64_t* special = nullptr;
    int64_t* offsets = nullptr;
    int32_t* cu_seqlens = nullptr;
};
void fill_packed(const std::vector<Rows>& rows, const PackedOut& out, const ParallelFor& run);

// The output index of each chunk's first row (rows.size() + 1 entries, the last one the total).
std::vector<size_t> first_rows(const std::vector<Rows>& rows);

}  // namespace fastbert
