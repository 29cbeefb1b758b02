// Concurrency: grids, plans and their lazily built parts used from several host threads at once. Every
// thread builds its own grids, maps and plans and runs the three convolution passes, and all threads also
// share one plan whose source-rows map and row orders are first built inside the threads. Every result
// must equal the serial one bit for bit, on each backend present (CUDA: the threads share device 0's
// legacy default stream).
#include "test_util.h"

#include <sparsegrid/convolution.h>
#include <sparsegrid/shapes.h>

#include <gtest/gtest.h>

#include <cstdio>
#include <thread>

namespace sparsegrid_test {
namespace {

using sparsegrid::Buffer;
using sparsegrid::ConvolutionPlan;
using sparsegrid::DType;

class ConcurrencyTest : public BackendTest {};
INSTANTIATE_TEST_SUITE_P(, ConcurrencyTest, ::testing::ValuesIn(available_backends()), backend_name);

constexpr int64_t kInChannels = 5;
constexpr int64_t kOutChannels = 3;

/// Everything one pass of the workload computes, on the host.
struct Outcome {
    std::vector<Vec3i> fine, coarse, upsampled;
    std::vector<int32_t> map_k3s1, map_k3s2;
    std::vector<double> forward, grad_input, grad_weight;
    std::vector<double> shared_forward, shared_grad_input, shared_grad_weight;
    bool operator==(const Outcome& o) const {
        return fine == o.fine && coarse == o.coarse && upsampled == o.upsampled && map_k3s1 == o.map_k3s1 &&
            map_k3s2 == o.map_k3s2 && forward == o.forward && grad_input == o.grad_input &&
            grad_weight == o.grad_weight && shared_forward == o.shared_forward &&
            shared_grad_input == o.shared_grad_input && shared_grad_weight == o.shared_grad_weight;
    }
};

std::vector<double> values(int64_t count, double scale) {
    std::vector<double> out(static_cast<std::size_t>(count));
    for (int64_t n = 0; n < count; ++n)
        out[static_cast<std::size_t>(n)] = scale * static_cast<double>((n * 37) % 101 - 50);
    return out;
}

/// Forward, input gradient and weight gradient of `plan` (float64) on fixed inputs, read back.
void convolve(const ConvolutionPlan& plan, const sparsegrid::Context& ctx, std::vector<double>* forward,
              std::vector<double>* grad_input, std::vector<double>* grad_weight) {
    const int64_t sources = plan.source_grid().num_voxels(), targets = plan.target_grid().num_voxels();
    const int64_t weights = kOutChannels * kInChannels * plan.kernel_volume();
    const Buffer<double> x = Buffer<double>::from_host(values(sources * kInChannels, 0.01), ctx);
    const Buffer<double> w = Buffer<double>::from_host(values(weights, 0.001), ctx);
    const Buffer<double> g = Buffer<double>::from_host(values(targets * kOutChannels, 0.1), ctx);
    const Buffer<double> out = Buffer<double>::allocate(targets * kOutChannels, ctx);
    const Buffer<double> gx = Buffer<double>::allocate(sources * kInChannels, ctx);
    const Buffer<double> gw = Buffer<double>::allocate(weights, ctx);
    plan.forward(x.data(), w.data(), out.data(), kInChannels, kOutChannels, DType::Float64);
    plan.backward_input(g.data(), w.data(), gx.data(), kInChannels, kOutChannels, DType::Float64);
    plan.backward_weight(x.data(), g.data(), gw.data(), kInChannels, kOutChannels, DType::Float64);
    *forward = out.to_host(ctx.stream);
    *grad_input = gx.to_host(ctx.stream);
    *grad_weight = gw.to_host(ctx.stream);
}

Outcome run_workload(const MemberLists& members, const ConvolutionPlan& shared, const sparsegrid::Context& ctx) {
    Outcome o;
    const GridBatch fine = GridBatch::from_ijk(members, {}, ctx);
    const GridBatch coarse = fine.conv_grid(3, 2);
    o.fine = fine.ijk_host();
    o.coarse = coarse.ijk_host();
    o.upsampled = coarse.conv_transpose_grid(2, 2).ijk_host();
    o.map_k3s1 = map_host(sparsegrid::neighbour_map(fine, fine, {3, 3, 3}, {1, 1, 1}));
    o.map_k3s2 = map_host(sparsegrid::neighbour_map(fine, coarse, {3, 3, 3}, {2, 2, 2}));
    const ConvolutionPlan own = ConvolutionPlan::make(fine, {3, 3, 3}, {2, 2, 2});
    convolve(own, ctx, &o.forward, &o.grad_input, &o.grad_weight);
    convolve(shared, ctx, &o.shared_forward, &o.shared_grad_input, &o.shared_grad_weight);
    return o;
}

TEST_P(ConcurrencyTest, ThreadsMatchTheSerialResultBitwise) {
    const uint64_t seed = 23;
    std::printf("[   SEED   ] concurrency: synthetic_surface_batch(4, 40, %llu)\n",
                static_cast<unsigned long long>(seed));
    const MemberLists members = sparsegrid::synthetic_surface_batch(4, 40, seed);
    const GridBatch grid = make_grid(members);
    // The serial reference uses a plan of its own; the threads share a fresh one whose lazy parts
    // (the source-rows map, row orders) are first built inside them.
    const Outcome serial = run_workload(members, ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1}), ctx());
    ASSERT_FALSE(serial.forward.empty());
    const ConvolutionPlan shared = ConvolutionPlan::make(grid, {3, 3, 3}, {1, 1, 1});

    constexpr int kThreads = 8;
    constexpr int kRounds = 2;
    std::vector<Outcome> outcomes(kThreads * kRounds);
    std::vector<std::string> failures(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            try {
                for (int r = 0; r < kRounds; ++r) outcomes[t * kRounds + r] = run_workload(members, shared, ctx());
            } catch (const std::exception& e) {
                failures[t] = e.what();
            }
        });
    for (std::thread& thread : threads) thread.join();
    for (int t = 0; t < kThreads; ++t) {
        EXPECT_EQ(failures[t], "") << "thread " << t;
        for (int r = 0; r < kRounds; ++r)
            EXPECT_TRUE(outcomes[t * kRounds + r] == serial) << "thread " << t << " round " << r;
    }
}

}  // namespace
}  // namespace sparsegrid_test
