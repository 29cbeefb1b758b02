// CUDA weight gradient of a convolution over a neighbour map: per tap, a GEMM over the rows that have an
// edge at that tap, over whichever map the front end chose (rows = target or source voxels). Rows are
// split into a shape-determined number of chunks; each block compacts its chunk's edges (block scan,
// order kept) and accumulates a 32 x 32 or 64 x 64 tile of [in_channels, out_channels] into its own
// slot; a second kernel adds the slots in chunk order. No atomics, so every result is bitwise
// reproducible.
#include "backend/backend.h"
#include "core/env.h"
#include "core/errors.h"
#include "cuda/conv_tiles.cuh"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>

namespace sparsegrid::detail::cuda {

namespace {

constexpr int kGradScan = 256;

/// partial[chunk][t][ci][co] = sum over the chunk's rows r with an edge at t of x[s, ci] * grad[r, co].
template <typename T, typename A, int Tile, int BK>
__global__ __launch_bounds__(kConvThreads) void weight_grad_kernel(const int32_t* __restrict__ map, int64_t rows,
                                                                   int32_t volume, const T* __restrict__ x,
                                                                   const T* __restrict__ grad, A* __restrict__ partial,
                                                                   int32_t in_channels, int32_t out_channels,
                                                                   int64_t rows_per_chunk, int32_t tiles_n) {
    constexpr int TM = Tile / 16;  // a 16 x 16 thread grid, TM x TN outputs each
    constexpr int TN = Tile / 16;
    constexpr int kColumns = Tile / TN;
    using BlockScan = cub::BlockScan<int, kConvThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ int32_t edge_source[kGradScan];
    __shared__ int64_t edge_row[kGradScan];
    __shared__ __align__(16) A a_tile[BK][Tile + 4];
    __shared__ __align__(16) A b_tile[BK][Tile + 4];

    const int tid = static_cast<int>(threadIdx.x);
    const int ty = tid / kColumns;
    const int tx = tid % kColumns;
    const int m0 = static_cast<int>(blockIdx.x / tiles_n) * Tile;
    const int n0 = static_cast<int>(blockIdx.x % tiles_n) * Tile;
    const int64_t chunk = blockIdx.y;
    const int32_t t = static_cast<int32_t>(blockIdx.z);
    const int64_t begin = chunk * rows_per_chunk;
    const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;

    A acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = A(0);

    for (int64_t base = begin; base < end; base += kGradScan) {
        const int64_t r = base + tid;
        int32_t s = -1;
        if (r < end) s = map ? map[r * volume + t] : static_cast<int32_t>(r);
        const int has_edge = s >= 0 ? 1 : 0;
        int position = 0;
        int edges = 0;
        BlockScan(scan_storage).ExclusiveSum(has_edge, position, edges);
        if (has_edge) {
            edge_source[position] = s;
            edge_row[position] = r;
        }
        __syncthreads();
        for (int k0 = 0; k0 < edges; k0 += BK) {
            for (int idx = tid; idx < BK * Tile; idx += kConvThreads) {
                const int kk = idx / Tile;
                const int c = idx % Tile;
                const bool valid = k0 + kk < edges;
                const int ci = m0 + c;
                const int co = n0 + c;
                a_tile[kk][c] = (valid && ci < in_channels)
                    ? to_acc<A>(x[int64_t{edge_source[k0 + kk]} * in_channels + ci])
                    : A(0);
                b_tile[kk][c] = (valid && co < out_channels) ? to_acc<A>(grad[edge_row[k0 + kk] * out_channels + co])
                                                             : A(0);
            }
            __syncthreads();
            multiply_tiles(a_tile, b_tile, ty * TM, tx * TN, acc);
            __syncthreads();
        }
        __syncthreads();  // edge lists and scan storage are reused by the next batch of rows
    }

    A* slot = partial + (chunk * volume + t) * int64_t{in_channels} * out_channels;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int ci = m0 + ty * TM + i;
        if (ci >= in_channels) continue;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int co = n0 + tx * TN + j;
            if (co < out_channels) slot[int64_t{ci} * out_channels + co] = acc[i][j];
        }
    }
}

/// Whether weight_grad_narrow_kernel takes a problem: both channel counts at most 32, and at most 256
/// products (one per thread). Off with SPARSEGRID_WEIGHT_NARROW=0 (for measurements; same results up to
/// the order of the sums).
bool narrow_weight_gradient(int64_t gathered_channels, int64_t row_channels) {
    static const bool enabled = env_switch("SPARSEGRID_WEIGHT_NARROW", true);
    return enabled && gathered_channels <= 32 && row_channels <= 32 && gathered_channels * row_channels <= 256;
}

/// weight_grad_kernel for narrow channel counts (narrow_weight_gradient), where a 32 x 32 tile would leave
/// most of its products zero: the 256 threads form G = 256 / (ca x cb) groups of one thread per product
/// (a, b); each chunk's edges are compacted as there and staged kEdges at a time (the rows of x and of
/// grad of all of them in flight at once), group g summing the staged edges g, g + G, ... in order; at
/// the end the G sums of a product are added in group order. The order depends only on the shape.
template <typename T, typename A>
__global__ __launch_bounds__(kConvThreads,
                             4) void weight_grad_narrow_kernel(const int32_t* __restrict__ map, int64_t rows,
                                                               int32_t volume, const T* __restrict__ x,
                                                               const T* __restrict__ grad, A* __restrict__ partial,
                                                               int32_t ca, int32_t cb, int64_t rows_per_chunk) {
    constexpr int kEdges = sizeof(A) == 8 ? 64 : 128;  // staged edges: at most kEdges x 40 values
    using BlockScan = cub::BlockScan<int, kConvThreads>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ int32_t edge_source[kGradScan];
    __shared__ int64_t edge_row[kGradScan];
    __shared__ A staged[kEdges * 40];  // ca + cb <= 40 when both are <= 32 with ca x cb <= 256
    __shared__ A sums[kConvThreads];

    const int tid = static_cast<int>(threadIdx.x);
    const int products = ca * cb;
    const int groups = kConvThreads / products;
    const int group = tid / products;
    const int a = (tid % products) / cb;
    const int b = tid % cb;
    A* x_rows = staged;                // [kEdges][ca]
    A* g_rows = staged + kEdges * ca;  // [kEdges][cb]
    const int64_t chunk = blockIdx.y;
    const int32_t t = static_cast<int32_t>(blockIdx.z);
    const int64_t begin = chunk * rows_per_chunk;
    const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;

    A acc = A(0);
    for (int64_t base = begin; base < end; base += kGradScan) {
        const int64_t r = base + tid;
        int32_t s = -1;
        if (r < end) s = map ? map[r * volume + t] : static_cast<int32_t>(r);
        const int has_edge = s >= 0 ? 1 : 0;
        int position = 0;
        int edges = 0;
        BlockScan(scan_storage).ExclusiveSum(has_edge, position, edges);
        if (has_edge) {
            edge_source[position] = s;
            edge_row[position] = r;
        }
        __syncthreads();
        for (int e0 = 0; e0 < edges; e0 += kEdges) {
            const int count = edges - e0 < kEdges ? edges - e0 : kEdges;
            for (int idx = tid; idx < count * ca; idx += kConvThreads)
                x_rows[idx] = to_acc<A>(x[int64_t{edge_source[e0 + idx / ca]} * ca + idx % ca]);
            for (int idx = tid; idx < count * cb; idx += kConvThreads)
                g_rows[idx] = to_acc<A>(grad[edge_row[e0 + idx / cb] * cb + idx % cb]);
            __syncthreads();
            if (group < groups)
                for (int e = group; e < count; e += groups) acc += x_rows[e * ca + a] * g_rows[e * cb + b];
            __syncthreads();
        }
        __syncthreads();  // edge lists and scan storage are reused by the next batch of rows
    }
    sums[tid] = acc;
    __syncthreads();
    if (tid < products) {
        A total = sums[tid];
        for (int g = 1; g < groups; ++g) total += sums[g * products + tid];
        partial[(chunk * volume + t) * int64_t{products} + tid] = total;
    }
}

/// Tensor-core variant of weight_grad_kernel for float16 / bfloat16 and TF32: 4 warps, a 64 x 64 tile of
/// [in_channels, out_channels], float32 accumulators; edges compacted and consumed in the same order.
template <typename T>
__global__ __launch_bounds__(128) void weight_grad_tensor_kernel(const int32_t* __restrict__ map, int64_t rows,
                                                                 int32_t volume, const T* __restrict__ x,
                                                                 const T* __restrict__ grad,
                                                                 float* __restrict__ partial, int32_t in_channels,
                                                                 int32_t out_channels, int64_t rows_per_chunk,
                                                                 int32_t tiles_n, bool vector_x, bool vector_g) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // never launched there: tensor_cores_available() is false below compute capability 8.0
#else
    using namespace nvcuda;
    constexpr int kTile = 64, BK = 32, kScan = 128;
    constexpr int kVector = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte load
    constexpr int kLd = kTile + 8, kLdc = kTile + 4;
    using BlockScan = cub::BlockScan<int, 128>;
    __shared__ typename BlockScan::TempStorage scan_storage;
    __shared__ int32_t edge_source[kScan];
    __shared__ int64_t edge_row[kScan];
    __shared__ __align__(32) T a_tile[BK * kLd];  // [k][ci]: the A operand (ci x k) in column-major order
    __shared__ __align__(32) T b_tile[BK * kLd];  // [k][co]
    __shared__ __align__(32) float c_tile[kTile * kLdc];

    const int tid = static_cast<int>(threadIdx.x);
    const int warp = tid / 32;
    const int warp_m = (warp / 2) * 32;
    const int warp_n = (warp % 2) * 32;
    const int m0 = static_cast<int>(blockIdx.x / tiles_n) * kTile;
    const int n0 = static_cast<int>(blockIdx.x % tiles_n) * kTile;
    const int64_t chunk = blockIdx.y;
    const int32_t t = static_cast<int32_t>(blockIdx.z);
    const int64_t begin = chunk * rows_per_chunk;
    const int64_t end = begin + rows_per_chunk < rows ? begin + rows_per_chunk : rows;
    const T zero = from_acc<T>(0.0f);

    WarpAccumulator<T> acc[2][2];
    warp_fill<T>(acc);

    for (int64_t base = begin; base < end; base += kScan) {
        const int64_t r = base + tid;
        int32_t s = -1;
        if (r < end) s = map ? map[r * volume + t] : static_cast<int32_t>(r);
        const int has_edge = s >= 0 ? 1 : 0;
        int position = 0;
        int edges = 0;
        BlockScan(scan_storage).ExclusiveSum(has_edge, position, edges);
        if (has_edge) {
            edge_source[position] = s;
            edge_row[position] = r;
        }
        __syncthreads();
        for (int k0 = 0; k0 < edges; k0 += BK) {
            // Rows k of both tiles: channels [m0, m0 + 64) of x at the edge's source, [n0, n0 + 64) of grad
            // at its target; zeros past the edges and the channel counts.
            for (int idx = tid; idx < BK * (kTile / kVector); idx += 128) {
                const int kk = idx / (kTile / kVector);
                const int c = (idx % (kTile / kVector)) * kVector;
                const bool valid = k0 + kk < edges;
                const T* x_row = valid ? x + int64_t{edge_source[k0 + kk]} * in_channels : nullptr;
                const T* g_row = valid ? grad + edge_row[k0 + kk] * out_channels : nullptr;
                if (vector_x) {
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (valid && m0 + c < in_channels) v = *reinterpret_cast<const uint4*>(x_row + m0 + c);
                    *reinterpret_cast<uint4*>(a_tile + kk * kLd + c) = v;
                } else {
                    for (int e = 0; e < kVector; ++e)
                        a_tile[kk * kLd + c + e] = valid && m0 + c + e < in_channels ? x_row[m0 + c + e] : zero;
                }
                if (vector_g) {
                    uint4 v = make_uint4(0, 0, 0, 0);
                    if (valid && n0 + c < out_channels) v = *reinterpret_cast<const uint4*>(g_row + n0 + c);
                    *reinterpret_cast<uint4*>(b_tile + kk * kLd + c) = v;
                } else {
                    for (int e = 0; e < kVector; ++e)
                        b_tile[kk * kLd + c + e] = valid && n0 + c + e < out_channels ? g_row[n0 + c + e] : zero;
                }
            }
            __syncthreads();
#pragma unroll
            for (int kk = 0; kk < BK; kk += WarpShape<T>::K)
                warp_multiply<T, wmma::col_major>(acc, a_tile + kk * kLd + warp_m, 16, kLd, b_tile + kk * kLd + warp_n,
                                                  kLd);
            __syncthreads();
        }
        __syncthreads();  // edge lists and scan storage are reused by the next batch of rows
    }
    warp_store<T>(acc, c_tile + warp_m * kLdc + warp_n, kLdc);
    __syncthreads();
    float* slot = partial + (chunk * volume + t) * int64_t{in_channels} * out_channels;
    for (int idx = tid; idx < kTile * kTile; idx += 128) {
        const int m = idx / kTile;
        const int n = idx % kTile;
        if (m0 + m < in_channels && n0 + n < out_channels)
            slot[int64_t{m0 + m} * out_channels + n0 + n] = c_tile[m * kLdc + n];
    }
#endif
}

/// Chunks of rows for the weight gradient: enough blocks to fill a large GPU, at least 1024 rows per
/// chunk, and at most 256 MiB of partial sums. Depends only on the problem's shape.
int64_t weight_grad_chunks(int64_t rows, int32_t volume, int64_t tiles, int64_t slot_bytes) {
    constexpr int64_t kTargetBlocks = 2048;
    constexpr int64_t kMinRows = 1024;
    constexpr int64_t kMaxBytes = int64_t{256} << 20;
    int64_t chunks = (kTargetBlocks + volume * tiles - 1) / (volume * tiles);
    chunks = std::min(chunks, (rows + kMinRows - 1) / kMinRows);
    chunks = std::min(chunks, kMaxBytes / std::max<int64_t>(1, slot_bytes));
    chunks = std::min<int64_t>(chunks, 65535);
    return std::max<int64_t>(chunks, 1);
}

}  // namespace

template <typename T>
void map_weight_gradient_typed(const MapWeightGradient& args, const Context& ctx) {
    using A = typename AccumulatorOf<T>::type;
    const int32_t* map = args.map;
    const int64_t rows = args.rows;
    const int32_t volume = args.volume;
    const bool rows_are_source = args.rows_are_source;
    const T* x = static_cast<const T*>(args.x);
    const T* grad = static_cast<const T*>(args.grad);
    const int64_t in_channels = args.in_channels;
    const int64_t out_channels = args.out_channels;
    const cudaStream_t stream = stream_of(ctx);
    const bool tensor_cores = use_tensor_cores<T>(ctx);
    if constexpr (kHasTensorKernel<T>) {
        if (tensor_cores && engine_weight_gradient<T>(args, ctx)) return;
    }
    // The kernels sum gathered[map[r][t], a] * row[r, b] into partial[chunk][t][a][b]: (a, b) = (ci, co)
    // over a map with rows = target voxels, (co, ci) over one with rows = source voxels.
    const T* gathered = rows_are_source ? grad : x;
    const T* per_row = rows_are_source ? x : grad;
    const int64_t gathered_channels = rows_are_source ? out_channels : in_channels;
    const int64_t row_channels = rows_are_source ? in_channels : out_channels;
    // 64 x 64 tiles on tensor cores, or (4 x 4 outputs per thread) once both channel counts exceed 32;
    // else 32 x 32.
    const int tile = tensor_cores || (in_channels > 32 && out_channels > 32) ? 64 : 32;
    const int64_t tiles_m = (gathered_channels + tile - 1) / tile;
    const int64_t tiles_n = (row_channels + tile - 1) / tile;
    if (tiles_m * tiles_n > INT32_MAX)
        throw_error(in_channels, " x ", out_channels, " channels exceed the CUDA grid limit");
    const int64_t slot_bytes = int64_t{volume} * in_channels * out_channels * static_cast<int64_t>(sizeof(A));
    int64_t chunks = 0;
    Buffer<A> partial;
    if (rows > 0) {
        chunks = weight_grad_chunks(rows, volume, tiles_m * tiles_n, slot_bytes);
        const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
        chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
        partial = Buffer<A>::allocate(chunks * volume * in_channels * out_channels, ctx);
        const dim3 grid(static_cast<unsigned>(tiles_m * tiles_n), static_cast<unsigned>(chunks),
                        static_cast<unsigned>(volume));
        const auto ca = static_cast<int32_t>(gathered_channels), cb = static_cast<int32_t>(row_channels);
        const auto columns = static_cast<int32_t>(tiles_n);
        bool launched = false;
        if constexpr (kHasTensorKernel<T>) {
            if (tensor_cores) {
                // 16-byte loads where rows of both operands start 16-byte aligned.
                constexpr int kVector = 16 / static_cast<int>(sizeof(T));
                const bool vector_a = ca % kVector == 0 && reinterpret_cast<uintptr_t>(gathered) % 16 == 0;
                const bool vector_b = cb % kVector == 0 && reinterpret_cast<uintptr_t>(per_row) % 16 == 0;
                weight_grad_tensor_kernel<T><<<grid, 128, 0, stream>>>(map, rows, volume, gathered, per_row,
                                                                       partial.data(), ca, cb, rows_per_chunk, columns,
                                                                       vector_a, vector_b);
                launched = true;
            }
        }
        constexpr int BK = sizeof(A) == 8 ? 8 : 16;
        // Float: edges in steps of 32 (wide tile shapes), else 16 (8 in double).
        constexpr int kDeep = std::is_same_v<T, float> ? 32 : BK;
        const bool deep = std::is_same_v<T, float> && wide_register_tiles();
        if (!launched && narrow_weight_gradient(gathered_channels, row_channels)) {
            const dim3 narrow_grid(1, static_cast<unsigned>(chunks), static_cast<unsigned>(volume));
            weight_grad_narrow_kernel<T, A><<<narrow_grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk);
            launched = true;
        }
        if (!launched && tile == 64 && deep)
            weight_grad_kernel<T, A, 64, kDeep><<<grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk, columns);
        else if (!launched && tile == 64)
            weight_grad_kernel<T, A, 64, BK><<<grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk, columns);
        else if (!launched && deep)
            weight_grad_kernel<T, A, 32, kDeep><<<grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk, columns);
        else if (!launched)
            weight_grad_kernel<T, A, 32, BK><<<grid, kConvThreads, 0, stream>>>(
                map, rows, volume, gathered, per_row, partial.data(), ca, cb, rows_per_chunk, columns);
        SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    }
    launch_reduce_weight_grad<T, A>(partial.data(), chunks, volume, in_channels, out_channels, rows_are_source,
                                    args.grad_weight, args.grad_weight_dtype == DType::Float32, stream);
}

template void map_weight_gradient_typed<float>(const MapWeightGradient&, const Context&);
template void map_weight_gradient_typed<double>(const MapWeightGradient&, const Context&);
template void map_weight_gradient_typed<__half>(const MapWeightGradient&, const Context&);
template void map_weight_gradient_typed<__nv_bfloat16>(const MapWeightGradient&, const Context&);

}  // namespace sparsegrid::detail::cuda
