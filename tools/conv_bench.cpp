// `sparsegrid conv`: the convolution kernels on their own, without a framework around them. For a
// submanifold k3s1 convolution (the batch's grid onto itself) and the generative k2s2 transposed
// convolution from it, per channel count (in = out = C): plan construction (maps and execution order, on
// a fresh grid each time), forward, input gradient and weight gradient, median of the timed runs on the
// device's stream, and the executions' host time (until the call returns). FLOP counts are those of the
// edges (2 * edges * C * C per execution), so rates compare with a dense GEMM of the same work.
#include "bench.h"

#include <sparsegrid/convolution.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <ostream>
#include <random>

namespace sparsegrid_tool {

namespace {

using sparsegrid::Buffer;
using sparsegrid::Context;
using sparsegrid::ConvolutionPlan;
using sparsegrid::DType;
using sparsegrid::GridBatch;

double median(std::vector<double> samples) {
    std::sort(samples.begin(), samples.end());
    const std::size_t n = samples.size();
    return n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
}

/// Median ms of `repeats` runs on the device's stream after `warmup` runs; with `host_us`, also the
/// median microseconds until run_once() returned (on CUDA the host's time to queue the work, on the CPU
/// the whole run).
double median_ms(const Context& context, int warmup, int repeats, const std::function<void()>& run_once,
                 double* host_us = nullptr) {
    for (int i = 0; i < warmup; ++i) run_once();
    sparsegrid::synchronize(context);
    sparsegrid::StreamTimer timer(context);
    std::vector<double> samples, host;
    for (int i = 0; i < repeats; ++i) {
        timer.start();
        const auto begin = std::chrono::steady_clock::now();
        run_once();
        host.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - begin).count());
        samples.push_back(timer.stop_ms());
    }
    if (host_us) *host_us = median(host);
    return median(samples);
}

DType parse_dtype(const std::string& name) {
    if (name == "float32") return DType::Float32;
    if (name == "float64") return DType::Float64;
    if (name == "float16") return DType::Float16;
    if (name == "bfloat16") return DType::BFloat16;
    throw UsageError("conv: --dtype must be float32, float64, float16 or bfloat16, got '" + name + "'");
}

/// `count` elements of `dtype` with values in [-1, 1] on the context's device.
Buffer<uint8_t> random_values(int64_t count, DType dtype, const Context& context, std::mt19937_64& rng) {
    const int64_t size = sparsegrid::dtype_size(dtype);
    std::vector<uint8_t> host(static_cast<std::size_t>(count * size));
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int64_t i = 0; i < count; ++i) {
        const float value = uniform(rng);
        uint8_t* dst = host.data() + i * size;
        if (dtype == DType::Float64) {
            const double wide = value;
            std::memcpy(dst, &wide, 8);
        } else if (dtype == DType::Float32) {
            std::memcpy(dst, &value, 4);
        } else {
            // Values are multiples of 1/8 written exactly in either 16-bit format.
            const float rounded = static_cast<float>(static_cast<int>(value * 8.0f)) / 8.0f;
            uint32_t bits = 0;
            std::memcpy(&bits, &rounded, 4);
            uint16_t half = 0;
            if (dtype == DType::BFloat16) {
                half = static_cast<uint16_t>(bits >> 16);
            } else if (rounded != 0.0f) {
                const uint32_t sign = (bits >> 16) & 0x8000u;
                const uint32_t exponent = ((bits >> 23) & 0xffu) - 127u + 15u;
                half = static_cast<uint16_t>(sign | (exponent << 10) | ((bits & 0x7fffffu) >> 13));
            }
            std::memcpy(dst, &half, 2);
        }
    }
    return Buffer<uint8_t>::from_host(host, context);
}

struct Layer {
    std::string name;
    std::function<ConvolutionPlan(const GridBatch&)> make;
};

std::string fixed(double value, int digits) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", digits, value);
    return text;
}

/// The bytes of a device buffer.
std::vector<uint8_t> bytes_of(const Buffer<uint8_t>& buffer, const Context& context) {
    return buffer.to_host(context.stream);
}

/// Forward, input gradient and weight gradient on "off" (the tiled kernels), every engine configuration
/// (a forward one leaves the weight gradient on its automatic choice, and the reverse) and "auto", with
/// each configuration's results compared bitwise with the first configuration's.
int engine_sweep(const BenchOptions& options, const Context& context, const GridBatch& grid,
                 const std::vector<Layer>& layers, DType dtype, std::ostream& out) {
    struct Restore {
        ~Restore() { sparsegrid::set_convolution_engine_configuration("auto"); }
    } restore;
    std::vector<std::string> configurations{"off"};
    for (const std::string& name : sparsegrid::convolution_engine_configurations()) configurations.push_back(name);
    configurations.push_back("auto");
    out << "| layer | C | configuration | forward ms | input grad ms | weight grad ms | forward TFLOP/s | "
           "forward / off | input grad / off | weight grad / off | bitwise as "
        << configurations[1] << " |\n"
        << "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
    std::mt19937_64 rng(options.seed);
    int status = 0;
    for (const Layer& layer : layers) {
        const ConvolutionPlan plan = layer.make(grid);
        plan.prepare();
        const int64_t edges = plan.target_map().num_edges();
        const int64_t rows = plan.target_grid().num_voxels(), sources = plan.source_grid().num_voxels();
        for (const int64_t c : options.channels) {
            const int64_t volume = plan.kernel_volume();
            const int64_t size = sparsegrid::dtype_size(dtype);
            const Buffer<uint8_t> x = random_values(sources * c, dtype, context, rng);
            const Buffer<uint8_t> w = random_values(c * c * volume, dtype, context, rng);
            const Buffer<uint8_t> g = random_values(rows * c, dtype, context, rng);
            const Buffer<uint8_t> y = Buffer<uint8_t>::allocate(rows * c * size, context);
            const Buffer<uint8_t> gx = Buffer<uint8_t>::allocate(sources * c * size, context);
            const Buffer<uint8_t> gw = Buffer<uint8_t>::allocate(c * c * volume * size, context);
            double off[3] = {0.0, 0.0, 0.0};
            std::vector<uint8_t> first[3];
            for (const std::string& configuration : configurations) {
                sparsegrid::set_convolution_engine_configuration(configuration);
                const double ms[3] = {
                    median_ms(context, options.warmup, options.repeats,
                              [&] { plan.forward(x.data(), w.data(), y.data(), c, c, dtype, context); }),
                    median_ms(context, options.warmup, options.repeats,
                              [&] { plan.backward_input(g.data(), w.data(), gx.data(), c, c, dtype, context); }),
                    median_ms(context, options.warmup, options.repeats,
                              [&] { plan.backward_weight(x.data(), g.data(), gw.data(), c, c, dtype, context); })};
                const std::vector<uint8_t> results[3] = {bytes_of(y, context), bytes_of(gx, context),
                                                         bytes_of(gw, context)};
                std::string same;
                if (configuration == "off") {
                    std::copy(ms, ms + 3, off);
                } else if (first[0].empty()) {
                    for (int i = 0; i < 3; ++i) first[i] = results[i];
                    same = "yes";
                } else {
                    const bool equal = results[0] == first[0] && results[1] == first[1] && results[2] == first[2];
                    same = equal ? "yes" : "NO";
                    if (!equal) status = 1;
                }
                const double flops = 2.0 * static_cast<double>(edges) * static_cast<double>(c * c);
                out << "| " << layer.name << " | " << c << " | " << configuration << " | " << fixed(ms[0], 3) << " | "
                    << fixed(ms[1], 3) << " | " << fixed(ms[2], 3) << " | " << fixed(flops / ms[0] / 1e9, 1) << " | "
                    << fixed(ms[0] / off[0], 2) << " | " << fixed(ms[1] / off[1], 2) << " | "
                    << fixed(ms[2] / off[2], 2) << " | " << same << " |\n";
            }
        }
    }
    return status;
}

}  // namespace

int run_conv_bench(const BenchOptions& options, std::ostream& out) {
    std::string description;
    const std::vector<std::vector<sparsegrid::Vec3i>> members = load_members(options, description);
    Context context;
    context.device = options.device;
    if (options.threads > 0) sparsegrid::set_cpu_threads(options.threads);
    const DType dtype = parse_dtype(options.dtype);
    if (context.device.is_cpu() && (dtype == DType::Float16 || dtype == DType::BFloat16))
        throw UsageError("conv: --dtype " + options.dtype + " runs on CUDA only; use --device cuda");
    if (options.tf32 && (context.device.is_cpu() || dtype != DType::Float32))
        throw UsageError("conv: --tf32 needs --dtype float32 and --device cuda");
    if (options.engine_sweep && context.device.is_cpu()) throw UsageError("conv: --configs needs --device cuda");
    context.allow_tf32 = options.tf32;
    const GridBatch grid = GridBatch::from_ijk(members, {}, context);
    const std::vector<Layer> layers{
        {"k3s1 submanifold",
         [](const GridBatch& g) {
             return ConvolutionPlan::make(g, g, {3, 3, 3}, {1, 1, 1});
         }},
        {"k2s2 generative transposed",
         [](const GridBatch& g) {
             return ConvolutionPlan::make_transposed(g, {2, 2, 2}, {2, 2, 2});
         }},
    };
    out << "batch:    " << description << ", " << grid.num_voxels() << " voxels\n"
        << "device:   " << context.device.str() << ", " << options.dtype << (options.tf32 ? " (TF32)" : "") << "\n"
        << "timing:   median of " << options.repeats << " runs after " << options.warmup
        << " warm-up runs; plan = maps + execution order (the generative plan: its grid too) on a fresh grid;"
        << " host us = until the call returned\n\n";
    if (options.engine_sweep) return engine_sweep(options, context, grid, layers, dtype, out);
    out << "| layer | C | target rows | edges | plan ms | forward ms | input grad ms | weight grad ms | "
           "fwd+bwd ms | forward TFLOP/s | fwd+bwd TFLOP/s | host us fwd / in / w |\n"
        << "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    std::mt19937_64 rng(options.seed);
    for (const Layer& layer : layers) {
        // A plan is kept on its source grid (make() of the same plan finds it), so each timed
        // construction gets a grid of its own, built beforehand from the same voxels.
        std::vector<GridBatch> fresh;
        for (int i = 0; i < options.warmup + options.repeats; ++i)
            fresh.push_back(GridBatch::from_ijk(members, {}, context));
        std::size_t next = 0;
        const double plan_ms = median_ms(context, options.warmup, options.repeats, [&] {
            const ConvolutionPlan plan = layer.make(fresh[next++]);
            plan.prepare();
        });
        fresh.clear();
        const ConvolutionPlan plan = layer.make(grid);
        plan.prepare();
        const int64_t edges = plan.target_map().num_edges();
        const int64_t rows = plan.target_grid().num_voxels(), sources = plan.source_grid().num_voxels();
        for (const int64_t c : options.channels) {
            const int64_t volume = plan.kernel_volume();
            const Buffer<uint8_t> x = random_values(sources * c, dtype, context, rng);
            const Buffer<uint8_t> w = random_values(c * c * volume, dtype, context, rng);
            const Buffer<uint8_t> g = random_values(rows * c, dtype, context, rng);
            const Buffer<uint8_t> y = Buffer<uint8_t>::allocate(rows * c * sparsegrid::dtype_size(dtype), context);
            const Buffer<uint8_t> gx = Buffer<uint8_t>::allocate(sources * c * sparsegrid::dtype_size(dtype), context);
            const Buffer<uint8_t> gw = Buffer<uint8_t>::allocate(c * c * volume * sparsegrid::dtype_size(dtype),
                                                                 context);
            double host[3] = {0.0, 0.0, 0.0};
            const double forward = median_ms(
                context, options.warmup, options.repeats,
                [&] { plan.forward(x.data(), w.data(), y.data(), c, c, dtype, context); }, &host[0]);
            const double input_grad = median_ms(
                context, options.warmup, options.repeats,
                [&] { plan.backward_input(g.data(), w.data(), gx.data(), c, c, dtype, context); }, &host[1]);
            const double weight_grad = median_ms(
                context, options.warmup, options.repeats,
                [&] { plan.backward_weight(x.data(), g.data(), gw.data(), c, c, dtype, context); }, &host[2]);
            const double flops = 2.0 * static_cast<double>(edges) * static_cast<double>(c * c);
            const double total = forward + input_grad + weight_grad;
            out << "| " << layer.name << " | " << c << " | " << rows << " | " << edges << " | " << fixed(plan_ms, 3)
                << " | " << fixed(forward, 3) << " | " << fixed(input_grad, 3) << " | " << fixed(weight_grad, 3)
                << " | " << fixed(total, 3) << " | " << fixed(flops / forward / 1e9, 3) << " | "
                << fixed(3.0 * flops / total / 1e9, 3) << " | " << fixed(host[0], 1) << " / " << fixed(host[1], 1)
                << " / " << fixed(host[2], 1) << " |\n";
        }
    }
    return 0;
}

}  // namespace sparsegrid_tool
