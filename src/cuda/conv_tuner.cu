// The tensor-core engine's tuner: per problem shape (execution kind, dtype, channel counts, taps, rows
// within a factor of two) and device name, the configuration that ran fastest when timed once, kept for
// the process and optionally in a text file that later processes read. Every configuration gives
// bitwise the same result, so a tuned run reproduces an untuned one exactly: only speed changes.
#include "backend/backend.h"
#include "core/env.h"
#include "core/errors.h"
#include "cuda/conv_tiles.cuh"
#include "cuda/cuda_common.cuh"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

namespace sparsegrid::detail::cuda {

namespace {

/// A shape, printed as one line of the cache file (tab-separated, the device name first).
std::string shape_text(const std::string& device_name, const EngineShape& shape) {
    std::ostringstream text;
    text << device_name << '\t' << shape.kind << '\t' << shape.dtype << '\t' << shape.x_channels << '\t'
         << shape.y_channels << '\t' << shape.volume << '\t' << shape.rows_log2;
    return text.str();
}

struct Tuner {
    std::mutex mutex;
    bool configured = false;  // set by the API or, at first use, from the environment
    bool enabled = false;
    std::string file;
    std::map<std::string, std::string> choices;  // shape text -> configuration name
    /// Read without the mutex on every execution: 0 once configured with tuning off and no choice (the
    /// common case skips the lock), 1 otherwise, -1 before the environment is read.
    std::atomic<int> active{-1};

    void update_active() { active.store(enabled || !choices.empty() ? 1 : 0, std::memory_order_release); }

    void load_file() {
        std::ifstream in(file);
        std::string line;
        while (std::getline(in, line)) {
            const size_t last_tab = line.rfind('\t');
            if (last_tab == std::string::npos) continue;
            choices[line.substr(0, last_tab)] = line.substr(last_tab + 1);
        }
    }

    /// Rewrites the file with every choice (through a temporary file renamed over it, so that a reader
    /// never sees half a file).
    void save_file() const {
        const std::string temporary = file + ".tmp";
        {
            std::ofstream out(temporary, std::ios::trunc);
            if (!out) throw_error("cannot write the tuning file '", temporary, "'");
            for (const auto& [shape, name] : choices) out << shape << '\t' << name << '\n';
            if (!out) throw_error("cannot write the tuning file '", temporary, "'");
        }
        if (std::rename(temporary.c_str(), file.c_str()) != 0)
            throw_error("cannot replace the tuning file '", file, "'");
    }

    void configure_from_environment() {
        if (configured) return;
        configured = true;
        enabled = env_switch("SPARSEGRID_CONV_TUNE", false);
        file = env_string("SPARSEGRID_CONV_TUNE_FILE");
        if (!file.empty()) load_file();
    }
};

Tuner& tuner() {
    static Tuner instance;
    return instance;
}

std::string device_name(const Context& ctx) {
    cudaDeviceProp properties{};
    SPARSEGRID_CUDA_CHECK(cudaGetDeviceProperties(&properties, ctx.device.index));
    return properties.name;
}

}  // namespace

void set_engine_tuning(bool enabled, const std::string& file) {
    Tuner& t = tuner();
    std::lock_guard<std::mutex> lock(t.mutex);
    t.configured = true;
    t.enabled = enabled;
    t.file = file;
    t.choices.clear();
    if (!file.empty()) t.load_file();
    t.update_active();
}

bool engine_tuning_idle() { return tuner().active.load(std::memory_order_acquire) == 0; }

TunedConfiguration tuned_configuration(const EngineShape& shape, const std::vector<std::string>& names,
                                       const std::function<void(int)>& run, const Context& ctx) {
    Tuner& t = tuner();
    if (engine_tuning_idle()) return {kEngineAutomatic, false};
    std::lock_guard<std::mutex> lock(t.mutex);
    t.configure_from_environment();
    t.update_active();
    if (!t.enabled && t.choices.empty()) return {kEngineAutomatic, false};
    static std::map<int, std::string> names_by_device;  // device index -> name, under the tuner's mutex
    auto known = names_by_device.find(ctx.device.index);
    if (known == names_by_device.end()) known = names_by_device.emplace(ctx.device.index, device_name(ctx)).first;
    const std::string key = shape_text(known->second, shape);
    const auto found = t.choices.find(key);
    if (found != t.choices.end()) {
        const auto position = std::find(names.begin(), names.end(), found->second);
        if (position != names.end()) return {static_cast<int>(position - names.begin()), false};
    }
    if (!t.enabled) return {kEngineAutomatic, false};
    // Each candidate once to warm up, then three timed runs; the fastest median wins, and the output is
    // left as the winner writes it (run once more unless it ran last).
    const cudaStream_t stream = stream_of(ctx);
    cudaEvent_t start = nullptr, stop = nullptr;
    SPARSEGRID_CUDA_CHECK(cudaEventCreate(&start));
    SPARSEGRID_CUDA_CHECK(cudaEventCreate(&stop));
    int best = 0;
    float best_ms = 0.0f;
    try {
        for (int candidate = 0; candidate < static_cast<int>(names.size()); ++candidate) {
            run(candidate);
            float samples[3];
            for (float& sample : samples) {
                SPARSEGRID_CUDA_CHECK(cudaEventRecord(start, stream));
                run(candidate);
                SPARSEGRID_CUDA_CHECK(cudaEventRecord(stop, stream));
                SPARSEGRID_CUDA_CHECK(cudaEventSynchronize(stop));
                count_host_synchronization();
                SPARSEGRID_CUDA_CHECK(cudaEventElapsedTime(&sample, start, stop));
            }
            std::sort(samples, samples + 3);
            if (candidate == 0 || samples[1] < best_ms) {
                best = candidate;
                best_ms = samples[1];
            }
        }
    } catch (...) {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
        throw;
    }
    SPARSEGRID_CUDA_CHECK(cudaEventDestroy(start));
    SPARSEGRID_CUDA_CHECK(cudaEventDestroy(stop));
    if (best != static_cast<int>(names.size()) - 1) run(best);
    t.choices[key] = names[static_cast<size_t>(best)];
    if (!t.file.empty()) t.save_file();
    return {best, true};
}

}  // namespace sparsegrid::detail::cuda
