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
