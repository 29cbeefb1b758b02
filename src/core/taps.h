// Tap and stride arithmetic of the edge relation fine = S*coarse + tap - pb, shared by every backend.
// All arithmetic is in int64 so that int32 coordinates at the ends of their range cannot wrap.
#pragma once

#include "core/keys.h"

#include <cstdint>

namespace sparsegrid::detail {

SG_HD int64_t floor_div(int64_t a, int64_t b) {
#ifdef __CUDA_ARCH__
    // A GPU divides 64-bit integers in a long instruction sequence, 32-bit ones in a short one: the
    // same quotient where both operands fit (b > 0 also rules out INT32_MIN / -1).
    if (b > 0 && b <= INT32_MAX && a >= INT32_MIN && a <= INT32_MAX) {
        const auto a32 = static_cast<int32_t>(a), b32 = static_cast<int32_t>(b);
        const int32_t q32 = a32 / b32;
        return q32 * b32 != a32 && a32 < 0 ? q32 - 1 : q32;
    }
#endif
    const int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}
SG_HD int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

/// Kernel geometry of one convolution, per axis: size K, stride S, low padding pb = (K - 1) / 2.
struct ConvGeometry {
    int32_t kernel[3];
    int32_t stride[3];
    int32_t pad[3];

    SG_HD int32_t kernel_volume() const { return kernel[0] * kernel[1] * kernel[2]; }
    /// Kernel size K and stride S on every axis.
    SG_HD bool is_uniform(int32_t k, int32_t s) const {
        return kernel[0] == k && kernel[1] == k && kernel[2] == k && stride[0] == s && stride[1] == s && stride[2] == s;
    }
    /// Per-axis taps of linear tap index t = t0*K1*K2 + t1*K2 + t2.
    SG_HD void tap_of(int32_t t, int32_t tap[3]) const {
        tap[2] = t % kernel[2];
        tap[1] = (t / kernel[2]) % kernel[1];
        tap[0] = t / (kernel[1] * kernel[2]);
    }
    /// The fine coordinate that coarse `c` reaches through `tap` on axis a.
    SG_HD int64_t fine_of(int a, int64_t c, int32_t tap) const { return int64_t{stride[a]} * c + tap - pad[a]; }
    /// The coarse coordinate from which fine `f` is reached through `tap` on axis a, if any.
    SG_HD bool coarse_of(int a, int64_t f, int32_t tap, int64_t* c) const {
        const int64_t num = f - tap + pad[a];
        const int64_t q = floor_div(num, stride[a]);
        *c = q;
        return q * stride[a] == num;
    }
    /// Inclusive range of coarse coordinates that reach fine `f` on axis a through some tap.
    SG_HD void coarse_range(int a, int64_t f, int64_t* lo, int64_t* hi) const {
        *lo = ceil_div(f + pad[a] - (kernel[a] - 1), stride[a]);
        *hi = floor_div(f + pad[a], stride[a]);
    }
};

}  // namespace sparsegrid::detail
