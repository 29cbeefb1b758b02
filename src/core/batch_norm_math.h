// The arithmetic of batch normalization with a fused activation, shared by the CPU and CUDA backends: the
// rows are cut into chunks whose size depends on the row count alone, each chunk is reduced on its own,
// and the chunks' results are combined (Chan's pairwise update for the mean and the sum of squared
// deviations) in an order fixed by their count: chunk order on the CPU, a fixed tree on CUDA. So neither
// backend's sums depend on threads or blocks; the two agree within rounding. The activations and their
// derivatives are those of torch.nn (ReLU, LeakyReLU, ELU, SiLU), taken at the pre-activation z.
#pragma once

#include "core/keys.h"

#include <sparsegrid/batch_norm.h>

#include <cmath>
#include <cstdint>

namespace sparsegrid::detail {

/// At most this many chunks per channel: the combining pass reads chunks x channels partial results.
constexpr int64_t kNormMaxChunks = 1024;
/// Chunks hold at least this many rows (a small input is one chunk per 64 rows).
constexpr int64_t kNormMinChunkRows = 64;

/// Rows per chunk for `rows` rows (> 0): a function of the row count alone, so that the sums are the
/// same on every device and thread count.
SG_HD int64_t norm_chunk_rows(int64_t rows) {
    const int64_t even = (rows + kNormMaxChunks - 1) / kNormMaxChunks;
    return even > kNormMinChunkRows ? even : kNormMinChunkRows;
}

SG_HD int64_t norm_chunks(int64_t rows) {
    const int64_t chunk = norm_chunk_rows(rows);
    return (rows + chunk - 1) / chunk;
}

/// Running mean and sum of squared deviations of `count` values (Welford). An aggregate without member
/// initializers, so that CUDA shared memory can hold it: start from Moments<Acc>{} (all zero).
template <typename Acc>
struct Moments {
    Acc count;
    Acc mean;
    Acc m2;

    SG_HD void add(Acc value) {
        count += Acc(1);
        const Acc delta = value - mean;
        mean += delta / count;
        m2 += delta * (value - mean);
    }

    /// Appends the values of `other` (Chan et al.): this one's values come first.
    SG_HD void combine(const Moments& other) {
        if (other.count == Acc(0)) return;
        if (count == Acc(0)) {
            *this = other;
            return;
        }
        const Acc total = count + other.count;
        const Acc delta = other.mean - mean;
        const Acc share = other.count / total;
        mean += delta * share;
        m2 += other.m2 + delta * delta * count * share;
        count = total;
    }
};

SG_HD float norm_exp(float value) { return expf(value); }
SG_HD double norm_exp(double value) { return exp(value); }

/// The exponential the activations use by default (the CPU backend passes a vectorizable one).
struct NormExp {
    template <typename Acc>
    SG_HD Acc operator()(Acc value) const {
        return norm_exp(value);
    }
};

template <typename Acc, typename Exp = NormExp>
SG_HD Acc activation_value(Activation activation, Acc z, Acc parameter, Exp exp_of = {}) {
    switch (activation) {
    case Activation::ReLU:
        return z > Acc(0) ? z : Acc(0);
    case Activation::LeakyReLU:
        return z > Acc(0) ? z : z * parameter;
    case Activation::ELU: {
        // exp(min(z, 0)) for every z, then a select: no branch, so the CPU's loops vectorize.
        const Acc e = exp_of(z < Acc(0) ? z : Acc(0));
        return z > Acc(0) ? z : parameter * (e - Acc(1));
    }
    case Activation::SiLU:
        return z / (Acc(1) + exp_of(-z));
    case Activation::Identity:
        break;
    }
    return z;
}

/// d activation / dz at z (ReLU's and LeakyReLU's derivative at 0 as torch takes it: that of z < 0).
template <typename Acc, typename Exp = NormExp>
SG_HD Acc activation_derivative(Activation activation, Acc z, Acc parameter, Exp exp_of = {}) {
    switch (activation) {
    case Activation::ReLU:
        return z > Acc(0) ? Acc(1) : Acc(0);
    case Activation::LeakyReLU:
        return z > Acc(0) ? Acc(1) : parameter;
    case Activation::ELU: {
        const Acc e = exp_of(z < Acc(0) ? z : Acc(0));
        return z > Acc(0) ? Acc(1) : parameter * e;
    }
    case Activation::SiLU: {
        const Acc s = Acc(1) / (Acc(1) + exp_of(-z));
        return s * (Acc(1) + z * (Acc(1) - s));
    }
    case Activation::Identity:
        break;
    }
    return Acc(1);
}

}  // namespace sparsegrid::detail
