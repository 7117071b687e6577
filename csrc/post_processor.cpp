#include "post_processor.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

namespace fastbert {

namespace {

using Window = std::pair<size_t, size_t>;  // [start, stop) token range

// Encoding::truncate: the main window first, then the overflowing windows.
std::vector<Window> windows(size_t len, size_t max_len, size_t stride, bool left) {
    if (max_len >= len) return {{0, len}};
    if (max_len == 0) return {{0, 0}, {0, len}};
    if (stride >= max_len)
        throw TruncationError("stride (" + std::to_string(stride) + ") must be strictly less than the length this "
                              "sequence is truncated to (" + std::to_string(max_len) +
                              " = max_length minus the special tokens and the other sequence's tokens)");
    const size_t step = max_len - stride;
    std::vector<Window> w;
    if (!left) {
        for (size_t start = 0; start < len; start += step) {
            const size_t stop = std::min(start + max_len, len);
            w.emplace_back(start, stop);
            if (stop == len) break;
        }
    } else {
        // HF walks stops backwards from len, step by step, until a window reaches 0
        for (size_t k = 0;; k += step) {
            if (k >= len) break;
            const size_t stop = len - k;
            const size_t start = stop < max_len ? 0 : stop - max_len;
            w.emplace_back(start, stop);
            if (start == 0) break;
        }
    }
    return w;
}

void emit_row(const Encoded& a, const std::vector<Window>& was, size_t ia, const Encoded* b,
              const std::vector<Window>& wbs, size_t ib, const PostConfig& cfg, int32_t item, Rows& out) {
    const Window wa = was[ia], wb = wbs[ib];
    const bool main = ia == 0 && ib == 0;
    if (cfg.words) {
        out.window.push_back(static_cast<uint32_t>(ia));
        out.window.push_back(static_cast<uint32_t>(ib));
        out.window.push_back(static_cast<uint32_t>(wa.second - wa.first));
    }
    auto special = [&](int32_t id, uint8_t type) {
        out.ids.push_back(id);
        out.type_ids.push_back(type);
        out.special.push_back(1);
        if (cfg.offsets) {
            out.offsets.push_back(0);
            out.offsets.push_back(0);
        }
        if (cfg.words) out.words.push_back(-1);
    };
    auto seq = [&](const Encoded& e, Window w, uint8_t type) {
        out.ids.insert(out.ids.end(), e.ids.begin() + w.first, e.ids.begin() + w.second);
        out.type_ids.insert(out.type_ids.end(), w.second - w.first, type);
        out.special.insert(out.special.end(), w.second - w.first, 0);
        if (cfg.offsets)
            out.offsets.insert(out.offsets.end(), e.offsets.begin() + 2 * w.first, e.offsets.begin() + 2 * w.second);
        if (cfg.words) out.words.insert(out.words.end(), e.words.begin() + w.first, e.words.begin() + w.second);
    };
    if (!cfg.add_special_tokens) {  // A B, with the template's type ids
        const std::vector<Piece>& t = cfg.tmpl->pair;
        uint8_t type_a = 0, type_b = 1;
        for (const Piece& p : t) {
            if (p.id == Piece::kSeqA) type_a = p.type;
            if (p.id == Piece::kSeqB) type_b = p.type;
        }
        if (!b) for (const Piece& p : cfg.tmpl->single) if (p.id == Piece::kSeqA) type_a = p.type;
        seq(a, wa, type_a);
        if (b) seq(*b, wb, type_b);
    } else {
        for (const Piece& p : b ? cfg.tmpl->pair : cfg.tmpl->single) {
            if (p.id == Piece::kSeqA) seq(a, wa, p.type);
            else if (p.id == Piece::kSeqB) seq(*b, wb, p.type);
            else special(p.id, p.type);
        }
    }
    out.start.push_back(out.ids.size());
    out.item.push_back(item);
    out.main.push_back(main ? 1 : 0);
}

}  // namespace

void Template::validate() const {
    auto count = [](const std::vector<Piece>& t, int32_t id) {
        return std::count_if(t.begin(), t.end(), [id](const Piece& p) { return p.id == id; });
    };
    if (count(single, Piece::kSeqA) != 1 || count(single, Piece::kSeqB) != 0)
        throw std::invalid_argument("template: the single-sequence template must hold $A once and no $B");
    if (count(pair, Piece::kSeqA) != 1 || count(pair, Piece::kSeqB) != 1)
        throw std::invalid_argument("template: the pair template must hold $A and $B once each");
    for (const Piece& p : pair)
        if (p.id == Piece::kSeqB) throw std::invalid_argument("template: the pair template must put $A before $B");
        else if (p.id == Piece::kSeqA) break;
    for (const auto* t : {&single, &pair})
        for (const Piece& p : *t)
            if (p.id < Piece::kSeqB) throw std::invalid_argument("template: a special token id must be >= 0");
}

void post_process(const Encoded& a, const Encoded* b, const PostConfig& cfg, int32_t item, Rows& out) {
    const size_t na = a.ids.size(), nb = b ? b->ids.size() : 0;
    std::vector<Window> wa{{0, na}}, wb{{0, nb}};
    if (cfg.truncation != Truncation::kNone) {
        size_t max_len = cfg.max_length;
        const size_t added = cfg.add_special_tokens ? cfg.tmpl->specials(b != nullptr) : 0;
        if (added) {
            // tokenizers computes max_length - added in usize: below zero wraps to "no limit"
            if (max_len < added) max_len = SIZE_MAX;
            else max_len -= added;
        }
        const size_t total = na + nb;
        if (max_len == 0) {
            wa = windows(na, 0, cfg.stride, cfg.truncate_left);
            if (b) wb = windows(nb, 0, cfg.stride, cfg.truncate_left);
        } else if (total > max_len) {
            const size_t to_remove = total - max_len;
            if (cfg.truncation == Truncation::kLongestFirst) {
                if (b) {
                    size_t n1 = na, n2 = nb;
                    const bool swap = n1 > n2;
                    if (swap) std::swap(n1, n2);
                    n2 = n1 > max_len ? n1 : std::max(n1, max_len - n1);
                    if (n1 + n2 > max_len) {
                        n1 = max_len / 2;
                        n2 = n1 + max_len % 2;
                    }
                    if (swap) std::swap(n1, n2);
                    wa = windows(na, n1, cfg.stride, cfg.truncate_left);
                    wb = windows(nb, n2, cfg.stride, cfg.truncate_left);
                } else {
                    wa = windows(na, total - to_remove, cfg.stride, cfg.truncate_left);
                }
            } else {
                const bool first = cfg.truncation == Truncation::kOnlyFirst;
                if (!first && !b)
                    throw TruncationError("Truncation error: Second sequence not provided");
                const size_t target = first ? na : nb;
                if (target <= to_remove)
                    throw TruncationError(
                        "Truncation error: Sequence to truncate too short to respect the provided max_length");
                (first ? wa : wb) = windows(target, target - to_remove, cfg.stride, cfg.truncate_left);
            }
        }
    }
    emit_row(a, wa, 0, b, wb, 0, cfg, item, out);
    if (!cfg.overflow) return;
    // Encoding::merge_with order: each overflow of A with B's main window then with B's overflows,
    // then A's main window with each overflow of B.
    for (size_t i = 1; i < wa.size(); ++i) {
        emit_row(a, wa, i, b, wb, 0, cfg, item, out);
        if (b)
            for (size_t j = 1; j < wb.size(); ++j) emit_row(a, wa, i, b, wb, j, cfg, item, out);
    }
    if (b)
        for (size_t j = 1; j < wb.size(); ++j) emit_row(a, wa, 0, b, wb, j, cfg, item, out);
}

}  // namespace fastbert
