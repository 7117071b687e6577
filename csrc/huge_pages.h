// An allocator for the tokenizer's large lookup tables (vocabulary slots, word caches): blocks of
// 1 MB and more are 2 MB-aligned and asked to be backed by transparent huge pages, so a table of a
// few MB takes one or two TLB entries instead of hundreds. When the tables have gone cold (another
// library ran in between), each random probe would otherwise pay a page walk on top of the miss.
#pragma once
#include <cstddef>
#include <cstdlib>
#if defined(_WIN32)
#include <malloc.h>
#endif
#include <new>
#include <vector>
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace fastbert {

template <class T>
struct HugePageAllocator {
    using value_type = T;
    static constexpr size_t kHuge = size_t{2} << 20, kMin = size_t{1} << 20;

    HugePageAllocator() = default;
    template <class U>
    HugePageAllocator(const HugePageAllocator<U>&) {}

    T* allocate(size_t n) {
        const size_t bytes = n * sizeof(T);
        if (bytes < kMin) {
            void* p = std::malloc(bytes ? bytes : 1);
            if (!p) throw std::bad_alloc();
            return static_cast<T*>(p);
        }
        const size_t rounded = (bytes + kHuge - 1) / kHuge * kHuge;
#if defined(_WIN32)
        void* p = _aligned_malloc(rounded, kHuge);  // MSVC has no std::aligned_alloc
#else
        void* p = std::aligned_alloc(kHuge, rounded);
#endif
        if (!p) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
        madvise(p, rounded, MADV_HUGEPAGE);  // advice only: without THP the pages stay 4 KB
#endif
        return static_cast<T*>(p);
    }
    void deallocate(T* p, size_t n) noexcept {
#if defined(_WIN32)
        if (n * sizeof(T) >= kMin) {
            _aligned_free(p);
            return;
        }
#else
        (void)n;
#endif
        std::free(p);
    }

    template <class U>
    bool operator==(const HugePageAllocator<U>&) const { return true; }
    template <class U>
    bool operator!=(const HugePageAllocator<U>&) const { return false; }
};

template <class T>
using HugeVector = std::vector<T, HugePageAllocator<T>>;

}  // namespace fastbert
