// The backend seam (src/backend/backend.h): every backend of this build implements every entry point of
// the list. Taking each entry point's address makes a missing definition a link error of this test.
#include "backend/backend.h"
#include "test_util.h"

#include <gtest/gtest.h>

#include <random>
#include <tuple>
#include <type_traits>

namespace sparsegrid::detail {
namespace {

template <typename Backend>
auto entry_points() {
#define SPARSEGRID_ENTRY_POINT_ADDRESS(ReturnType, name, ...) &Backend::name,
    return std::make_tuple(SPARSEGRID_BACKEND_ENTRY_POINTS(SPARSEGRID_ENTRY_POINT_ADDRESS) nullptr);
#undef SPARSEGRID_ENTRY_POINT_ADDRESS
}

template <typename Tuple>
int count_defined(const Tuple& addresses) {
    return std::apply([](const auto&... address) { return ((address != nullptr ? 1 : 0) + ...); }, addresses);
}

TEST(BackendSeam, EveryBackendImplementsEveryEntryPoint) {
    const auto cpu = entry_points<CpuBackend>();
    constexpr int entries = static_cast<int>(std::tuple_size_v<decltype(cpu)>) - 1;  // the trailing nullptr
    EXPECT_GE(entries, 30);
    EXPECT_EQ(count_defined(cpu), entries);
#if defined(SPARSEGRID_WITH_CUDA)
    const auto cuda = entry_points<CudaBackend>();
    static_assert(std::is_same_v<decltype(cpu), decltype(cuda)>, "both backends have the same signatures");
    EXPECT_EQ(count_defined(cuda), entries);
#else
    GTEST_LOG_(INFO) << "this build has no CUDA backend; the CPU backend implements all " << entries << " entry points";
#endif
}

TEST(BackendSeam, TapMajorMapIsTheMapTapByTap) {
    // 1000 rows (not a multiple of the CUDA kernel's 32-row tiles), a third of the entries absent.
    std::mt19937 rng(2024);
    for (const int32_t volume : {8, 27, 125}) {
        SCOPED_TRACE("volume " + std::to_string(volume));
        const int64_t rows = 1000;
        std::vector<int32_t> map(static_cast<size_t>(rows * volume));
        for (int32_t& entry : map) entry = rng() % 3 == 0 ? -1 : static_cast<int32_t>(rng() % 5000);
        std::vector<int32_t> expected(map.size());
        for (int64_t r = 0; r < rows; ++r)
            for (int32_t t = 0; t < volume; ++t)
                expected[static_cast<size_t>(t * rows + r)] = map[static_cast<size_t>(r * volume + t)];
        const Context cpu = sparsegrid_test::cpu_context();
        EXPECT_EQ(CpuBackend::tap_major_map(map.data(), rows, volume, cpu).to_host(), expected);
#if defined(SPARSEGRID_WITH_CUDA)
        if (sparsegrid_test::cuda_device_present()) {
            const Context cuda = sparsegrid_test::cuda_context();
            const Buffer<int32_t> device_map = Buffer<int32_t>::from_host(map, cuda);
            EXPECT_EQ(CudaBackend::tap_major_map(device_map.data(), rows, volume, cuda).to_host(cuda.stream), expected);
            EXPECT_EQ(CudaBackend::tap_major_map(device_map.data(), 0, volume, cuda).size(), 0);
        }
#endif
    }
}

}  // namespace
}  // namespace sparsegrid::detail
