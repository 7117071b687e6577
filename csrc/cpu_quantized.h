// The int8 linear's C++ parts (py_quantized_linear.cpp) for other C++ callers (py_layers.cpp): the
// per-row passes and the few-row int8 GEMM. Call them without the GIL, on the CPUs their checks name.
#pragma once
#include <cstdint>

namespace fastbert {

// AVX-512 VNNI (vpdpbusd): the few-row int8 GEMM runs only there.
bool int8_gemm_available();

// Bytes of one packed 32-column panel of a weight with k inputs (k a multiple of 4): k / 4 groups of
// 32 columns x 4 inputs, then the panel's 32 correction terms (int32).
int64_t int8_panel_bytes(int64_t k);

// What the GEMM does with a finished row of sums: keep the exact int32 sums, or rescale them to the
// layer's float32 output as int8_rescale_rows does (the same instructions, so the same bits), with the
// erf GELU after it or not.
enum class Int8Store { kSums, kRescale, kRescaleGelu };

// The per-row and per-column numbers of the rescale (x ~= mid_r + scale_r * q; y = scale_r * float(sum)
// * w_scale_c + (mid_r * wsum_c + bias_c)); scale and mid from the GEMM's first row on.
struct Int8Rescale {
    const float *scale, *mid, *wsum, *bias, *w_scale;
};

// u = q + 128 (q xor 0x80) for count codes: the GEMM's unsigned form of the activation codes.
void int8_to_unsigned(const int8_t* q, uint8_t* u, int64_t count);

// out (m, n) = the sums of q (m, k) int8 (given as u = q + 128, int8_to_unsigned) times the packed
// weight's columns, panels [p0, p1) only, on the calling thread, stored as `store` says (int32 for kSums, else float32; out may be any m x n
// buffer of 4-byte values, and holds partial sums between k slices). A row's sums are exact: they do
// not depend on the other rows, on m, or on the split.
void int8_gemm_panels(const uint8_t* u, int64_t m, int64_t k, const int8_t* packed, int64_t n, Int8Store store,
                      const Int8Rescale& rescale, void* out, int64_t p0, int64_t p1);

// int8_quantize_rows' AVX-512 rows (x (rows, k) -> q, scale, mid per row), on the calling thread.
void int8_quantize_rows_avx512(const float* x, int8_t* q, float* scale, float* mid, int64_t rows, int64_t k);

// int8_rescale_add_norm's AVX-512 rows: y = LayerNorm(rescale(sums) + res) (gamma, beta, eps), rows of n;
// `rescale`'s scale and mid start at the first of these rows.
void int8_rescale_add_norm_avx512(const int32_t* sums, const Int8Rescale& rescale, float* y, const float* res,
                                  const float* gamma, const float* beta, float eps, int64_t rows, int64_t n);

}  // namespace fastbert
