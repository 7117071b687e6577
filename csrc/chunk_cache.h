// Per-thread cache of whitespace-delimited chunks of raw text -> their token ids. Text seen
// before (repeated phrases, a corpus encoded twice, common words within one batch) skips
// normalization, splitting and WordPiece.
// Exactness: ' ', TAB, LF and CR always end a word and make no token, so a chunk between them
// tokenizes the same on its own as inside its text.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "huge_pages.h"
#include "str_map.h"

namespace fastbert {

// A chunk of at most 15 bytes (nearly every word of running text) as its bytes zero-padded to
// 16, in two words: probing for it needs no hashing loop and no key stored elsewhere.
struct ShortChunk {
    static constexpr size_t kMax = 15;
    uint64_t a = 0, b = 0;
    uint32_t n = 0;  // bytes

    static ShortChunk of(const char* p, size_t n) {
        char buf[16] = {};
        std::memcpy(buf, p, n);
        return ShortChunk{load64(buf), load64(buf + 8), static_cast<uint32_t>(n)};
    }
    // The same from 16 readable bytes at p (no copy through memory).
    static ShortChunk of16(const char* p, size_t n) {
        const uint64_t lo = n >= 8 ? ~uint64_t{0} : (uint64_t{1} << (8 * n)) - 1;
        const uint64_t hi = n <= 8 ? 0 : (uint64_t{1} << (8 * (n - 8))) - 1;
        return ShortChunk{load64(p) & lo, load64(p + 8) & hi, static_cast<uint32_t>(n)};
    }
};

class ChunkCache {
 public:
    static constexpr size_t kSlots = size_t{1} << 12, kMaxKey = 64, kMaxIds = 48;  // 16..64-byte chunks: rare
    static constexpr size_t kShortSlots = size_t{1} << 15, kInline = 3;
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

    // The same for short chunks: up to kInline ids live in the slot itself.
    const int32_t* find(const ShortChunk& k, size_t* count) const {
        const ShortSlot& s = short_[index(k)];
        if (s.a != k.a || s.b != k.b || s.len != k.n) return nullptr;
        *count = s.n;
        return s.n <= kInline ? s.ids : reinterpret_cast<const int32_t*>(arena_.data() + s.ids[0]);
    }
    void put(const ShortChunk& k, const int32_t* ids, size_t count) {
        if (count > kMaxIds) return;
        ShortSlot s{k.a, k.b, {}, static_cast<uint8_t>(k.n), static_cast<uint8_t>(count)};
        if (count <= kInline) {
            if (count) std::memcpy(s.ids, ids, count * sizeof(int32_t));
        } else {
            const size_t off = take(count * sizeof(int32_t));
            std::memcpy(arena_.data() + off, ids, count * sizeof(int32_t));
            s.ids[0] = static_cast<int32_t>(off);
        }
        short_[index(k)] = s;
    }

    void prefetch(const ShortChunk& k) const { __builtin_prefetch(&short_[index(k)]); }

    void clear() {
        std::fill(slots_.begin(), slots_.end(), Slot{});
        std::fill(short_.begin(), short_.end(), ShortSlot{});
        arena_.clear();
    }

 private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t off = 0;
        uint16_t len = 0;  // 0: empty (chunks are never empty)
        uint16_t n = 0;
    };
    struct ShortSlot {  // 32 bytes: two per cache line
        uint64_t a = 0, b = 0;
        int32_t ids[kInline] = {};  // the ids, or ids[0] = their arena offset when more
        uint8_t len = 0;            // 0: empty
        uint8_t n = 0;
    };
    static size_t align(size_t x) { return (x + 3) & ~size_t{3}; }
    static size_t index(const ShortChunk& k) {
        // Fibonacci hashing: the top bits of the product depend on every key bit
        const uint64_t x = k.a ^ (k.b * 0x9E3779B97F4A7C15ull) ^ k.n;
        return static_cast<size_t>((x * 0xFF51AFD7ED558CCDull) >> (64 - 15));
    }
    static_assert(kShortSlots == size_t{1} << 15, "index() takes 15 bits");
    // Room for n more bytes at the (4-aligned) end of the arena; drops everything when full.
    size_t take(size_t n) {
        if (arena_.size() + n + 8 > kArenaBytes) clear();
        if (arena_.capacity() < kArenaBytes) arena_.reserve(kArenaBytes);
        const size_t off = align(arena_.size());
        arena_.resize(off + n);
        return off;
    }
    std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
    HugeVector<ShortSlot> short_ = HugeVector<ShortSlot>(kShortSlots);  // 1 MB
    HugeVector<char> arena_;
};

}  // namespace fastbert
