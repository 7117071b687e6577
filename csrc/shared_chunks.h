// Short chunks -> their token ids (up to 3), one table for every thread of a tokenizer: a word one
// thread tokenized is a hit for the others. With per-thread caches alone, every thread of a batch
// tokenized the common words again; on text that starts cold, that repeated work was most of what
// two threads lost against one. Chunks with more ids stay in the per-thread ChunkCache.
//
// Slots are written once: claimed by a compare-and-swap, filled, then published by a release store
// of their state. A reader that sees a published state (acquire) sees the slot's data, and that data
// never changes while the table lives, so lookups take no lock. A full table is replaced, not
// cleared in place, while a batch may still read it (Tokenizer keeps it behind a shared_ptr).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "chunk_cache.h"

namespace fastbert {

class SharedChunks {
 public:
    static constexpr size_t kSlots = size_t{1} << 16, kProbes = 4, kMaxIds = 3;

    // Appends the ids of chunk k to ids and returns true, or returns false (not in the table).
    template <class Ids>
    bool find(const ShortChunk& k, Ids& ids) const {
        size_t i = index(k);
        for (size_t p = 0; p < kProbes; ++p, i = (i + 1) & (kSlots - 1)) {
            const Slot& s = slots_[i];
            const uint64_t st = s.state.load(std::memory_order_acquire);
            if (st == kEmpty) return false;  // an insert would have taken this slot
            if (!(st & kReady) || len_of(st) != k.n || s.a.load(std::memory_order_relaxed) != k.a ||
                s.b.load(std::memory_order_relaxed) != k.b)
                continue;
            const uint64_t two = s.ids.load(std::memory_order_relaxed);
            const size_t n = count_of(st);
            if (n > 0) ids.push_back(static_cast<int32_t>(static_cast<uint32_t>(two)));
            if (n > 1) ids.push_back(static_cast<int32_t>(static_cast<uint32_t>(two >> 32)));
            if (n > 2) ids.push_back(static_cast<int32_t>(static_cast<uint32_t>(st >> 32)));
            return true;
        }
        return false;
    }

    // Publishes the ids of chunk k. False when they do not fit (more than kMaxIds, a negative id, or
    // no free slot among the probed ones): the caller keeps them in its own cache.
    bool put(const ShortChunk& k, const int32_t* ids, size_t count) {
        if (count > kMaxIds) return false;
        for (size_t t = 0; t < count; ++t)
            if (ids[t] < 0) return false;
        const auto id = [&](size_t t) { return t < count ? static_cast<uint64_t>(static_cast<uint32_t>(ids[t])) : 0; };
        size_t i = index(k);
        for (size_t p = 0; p < kProbes; ++p, i = (i + 1) & (kSlots - 1)) {
            Slot& s = slots_[i];
            uint64_t st = kEmpty;
            if (s.state.compare_exchange_strong(st, kBusy, std::memory_order_acquire)) {
                s.a.store(k.a, std::memory_order_relaxed);
                s.b.store(k.b, std::memory_order_relaxed);
                s.ids.store(id(0) | id(1) << 32, std::memory_order_relaxed);
                s.state.store(kReady | uint64_t{k.n} << 8 | uint64_t{count} << 16 | id(2) << 32,
                              std::memory_order_release);
                entries_.fetch_add(1, std::memory_order_relaxed);
                return true;
            }
            // taken: by this very chunk (another thread got there first), or by another chunk
            if ((st & kReady) && len_of(st) == k.n && s.a.load(std::memory_order_relaxed) == k.a &&
                s.b.load(std::memory_order_relaxed) == k.b)
                return true;
        }
        return false;
    }

    void prefetch(const ShortChunk& k) const { __builtin_prefetch(&slots_[index(k)]); }
    // Half the slots taken: probes would start to fail; the owner replaces the table.
    bool full() const { return entries_.load(std::memory_order_relaxed) >= kSlots / 2; }

 private:
    // state: kEmpty, kBusy (being written), or kReady | len << 8 | count << 16 | ids[2] << 32
    static constexpr uint64_t kEmpty = 0, kBusy = 2, kReady = 1;
    static size_t len_of(uint64_t st) { return (st >> 8) & 0xFF; }
    static size_t count_of(uint64_t st) { return (st >> 16) & 0xFF; }
    static size_t index(const ShortChunk& k) {
        const uint64_t x = k.a ^ (k.b * 0x9E3779B97F4A7C15ull) ^ k.n;
        return static_cast<size_t>((x * 0xFF51AFD7ED558CCDull) >> (64 - 16));
    }
    static_assert(kSlots == size_t{1} << 16, "index() takes 16 bits");
    struct alignas(32) Slot {  // two per cache line
        std::atomic<uint64_t> state{kEmpty}, a{0}, b{0}, ids{0};
    };
    // value-initialised here, so a new table's pages are touched when it is made, not by the batch
    std::unique_ptr<Slot[]> slots_ = std::make_unique<Slot[]>(kSlots);
    std::atomic<size_t> entries_{0};
};

}  // namespace fastbert
