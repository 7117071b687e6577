// Open-addressing hash map from byte strings to int32 ids: the vocabulary lookup of the
// WordPiece hot loop (one hash, usually one probe, one memcmp; no std::string built per query).
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "huge_pages.h"

namespace fastbert {

inline uint64_t load64(const char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
}
inline uint64_t load32(const char* p) {
    uint32_t v;
    std::memcpy(&v, p, 4);
    return v;
}

// Byte equality for short keys without a libc call (overlapping fixed-size loads, no over-read).
inline bool equal_bytes(const char* a, const char* b, size_t n) {
    if (n >= 8) {
        if (n > 16) return std::memcmp(a, b, n) == 0;
        return load64(a) == load64(b) && load64(a + n - 8) == load64(b + n - 8);
    }
    if (n >= 4) return load32(a) == load32(b) && load32(a + n - 4) == load32(b + n - 4);
    for (size_t i = 0; i < n; ++i)
        if (a[i] != b[i]) return false;
    return true;
}

inline uint64_t hash_bytes(const char* p, size_t n) {
    // 8 bytes at a time, multiply-xorshift mixing. The tail is read with fixed-size loads
    // (overlapping ones for 4..7 bytes), never a variable-length copy: that one stalls on
    // store forwarding and was the single hottest instruction of the WordPiece loop.
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    const char* end = p + n;
    while (end - p > 8) {
        h = (h ^ load64(p)) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
    }
    const size_t r = static_cast<size_t>(end - p);  // 0..8 bytes left
    uint64_t v;
    if (r == 8) {
        v = load64(p);
    } else if (r >= 4) {
        v = load32(p) | (load32(end - 4) << 32);
    } else if (r > 0) {
        v = static_cast<unsigned char>(p[0]) | (uint64_t{static_cast<unsigned char>(p[r / 2])} << 8) |
            (uint64_t{static_cast<unsigned char>(end[-1])} << 16);
    } else {
        v = 0;
    }
    h = (h ^ v) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 32;
    return h;
}

class StrMap {
 public:
    void reserve(size_t n) {
        size_t cap = 16;
        while (cap < n * 2) cap <<= 1;
        slots_.assign(cap, Slot{});
        mask_ = cap - 1;
    }
    // Inserts key -> id; an existing key keeps its first id unless overwrite.
    void insert(std::string_view key, int32_t id, bool overwrite) {
        if ((count_ + 1) * 2 > slots_.size()) grow();
        uint64_t h = hash_bytes(key.data(), key.size());
        size_t i = h & mask_;
        while (slots_[i].id >= 0) {
            if (slots_[i].tag == static_cast<uint32_t>(h) && view(slots_[i]) == key) {
                if (overwrite) slots_[i].id = id;
                return;
            }
            i = (i + 1) & mask_;
        }
        Slot slot{static_cast<uint32_t>(h), id, static_cast<uint32_t>(pool_.size()),
                  static_cast<uint32_t>(key.size()), {}};
        std::memcpy(slot.key, key.data(), std::min(key.size(), kInline));
        slots_[i] = slot;
        const uint64_t bit = h >> (64 - kFilterBits);
        filter_[bit >> 6] |= uint64_t{1} << (bit & 63);
        pool_.append(key.data(), key.size());
        ++count_;
        if (key.size() > max_len_) max_len_ = key.size();
    }
    int32_t find(const char* p, size_t n) const { return find(p, n, hash_bytes(p, n)); }
    int32_t find(const char* p, size_t n, uint64_t h) const {
        if (slots_.empty()) return -1;
        // most WordPiece probes miss: a 64 KB bit filter answers them without touching the table
        const uint64_t bit = h >> (64 - kFilterBits);
        if (!(filter_[bit >> 6] >> (bit & 63) & 1)) return -1;
        return find_in_table(p, n, h);
    }
    // The same without the filter: for a probe that usually hits (a whole word), where the filter
    // would be one more memory access.
    int32_t find_in_table(const char* p, size_t n, uint64_t h) const {
        if (slots_.empty()) return -1;
        size_t i = h & mask_;
        for (;;) {
            const Slot& s = slots_[i];
            if (s.id < 0) return -1;
            if (s.tag == static_cast<uint32_t>(h) && s.len == n &&
                equal_bytes(n <= kInline ? s.key : pool_.data() + s.off, p, n))
                return s.id;
            i = (i + 1) & mask_;
        }
    }
    // Starts loading the table slot of hash h (a lookup will follow after other work).
    void prefetch(uint64_t h) const {
        if (!slots_.empty()) __builtin_prefetch(&slots_[h & mask_]);
    }
    size_t max_len() const { return max_len_; }
    size_t size() const { return count_; }

 private:
    static constexpr int kFilterBits = 19;
    static constexpr size_t kInline = 16;
    // 32 bytes: a key of up to 16 bytes (nearly every vocabulary entry) is compared in the slot
    // itself, so a hit costs one memory access, not a second one into the pool
    struct Slot {
        uint32_t tag = 0;  // low hash bits
        int32_t id = -1;
        uint32_t off = 0;
        uint32_t len = 0;
        char key[kInline] = {};  // the key's first bytes
    };
    std::string_view view(const Slot& s) const { return std::string_view(pool_.data() + s.off, s.len); }
    void grow() {
        HugeVector<Slot> old;
        old.swap(slots_);
        reserve(old.empty() ? 8 : old.size());
        for (const Slot& s : old) {
            if (s.id < 0) continue;
            size_t i = hash_bytes(pool_.data() + s.off, s.len) & mask_;
            while (slots_[i].id >= 0) i = (i + 1) & mask_;
            slots_[i] = s;
        }
    }
    HugeVector<Slot> slots_;  // 2 MB for a 30k vocabulary: one huge page
    std::vector<uint64_t> filter_ = std::vector<uint64_t>((size_t{1} << kFilterBits) / 64, 0);
    std::string pool_;
    size_t mask_ = 0, count_ = 0, max_len_ = 0;
};

}  // namespace fastbert
