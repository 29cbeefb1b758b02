// `sparsegrid bench`: times every topology operation and kernel map of the library on one batch, next
// to a naive single-threaded reference measured in the same run, and checks each result against it.
#pragma once

#include <sparsegrid/grid_batch.h>
#include <sparsegrid/types.h>

#include <cstdint>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

namespace sparsegrid_tool {

/// A bad command line: the tool prints the message and its usage and exits with status 2.
class UsageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

struct BenchOptions {
    int64_t batch_size = 16;  ///< synthetic batch only
    int32_t resolution = 64;  ///< synthetic batch only
    uint64_t seed = 0;        ///< synthetic batch only
    std::string input_path;   ///< non-empty: read the batch from this file instead
    int64_t members = -1;     ///< with input_path: the first `members` members; -1 = all
    int repeats = 15;
    int warmup = 2;
    sparsegrid::Device device = sparsegrid::Device::cpu();
    int threads = 0;  ///< OpenMP threads; 0 = OpenMP's default
    std::string json_path;
    bool check = true;                           ///< compare every result with the naive reference
    bool as_one_member = false;                  ///< merge all members side by side into one member
    std::vector<int64_t> channels{32, 64, 128};  ///< conv: channel counts (in = out)
    std::string dtype = "float32";               ///< conv: float32, float64, float16 or bfloat16
    bool tf32 = false;                           ///< conv: float32 on tensor cores (TF32)
    bool engine_sweep = false;                   ///< conv: every engine configuration against "off"
};

/// The batch the options describe (synthetic, or the first members of the input file), and a
/// one-line description of it.
std::vector<std::vector<sparsegrid::Vec3i>> load_members(const BenchOptions& options, std::string& description);

/// Runs the benchmark and prints its report to `out`. Throws UsageError for option values that turn
/// out invalid only once the input is read (--members larger than the file), sparsegrid::Error on
/// other failures (for example --device cuda without the CUDA backend). Returns the process exit
/// code: 0, or 1 when a result differs from the naive reference.
int run_bench(const BenchOptions& options, std::ostream& out);

/// `sparsegrid conv`: times plan construction and the three executions of a submanifold k3s1 convolution and a
/// generative k2s2 transposed convolution on the batch, per channel count. Returns 0.
int run_conv_bench(const BenchOptions& options, std::ostream& out);

}  // namespace sparsegrid_tool
