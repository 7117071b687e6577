#include "output_layout.h"

#include <algorithm>
#include <string>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace fastbert {

namespace {

// the most output cells (rows x width) a batch may ask for: beyond it (or an overflow of
// rows x width x 8 bytes) the allocation could never succeed
constexpr size_t kMaxCells = size_t{1} << 40;

template <bool Stream>
inline void store(int64_t* d, int64_t v) {
#if defined(__x86_64__)
    if constexpr (Stream) {
        _mm_stream_si64(reinterpret_cast<long long*>(d), v);
        return;
    }
#endif
    *d = v;
}

// One padded row: pad before (left padding), the values, pad after; each element written once
// (filling the row first and then overwriting it doubled the stores to an output of many MB).
template <bool Stream, class V>
inline void pad_row(int64_t* d, size_t width, size_t lo, size_t len, int64_t pad, V value) {
    for (size_t t = 0; t < lo; ++t) store<Stream>(d + t, pad);
    for (size_t t = 0; t < len; ++t) store<Stream>(d + lo + t, static_cast<int64_t>(value(t)));
    for (size_t t = lo + len; t < width; ++t) store<Stream>(d + t, pad);
}

template <bool Stream>
void fill_rows(const Rows& rs, size_t row0, size_t W, const EncodeOptions& o, const PadOut& out) {
    for (size_t r = 0; r < rs.rows(); ++r) {
        const size_t len = rs.len(r), s0 = rs.start[r];
        if (len > W) continue;
        const size_t lo = o.pad_left ? W - len : 0;  // first real position
        const size_t base = (row0 + r) * W;
        if (out.ids) {
            const int32_t* v = rs.ids.data() + s0;
            pad_row<Stream>(out.ids + base, W, lo, len, o.pad_id, [v](size_t t) { return v[t]; });
        }
        if (out.type_ids) {
            const uint8_t* v = rs.type_ids.data() + s0;
            pad_row<Stream>(out.type_ids + base, W, lo, len, 0, [v](size_t t) { return v[t]; });
        }
        if (out.attention) pad_row<Stream>(out.attention + base, W, lo, len, 0, [](size_t) { return 1; });
        if (out.special) {
            const uint8_t* v = rs.special.data() + s0;
            pad_row<Stream>(out.special + base, W, lo, len, 1, [v](size_t t) { return v[t]; });
        }
        if (out.offsets) {
            const uint32_t* v = rs.offsets.data() + 2 * s0;
            pad_row<Stream>(out.offsets + 2 * base, 2 * W, 2 * lo, 2 * len, 0, [v](size_t t) { return v[t]; });
        }
    }
}

}  // namespace

std::vector<size_t> first_rows(const std::vector<Rows>& rows) {
    std::vector<size_t> first(rows.size() + 1, 0);
    for (size_t c = 0; c < rows.size(); ++c) first[c + 1] = first[c] + rows[c].rows();
    return first;
}

Layout plan_layout(const std::vector<Rows>& rows, const EncodeOptions& o) {
    Layout l;
    size_t longest = 0, shortest = SIZE_MAX;
    for (const Rows& rs : rows) {
        l.tokens += rs.ids.size();
        for (size_t r = 0; r < rs.rows(); ++r) {
            ++l.rows;
            const size_t len = rs.len(r);
            if (rs.main[r]) longest = std::max(longest, len);  // HF pads "longest" by the main rows
            l.widest = std::max(l.widest, len);
            shortest = std::min(shortest, len);
        }
    }
    if (o.padding == Padding::kNone) {
        l.width = l.widest;
        l.rect = l.rows == 0 || l.widest == shortest;
    } else {
        l.width = padded_width(o, longest);
        l.rect = l.widest <= l.width;
    }
    check_cells(l.rows, l.width);
    return l;
}

size_t padded_width(const EncodeOptions& o, size_t longest) {
    size_t width = o.padding == Padding::kLongest ? longest : o.max_length;
    if (o.pad_to_multiple_of && width % o.pad_to_multiple_of)
        width += o.pad_to_multiple_of - width % o.pad_to_multiple_of;
    return width;
}

void check_cells(size_t rows, size_t width) {
    if (rows && width > kMaxCells / rows)
        throw LayoutTooLarge("cannot pad " + std::to_string(rows) + " rows to " + std::to_string(width) +
                             " tokens: the outputs would not fit in memory (check max_length / pad_to_multiple_of)");
}

void fill_padded_rows(const Rows& rs, size_t row0, size_t W, const EncodeOptions& o, const PadOut& out) {
    if (!out.stream) {
        fill_rows<false>(rs, row0, W, o, out);
        return;
    }
    fill_rows<true>(rs, row0, W, o, out);
#if defined(__x86_64__)
    _mm_sfence();  // streamed stores are weakly ordered: seen by any thread before this task counts as done
#endif
}

void fill_padded(const std::vector<Rows>& rows, const Layout& layout, const EncodeOptions& o, const PadOut& out,
                 const ParallelFor& run) {
    if (!layout.rect) throw std::logic_error("fill_padded: a row is longer than the padded width");
    const std::vector<size_t> first = first_rows(rows);
    run(rows.size(), [&](size_t c) { fill_padded_rows(rows[c], first[c], layout.width, o, out); });
}

void fill_packed(const std::vector<Rows>& rows, const PackedOut& out, const ParallelFor& run) {
    // each chunk's tokens and rows start where the previous chunk's end
    std::vector<size_t> token0(rows.size() + 1, 0);
    for (size_t c = 0; c < rows.size(); ++c) token0[c + 1] = token0[c] + rows[c].ids.size();
    const std::vector<size_t> first = first_rows(rows);
    if (token0.back() > static_cast<size_t>(INT32_MAX))
        throw LayoutTooLarge("cannot pack " + std::to_string(token0.back()) +
                             " tokens: cu_seqlens is int32 (at most 2**31 - 1 tokens per batch)");
    out.cu_seqlens[first.back()] = static_cast<int32_t>(token0.back());
    run(rows.size(), [&](size_t c) {
        const Rows& rs = rows[c];
        const size_t t0 = token0[c], n = rs.ids.size();
        for (size_t r = 0; r < rs.rows(); ++r) {
            out.cu_seqlens[first[c] + r] = static_cast<int32_t>(t0 + rs.start[r]);
            if (out.position_ids)
                for (size_t t = rs.start[r]; t < rs.start[r + 1]; ++t)
                    out.position_ids[t0 + t] = static_cast<int64_t>(t - rs.start[r]);
        }
        if (out.ids) std::copy(rs.ids.begin(), rs.ids.end(), out.ids + t0);
        if (out.type_ids) std::copy(rs.type_ids.begin(), rs.type_ids.end(), out.type_ids + t0);
        if (out.special) std::copy(rs.special.begin(), rs.special.end(), out.special + t0);
        if (out.offsets) std::copy(rs.offsets.begin(), rs.offsets.begin() + 2 * n, out.offsets + 2 * t0);
    });
}

}  // namespace fastbert
