// The packed CPU attention of py_attention.cpp for other C++ callers (py_layers.cpp).
#pragma once
#include <cstdint>

namespace fastbert {

// out (tokens, heads, dim) contiguous = softmax(scale q k^T) v per (sequence, head), the sequences given
// by bounds[0 .. batch] (0, ..., tokens); q, k, v: each token's heads and dim contiguous, rows qs, ks, vs
// floats apart; dim a multiple of 16 up to 128. Call it without the GIL. False (nothing written) where
// this CPU or build has no AVX-512.
bool attention_rows(const float* q, const float* k, const float* v, int64_t qs, int64_t ks, int64_t vs,
                    const int64_t* bounds, int64_t batch, int64_t heads, int64_t dim, float* out, float scale,
                    int threads);

// attention_rows' task t: (sequence t / heads, head t % heads), on the calling thread; AVX-512 CPUs only.
void attention_task(const float* q, const float* k, const float* v, int64_t qs, int64_t ks, int64_t vs,
                    const int64_t* bounds, int64_t heads, int64_t dim, float* out, float scale, int64_t t);

}  // namespace fastbert
