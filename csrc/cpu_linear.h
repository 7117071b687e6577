// fastbert's fp32 GEMM for a few dozen rows (py_linear.cpp) for other C++ callers (py_layers.cpp).
#pragma once
#include <cstdint>

namespace fastbert {

enum class Epilogue { kNone, kGelu, kResidual };

// out (m, n) = x (m, k) W^T + bias (null: none), then the epilogue (kResidual: + residual (m, n)),
// with W packed by linear_f32_pack ((ceil(n / 32), k, 32), 64-byte aligned), the panels split over
// up to `threads` threads. All arrays contiguous. Call it without the GIL, on an AVX-512 CPU only.
void linear_rows(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias,
                 Epilogue epilogue, const float* residual, float* out, int threads);

// linear_rows' columns of panels [p0, p1) only (32 columns each, ceil(n / 32) in all), on the calling
// thread: a caller that splits the panels itself. A panel's outputs do not depend on the split.
void linear_panels(const float* x, int64_t m, int64_t k, const float* packed, int64_t n, const float* bias,
                   Epilogue epilogue, const float* residual, float* out, int64_t p0, int64_t p1);

}  // namespace fastbert
