// Per-thread cache of whole texts (a str, or its part between added tokens) -> their token ids:
// text encoded again (a corpus in its next epoch, repeated queries) costs one comparison and a
// copy, from its third time on. A text cut short by truncation is cached with how far it got; a
// later call that needs more continues from there (chunk boundaries: see chunk_cache.h).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "huge_pages.h"

#include "str_map.h"

namespace fastbert {

class TextCache {
 public:
    static constexpr size_t kMinBytes = 16, kMaxBytes = size_t{64} << 10, kSlots = 8192;
    static constexpr size_t kArenaBytes = size_t{4} << 20;  // then everything is dropped at once

    struct Hit {
        const int32_t* ids;
        size_t count;
        size_t done;  // bytes of the text those ids cover (the whole text, or up to a chunk end)
    };
    static bool fits(size_t n) { return n >= kMinBytes && n <= kMaxBytes; }

    bool find(const char* p, size_t n, Hit& hit) const {
        const uint64_t h = sample_hash(p, n);
        const size_t i = lookup(p, n, h);
        if (i == kSlots || !slots_[i].len || slots_[i].off == kSeen) return false;
        const Slot& s = slots_[i];
        hit = Hit{reinterpret_cast<const int32_t*>(arena_.data() + align(s.off + n)), s.count, s.done};
        return true;
    }
    // A text is stored the second time it is put: the first time only its hash is noted (a single
    // pass over a corpus, where nothing repeats, copies no text).
    void put(const char* p, size_t n, size_t done, const int32_t* ids, size_t count) {
        const size_t need = align(n) + count * sizeof(int32_t);
        if (need > kArenaBytes / 4) return;
        if (arena_.size() + need > kArenaBytes || entries_ >= kSlots / 2) clear();
        const uint64_t h = sample_hash(p, n);
        const size_t i = lookup(p, n, h);
        if (i == kSlots) return;
        Slot& s = slots_[i];
        if (!s.len) {
            ++entries_;
            s = Slot{h, kSeen, static_cast<uint32_t>(n), 0, 0};
            return;
        }
        if (arena_.capacity() < kArenaBytes) arena_.reserve(kArenaBytes);
        const size_t off = arena_.size();  // always 4-aligned
        arena_.resize(off + need);
        std::memcpy(arena_.data() + off, p, n);
        if (count) std::memcpy(arena_.data() + align(off + n), ids, count * sizeof(int32_t));
        // seen before, or stored with less of it done: (re)placed
        s = Slot{h, static_cast<uint32_t>(off), static_cast<uint32_t>(n), static_cast<uint32_t>(done),
                 static_cast<uint32_t>(count)};
    }
    void clear() {
        std::fill(slots_.begin(), slots_.end(), Slot{});
        arena_.clear();
        entries_ = 0;
    }

 private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t off = 0, len = 0, done = 0, count = 0;  // len 0: empty
    };
    static size_t align(size_t x) { return (x + 3) & ~size_t{3}; }
    static constexpr size_t kProbes = 8;
    static constexpr uint32_t kSeen = UINT32_MAX;  // Slot::off of a text seen once, not stored
    // The slot holding this text, or the empty slot where it would go (linear probing; the table
    // is at most half full, and entries are only ever dropped all at once).
    // Gives up (kSlots) after kProbes slots: texts that differ only where the hash does not look
    // (templates) share a hash, and must not make every lookup compare with all of them.
    size_t lookup(const char* p, size_t n, uint64_t h) const {
        size_t i = h & (kSlots - 1);
        for (size_t k = 0; k < kProbes; ++k, i = (i + 1) & (kSlots - 1)) {
            const Slot& s = slots_[i];
            if (!s.len || (s.hash == h && s.len == n &&
                           (s.off == kSeen || std::memcmp(arena_.data() + s.off, p, n) == 0)))
                return i;
        }
        return kSlots;
    }
    // The length and 40 bytes from the start, middle and end: O(1) per text; a full comparison
    // confirms every hit.
    static uint64_t sample_hash(const char* p, size_t n) {
        uint64_t h = n * 0x9E3779B97F4A7C15ull;
        for (const char* q : {p, p + 8, p + n / 2 - 4, p + n - 16, p + n - 8}) {
            h = (h ^ load64(q)) * 0xFF51AFD7ED558CCDull;
            h ^= h >> 32;
        }
        return h;
    }
    std::vector<Slot> slots_ = std::vector<Slot>(kSlots);
    HugeVector<char> arena_;
    size_t entries_ = 0;
};

}  // namespace fastbert
