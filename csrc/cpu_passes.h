// What the C++ CPU passes share (py_quantized_linear.cpp, py_attention.cpp, py_linear.cpp): the
// AVX-512 switch (compiled in on x86 with GCC or clang, taken at run time where the CPU has it), a
// vector exp and erf GELU, and a pool of the module's own threads to split a large input over.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>

#include "thread_pool.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's intrinsics (the reductions, the narrowing store) read an _mm512_undefined_* it then warns about
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#define FASTBERT_AVX512 1
#define AVX512 __attribute__((target("avx512f")))
#define AVX512_VNNI __attribute__((target("avx512f,avx512vnni")))
#endif

namespace fastbert {

#ifdef FASTBERT_AVX512
inline bool has_avx512() {
    static const bool yes = __builtin_cpu_supports("avx512f");
    return yes;
}

inline bool has_avx512_vnni() {
    static const bool yes = has_avx512() && __builtin_cpu_supports("avx512vnni");
    return yes;
}

// exp(x) for x <= 0: 2^n * p(r), r = x - n ln2 in [-ln2/2, ln2/2], p its degree-6 Taylor polynomial
// (relative error < 2e-7); x below -87 gives 0.
AVX512 inline __m512 exp_nonpositive(__m512 x) {
    const __m512 tiny = _mm512_set1_ps(-87.0f);
    const __mmask16 zero = _mm512_cmp_ps_mask(x, tiny, _CMP_LT_OQ);
    x = _mm512_max_ps(x, tiny);
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);     // ln2 = 0.693359375 - 2.12194e-4
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.0f / 720);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    return _mm512_maskz_scalef_ps(static_cast<__mmask16>(~zero), p, n);
}

// GELU(v) = v/2 (1 + erf(v / sqrt 2)); erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7).
AVX512 inline __m512 gelu_avx512(__m512 v) {
    const __m512 z = _mm512_mul_ps(v, _mm512_set1_ps(0.70710678118654752f));
    const __m512 a = _mm512_abs_ps(z);
    // t = 1 / d: the 14-bit reciprocal and one Newton step (~1 ulp; a division costs several times more)
    const __m512 d = _mm512_fmadd_ps(a, _mm512_set1_ps(0.3275911f), _mm512_set1_ps(1.0f));
    const __m512 r = _mm512_rcp14_ps(d);
    const __m512 t = _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
    __m512 p = _mm512_set1_ps(1.061405429f);
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
    p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
    p = _mm512_mul_ps(p, t);
    const __m512 e = exp_nonpositive(_mm512_mul_ps(_mm512_sub_ps(_mm512_setzero_ps(), a), a));
    __m512 erf_abs = _mm512_fnmadd_ps(p, e, _mm512_set1_ps(1.0f));
    // erf is odd: the sign of z (a sign bit copied with integer ops, which AVX-512F has)
    const __m512i sign = _mm512_and_si512(_mm512_castps_si512(z), _mm512_set1_epi32(INT32_MIN));
    const __m512 erf = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(erf_abs), sign));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), v), _mm512_add_ps(_mm512_set1_ps(1.0f), erf));
}
#endif

// fn(0 .. tasks-1), on up to `threads` threads of a pool of the module's own (the calling thread
// one of them); on the calling thread alone when threads or tasks are 1, or when another call holds
// the pool. Tasks are taken in turn by whichever thread is free: a task's result must not depend on
// the thread that runs it.
inline void run_tasks(int64_t tasks, int threads, const std::function<void(int64_t)>& fn) {
    static std::mutex mu;
    static std::unique_ptr<ThreadPool> pool;
    static long pool_pid = -1;
    std::unique_lock<std::mutex> lock(mu, std::defer_lock);
    if (threads <= 1 || tasks <= 1 || !lock.try_lock()) {
        for (int64_t i = 0; i < tasks; ++i) fn(i);
        return;
    }
    const long pid = static_cast<long>(getpid());
    if (pool && pool_pid != pid) (void)pool.release();   // a forked child: the parent's workers are gone
    if (!pool || pool->size() != threads) {
        pool.reset(new ThreadPool(threads));
        pool_pid = pid;
    }
    pool->run(static_cast<size_t>(tasks), [&](size_t i) { fn(static_cast<int64_t>(i)); });
}

}  // namespace fastbert
