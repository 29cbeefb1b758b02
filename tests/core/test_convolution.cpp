// Convolution execution against a scatter-form oracle: every edge (fine f, coarse c, tap t) of the
// literal relation f = S*c + tap - pb adds W[:, :, t] . x[source] into a per-coordinate accumulator,
// read out at the target voxels. The library computes the same sums in gather form over its maps, so
// the two share nothing but the definition. The CUDA backend is checked against the CPU one in
// test_convolution_cuda.cpp.
#include "core/storage.h"
#include "oracle.h"
#include "test_util.h"

#include <sparsegrid/convolution.h>
#include <sparsegrid/shapes.h>

#include <gtest/gtest.h>

#include <cmath>
#include <map>

namespace sparsegrid_test {
namespace {

using sparsegrid::ConvolutionPlan;
using sparsegrid::DType;

using Key = std::pair<int64_t, Coord64>;  // (member, coordinate)

std::map<Key, int64_t> index_of(const GridBatch& grid) {
    std::map<Key, int64_t> out;
    const std::vector<Vec3i> ijk = grid.ijk_host();
    const std::vector<int64_t>& offsets = grid.voxel_offsets();
    for (int64_t m = 0; m + 1 < static_cast<int64_t>(offsets.size()); ++m)
        for (int64_t n = offsets[m]; n < offsets[m + 1]; ++n) out[{m, {ijk[n][0], ijk[n][1], ijk[n][2]}}] = n;
    return out;
}

/// Every edge (source index, target index, tap) between a coarse and a fine grid, by enumeration of
/// (coarse voxel, tap) pairs.
struct Edge {
    int64_t source, target;
    int64_t tap;
};

std::vector<Edge> oracle_edges(const GridBatch& source, const GridBatch& target, const Vec3i& k, const Vec3i& s,
                               sparsegrid::MapDirection direction) {
    const bool forward = direction == sparsegrid::MapDirection::Forward;
    const GridBatch& coarse = forward ? target : source;
    const GridBatch& fine = forward ? source : target;
    const std::map<Key, int64_t> fine_index = index_of(fine);
    std::vector<Edge> edges;
    for (const auto& [key, coarse_n] : index_of(coarse))
        for (int64_t t = 0; t < kernel_volume(k); ++t) {
            const auto tap = tap_of_index(t, k);
            Coord64 f;
            for (int a = 0; a < 3; ++a) f[a] = int64_t{s[a]} * key.second[a] + tap[a] - (k[a] - 1) / 2;
            const auto it = fine_index.find({key.first, f});
            if (it == fine_index.end()) continue;
            edges.push_back(forward ? Edge{it->second, coarse_n, t} : Edge{coarse_n, it->second, t});
        }
    return edges;
}

/// out[target] += W[:, :, t] . x[source] for every edge (scatter form), in long double.
std::vector<double> oracle_convolution(const std::vector<Edge>& edges, int64_t num_target, const std::vector<double>& x,
                                       const std::vector<double>& w, int64_t cin, int64_t cout, int64_t volume) {
    std::vector<long double> acc(static_cast<size_t>(num_target * cout), 0.0L);
    for (const Edge& e : edges)
        for (int64_t co = 0; co < cout; ++co)
            for (int64_t ci = 0; ci < cin; ++ci)
                acc[e.target * cout + co] += static_cast<long double>(w[(co * cin + ci) * volume + e.tap]) *
                    x[e.source * cin + ci];
    return std::vector<double>(acc.begin(), acc.end());
}

std::vector<double> random_values(Rng& rng, int64_t count) {
    std::vector<double> v(static_cast<size_t>(count));
    for (double& x : v) x = uniform_real(rng, -1.0, 1.0);
    return v;
}

::testing::AssertionResult near_all(const std::vector<double>& actual, const std::vector<double>& expected,
                                    double tolerance) {
    if (actual.size() != expected.size())
        return ::testing::AssertionFailure() << actual.size() << " values, expected " << expected.size();
    for (size_t i = 0; i < actual.size(); ++i)
        if (!(std::abs(actual[i] - expected[i]) <= tolerance * (1.0 + std::abs(expected[i]))))
            return ::testing::AssertionFailure()
                << "value " << i << " is " << actual[i] << ", expected " << expected[i];
    return ::testing::AssertionSuccess();
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
    long double sum = 0.0L;
    for (size_t i = 0; i < a.size(); ++i) sum += static_cast<long double>(a[i]) * b[i];
    return static_cast<double>(sum);
}

const std::vector<std::pair<Vec3i, Vec3i>> kConvCases{
    {{3, 3, 3}, {1, 1, 1}}, {{2, 2, 2}, {2, 2, 2}}, {{3, 3, 3}, {2, 2, 2}}, {{1, 1, 1}, {1, 1, 1}},
    {{3, 2, 5}, {1, 2, 3}}, {{4, 4, 4}, {4, 4, 4}}, {{2, 1, 3}, {3, 1, 2}},
};

GridBatch random_grid(uint64_t seed, int64_t batch_size) {
    Rng rng(seed);
    RandomBatchOptions options;
    options.batch_size = batch_size;
    options.max_blob_radius = 3;
    return GridBatch::from_ijk(random_members(rng, options));
}

/// Forward, input gradient and weight gradient of `plan` against the scatter oracle (float64).
void check_plan(const ConvolutionPlan& plan, Rng& rng) {
    const int64_t cin = uniform_int(rng, 1, 4), cout = uniform_int(rng, 1, 4);
    const int64_t volume = plan.kernel_volume();
    const int64_t ns = plan.source_grid().num_voxels(), nt = plan.target_grid().num_voxels();
    const std::vector<double> x = random_values(rng, ns * cin), w = random_values(rng, cout * cin * volume),
                              g = random_values(rng, nt * cout);
    const std::vector<Edge> edges = oracle_edges(plan.source_grid(), plan.target_grid(), plan.kernel_size(),
                                                 plan.stride(), plan.direction());
    std::vector<double> y(static_cast<size_t>(nt * cout), -7.0);
    plan.forward(x.data(), w.data(), y.data(), cin, cout, DType::Float64);
    EXPECT_TRUE(near_all(y, oracle_convolution(edges, nt, x, w, cin, cout, volume), 1e-12)) << "forward";

    // Input gradient: the same edges read backwards, W transposed.
    std::vector<Edge> reversed;
    for (const Edge& e : edges) reversed.push_back({e.target, e.source, e.tap});
    std::vector<double> w_transposed(w.size());
    for (int64_t co = 0; co < cout; ++co)
        for (int64_t ci = 0; ci < cin; ++ci)
            for (int64_t t = 0; t < volume; ++t)
                w_transposed[(ci * cout + co) * volume + t] = w[(co * cin + ci) * volume + t];
    std::vector<double> gx(static_cast<size_t>(ns * cin), -7.0);
    plan.backward_input(g.data(), w.data(), gx.data(), cin, cout, DType::Float64);
    EXPECT_TRUE(near_all(gx, oracle_convolution(reversed, ns, g, w_transposed, cout, cin, volume), 1e-12))
        << "backward_input";
    // The adjoint identity <A x, g> = <x, A^T g>.
    EXPECT_NEAR(dot(y, g), dot(x, gx), 1e-10 * (1.0 + std::abs(dot(y, g))));

    // Weight gradient: d<A_W x, g>/dW[co, ci, t] = sum over tap-t edges of g[target, co] x[source, ci].
    std::vector<long double> expected_gw(w.size(), 0.0L);
    for (const Edge& e : edges)
        for (int64_t co = 0; co < cout; ++co)
            for (int64_t ci = 0; ci < cin; ++ci)
                expected_gw[(co * cin + ci) * volume + e.tap] += static_cast<long double>(g[e.target * cout + co]) *
                    x[e.source * cin + ci];
    std::vector<double> gw(w.size(), -7.0);
    plan.backward_weight(x.data(), g.data(), gw.data(), cin, cout, DType::Float64);
    EXPECT_TRUE(near_all(gw, std::vector<double>(expected_gw.begin(), expected_gw.end()), 1e-12)) << "backward_weight";
}

TEST(Convolution, ForwardPlansMatchScatterOracle) {
    for (std::size_t index = 0; index < test_seeds().size(); ++index) {
        const uint64_t seed = test_seeds()[index] + 9000;
        SCOPED_TRACE("seed " + std::to_string(seed));
        Rng rng(seed);
        const GridBatch grid = random_grid(seed, 1 + static_cast<int64_t>(index % 5));
        for (const auto& [k, s] : kConvCases) {
            SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
            const ConvolutionPlan plan = ConvolutionPlan::make(grid, k, s);
            EXPECT_TRUE(grid_is_well_formed(plan.target_grid(), sparsegrid::Device::cpu()));
            check_plan(plan, rng);
        }
    }
}

TEST(Convolution, TransposedPlansMatchScatterOracle) {
    for (std::size_t index = 0; index < test_seeds().size(); ++index) {
        const uint64_t seed = test_seeds()[index] + 9100;
        SCOPED_TRACE("seed " + std::to_string(seed));
        Rng rng(seed);
        const GridBatch grid = random_grid(seed, 1 + static_cast<int64_t>((index + 2) % 5));
        for (const auto& [k, s] : kConvCases) {
            SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
            check_plan(ConvolutionPlan::make_transposed(grid, k, s), rng);
            // The transpose of a forward plan is the transposed plan between the same two grids.
            const ConvolutionPlan forward = ConvolutionPlan::make(grid, k, s);
            const ConvolutionPlan flipped = forward.transposed();
            EXPECT_EQ(flipped.direction(), sparsegrid::MapDirection::Transposed);
            EXPECT_EQ(&flipped.source_grid().storage(), &forward.target_grid().storage());
            check_plan(flipped, rng);
            if (!forward.is_identity()) {
                EXPECT_TRUE(maps_equal(flipped.target_map(), forward.source_map()));
            }
        }
    }
}

TEST(Convolution, PlansOnGivenTargets) {
    Rng rng(4711);
    const GridBatch source = random_grid(4711, 3);
    const GridBatch other = random_grid(4712, 3);
    check_plan(ConvolutionPlan::make(source, other, {3, 3, 3}, {1, 1, 1}), rng);
    check_plan(ConvolutionPlan::make(source, other, {3, 2, 1}, {2, 1, 1}), rng);
    check_plan(ConvolutionPlan::make_transposed(source, other, {2, 2, 2}, {2, 1, 2}), rng);
}

TEST(Convolution, PlansOnTheirSourceGrid) {
    // Stride 1 and odd kernel sizes on one grid: the passes that need the map with rows = source voxels
    // read the target rows' map with the taps mirrored instead (ConvolutionPlan::mirrored_maps). Even and
    // mixed kernel sizes and both directions, against the oracle; and the mirror relation itself.
    Rng rng(4811);
    const GridBatch grid = random_grid(4811, 3);
    const std::vector<Vec3i> kernels = {{3, 3, 3}, {3, 1, 5}, {1, 3, 1}, {5, 5, 5}, {2, 2, 2}, {3, 2, 3}};
    for (const Vec3i& k : kernels) {
        SCOPED_TRACE("K=" + str(k));
        const ConvolutionPlan forward = ConvolutionPlan::make(grid, grid, k, {1, 1, 1});
        check_plan(forward, rng);
        check_plan(forward.transposed(), rng);
        check_plan(ConvolutionPlan::make_transposed(grid, grid, k, {1, 1, 1}), rng);
        if (k[0] % 2 == 1 && k[1] % 2 == 1 && k[2] % 2 == 1) {
            const std::vector<int32_t> rows_of_target = map_host(forward.target_map());
            const std::vector<int32_t> rows_of_source = map_host(forward.source_map());
            const int32_t volume = forward.kernel_volume();
            bool mirrored = rows_of_target.size() == rows_of_source.size();
            for (std::size_t n = 0; mirrored && n < rows_of_target.size(); ++n) {
                const std::size_t row = n / volume, t = n % volume;
                mirrored = rows_of_source[n] == rows_of_target[row * volume + (volume - 1 - t)];
            }
            EXPECT_TRUE(mirrored) << "the source rows' map is the target rows' map with the taps mirrored";
        }
    }
}

TEST(Convolution, PreparedPlansMatchScatterOracle) {
    // prepare() builds ahead what the executions would build on first use (the source rows' map unless
    // mirrored, the row orders on CUDA): every kind of plan, prepared before its first execution (and
    // prepared again after it), still matches the oracle.
    Rng rng(4911);
    const GridBatch grid = random_grid(4911, 4);
    for (const auto& [k, s] : kConvCases) {
        SCOPED_TRACE("K=" + str(k) + " S=" + str(s));
        const ConvolutionPlan forward = ConvolutionPlan::make(grid, k, s);
        for (const ConvolutionPlan& plan : {forward, forward.transposed(), ConvolutionPlan::make_transposed(grid, k, s),
                                            ConvolutionPlan::make(grid, grid, k, {1, 1, 1})}) {
            plan.prepare();
            check_plan(plan, rng);
            plan.prepare();
            check_plan(plan, rng);
        }
    }
}

TEST(Convolution, PlansAreKeptOnTheirSourceGrid) {
    // make() of a plan already made from the same source returns its maps (and its generated target)
    // again; other kernel sizes, strides, directions and targets get their own; entries of given targets
    // that are gone are dropped; and nothing keeps the source alive (no reference cycle).
    const GridBatch other = random_grid(4911, 2);
    std::weak_ptr<const sparsegrid::detail::GridStorage> source_alive, generated_alive;
    {
        const GridBatch source = random_grid(4910, 2);
        source_alive = source.storage().weak_from_this();
        const ConvolutionPlan a = ConvolutionPlan::make(source, {3, 3, 3}, {2, 2, 2});
        const ConvolutionPlan b = ConvolutionPlan::make(source, {3, 3, 3}, {2, 2, 2});
        EXPECT_EQ(&a.target_grid().storage(), &b.target_grid().storage());
        EXPECT_EQ(&a.target_map(), &b.target_map());
        generated_alive = a.target_grid().storage().weak_from_this();
        const ConvolutionPlan c = ConvolutionPlan::make(source, {3, 3, 3}, {1, 2, 2});
        const ConvolutionPlan d = ConvolutionPlan::make_transposed(source, {3, 3, 3}, {2, 2, 2});
        EXPECT_NE(&c.target_map(), &a.target_map());
        EXPECT_NE(&d.target_map(), &a.target_map());
        const ConvolutionPlan same = ConvolutionPlan::make(source, source, {3, 3, 3}, {1, 1, 1});
        EXPECT_EQ(&ConvolutionPlan::make(source, source, {3, 3, 3}, {1, 1, 1}).target_map(), &same.target_map());
        const ConvolutionPlan given = ConvolutionPlan::make(source, other, {3, 3, 3}, {1, 1, 1});
        EXPECT_EQ(&ConvolutionPlan::make(source, other, {3, 3, 3}, {1, 1, 1}).target_map(), &given.target_map());
        EXPECT_NE(&given.target_map(), &same.target_map());
        const std::size_t kept = source.storage().cache.plans.size();
        EXPECT_EQ(kept, 5u);
        {
            const GridBatch gone = random_grid(4912, 2);
            ConvolutionPlan::make(source, gone, {3, 3, 3}, {1, 1, 1});
            EXPECT_EQ(source.storage().cache.plans.size(), kept + 1);
        }
        ConvolutionPlan::make(source, other, {1, 3, 1}, {1, 1, 1});  // drops the entry of `gone`
        EXPECT_EQ(source.storage().cache.plans.size(), kept + 1);
        // The kept plans compute what fresh ones do (the same maps).
        Rng rng(4913);
        check_plan(ConvolutionPlan::make(source, {3, 3, 3}, {2, 2, 2}), rng);
        check_plan(ConvolutionPlan::make(source, other, {3, 3, 3}, {1, 1, 1}), rng);
    }
    EXPECT_TRUE(source_alive.expired()) << "the source grid outlived every handle";
    EXPECT_TRUE(generated_alive.expired()) << "the generated target outlived its source and plans";
}

TEST(Convolution, IdentityPlanIsAMatrixProduct) {
    Rng rng(99);
    const GridBatch grid = random_grid(99, 4);
    const ConvolutionPlan plan = ConvolutionPlan::make(grid, grid, {1, 1, 1}, {1, 1, 1});
    EXPECT_TRUE(plan.is_identity());
    EXPECT_THROW(plan.target_map(), sparsegrid::Error);
    check_plan(plan, rng);
}

TEST(Convolution, AllOnesWeightsGiveEachOutputItsDegree) {
    std::vector<Vec3i> line;
    for (int32_t i = 0; i < 16; ++i) line.push_back({i, 0, 0});
    const GridBatch grid = GridBatch::from_ijk({line, {}});
    const ConvolutionPlan plan = ConvolutionPlan::make(grid, {4, 1, 1}, {4, 1, 1});
    const std::vector<float> x(16, 1.0f), w(4, 1.0f);
    std::vector<float> y(static_cast<size_t>(plan.target_grid().num_voxels()));
    plan.forward(x.data(), w.data(), y.data(), 1, 1, DType::Float32);
    EXPECT_EQ(y, (std::vector<float>{3, 4, 4, 4, 1}));
}

TEST(Convolution, Float32AgreesWithFloat64AndIsDeterministic) {
    Rng rng(2024);
    const GridBatch grid = random_grid(2024, 6);
    const ConvolutionPlan plan = ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1});
    const int64_t cin = 8, cout = 5, ns = grid.num_voxels(), nt = plan.target_grid().num_voxels();
    const std::vector<double> x = random_values(rng, ns * cin), w = random_values(rng, cout * cin * 27);
    std::vector<double> y64(static_cast<size_t>(nt * cout));
    plan.forward(x.data(), w.data(), y64.data(), cin, cout, DType::Float64);
    const std::vector<float> x32(x.begin(), x.end()), w32(w.begin(), w.end());
    std::vector<float> first(static_cast<size_t>(nt * cout)), again(first.size()), one_thread(first.size());
    plan.forward(x32.data(), w32.data(), first.data(), cin, cout, DType::Float32);
    plan.forward(x32.data(), w32.data(), again.data(), cin, cout, DType::Float32);
    const int threads = sparsegrid::cpu_threads();
    sparsegrid::set_cpu_threads(1);
    plan.forward(x32.data(), w32.data(), one_thread.data(), cin, cout, DType::Float32);
    sparsegrid::set_cpu_threads(0);
    EXPECT_GE(threads, 1);
    EXPECT_EQ(first, again);
    EXPECT_EQ(first, one_thread);
    EXPECT_TRUE(near_all(std::vector<double>(first.begin(), first.end()), y64, 1e-5));
    // The weight gradient is a fixed-order reduction too.
    const std::vector<float> g(static_cast<size_t>(nt * cout), 0.5f);
    std::vector<float> gw1(w32.size()), gw2(w32.size());
    plan.backward_weight(x32.data(), g.data(), gw1.data(), cin, cout, DType::Float32);
    sparsegrid::set_cpu_threads(1);
    plan.backward_weight(x32.data(), g.data(), gw2.data(), cin, cout, DType::Float32);
    sparsegrid::set_cpu_threads(0);
    EXPECT_EQ(gw1, gw2);
}

TEST(Convolution, WeightGradientIndependentOfThreadCount) {
    // Channel blocks per tap depend on the thread count; every count must cover the channels exactly.
    Rng rng(31);
    const GridBatch grid = GridBatch::from_ijk(sparsegrid::synthetic_surface_batch(8, 48, 31));  // parallel sizes
    for (const ConvolutionPlan& plan :
         {ConvolutionPlan::make(grid, grid, {1, 1, 1}, {1, 1, 1}), ConvolutionPlan::make(grid, {2, 2, 2}, {2, 2, 2})}) {
        const int64_t cin = 3, cout = 70, volume = plan.kernel_volume();
        const std::vector<double> x = random_values(rng, plan.source_grid().num_voxels() * cin);
        const std::vector<double> g = random_values(rng, plan.target_grid().num_voxels() * cout);
        std::vector<double> reference(static_cast<size_t>(cout * cin * volume));
        sparsegrid::set_cpu_threads(1);
        plan.backward_weight(x.data(), g.data(), reference.data(), cin, cout, DType::Float64);
        for (const int threads : {2, 3, 16, 40}) {
            sparsegrid::set_cpu_threads(threads);
            std::vector<double> gw(reference.size(), -7.0);
            plan.backward_weight(x.data(), g.data(), gw.data(), cin, cout, DType::Float64);
            EXPECT_EQ(gw, reference) << threads << " threads";
        }
        sparsegrid::set_cpu_threads(0);
    }
}

TEST(Convolution, BadArgumentsRaise) {
    const GridBatch grid = random_grid(5, 2);
    const ConvolutionPlan plan = ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1});
    std::vector<float> x(static_cast<size_t>(grid.num_voxels() * 2)), w(2 * 2 * 27),
        y(static_cast<size_t>(plan.target_grid().num_voxels() * 2));
    EXPECT_TRUE(throws_error([&] { plan.forward(x.data(), w.data(), y.data(), 0, 2, DType::Float32); },
                             "ConvolutionPlan::forward", {"in_channels"}));
    EXPECT_TRUE(throws_error([&] { plan.forward(x.data(), w.data(), y.data(), 2, -1, DType::Float32); },
                             "ConvolutionPlan::forward", {"out_channels"}));
    EXPECT_TRUE(throws_error([&] { plan.forward(nullptr, w.data(), y.data(), 2, 2, DType::Float32); },
                             "ConvolutionPlan::forward", {"input"}));
    EXPECT_TRUE(throws_error([&] { plan.backward_weight(x.data(), y.data(), nullptr, 2, 2, DType::Float32); },
                             "ConvolutionPlan::backward_weight", {"grad_weight"}));
    EXPECT_TRUE(throws_error(
        [&] {
            ConvolutionPlan::make(grid, {3, 0, 3}, {1, 1, 1});
        },
        "ConvolutionPlan::make", {"kernel_size"}));
    EXPECT_TRUE(throws_error([&] { plan.forward(x.data(), w.data(), y.data(), 2, 2, DType::Float16); },
                             "ConvolutionPlan::forward", {"float16", "CUDA only"}));
    EXPECT_TRUE(throws_error([&] { plan.forward(x.data(), w.data(), y.data(), 2, 2, static_cast<DType>(9)); },
                             "ConvolutionPlan::forward", {"dtype", "9"}));
    // Float32 weights go with float16 / bfloat16 features only (which run on CUDA).
    const sparsegrid::Context& ctx = grid.context();
    EXPECT_TRUE(
        throws_error([&] { plan.forward(x.data(), w.data(), y.data(), 2, 2, DType::Float64, DType::Float32, ctx); },
                     "ConvolutionPlan::forward", {"weight_dtype", "float64", "float32"}));
    EXPECT_TRUE(throws_error(
        [&] { plan.backward_input(y.data(), w.data(), x.data(), 2, 2, DType::Float32, DType::Float16, ctx); },
        "ConvolutionPlan::backward_input", {"weight_dtype", "float16"}));
    EXPECT_TRUE(throws_error(
        [&] { plan.backward_weight(x.data(), y.data(), w.data(), 2, 2, DType::Float32, DType::Float64, ctx); },
        "ConvolutionPlan::backward_weight", {"weight_dtype", "float64"}));
    EXPECT_TRUE(
        throws_error([&] { plan.forward(x.data(), w.data(), y.data(), 2, 2, DType::BFloat16, DType::Float32, ctx); },
                     "ConvolutionPlan::forward", {"bfloat16", "CUDA only"}));
    EXPECT_TRUE(throws_error(
        [&] { plan.forward(x.data(), w.data(), y.data(), 2, 2, DType::Float32, static_cast<DType>(7), ctx); },
        "ConvolutionPlan::forward", {"weight_dtype", "7"}));
    // The plain execution through the mixed overload.
    std::vector<float> y_plain = y, y_same = y;
    plan.forward(x.data(), w.data(), y_plain.data(), 2, 2, DType::Float32);
    plan.forward(x.data(), w.data(), y_same.data(), 2, 2, DType::Float32, DType::Float32, ctx);
    EXPECT_EQ(y_plain, y_same);
}

}  // namespace
}  // namespace sparsegrid_test
