// OpenMP building blocks of the CPU backend: contiguous static chunks (so per-thread results
// concatenate in input order), member-aware iteration, scans and the key sort.
#pragma once

#include "core/keys.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace sparsegrid::detail::cpu {

/// Below this many items a loop runs on one thread: thread start-up costs more than it saves.
constexpr int64_t kSerialThreshold = 1 << 14;

inline int threads_for(int64_t n) { return n < kSerialThreshold ? 1 : omp_get_max_threads(); }

/// Calls fn(begin, end, chunk, num_chunks) for contiguous chunks covering [0, n), chunk c before c + 1.
template <typename Fn>
void parallel_chunks(int64_t n, Fn&& fn) {
    const int requested = threads_for(n);
    if (requested <= 1) {
        fn(int64_t{0}, n, 0, 1);
        return;
    }
#pragma omp parallel num_threads(requested)
    {
        const int chunks = omp_get_num_threads();
        const int chunk = omp_get_thread_num();
        const int64_t begin = n * chunk / chunks;
        const int64_t end = n * (chunk + 1) / chunks;
        fn(begin, end, chunk, chunks);
    }
}

/// Like parallel_chunks, but fn(member, voxel) is called for every voxel of [begin, end) with its member.
template <typename Fn>
void for_each_voxel(const std::vector<int64_t>& offsets, int64_t begin, int64_t end, Fn&& fn) {
    if (begin >= end) return;
    int64_t member = std::upper_bound(offsets.begin(), offsets.end(), begin) - offsets.begin() - 1;
    for (int64_t n = begin; n < end; ++n) {
        while (n >= offsets[member + 1]) ++member;
        fn(member, n);
    }
}

/// Exclusive prefix sum of nonzero flags: result[n] = number of nonzero flags[0..n), n = 0..count.
std::vector<int64_t> exclusive_scan_flags(const uint8_t* flags, int64_t count);

/// Sorts keys ascending. uint64_t keys use a parallel LSD radix sort over their low `bits` bits.
void sort_keys(std::vector<uint64_t>& keys, int32_t bits);
void sort_keys(std::vector<Key128>& keys, int32_t bits);

}  // namespace sparsegrid::detail::cpu
