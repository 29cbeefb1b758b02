// CUDA convolution execution against the CPU backend (itself checked against the scatter oracle in
// test_convolution.cpp): the same plans built on both devices, forward, input gradient and weight
// gradient over random grids, every kernel/stride case, channel counts across the kernels' tile
// sizes, and a batch of synthetic surfaces large enough for many blocks and row chunks. Also bitwise
// determinism, float16/bfloat16 and TF32 against float32, and the errors. Skipped without a CUDA device.
#include "test_util.h"

#include <sparsegrid/convolution.h>
#include <sparsegrid/shapes.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <sstream>
#include <string>

namespace sparsegrid_test {
namespace {

using sparsegrid::Buffer;
using sparsegrid::ConvolutionPlan;
using sparsegrid::DType;

template <typename T>
struct Results {
    std::vector<T> y, gx, gw;
};

/// Forward, input gradient and weight gradient of `plan` on its device, from host values; with `tf32`
/// on a context that allows TF32.
template <typename T>
Results<T> execute(const ConvolutionPlan& plan, const std::vector<T>& x, const std::vector<T>& w,
                   const std::vector<T>& g, int64_t cin, int64_t cout, DType dtype, bool tf32 = false) {
    // The core takes raw pointers and cannot see their extents: a wrong size here reads past a buffer.
    EXPECT_EQ(static_cast<int64_t>(x.size()), plan.source_grid().num_voxels() * cin) << "x must be [source, cin]";
    EXPECT_EQ(static_cast<int64_t>(w.size()), cout * cin * plan.kernel_volume()) << "w must be [cout, cin, K]";
    EXPECT_EQ(static_cast<int64_t>(g.size()), plan.target_grid().num_voxels() * cout) << "g must be [target, cout]";
    if (::testing::Test::HasFailure()) return {};
    const sparsegrid::Context& ctx = plan.target_grid().context();
    const Buffer<T> dx = Buffer<T>::from_host(x, ctx), dw = Buffer<T>::from_host(w, ctx),
                    dg = Buffer<T>::from_host(g, ctx);
    Buffer<T> y = Buffer<T>::allocate(plan.target_grid().num_voxels() * cout, ctx);
    Buffer<T> gx = Buffer<T>::allocate(plan.source_grid().num_voxels() * cin, ctx);
    Buffer<T> gw = Buffer<T>::allocate(static_cast<int64_t>(w.size()), ctx);
    sparsegrid::Context run = ctx;
    run.allow_tf32 = tf32;
    plan.forward(dx.data(), dw.data(), y.data(), cin, cout, dtype, run);
    plan.backward_input(dg.data(), dw.data(), gx.data(), cin, cout, dtype, run);
    plan.backward_weight(dx.data(), dg.data(), gw.data(), cin, cout, dtype, run);
    return {y.to_host(ctx.stream), gx.to_host(ctx.stream), gw.to_host(ctx.stream)};
}

/// Multiples of 1/8 in [-2, 2]: exact in every dtype, so all dtypes see the same inputs.
std::vector<double> random_eighths(Rng& rng, int64_t count) {
    std::vector<double> v(static_cast<size_t>(count));
    for (double& x : v) x = static_cast<double>(uniform_int(rng, -16, 16)) / 8.0;
    return v;
}

/// Uniform values in [-1, 1]: most are not exact in 16 bits or TF32.
std::vector<double> uniform_values(Rng& rng, int64_t count) {
    std::uniform_real_distribution<double> uniform(-1.0, 1.0);
    std::vector<double> v(static_cast<size_t>(count));
    for (double& value : v) value = uniform(rng);
    return v;
}

template <typename T>
std::vector<T> cast(const std::vector<double>& v) {
    return std::vector<T>(v.begin(), v.end());
}

::testing::AssertionResult close(const std::vector<double>& actual, const std::vector<double>& expected,
                                 double relative, const char* what) {
    if (actual.size() != expected.size())
        return ::testing::AssertionFailure()
            << what << ": " << actual.size() << " values, expected " << expected.size();
    double scale = 0.0;
    for (double e : expected) scale = std::max(scale, std::abs(e));
    for (size_t i = 0; i < actual.size(); ++i)
        if (!(std::abs(actual[i] - expected[i]) <= relative * (std::abs(expected[i]) + scale + 1.0)))
            return ::testing::AssertionFailure()
                << what << ": value " << i << " is " << actual[i] << ", expected " << expected[i];
    return ::testing::AssertionSuccess();
}

template <typename T>
std::vector<double> widen(const std::vector<T>& v) {
    return std::vector<double>(v.begin(), v.end());
}

/// The plan rebuilt on the other grid pair: `make` receives the source grid (and target when given).
struct PlanCase {
    const char* name;
    std::function<ConvolutionPlan(const GridBatch&, const GridBatch&)> make;
};

std::vector<PlanCase> plan_cases() {
    std::vector<PlanCase> cases;
    const std::vector<std::pair<Vec3i, Vec3i>> shapes{
        {{3, 3, 3}, {1, 1, 1}}, {{2, 2, 2}, {2, 2, 2}}, {{3, 3, 3}, {2, 2, 2}}, {{3, 2, 5}, {1, 2, 3}},
        {{4, 4, 4}, {4, 4, 4}}, {{2, 1, 3}, {3, 1, 2}}, {{5, 5, 5}, {1, 1, 1}},
    };
    for (const auto& [k, s] : shapes) {
        cases.push_back({"forward", [k = k, s = s](const GridBatch& a, const GridBatch&) {
                             return ConvolutionPlan::make(a, k, s);
                         }});
        cases.push_back({"transposed", [k = k, s = s](const GridBatch& a, const GridBatch&) {
                             return ConvolutionPlan::make_transposed(a, k, s);
                         }});
    }
    cases.push_back({"given target", [](const GridBatch& a, const GridBatch& b) {
                         return ConvolutionPlan::make(a, b, {3, 2, 1}, {2, 1, 1});
                     }});
    // K = S with given targets: fine rows without a coarse neighbour (zero rows of the scatter mode).
    cases.push_back({"given target, K = S", [](const GridBatch& a, const GridBatch& b) {
                         return ConvolutionPlan::make(a, b, {2, 2, 2}, {2, 2, 2});
                     }});
    cases.push_back({"transposed, given target, K = S", [](const GridBatch& a, const GridBatch& b) {
                         return ConvolutionPlan::make_transposed(a, b, {2, 3, 2}, {2, 3, 2});
                     }});
    cases.push_back({"transposed() of a strided plan", [](const GridBatch& a, const GridBatch&) {
                         return ConvolutionPlan::make(a, {3, 3, 3}, {2, 2, 2}).transposed();
                     }});
    cases.push_back({"identity", [](const GridBatch& a, const GridBatch&) {
                         return ConvolutionPlan::make(a, a, {1, 1, 1}, {1, 1, 1});
                     }});
    return cases;
}

std::vector<std::vector<Vec3i>> random_batch(uint64_t seed, int64_t batch_size) {
    Rng rng(seed);
    RandomBatchOptions options;
    options.batch_size = batch_size;
    options.max_blob_radius = 4;
    return random_members(rng, options);
}

/// CUDA against CPU in float64 and float32 for one plan case and channel pair.
void compare_backends(const PlanCase& plan_case, const std::vector<std::vector<Vec3i>>& members_a,
                      const std::vector<std::vector<Vec3i>>& members_b, int64_t cin, int64_t cout, Rng& rng) {
    const GridBatch cpu_a = GridBatch::from_ijk(members_a), cpu_b = GridBatch::from_ijk(members_b);
    const GridBatch gpu_a = GridBatch::from_ijk(members_a, {}, cuda_context());
    const GridBatch gpu_b = GridBatch::from_ijk(members_b, {}, cuda_context());
    const ConvolutionPlan cpu_plan = plan_case.make(cpu_a, cpu_b);
    const ConvolutionPlan gpu_plan = plan_case.make(gpu_a, gpu_b);
    ASSERT_EQ(cpu_plan.target_grid().num_voxels(), gpu_plan.target_grid().num_voxels());
    const int64_t volume = cpu_plan.kernel_volume();
    const std::vector<double> x = random_eighths(rng, cpu_plan.source_grid().num_voxels() * cin);
    const std::vector<double> w = random_eighths(rng, cout * cin * volume);
    const std::vector<double> g = random_eighths(rng, cpu_plan.target_grid().num_voxels() * cout);

    const Results<double> expected = execute(cpu_plan, x, w, g, cin, cout, DType::Float64);
    const Results<double> actual = execute(gpu_plan, x, w, g, cin, cout, DType::Float64);
    EXPECT_TRUE(close(actual.y, expected.y, 1e-13, "forward f64"));
    EXPECT_TRUE(close(actual.gx, expected.gx, 1e-13, "backward_input f64"));
    EXPECT_TRUE(close(actual.gw, expected.gw, 1e-13, "backward_weight f64"));

    const Results<float> actual32 = execute(gpu_plan, cast<float>(x), cast<float>(w), cast<float>(g), cin, cout,
                                            DType::Float32);
    EXPECT_TRUE(close(widen(actual32.y), expected.y, 1e-6, "forward f32"));
    EXPECT_TRUE(close(widen(actual32.gx), expected.gx, 1e-6, "backward_input f32"));
    EXPECT_TRUE(close(widen(actual32.gw), expected.gw, 1e-6, "backward_weight f32"));
}

// Round to nearest even, for the finite values of these tests.
uint16_t half_bits(float value) {
    uint32_t x = 0;
    std::memcpy(&x, &value, 4);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const int32_t exponent = static_cast<int32_t>((x >> 23) & 0xffu) - 127 + 15;
    uint32_t mantissa = x & 0x7fffffu;
    if (exponent >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
    if (exponent <= 0) {
        if (exponent < -10) return static_cast<uint16_t>(sign);
        mantissa |= 0x800000u;
        const uint32_t shift = static_cast<uint32_t>(14 - exponent);
        uint32_t half = mantissa >> shift;
        const uint32_t rest = mantissa & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rest > halfway || (rest == halfway && (half & 1u))) ++half;
        return static_cast<uint16_t>(sign | half);
    }
    uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
    return static_cast<uint16_t>(half);
}

float from_half_bits(uint16_t h) {
    const int exponent = (h >> 10) & 0x1f;
    const int mantissa = h & 0x3ff;
    float value = exponent == 0 ? std::ldexp(static_cast<float>(mantissa), -24)
                                : std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
    if (exponent == 31) value = INFINITY;
    return (h & 0x8000) ? -value : value;
}

uint16_t bfloat_bits(float value) {
    uint32_t x = 0;
    std::memcpy(&x, &value, 4);
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}

float from_bfloat_bits(uint16_t b) {
    const uint32_t x = uint32_t{b} << 16;
    float value = 0.0f;
    std::memcpy(&value, &x, 4);
    return value;
}

class ConvolutionCuda : public ::testing::Test {
protected:
    void SetUp() override {
        if (!cuda_device_present()) GTEST_SKIP() << "no CUDA device";
    }
};

TEST_F(ConvolutionCuda, MatchesCpuForEveryPlanKind) {
    // Every tile shape: up to 16, 32, 64 and over 64 output channels (in either direction), channel counts
    // with and without float4 rows, and more output channels than one 128-wide tile; and the narrow
    // weight gradient (both counts <= 32, at most 256 products) with 256, 5, 4 and 1 groups of threads.
    const std::vector<std::pair<int64_t, int64_t>> channels{{1, 1},    {3, 17}, {40, 5}, {33, 70},
                                                            {64, 132}, {8, 8},  {7, 32}};
    int64_t seed = 100;
    for (const PlanCase& plan_case : plan_cases())
        for (const auto& [cin, cout] : channels) {
            SCOPED_TRACE(::testing::Message() << plan_case.name << " cin " << cin << " cout " << cout);
            Rng rng(static_cast<uint64_t>(++seed));
            compare_backends(plan_case, random_batch(static_cast<uint64_t>(seed), 5),
                             random_batch(static_cast<uint64_t>(seed) + 1000, 5), cin, cout, rng);
        }
}

TEST_F(ConvolutionCuda, EmptyGridsAndMembers) {
    Rng rng(7);
    const PlanCase forward{"k3s2", [](const GridBatch& a, const GridBatch&) {
                               return ConvolutionPlan::make(a, {3, 3, 3}, {2, 2, 2});
                           }};
    compare_backends(forward, {{}, {}, {}}, {{}, {}, {}}, 4, 6, rng);
    compare_backends(forward, {{}, {{1, 2, 3}, {-4, 5, 6}}, {}}, {{}, {}, {}}, 4, 6, rng);
    // K = S both ways (the scatter mode), from empty grids and to a given target from an empty source.
    const PlanCase down{"k2s2", [](const GridBatch& a, const GridBatch&) {
                            return ConvolutionPlan::make(a, {2, 2, 2}, {2, 2, 2});
                        }};
    const PlanCase up{"k2s2 generative", [](const GridBatch& a, const GridBatch&) {
                          return ConvolutionPlan::make_transposed(a, {2, 2, 2}, {2, 2, 2});
                      }};
    const PlanCase up_to_target{"k2s2 to a given target", [](const GridBatch& a, const GridBatch& b) {
                                    return ConvolutionPlan::make_transposed(a, b, {2, 2, 2}, {2, 2, 2});
                                }};
    for (const PlanCase* plan_case : {&down, &up}) {
        compare_backends(*plan_case, {{}, {}, {}}, {{}, {}, {}}, 4, 6, rng);
        compare_backends(*plan_case, {{}, {{1, 2, 3}, {-4, 5, 6}}, {}}, {{}, {}, {}}, 4, 6, rng);
    }
    compare_backends(up_to_target, {{}, {}}, {{{0, 0, 0}, {3, 1, 2}}, {{-1, -1, -1}}}, 4, 6, rng);
}

TEST_F(ConvolutionCuda, SyntheticSurfacesManyBlocksAndChunks) {
    // ~70k voxels: many row tiles, and weight-gradient rows split over many chunks.
    const auto members = sparsegrid::synthetic_surface_batch(8, 48, 3);
    Rng rng(11);
    const PlanCase k3s1{"k3s1", [](const GridBatch& a, const GridBatch&) {
                            return ConvolutionPlan::make(a, {3, 3, 3}, {1, 1, 1});
                        }};
    const PlanCase k2s2{"k2s2 generative", [](const GridBatch& a, const GridBatch&) {
                            return ConvolutionPlan::make_transposed(a, {2, 2, 2}, {2, 2, 2});
                        }};
    compare_backends(k3s1, members, members, 32, 32, rng);
    compare_backends(k3s1, members, members, 8, 8, rng);  // the narrow weight gradient over many chunks
    compare_backends(k2s2, members, members, 16, 64, rng);
    // The 8 x 8 register tiles (over 64 output channels) on ordered maps, and 64 x 64 tiles the other way.
    compare_backends(k3s1, members, members, 48, 72, rng);
}

TEST_F(ConvolutionCuda, RepeatedRunsAreBitwiseIdentical) {
    const auto members = sparsegrid::synthetic_surface_batch(4, 40, 5);
    const GridBatch grid = GridBatch::from_ijk(members, {}, cuda_context());
    const ConvolutionPlan plan = ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1});
    Rng rng(3);
    // 24 -> 48 channels, and 8 -> 16 (the narrow weight gradient, 2 groups of threads per product).
    for (const auto& [cin, cout] : {std::pair<int64_t, int64_t>{24, 48}, std::pair<int64_t, int64_t>{8, 16}}) {
        SCOPED_TRACE(::testing::Message() << "cin " << cin << " cout " << cout);
        // The target is conv_grid(3, 1) of the grid (the dilated grid), larger than the source.
        std::vector<float> x(static_cast<size_t>(grid.num_voxels() * cin)), w(static_cast<size_t>(cout * cin * 27)),
            g(static_cast<size_t>(plan.target_grid().num_voxels() * cout));
        for (float& v : x) v = static_cast<float>(uniform_real(rng, -1, 1));
        for (float& v : w) v = static_cast<float>(uniform_real(rng, -1, 1));
        for (float& v : g) v = static_cast<float>(uniform_real(rng, -1, 1));
        const Results<float> first = execute(plan, x, w, g, cin, cout, DType::Float32);
        const Results<float> second = execute(plan, x, w, g, cin, cout, DType::Float32);
        EXPECT_EQ(first.y, second.y);
        EXPECT_EQ(first.gx, second.gx);
        EXPECT_EQ(first.gw, second.gw);
    }
}

TEST_F(ConvolutionCuda, HalfPrecisionAgreesWithFloat32) {
    const auto members = random_batch(77, 4);
    const GridBatch grid = GridBatch::from_ijk(members, {}, cuda_context());
    Rng rng(77);
    for (const ConvolutionPlan& plan : {ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1}),
                                        ConvolutionPlan::make_transposed(grid, {2, 2, 2}, {2, 2, 2})}) {
        const int64_t cin = 24, cout = 40, volume = plan.kernel_volume();
        const std::vector<double> x = random_eighths(rng, plan.source_grid().num_voxels() * cin);
        const std::vector<double> w = random_eighths(rng, cout * cin * volume);
        const std::vector<double> g = random_eighths(rng, plan.target_grid().num_voxels() * cout);
        const Results<float> reference = execute(plan, cast<float>(x), cast<float>(w), cast<float>(g), cin, cout,
                                                 DType::Float32);
        for (const DType dtype : {DType::Float16, DType::BFloat16}) {
            const bool half = dtype == DType::Float16;
            auto encode = [&](const std::vector<double>& v) {
                std::vector<uint16_t> out;
                for (double d : v) {
                    const float f = static_cast<float>(d);
                    out.push_back(half ? half_bits(f) : bfloat_bits(f));
                }
                return out;
            };
            auto decode = [&](const std::vector<uint16_t>& v) {
                std::vector<double> out;
                for (uint16_t b : v) out.push_back(half ? from_half_bits(b) : from_bfloat_bits(b));
                return out;
            };
            const Results<uint16_t> low = execute(plan, encode(x), encode(w), encode(g), cin, cout, dtype);
            // Inputs are exact in both formats and sums run in float32: only the final rounding differs.
            const double tolerance = half ? 1.0 / 1024 : 1.0 / 128;
            const char* name = half ? "float16" : "bfloat16";
            EXPECT_TRUE(close(decode(low.y), widen(reference.y), tolerance, name));
            EXPECT_TRUE(close(decode(low.gx), widen(reference.gx), tolerance, name));
            EXPECT_TRUE(close(decode(low.gw), widen(reference.gw), tolerance, name));
        }
    }
}

TEST_F(ConvolutionCuda, Tf32AgreesWithFloat32) {
    // Multiples of 1/8 in [-2, 2] are exact in TF32 and their products in float32: with TF32 allowed only
    // the order of the float32 sums may differ. Channel counts across tiles, with and without float4 rows.
    const auto members = random_batch(91, 4);
    const GridBatch grid = GridBatch::from_ijk(members, {}, cuda_context());
    Rng rng(91);
    const std::vector<std::pair<int64_t, int64_t>> channels{{24, 40}, {70, 6}, {64, 132}};
    for (const ConvolutionPlan& plan : {ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1}),
                                        ConvolutionPlan::make_transposed(grid, {2, 2, 2}, {2, 2, 2}),
                                        ConvolutionPlan::make(grid, grid, {1, 1, 1}, {1, 1, 1})})
        for (const auto& [cin, cout] : channels) {
            SCOPED_TRACE(::testing::Message()
                         << "volume " << plan.kernel_volume() << " cin " << cin << " cout " << cout);
            const int64_t volume = plan.kernel_volume();
            const std::vector<float> x = cast<float>(random_eighths(rng, plan.source_grid().num_voxels() * cin));
            const std::vector<float> w = cast<float>(random_eighths(rng, cout * cin * volume));
            const std::vector<float> g = cast<float>(random_eighths(rng, plan.target_grid().num_voxels() * cout));
            const Results<float> reference = execute(plan, x, w, g, cin, cout, DType::Float32);
            const Results<float> tf32 = execute(plan, x, w, g, cin, cout, DType::Float32, true);
            EXPECT_TRUE(close(widen(tf32.y), widen(reference.y), 1e-6, "forward tf32"));
            EXPECT_TRUE(close(widen(tf32.gx), widen(reference.gx), 1e-6, "backward_input tf32"));
            EXPECT_TRUE(close(widen(tf32.gw), widen(reference.gw), 1e-6, "backward_weight tf32"));
            const Results<float> again = execute(plan, x, w, g, cin, cout, DType::Float32, true);
            EXPECT_EQ(tf32.y, again.y);
            EXPECT_EQ(tf32.gx, again.gx);
            EXPECT_EQ(tf32.gw, again.gw);
        }
}

/// Values encoded in a 16-bit float format and back (float16 or bfloat16, round to nearest even).
std::vector<uint16_t> encode16(const std::vector<double>& values, bool half) {
    std::vector<uint16_t> out;
    out.reserve(values.size());
    for (double d : values) out.push_back(half ? half_bits(static_cast<float>(d)) : bfloat_bits(static_cast<float>(d)));
    return out;
}

std::vector<double> decode16(const std::vector<uint16_t>& bits, bool half) {
    std::vector<double> out;
    out.reserve(bits.size());
    for (uint16_t b : bits) out.push_back(half ? from_half_bits(b) : from_bfloat_bits(b));
    return out;
}

/// A plan's inputs x [source, cin], w [cout, cin, K], g [target, cout] twice: as multiples of 1/8 (exact
/// in every dtype), then uniform in [-1, 1] (rx, rw, rg), drawn from rng in that order.
struct EngineInputs {
    std::vector<double> x, w, g, rx, rw, rg;
};
EngineInputs engine_inputs(Rng& rng, const ConvolutionPlan& plan, int64_t cin, int64_t cout) {
    const int64_t volume = plan.kernel_volume();
    const int64_t sources = plan.source_grid().num_voxels(), targets = plan.target_grid().num_voxels();
    EngineInputs in;
    in.x = random_eighths(rng, sources * cin);
    in.w = random_eighths(rng, cout * cin * volume);
    in.g = random_eighths(rng, targets * cout);
    in.rx = uniform_values(rng, sources * cin);
    in.rw = uniform_values(rng, cout * cin * volume);
    in.rg = uniform_values(rng, targets * cout);
    return in;
}

/// The engine's configurations back on the automatic choice when a test ends, whatever happened.
struct AutomaticEngineConfiguration {
    ~AutomaticEngineConfiguration() { sparsegrid::set_convolution_engine_configuration("auto"); }
};

TEST_F(ConvolutionCuda, EveryEngineConfigurationIsExactAndBitwiseAlike) {
    // Every tile configuration of the tensor-core engine, in float16, bfloat16 and TF32, on plans whose
    // gathers it runs (k3s1, k3s2, the input gradient of a generative k2s2, given targets with per-axis
    // sizes, one of them past 32 taps, where the source table is read in two halves of taps) and channel
    // counts that cover partial k chunks and partial or several channel tiles.
    // With multiples of 1/8 every product and sum is exact in float32: each result must equal the
    // float32 one rounded once to the dtype. With random values each configuration must give bitwise the
    // result of the first (they sum in one order), near the float32 one.
    const std::vector<std::string> configurations = sparsegrid::convolution_engine_configurations();
    ASSERT_GE(configurations.size(), 2u);
    const AutomaticEngineConfiguration restore;
    const auto members = random_batch(123, 5);
    const GridBatch grid = GridBatch::from_ijk(members, {}, cuda_context());
    const std::vector<ConvolutionPlan> plans{ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1}),
                                             ConvolutionPlan::make(grid, {3, 3, 3}, {2, 2, 2}),
                                             ConvolutionPlan::make_transposed(grid, {2, 2, 2}, {2, 2, 2}),
                                             ConvolutionPlan::make(grid, grid, {3, 2, 1}, {1, 1, 1}),
                                             ConvolutionPlan::make(grid, grid, {4, 3, 3}, {1, 1, 1})};
    const std::vector<std::pair<int64_t, int64_t>> channels{{32, 32}, {64, 64}, {24, 136}, {136, 40}, {8, 264}};
    Rng rng(123);
    for (const ConvolutionPlan& plan : plans)
        for (const auto& [cin, cout] : channels) {
            const int64_t volume = plan.kernel_volume();
            const auto& [x, w, g, rx, rw, rg] = engine_inputs(rng, plan, cin, cout);
            sparsegrid::set_convolution_engine_configuration("off");
            const Results<float> exact = execute(plan, cast<float>(x), cast<float>(w), cast<float>(g), cin, cout,
                                                 DType::Float32);
            const Results<float> reference = execute(plan, cast<float>(rx), cast<float>(rw), cast<float>(rg), cin, cout,
                                                     DType::Float32);
            std::map<int, Results<uint16_t>> first16;
            Results<float> first_tf32;
            for (const std::string& configuration : configurations) {
                SCOPED_TRACE(::testing::Message() << "configuration " << configuration << ", volume " << volume
                                                  << ", cin " << cin << ", cout " << cout);
                sparsegrid::set_convolution_engine_configuration(configuration);
                const Results<float> tf32 = execute(plan, cast<float>(x), cast<float>(w), cast<float>(g), cin, cout,
                                                    DType::Float32, true);
                EXPECT_EQ(tf32.y, exact.y);
                EXPECT_EQ(tf32.gx, exact.gx);
                EXPECT_EQ(tf32.gw, exact.gw);
                const Results<float> random_tf32 = execute(plan, cast<float>(rx), cast<float>(rw), cast<float>(rg), cin,
                                                           cout, DType::Float32, true);
                EXPECT_TRUE(close(widen(random_tf32.y), widen(reference.y), 2e-3, "forward tf32"));
                EXPECT_TRUE(close(widen(random_tf32.gx), widen(reference.gx), 2e-3, "backward_input tf32"));
                EXPECT_TRUE(close(widen(random_tf32.gw), widen(reference.gw), 2e-3, "backward_weight tf32"));
                if (configuration == configurations.front()) first_tf32 = random_tf32;
                EXPECT_EQ(random_tf32.y, first_tf32.y) << "TF32 forward differs from " << configurations.front();
                EXPECT_EQ(random_tf32.gx, first_tf32.gx)
                    << "TF32 input gradient differs from " << configurations.front();
                EXPECT_EQ(random_tf32.gw, first_tf32.gw)
                    << "TF32 weight gradient differs from " << configurations.front();
                for (const bool half : {true, false}) {
                    const DType dtype = half ? DType::Float16 : DType::BFloat16;
                    const char* name = half ? "float16" : "bfloat16";
                    const Results<uint16_t> low = execute(plan, encode16(x, half), encode16(w, half), encode16(g, half),
                                                          cin, cout, dtype);
                    EXPECT_EQ(low.y, encode16(widen(exact.y), half)) << name << " forward";
                    EXPECT_EQ(low.gx, encode16(widen(exact.gx), half)) << name << " input gradient";
                    EXPECT_EQ(low.gw, encode16(widen(exact.gw), half)) << name << " weight gradient";
                    const Results<uint16_t> random_low = execute(plan, encode16(rx, half), encode16(rw, half),
                                                                 encode16(rg, half), cin, cout, dtype);
                    const double tolerance = half ? 1e-2 : 5e-2;
                    EXPECT_TRUE(close(decode16(random_low.y, half), widen(reference.y), tolerance, name));
                    EXPECT_TRUE(close(decode16(random_low.gx, half), widen(reference.gx), tolerance, name));
                    EXPECT_TRUE(close(decode16(random_low.gw, half), widen(reference.gw), tolerance, name));
                    auto [slot, inserted] = first16.try_emplace(half ? 1 : 0, random_low);
                    EXPECT_EQ(random_low.y, slot->second.y)
                        << name << " forward differs from " << configurations.front();
                    EXPECT_EQ(random_low.gx, slot->second.gx)
                        << name << " input gradient differs from " << configurations.front();
                    EXPECT_EQ(random_low.gw, slot->second.gw)
                        << name << " weight gradient differs from " << configurations.front();
                }
            }
        }
}

/// SPARSEGRID_WEIGHT_TAPS_FASTEST set for a scope ("" unsets it), restored when it ends.
class WeightBlockOrder {
public:
    explicit WeightBlockOrder(const char* value) {
        if (const char* old = std::getenv(kName)) m_old = old, m_had = true;
        set(value);
    }
    ~WeightBlockOrder() { set(m_had ? m_old.c_str() : ""); }
    static void set(const char* value) {
        if (*value)
            setenv(kName, value, 1);
        else
            unsetenv(kName);
    }

private:
    static constexpr const char* kName = "SPARSEGRID_WEIGHT_TAPS_FASTEST";
    std::string m_old;
    bool m_had = false;
};

TEST_F(ConvolutionCuda, WeightGradientBlockOrdersAreExactAndBitwiseAlike) {
    // The engine's weight-gradient blocks run taps fastest or taps slowest (chosen by the operands' size
    // against the L2 cache, which these small problems never pass). Forced either way, every
    // configuration must give the exact result on multiples of 1/8 and, on random values, bitwise the
    // automatic order's.
    const AutomaticEngineConfiguration restore;
    const WeightBlockOrder restore_order("");
    const GridBatch grid = GridBatch::from_ijk(random_batch(321, 4), {}, cuda_context());
    const std::vector<ConvolutionPlan> plans{ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1}),
                                             ConvolutionPlan::make_transposed(grid, {2, 2, 2}, {2, 2, 2})};
    const std::vector<std::pair<int64_t, int64_t>> channels{{64, 64}, {24, 136}, {136, 40}};
    Rng rng(321);
    for (const ConvolutionPlan& plan : plans)
        for (const auto& [cin, cout] : channels) {
            const int64_t volume = plan.kernel_volume();
            const auto& [x, w, g, rx, rw, rg] = engine_inputs(rng, plan, cin, cout);
            sparsegrid::set_convolution_engine_configuration("off");
            const Results<float> exact = execute(plan, cast<float>(x), cast<float>(w), cast<float>(g), cin, cout,
                                                 DType::Float32);
            for (const std::string& configuration : sparsegrid::convolution_engine_configurations()) {
                if (configuration.rfind("w", 0) != 0) continue;  // the weight-gradient configurations: w..., wg...
                sparsegrid::set_convolution_engine_configuration(configuration);
                WeightBlockOrder::set("");
                const Results<float> automatic_tf32 = execute(plan, cast<float>(rx), cast<float>(rw), cast<float>(rg),
                                                              cin, cout, DType::Float32, true);
                const Results<uint16_t> automatic_half = execute(plan, encode16(rx, true), encode16(rw, true),
                                                                 encode16(rg, true), cin, cout, DType::Float16);
                for (const char* order : {"1", "0"}) {
                    SCOPED_TRACE(::testing::Message() << "configuration " << configuration << ", taps fastest " << order
                                                      << ", volume " << volume << ", cin " << cin << ", cout " << cout);
                    WeightBlockOrder::set(order);
                    EXPECT_EQ(
                        execute(plan, cast<float>(x), cast<float>(w), cast<float>(g), cin, cout, DType::Float32, true)
                            .gw,
                        exact.gw);
                    EXPECT_EQ(execute(plan, encode16(x, false), encode16(w, false), encode16(g, false), cin, cout,
                                      DType::BFloat16)
                                  .gw,
                              encode16(widen(exact.gw), false));
                    EXPECT_EQ(execute(plan, cast<float>(rx), cast<float>(rw), cast<float>(rg), cin, cout,
                                      DType::Float32, true)
                                  .gw,
                              automatic_tf32.gw);
                    EXPECT_EQ(execute(plan, encode16(rx, true), encode16(rw, true), encode16(rg, true), cin, cout,
                                      DType::Float16)
                                  .gw,
                              automatic_half.gw);
                }
            }
        }
    WeightBlockOrder::set("2");
    sparsegrid::set_convolution_engine_configuration("auto");
    const ConvolutionPlan& plan = plans.front();
    const int64_t sources = plan.source_grid().num_voxels(), targets = plan.target_grid().num_voxels();
    EXPECT_TRUE(throws_error(
        [&] {
            execute(plan, encode16(std::vector<double>(static_cast<size_t>(sources * 64), 0.5), true),
                    encode16(std::vector<double>(64 * 64 * 27, 0.5), true),
                    encode16(std::vector<double>(static_cast<size_t>(targets * 64), 0.5), true), 64, 64,
                    DType::Float16);
        },
        "SPARSEGRID_WEIGHT_TAPS_FASTEST", {"1 (taps fastest)", "\"2\""}));
}

TEST_F(ConvolutionCuda, TunedExecutionsEqualUntunedOnesAndTheChoicesPersist) {
    // Tuning times every configuration on the first execution of a shape (waiting for the device), keeps
    // the fastest and writes it to the file; results are bitwise those of the automatic choice; a later
    // execution, and a fresh start from the file with tuning off, neither wait nor change a bit.
    struct TuningOff {
        ~TuningOff() { sparsegrid::set_convolution_engine_tuning(false); }
    } restore;
    const auto members = random_batch(321, 4);
    const GridBatch grid = GridBatch::from_ijk(members, {}, cuda_context());
    const ConvolutionPlan plan = ConvolutionPlan::make(grid, grid, {3, 3, 3}, {1, 1, 1});
    const int64_t cin = 32, cout = 48, volume = plan.kernel_volume();
    Rng rng(321);
    const auto x = encode16(random_eighths(rng, grid.num_voxels() * cin), true);
    const auto w = encode16(random_eighths(rng, cout * cin * volume), true);
    const auto g = encode16(random_eighths(rng, grid.num_voxels() * cout), true);
    const Results<uint16_t> automatic = execute(plan, x, w, g, cin, cout, DType::Float16);
    const std::string file = ::testing::TempDir() + "sparsegrid_tuning_test.txt";
    std::remove(file.c_str());
    sparsegrid::set_convolution_engine_tuning(true, file);
    const int64_t before = sparsegrid::host_synchronizations();
    const Results<uint16_t> tuned = execute(plan, x, w, g, cin, cout, DType::Float16);
    EXPECT_GT(sparsegrid::host_synchronizations(), before) << "tuning times on the device";
    EXPECT_EQ(tuned.y, automatic.y);
    EXPECT_EQ(tuned.gx, automatic.gx);
    EXPECT_EQ(tuned.gw, automatic.gw);
    const int64_t after_tuning = sparsegrid::host_synchronizations();
    const Results<uint16_t> again = execute(plan, x, w, g, cin, cout, DType::Float16);
    // execute() reads its three results back (three counted waits); nothing else may wait.
    EXPECT_EQ(sparsegrid::host_synchronizations() - after_tuning, 3);
    EXPECT_EQ(again.y, automatic.y);
    EXPECT_EQ(again.gw, automatic.gw);

    // The file: the forward (cin -> cout), the input gradient (cout -> cin) and the weight gradient (over
    // the map the front end picks: [cin, cout] over target rows, [cout, cin] over source rows).
    const std::vector<std::string> names = sparsegrid::convolution_engine_configurations();
    std::ifstream in(file);
    std::string line;
    std::vector<std::string> kinds;
    while (std::getline(in, line)) {
        std::vector<std::string> fields;
        std::stringstream stream(line);
        for (std::string field; std::getline(stream, field, '\t');) fields.push_back(field);
        ASSERT_EQ(fields.size(), 8u) << line;
        EXPECT_EQ(fields[2], "float16") << line;
        EXPECT_NE(std::find(names.begin(), names.end(), fields[7]), names.end()) << line;
        kinds.push_back(fields[1] + " " + fields[3] + " " + fields[4]);
    }
    std::sort(kinds.begin(), kinds.end());
    ASSERT_EQ(kinds.size(), 3u);
    EXPECT_EQ(kinds[0], "forward 32 48");
    EXPECT_EQ(kinds[1], "forward 48 32");
    EXPECT_TRUE(kinds[2] == "weight 32 48" || kinds[2] == "weight 48 32") << kinds[2];

    sparsegrid::set_convolution_engine_tuning(false, file);
    const int64_t reloaded = sparsegrid::host_synchronizations();
    const Results<uint16_t> from_file = execute(plan, x, w, g, cin, cout, DType::Float16);
    EXPECT_EQ(sparsegrid::host_synchronizations() - reloaded, 3);
    EXPECT_EQ(from_file.y, automatic.y);
    EXPECT_EQ(from_file.gx, automatic.gx);
    EXPECT_EQ(from_file.gw, automatic.gw);
    std::remove(file.c_str());
}

struct MixedResults {
    std::vector<uint16_t> y, gx;
    std::vector<float> gw;
};

/// execute() with 16-bit features (bits) and float32 weights: the weight gradient in float32.
MixedResults execute_mixed(const ConvolutionPlan& plan, const std::vector<uint16_t>& x, const std::vector<float>& w,
                           const std::vector<uint16_t>& g, int64_t cin, int64_t cout, DType dtype) {
    const sparsegrid::Context& ctx = plan.target_grid().context();
    const Buffer<uint16_t> dx = Buffer<uint16_t>::from_host(x, ctx), dg = Buffer<uint16_t>::from_host(g, ctx);
    const Buffer<float> dw = Buffer<float>::from_host(w, ctx);
    Buffer<uint16_t> y = Buffer<uint16_t>::allocate(plan.target_grid().num_voxels() * cout, ctx);
    Buffer<uint16_t> gx = Buffer<uint16_t>::allocate(plan.source_grid().num_voxels() * cin, ctx);
    Buffer<float> gw = Buffer<float>::allocate(static_cast<int64_t>(w.size()), ctx);
    plan.forward(dx.data(), dw.data(), y.data(), cin, cout, dtype, DType::Float32, ctx);
    plan.backward_input(dg.data(), dw.data(), gx.data(), cin, cout, dtype, DType::Float32, ctx);
    plan.backward_weight(dx.data(), dg.data(), gw.data(), cin, cout, dtype, DType::Float32, ctx);
    return {y.to_host(ctx.stream), gx.to_host(ctx.stream), gw.to_host(ctx.stream)};
}

TEST_F(ConvolutionCuda, Float32WeightsWith16BitFeaturesEqualRoundedWeights) {
    // Autocast's layers: float16 / bfloat16 features with float32 weights. The output and the input
    // gradient must be bitwise those of the weights rounded to 16 bits first, and the float32 weight
    // gradient must round to the 16-bit one (it is the same float32 sum, unrounded), on the engine and
    // on the tiled kernels (engine off; odd channel counts), gathering and scattering (K = S), and for
    // the identity plan.
    const AutomaticEngineConfiguration restore;
    const auto members = random_batch(211, 4);
    const GridBatch grid = GridBatch::from_ijk(members, {}, cuda_context());
    const std::vector<ConvolutionPlan> plans{ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1}),
                                             ConvolutionPlan::make(grid, {3, 3, 3}, {2, 2, 2}),
                                             ConvolutionPlan::make_transposed(grid, {2, 2, 2}, {2, 2, 2}),
                                             ConvolutionPlan::make(grid, grid, {1, 1, 1}, {1, 1, 1})};
    const std::vector<std::pair<int64_t, int64_t>> channels{{32, 48}, {3, 5}, {64, 64}};
    Rng rng(211);
    for (const std::string configuration : {"auto", "off"})
        for (const ConvolutionPlan& plan : plans)
            for (const auto& [cin, cout] : channels)
                for (const bool half : {true, false}) {
                    SCOPED_TRACE(::testing::Message()
                                 << "configuration " << configuration << ", volume " << plan.kernel_volume() << ", cin "
                                 << cin << ", cout " << cout << (half ? ", float16" : ", bfloat16"));
                    sparsegrid::set_convolution_engine_configuration(configuration);
                    const DType dtype = half ? DType::Float16 : DType::BFloat16;
                    const std::vector<uint16_t> x = encode16(uniform_values(rng, plan.source_grid().num_voxels() * cin),
                                                             half);
                    const std::vector<uint16_t> g = encode16(
                        uniform_values(rng, plan.target_grid().num_voxels() * cout), half);
                    const std::vector<float> w = cast<float>(uniform_values(rng, cout * cin * plan.kernel_volume()));
                    const MixedResults mixed = execute_mixed(plan, x, w, g, cin, cout, dtype);
                    const Results<uint16_t> rounded = execute(plan, x, encode16(widen(w), half), g, cin, cout, dtype);
                    EXPECT_EQ(mixed.y, rounded.y) << "forward";
                    EXPECT_EQ(mixed.gx, rounded.gx) << "input gradient";
                    EXPECT_EQ(encode16(widen(mixed.gw), half), rounded.gw) << "weight gradient";
                    // The float32 gradient keeps what the 16-bit one rounds away.
                    EXPECT_NE(widen(mixed.gw), decode16(rounded.gw, half)) << "weight gradient";
                }
    // Other pairs raise, naming the argument.
    const ConvolutionPlan& plan = plans.front();
    EXPECT_TRUE(throws_error(
        [&] { plan.forward(nullptr, nullptr, nullptr, 1, 1, DType::Float32, DType::Float16, grid.context()); },
        "ConvolutionPlan::forward", {"weight_dtype", "float16"}));
}

TEST_F(ConvolutionCuda, EngineConfigurationNamesAreChecked) {
    const AutomaticEngineConfiguration restore;
    EXPECT_TRUE(throws_error([] { sparsegrid::set_convolution_engine_configuration("64x64"); },
                             "set_convolution_engine_configuration", {"auto", "off", "64x64"}));
    EXPECT_NO_THROW(sparsegrid::set_convolution_engine_configuration("off"));
    EXPECT_NO_THROW(sparsegrid::set_convolution_engine_configuration("auto"));
}

TEST_F(ConvolutionCuda, ContextOnAnotherDeviceRaises) {
    const GridBatch grid = GridBatch::from_ijk({{{0, 0, 0}, {1, 0, 0}}}, {}, cuda_context());
    const ConvolutionPlan plan = ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1});
    const sparsegrid::Context host;
    EXPECT_TRUE(throws_error([&] { plan.forward(nullptr, nullptr, nullptr, 1, 1, DType::Float32, host); },
                             "ConvolutionPlan::forward", {"context", "cpu", "cuda"}));
}

}  // namespace
}  // namespace sparsegrid_test
