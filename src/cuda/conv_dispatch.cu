// The CUDA backend's convolution entry points: the dtype switch into the typed launchers of
// conv_forward.cu and conv_weight_gradient.cu, the checks of the sizes against the CUDA grid limits, the
// tile switch (SPARSEGRID_CONV_TILES) and the row order of a map. Whether a map gets a row order, and
// whether an execution scatters, is the front end's choice (src/api/convolution.cpp).
#include "backend/backend.h"
#include "core/env.h"
#include "core/errors.h"
#include "cuda/conv_tiles.cuh"
#include "cuda/cuda_common.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cstdint>

namespace sparsegrid::detail::cuda {

bool wide_register_tiles() {
    static const bool wide = env_string("SPARSEGRID_CONV_TILES") != "4x4";
    return wide;
}

namespace {

/// The limits of the kernels' grids and index arithmetic (the messages name no operation: the dispatch
/// prefixes the user's).
void check_sizes(int64_t rows, int32_t volume, int64_t x_channels, int64_t y_channels) {
    if (rows > int64_t{INT32_MAX} * 64)
        throw_error(rows, " rows exceed the CUDA grid limit of ", int64_t{INT32_MAX} * 64);
    if (x_channels > INT32_MAX / 2 || y_channels > 65535LL * 16)
        throw_error("channel counts (", x_channels, ", ", y_channels, ") exceed the CUDA limits (", INT32_MAX / 2, ", ",
                    65535LL * 16, ")");
    if (volume > 65535) throw_error("kernel volume ", volume, " exceeds the CUDA limit of 65535 taps");
}

/// keys[r] = the set of taps at which row r has an edge (bit t for tap t); index[r] = r.
template <typename Key>
__global__ void row_mask_kernel(const int32_t* __restrict__ map, int64_t rows, int32_t volume, Key* __restrict__ keys,
                                int32_t* __restrict__ index) {
    SG_GRID_STRIDE_LOOP(r, rows) {
        Key mask = 0;
        for (int32_t t = 0; t < volume; ++t)
            if (map[r * volume + t] >= 0) mask |= Key{1} << t;
        keys[r] = mask;
        index[r] = static_cast<int32_t>(r);
    }
}

template <typename Key>
Buffer<int32_t> row_order_typed(const int32_t* map, int64_t rows, int32_t volume, const Context& ctx) {
    const cudaStream_t stream = stream_of(ctx);
    Buffer<Key> keys = Buffer<Key>::allocate(rows, ctx), sorted_keys = Buffer<Key>::allocate(rows, ctx);
    Buffer<int32_t> index = Buffer<int32_t>::allocate(rows, ctx), order = Buffer<int32_t>::allocate(rows, ctx);
    row_mask_kernel<Key><<<blocks_for(rows), kThreads, 0, stream>>>(map, rows, volume, keys.data(), index.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    const int n = static_cast<int>(rows);
    cub_call(ctx, [&](void* temp, size_t& bytes) {
        return cub::DeviceRadixSort::SortPairs(temp, bytes, keys.data(), sorted_keys.data(), index.data(), order.data(),
                                               n, 0, volume, stream);
    });
    return order;
}

/// A tile of 32 rows x every tap through shared memory: read row-major (consecutive threads, consecutive
/// entries), written tap-major (32 consecutive rows of one tap per warp). The tile's row pitch is odd
/// (volume | 1), so the column reads of the second loop fall on distinct banks.
constexpr int kTapMajorRows = 32;

__global__ void tap_major_kernel(const int32_t* __restrict__ map, int64_t rows, int32_t volume,
                                 int32_t* __restrict__ out) {
    extern __shared__ int32_t tile[];  // [kTapMajorRows][volume | 1]
    const int32_t pitch = volume | 1;
    const int64_t r0 = int64_t{blockIdx.x} * kTapMajorRows;
    const int32_t tile_rows = static_cast<int32_t>(rows - r0 < kTapMajorRows ? rows - r0 : kTapMajorRows);
    const int32_t entries = tile_rows * volume;
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < entries; i += static_cast<int32_t>(blockDim.x))
        tile[(i / volume) * pitch + i % volume] = map[r0 * volume + i];
    __syncthreads();
    for (int32_t i = static_cast<int32_t>(threadIdx.x); i < kTapMajorRows * volume;
         i += static_cast<int32_t>(blockDim.x)) {
        const int32_t t = i / kTapMajorRows, r = i % kTapMajorRows;
        if (r < tile_rows) out[int64_t{t} * rows + r0 + r] = tile[r * pitch + t];
    }
}

}  // namespace

}  // namespace sparsegrid::detail::cuda

// ---- backend entry points -------------------------------------------------------------------------

namespace sparsegrid::detail {

using namespace cuda;

// Built whenever the front end asks (it decides which maps are worth ordering): 1 < volume <= 64 and
// rows < 2^31. Two launches (the tap sets, a stable radix sort over `volume` bits), five allocations, no
// sync.
Buffer<int32_t> CudaBackend::row_order(const int32_t* map, int64_t rows, int32_t volume, const Context& ctx) {
    DeviceGuard guard(ctx);
    return volume <= 32 ? row_order_typed<uint32_t>(map, rows, volume, ctx)
                        : row_order_typed<uint64_t>(map, rows, volume, ctx);
}

// One launch, no sync. The tile takes (volume | 1) x 32 x 4 bytes of shared memory, within the default
// 48 KB for volume <= 374 (the front end asks for no larger kernels).
Buffer<int32_t> CudaBackend::tap_major_map(const int32_t* map, int64_t rows, int32_t volume, const Context& ctx) {
    DeviceGuard guard(ctx);
    if (volume > 374) throw_error("tap_major_map: at most 374 taps, got ", volume);
    Buffer<int32_t> out = Buffer<int32_t>::allocate(rows * volume, ctx);
    if (rows == 0) return out;
    const cudaStream_t stream = stream_of(ctx);
    const int64_t blocks = (rows + kTapMajorRows - 1) / kTapMajorRows;
    const size_t shared = static_cast<size_t>(kTapMajorRows) * static_cast<size_t>(volume | 1) * sizeof(int32_t);
    tap_major_kernel<<<static_cast<unsigned>(blocks), 256, shared, stream>>>(map, rows, volume, out.data());
    SPARSEGRID_CUDA_CHECK_LAUNCH(stream);
    return out;
}

void CudaBackend::map_convolution(const MapConvolution& args, const Context& ctx) {
    DeviceGuard guard(ctx);
    // An empty map has no storage: a scatter over no rows only zeroes the output.
    if (args.scatter && args.map == nullptr && args.rows > 0) throw_error("scatter needs a map");
    check_sizes(args.rows, args.volume, args.x_channels, args.out_channels);
    switch (args.dtype) {
    case DType::Float32:
        return map_convolution_typed<float>(args, ctx);
    case DType::Float64:
        return map_convolution_typed<double>(args, ctx);
    case DType::Float16:
        return map_convolution_typed<__half>(args, ctx);
    case DType::BFloat16:
        return map_convolution_typed<__nv_bfloat16>(args, ctx);
    }
}

void CudaBackend::map_weight_gradient(const MapWeightGradient& args, const Context& ctx) {
    DeviceGuard guard(ctx);
    check_sizes(args.rows, args.volume, args.in_channels, args.out_channels);
    switch (args.dtype) {
    case DType::Float32:
        return map_weight_gradient_typed<float>(args, ctx);
    case DType::Float64:
        return map_weight_gradient_typed<double>(args, ctx);
    case DType::Float16:
        return map_weight_gradient_typed<__half>(args, ctx);
    case DType::BFloat16:
        return map_weight_gradient_typed<__nv_bfloat16>(args, ctx);
    }
}

std::vector<std::string> CudaBackend::engine_configurations() { return cuda::engine_configurations(); }

void CudaBackend::force_engine_configuration(const std::string& name) { cuda::force_engine_configuration(name); }

void CudaBackend::set_engine_tuning(bool enabled, const std::string& file) { cuda::set_engine_tuning(enabled, file); }

}  // namespace sparsegrid::detail
