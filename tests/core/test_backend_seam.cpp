// The backend seam (src/backend/backend.h): every backend of this build implements every entry point of
// the list. Taking each entry point's address makes a missing definition a link error of this test.
#include "backend/backend.h"

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace sparsegrid::detail
