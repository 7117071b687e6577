// Short chunks of raw text (whitespace-delimited, at most 15 bytes: nearly every word of running
// text) -> their token ids, one table for all the threads that encode with a tokenizer. With a
// table per thread, each thread tokenized every new word itself: on two threads, each word of a
// batch met by both was tokenized twice (5-8% more work on new English text, the part of a batch
// that does not get faster with threads).
//
// Lock-free: a slot is a seqlock. A writer takes the slot by making its sequence odd (and gives
// up if another writer has it: this is a cache), writes, then makes it even again; a reader keeps
// what it read only if the sequence was even and the same before and after. Every field is an
// atomic, so a torn read is never used and there is no data race. clear() only starts a new
// epoch: an entry of an older one is empty.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstring>
#include <vector>

#include "huge_pages.h"
#include "str_map.h"

namespace fastbert {

// A chunk of at most 15 bytes as its bytes zero-padded to 16, in two words: probing for it needs
// no hashing loop and no key stored elsewhere.
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

class SharedChunkCache {
 public:
    static constexpr size_t kSlots = size_t{1} << 15;  // 2 MB
    static constexpr size_t kMaxIds = 10;               // more: the thread's own ChunkCache holds them

    enum class Found { kMiss, kHit, kNotKept };

    // The current epoch, for find and put: read once per text, not per chunk.
    uint64_t epoch() const { return (epoch_.load(std::memory_order_relaxed) + (uint64_t{1} << 24)) & kEpochMask; }

    // kHit appends the chunk's ids to out; kNotKept: it has more than kMaxIds ids, which each
    // thread's own cache keeps. slot: slot_of(k), computed once per chunk by the caller (for
    // prefetch, find and put alike).
    Found find(const ShortChunk& k, size_t slot, uint64_t epoch, std::vector<int32_t>& out) const {
        const Slot& s = slots_[slot];
        const uint64_t meta = s.meta.load(std::memory_order_acquire);
        // not being written, of this epoch, this many bytes: one comparison
        if ((meta & kCheckMask) != (epoch | len_bits(k.n))) return Found::kMiss;
        if (s.a.load(std::memory_order_relaxed) != k.a || s.b.load(std::memory_order_relaxed) != k.b)
            return Found::kMiss;
        const size_t count = count_of(meta);
        int32_t ids[kMaxIds];
        const size_t n = count == kNotKept ? 0 : count;
        for (size_t t = 0; t < n; ++t) ids[t] = s.ids[t].load(std::memory_order_relaxed);
        std::atomic_thread_fence(std::memory_order_acquire);
        if (s.meta.load(std::memory_order_relaxed) != meta) return Found::kMiss;  // rewritten meanwhile
        if (count == kNotKept) return Found::kNotKept;
        for (size_t t = 0; t < n; ++t) out.push_back(ids[t]);
        return Found::kHit;
    }

    // Stores the chunk's ids (or, for more than kMaxIds, that they are not kept here); does
    // nothing while another thread writes the same slot.
    void put(const ShortChunk& k, size_t slot, uint64_t epoch, const int32_t* ids, size_t count) {
        Slot& s = slots_[slot];
        uint64_t meta = s.meta.load(std::memory_order_relaxed);
        if (meta & 1) return;
        const uint64_t seq = meta & kSeqMask;
        if (!s.meta.compare_exchange_strong(meta, (meta & ~kSeqMask) | ((seq + 1) & kSeqMask),
                                            std::memory_order_acq_rel, std::memory_order_relaxed))
            return;
        // the odd sequence is seen before any of the writes below (see the reader's fence)
        std::atomic_thread_fence(std::memory_order_release);
        const bool kept = count <= kMaxIds;
        s.a.store(k.a, std::memory_order_relaxed);
        s.b.store(k.b, std::memory_order_relaxed);
        if (kept)
            for (size_t t = 0; t < count; ++t) s.ids[t].store(ids[t], std::memory_order_relaxed);
        s.meta.store(((seq + 2) & kSeqMask) | epoch | len_bits(k.n) | (uint64_t{kept ? count : kNotKept} << 56),
                     std::memory_order_release);
    }

    void prefetch(size_t slot) const { __builtin_prefetch(&slots_[slot]); }

    // The slot a chunk goes to (chunks with the same slot replace one another).
    static size_t slot_of(const ShortChunk& k) {
        // Fibonacci hashing: the top bits of the product depend on every key bit
        const uint64_t x = k.a ^ (k.b * 0x9E3779B97F4A7C15ull) ^ k.n;
        return static_cast<size_t>((x * 0xFF51AFD7ED558CCDull) >> (64 - 15));
    }

    // Forgets every entry at once (a batch running meanwhile may still add some). Then reads the
    // table through: the next batch probes it right away and finds it in the CPU caches, as it
    // finds the per-thread caches, which are emptied in place (without this, a batch after a clear
    // started on a table gone out of the CPU caches).
    void clear() {
        epoch_.fetch_add(uint64_t{1} << 24, std::memory_order_relaxed);
        uint64_t seen = 0;
        for (const Slot& s : slots_) seen |= s.meta.load(std::memory_order_relaxed);
        last_clear_seen_.store(seen, std::memory_order_relaxed);  // a use, so the reads are kept
    }

 private:
    static constexpr size_t kNotKept = 255;
    // meta: sequence (bits 0-23, odd while written), epoch (24-47), chunk bytes (48-55; 0: empty),
    // id count (56-63; kNotKept: more than kMaxIds)
    static constexpr uint64_t kSeqMask = (uint64_t{1} << 24) - 1;
    static constexpr uint64_t kEpochMask = ((uint64_t{1} << 24) - 1) << 24;
    static constexpr uint64_t kCheckMask = 1 | kEpochMask | (uint64_t{0xFF} << 48);
    static uint64_t len_bits(uint32_t n) { return uint64_t{n} << 48; }
    static size_t count_of(uint64_t meta) { return static_cast<size_t>(meta >> 56); }

    struct alignas(64) Slot {  // one cache line
        std::atomic<uint64_t> meta{0}, a{0}, b{0};
        std::atomic<int32_t> ids[kMaxIds] = {};
    };
    static_assert(sizeof(Slot) == 64, "a slot is one cache line");
    static_assert(kSlots == size_t{1} << 15, "slot_of() takes 15 bits");
    // the clears so far, in meta's epoch bits; the epoch is 1 more (an all-zero slot is empty)
    std::atomic<uint64_t> epoch_{0};
    std::atomic<uint64_t> last_clear_seen_{0};
    HugeVector<Slot> slots_ = HugeVector<Slot>(kSlots);
};

}  // namespace fastbert
