// Stress test of SharedChunkCache's seqlock: threads look up and store chunks whose keys share a
// few slots, so that writers overwrite one another's entries while readers read them, and one
// thread clears the cache now and then. Every hit must give exactly the ids of its own key, and
// a chunk of more than kMaxIds ids must never be a hit. Built and run by ci.sh with
// ThreadSanitizer (no data race) and without it (timing closer to a real run).
// Usage: stress_shared_chunk_cache [SECONDS]  (default 3); exit status 1 on a wrong hit.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "shared_chunk_cache.h"

using namespace fastbert;

namespace {

struct Key {
    std::string text;
    ShortChunk chunk;
    std::vector<int32_t> ids;  // 1..14 ids, all derived from the key's number
};

// Keys in groups that each map to one slot: 4 slots, 6 keys each.
std::vector<Key> colliding_keys() {
    std::vector<Key> keys;
    std::vector<size_t> slots;
    std::vector<int> per_slot;
    for (uint32_t i = 0; keys.size() < 24; ++i) {
        const std::string text = "w" + std::to_string(i);
        const ShortChunk c = ShortChunk::of(text.data(), text.size());
        const size_t slot = SharedChunkCache::slot_of(c);
        size_t g = 0;
        while (g < slots.size() && slots[g] != slot) ++g;
        if (g == slots.size()) {
            if (slots.size() == 4) continue;
            slots.push_back(slot);
            per_slot.push_back(0);
        }
        if (per_slot[g] == 6) continue;
        ++per_slot[g];
        const int32_t number = static_cast<int32_t>(keys.size());
        std::vector<int32_t> ids(1 + number % 14);
        for (size_t t = 0; t < ids.size(); ++t) ids[t] = number * 1000 + static_cast<int32_t>(t);
        keys.push_back(Key{text, c, ids});
    }
    return keys;
}

}  // namespace

int main(int argc, char** argv) {
    const double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
    const std::vector<Key> keys = colliding_keys();
    SharedChunkCache cache;
    std::atomic<bool> stop{false};
    std::atomic<long> hits{0}, not_kept{0}, wrong{0};
    auto work = [&](unsigned seed) {
        std::vector<int32_t> out;
        uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
        long my_hits = 0, my_not_kept = 0;
        while (!stop.load(std::memory_order_relaxed)) {
            state = state * 6364136223846793005ull + 1442695040888963407ull;
            const Key& k = keys[(state >> 33) % keys.size()];
            const uint64_t epoch = cache.epoch();
            out.assign(3, -1);  // ids are appended after what is there
            const size_t slot = SharedChunkCache::slot_of(k.chunk);
            switch (cache.find(k.chunk, slot, epoch, out)) {
                case SharedChunkCache::Found::kHit:
                    ++my_hits;
                    if (k.ids.size() > SharedChunkCache::kMaxIds || out.size() != 3 + k.ids.size() ||
                        !std::equal(k.ids.begin(), k.ids.end(), out.begin() + 3)) {
                        if (wrong.fetch_add(1) < 5)
                            std::fprintf(stderr, "wrong hit for %s: %zu ids\n", k.text.c_str(), out.size() - 3);
                    }
                    break;
                case SharedChunkCache::Found::kNotKept:
                    ++my_not_kept;
                    if (k.ids.size() <= SharedChunkCache::kMaxIds || out.size() != 3) wrong.fetch_add(1);
                    break;
                case SharedChunkCache::Found::kMiss:
                    if (out.size() != 3) wrong.fetch_add(1);
                    cache.put(k.chunk, slot, epoch, k.ids.data(), k.ids.size());
                    break;
            }
        }
        hits += my_hits;
        not_kept += my_not_kept;
    };
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < 4; ++t) threads.emplace_back(work, t);
    threads.emplace_back([&] {
        while (!stop.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
            cache.clear();
        }
    });
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    stop = true;
    for (std::thread& t : threads) t.join();
    std::printf("shared chunk cache: %ld hits, %ld not kept, %ld wrong\n", hits.load(), not_kept.load(), wrong.load());
    // a run without hits or without the not-kept answer tested nothing
    return wrong.load() == 0 && hits.load() > 0 && not_kept.load() > 0 ? 0 : 1;
}
