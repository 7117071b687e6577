// Open-addressing hash map from byte strings to int32 ids: the vocabulary lookup of the
// WordPiece hot loop (one hash, usually one probe, one memcmp; no std::string built per query).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace fastbert {

inline uint64_t hash_bytes(const char* p, size_t n) {
    // 8 bytes at a time, multiply-xorshift mixing; good enough for vocab keys.
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t v;
        std::memcpy(&v, p, 8);
        h = (h ^ v) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    std::memcpy(&v, p, n);
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
            if (slots_[i].hash == h && view(slots_[i]) == key) {
                if (overwrite) slots_[i].id = id;
                return;
            }
            i = (i + 1) & mask_;
        }
        slots_[i] = Slot{h, static_cast<uint32_t>(pool_.size()), static_cast<uint32_t>(key.size()), id};
        pool_.append(key.data(), key.size());
        ++count_;
        if (key.size() > max_len_) max_len_ = key.size();
    }
    int32_t find(const char* p, size_t n) const {
        if (slots_.empty()) return -1;
        uint64_t h = hash_bytes(p, n);
        size_t i = h & mask_;
        for (;;) {
            const Slot& s = slots_[i];
            if (s.id < 0) return -1;
            if (s.hash == h && s.len == n && std::memcmp(pool_.data() + s.off, p, n) == 0) return s.id;
            i = (i + 1) & mask_;
        }
    }
    size_t max_len() const { return max_len_; }
    size_t size() const { return count_; }

 private:
    struct Slot {
        uint64_t hash = 0;
        uint32_t off = 0;
        uint32_t len = 0;
        int32_t id = -1;
    };
    std::string_view view(const Slot& s) const { return std::string_view(pool_.data() + s.off, s.len); }
    void grow() {
        std::vector<Slot> old;
        old.swap(slots_);
        reserve(old.empty() ? 8 : old.size());
        for (const Slot& s : old) {
            if (s.id < 0) continue;
            size_t i = s.hash & mask_;
            while (slots_[i].id >= 0) i = (i + 1) & mask_;
            slots_[i] = s;
        }
    }
    std::vector<Slot> slots_;
    std::string pool_;
    size_t mask_ = 0, count_ = 0, max_len_ = 0;
};

}  // namespace fastbert
