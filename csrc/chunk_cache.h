// Per-thread cache of whitespace-delimited chunks of raw text -> their token ids, for the chunks
// that the shared one (shared_chunk_cache.h) does not hold: 16 to 64 bytes, or more ids than it
// keeps. Text seen before (repeated phrases, a corpus encoded twice, common words within one
// batch) skips normalization, splitting and WordPiece.
// Exactness: ' ', TAB, LF and CR always end a word and make no token, so a chunk between them
// tokenizes the same on its own as inside its text.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "huge_pages.h"
#include "str_map.h"

namespace fastbert {

class ChunkCache {
 public:
    static constexpr size_t kSlots = size_t{1} << 12, kMaxKey = 64, kMaxIds = 48;  // rare chunks
    static constexpr size_t kArenaBytes = size_t{4} << 20;  // then everything is dropped at once

    // The ids of chunk [p, p + n) with hash h, or nullptr; *count receives their number.
    const int32_t* find(const char* p, size_t n, uint64_t h, size_t* count) const {
        const Slot& s = slots_[h & (kSlots - 1)];
        if (s.hash != h || s.len != n || !equal_bytes(arena_.data() + s.off, p, n)) return nullptr;
        *count = s.n;
        return reinterpret_cast<const int32_t*>(arena_.data() + align(s.off + n));
    }
    void put(const char* p, size_t n, uint64_t h, const int32_t* ids, size_t count) {
        if (n > kMaxKey || count > kMaxIds) return;
        const size_t off = take(align(n) + count * sizeof(int32_t));
        std::memcpy(arena_.data() + off, p, n);
        // a chunk may give no token (only dropped control characters): ids is then null, and
        // memcpy from null is undefined even for 0 bytes (UBSan, found by csrc/fuzz)
        if (count) std::memcpy(arena_.data() + align(off + n), ids, count * sizeof(int32_t));
        slots_[h & (kSlots - 1)] = Slot{h, static_cast<uint32_t>(off), static_cast<uint16_t>(n),
                                        static_cast<uint16_t>(count)};
    }

    void clear() {
        std::fill(slots_.begin(), slots_.end(), Slot{});
        arena_.clear();
    }

 private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t off = 0;
        uint16_t len = 0;  // 0: empty (chunks are never empty)
        uint16_t n = 0;
    };
    static size_t align(size_t x) { return (x + 3) & ~size_t{3}; }
    // Room for n more bytes at the (4-aligned) end of the arena; drops everything when full.
    size_t take(size_t n) {
        if (arena_.size() + n + 8 > kArenaBytes) clear();
        if (arena_.capacity() < kArenaBytes) arena_.reserve(kArenaBytes);
        const size_t off = align(arena_.size());
        arena_.resize(off + n);
        return off;
    }
    std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
    HugeVector<char> arena_;
};

}  // namespace fastbert
