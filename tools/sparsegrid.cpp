// The `sparsegrid` command-line tool: benchmarks, voxel batch files.
//
// Exit status: 0 success, 1 failure (an error, or a benchmark result differing from the reference),
// 2 bad command line.
#include "bench.h"

#include <sparsegrid/io.h>
#include <sparsegrid/mesh_io.h>
#include <sparsegrid/shapes.h>
#include <sparsegrid/types.h>
#include <sparsegrid/version.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <iostream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

namespace sparsegrid_tool {

namespace {

constexpr int kExitSuccess = 0;
constexpr int kExitFailure = 1;
constexpr int kExitUsage = 2;

constexpr int64_t kMaxBatchSize = int64_t{1} << 20;
constexpr int64_t kMaxRepeats = 100000;
constexpr int64_t kMaxThreads = 4096;

void print_usage(std::ostream& out) {
    out << "usage: sparsegrid <command> [options]\n"
           "\n"
           "commands:\n"
           "  bench      time the topology operations and kernel maps on a batch of voxel grids\n"
           "  conv       time convolution plans and executions (k3s1, generative k2s2) on a batch\n"
           "  info       per-member voxel counts and bounding boxes of a voxel batch file\n"
           "  generate   write a synthetic batch of surface voxels to a voxel batch file\n"
           "  mesh       load triangle mesh files (load_mesh) and report their sizes or the error\n"
           "  help       print this message\n"
           "  --version  print the library version\n"
           "\n"
           "sparsegrid bench [options]\n"
           "  --batch B          synthetic batch size (default 16)\n"
           "  --resolution R     synthetic grid resolution in [1, 4096] (default 64)\n"
           "  --seed S           synthetic batch seed (default 0)\n"
           "  --input FILE       use the members of a voxel batch file instead of a synthetic batch\n"
           "  --members N        with --input: only the first N members (default: all)\n"
           "  --repeats N        timed runs per operation (default 15)\n"
           "  --warmup N         untimed runs before timing (default 2)\n"
           "  --device cpu|cuda  backend to run on (default cpu)\n"
           "  --threads T        OpenMP threads (default: OpenMP's default)\n"
           "  --json FILE        also write the rows as JSON\n"
           "  --no-check         do not compare the results with the naive reference\n"
           "  --as-one-member    place all members side by side (along i) in one member: the same voxels\n"
           "                     and work, to measure what a batch costs over one large grid\n"
           "\n"
           "sparsegrid conv [options]\n"
           "  the batch, --repeats, --warmup, --device and --threads options of bench, and\n"
           "  --channels C,...   channel counts, in = out (default 32,64,128)\n"
           "  --dtype T          float32 (default), float64, float16 or bfloat16 (16-bit: CUDA only)\n"
           "  --tf32             float32 on tensor cores (TF32, CUDA)\n"
           "  --configs          forward, input and weight gradient on every configuration of the\n"
           "                     tensor-core engine, against the tiled kernels (\"off\") and the\n"
           "                     automatic choice, with the results compared bitwise\n"
           "\n"
           "sparsegrid info FILE\n"
           "sparsegrid generate --output FILE [--batch B] [--resolution R] [--seed S]\n"
           "\n"
           "sparsegrid mesh FILE...\n"
           "  exit status 1 when a file cannot be loaded (each error is printed)\n"
           "\n"
           "Voxel batch files: line 1 the member count B, line 2 the B+1 member offsets, then one\n"
           "\"i j k\" line per voxel, member-major (see data/README.md).\n";
}

// ---- command-line parsing ------------------------------------------------------------------------

/// Reads "--name value", "--name=value" and "--flag" options of one command, in order.
class OptionReader {
public:
    OptionReader(std::string command, std::vector<std::string> args)
        : m_command(std::move(command)), m_args(std::move(args)) {}

    /// The next option name (with its dashes), or nullopt at the end. Positional arguments are
    /// returned as they are (no leading "--").
    std::optional<std::string> next() {
        if (m_position >= m_args.size()) return std::nullopt;
        std::string arg = m_args[m_position++];
        m_inline_value.reset();
        const std::size_t equals = arg.find('=');
        if (arg.rfind("--", 0) == 0 && equals != std::string::npos) {
            m_inline_value = arg.substr(equals + 1);
            arg.resize(equals);
        }
        m_current = arg;
        return arg;
    }

    std::string value() {
        if (m_inline_value) return *m_inline_value;
        if (m_position >= m_args.size()) fail("option " + m_current + " needs a value");
        return m_args[m_position++];
    }

    /// For options without a value.
    void expect_no_value() const {
        if (m_inline_value) fail("option " + m_current + " takes no value, got '" + *m_inline_value + "'");
    }

    int64_t integer_value(int64_t lo, int64_t hi) {
        const std::string text = value();
        int64_t parsed = 0;
        const auto [end, status] = std::from_chars(text.data(), text.data() + text.size(), parsed);
        if (status != std::errc() || end != text.data() + text.size() || parsed < lo || parsed > hi)
            fail(m_current + " must be an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" +
                 text + "'");
        return parsed;
    }

    uint64_t unsigned_value() {
        const std::string text = value();
        uint64_t parsed = 0;
        const auto [end, status] = std::from_chars(text.data(), text.data() + text.size(), parsed);
        if (status != std::errc() || end != text.data() + text.size())
            fail(m_current + " must be an integer in [0, 2^64), got '" + text + "'");
        return parsed;
    }

    [[noreturn]] void fail(const std::string& problem) const { throw UsageError(m_command + ": " + problem); }
    [[noreturn]] void unknown(const std::string& arg) const {
        fail(arg.rfind("-", 0) == 0 ? "unknown option '" + arg + "'" : "unexpected argument '" + arg + "'");
    }

private:
    std::string m_command;
    std::vector<std::string> m_args;
    std::size_t m_position = 0;
    std::string m_current;
    std::optional<std::string> m_inline_value;
};

sparsegrid::Device parse_device(OptionReader& reader) {
    const std::string name = reader.value();
    if (name == "cpu") return sparsegrid::Device::cpu();
    if (name == "cuda") return sparsegrid::Device::cuda();
    reader.fail("--device must be cpu or cuda, got '" + name + "'");
}

/// Options that only make sense for one batch source must not be mixed with the other.
void check_batch_source(const OptionReader& reader, const BenchOptions& options, bool synthetic_option_given) {
    if (!options.input_path.empty() && synthetic_option_given)
        reader.fail("--batch, --resolution and --seed describe a synthetic batch; with --input use --members");
    if (options.input_path.empty() && options.members >= 0) reader.fail("--members needs --input");
}

BenchOptions parse_bench_options(const std::string& command, const std::vector<std::string>& args) {
    OptionReader reader(command, args);
    BenchOptions options;
    bool synthetic_option_given = false;
    while (const auto option = reader.next()) {
        if (*option == "--batch") {
            options.batch_size = reader.integer_value(1, kMaxBatchSize);
            synthetic_option_given = true;
        } else if (*option == "--resolution") {
            options.resolution = static_cast<int32_t>(reader.integer_value(1, sparsegrid::kMaxShapeResolution));
            synthetic_option_given = true;
        } else if (*option == "--seed") {
            options.seed = reader.unsigned_value();
            synthetic_option_given = true;
        } else if (*option == "--input") {
            options.input_path = reader.value();
        } else if (*option == "--members") {
            options.members = reader.integer_value(1, kMaxBatchSize);
        } else if (*option == "--repeats") {
            options.repeats = static_cast<int>(reader.integer_value(1, kMaxRepeats));
        } else if (*option == "--warmup") {
            options.warmup = static_cast<int>(reader.integer_value(0, kMaxRepeats));
        } else if (*option == "--device") {
            options.device = parse_device(reader);
        } else if (*option == "--threads") {
            options.threads = static_cast<int>(reader.integer_value(1, kMaxThreads));
        } else if (*option == "--json") {
            options.json_path = reader.value();
        } else if (*option == "--as-one-member") {
            reader.expect_no_value();
            options.as_one_member = true;
        } else if (command == "conv" && *option == "--channels") {
            options.channels.clear();
            const std::string text = reader.value();
            std::size_t start = 0;
            while (start <= text.size()) {
                const std::size_t comma = std::min(text.find(',', start), text.size());
                const std::string item = text.substr(start, comma - start);
                int64_t value = 0;
                const auto [end, status] = std::from_chars(item.data(), item.data() + item.size(), value);
                if (item.empty() || status != std::errc() || end != item.data() + item.size() || value < 1 ||
                    value > 4096)
                    reader.fail("--channels must be a comma-separated list of integers in [1, 4096], got '" + text +
                                "'");
                options.channels.push_back(value);
                start = comma + 1;
            }
        } else if (command == "conv" && *option == "--dtype") {
            options.dtype = reader.value();
        } else if (command == "conv" && *option == "--tf32") {
            reader.expect_no_value();
            options.tf32 = true;
        } else if (command == "conv" && *option == "--configs") {
            reader.expect_no_value();
            options.engine_sweep = true;
        } else if (*option == "--no-check") {
            reader.expect_no_value();
            options.check = false;
        } else {
            reader.unknown(*option);
        }
    }
    check_batch_source(reader, options, synthetic_option_given);
    return options;
}

// ---- commands ------------------------------------------------------------------------------------

struct BoundingBox {
    sparsegrid::Vec3i lo{0, 0, 0};
    sparsegrid::Vec3i hi{-1, -1, -1};
};

BoundingBox bounding_box(const std::vector<sparsegrid::Vec3i>& voxels) {
    if (voxels.empty()) return {};
    BoundingBox box{voxels.front(), voxels.front()};
    for (const auto& v : voxels)
        for (int a = 0; a < 3; ++a) {
            box.lo[a] = std::min(box.lo[a], v[a]);
            box.hi[a] = std::max(box.hi[a], v[a]);
        }
    return box;
}

std::string format_vec(const sparsegrid::Vec3i& v) {
    return "(" + std::to_string(v[0]) + ", " + std::to_string(v[1]) + ", " + std::to_string(v[2]) + ")";
}

std::string pad_left(const std::string& text, std::size_t width) {
    return text.size() >= width ? text : std::string(width - text.size(), ' ') + text;
}

int run_info(const std::vector<std::string>& args) {
    OptionReader reader("info", args);
    std::string path;
    while (const auto arg = reader.next()) {
        if (*arg == "--input")
            path = reader.value();
        else if (arg->rfind("-", 0) != 0 && path.empty())
            path = *arg;
        else
            reader.unknown(*arg);
    }
    if (path.empty()) reader.fail("needs a voxel batch file: sparsegrid info FILE");

    const auto members = sparsegrid::read_voxel_batch(path);
    int64_t total = 0;
    std::cout << path << ": " << members.size() << " members\n"
              << "member   voxels  bounding box (lo .. hi)\n";
    for (std::size_t m = 0; m < members.size(); ++m) {
        const BoundingBox box = bounding_box(members[m]);
        const std::string extent = members[m].empty() ? "empty" : format_vec(box.lo) + " .. " + format_vec(box.hi);
        std::cout << pad_left(std::to_string(m), 6) << "  " << pad_left(std::to_string(members[m].size()), 7) << "  "
                  << extent << '\n';
        total += static_cast<int64_t>(members[m].size());
    }
    std::cout << "total voxels: " << total << '\n';
    return kExitSuccess;
}

int run_generate(const std::vector<std::string>& args) {
    OptionReader reader("generate", args);
    int64_t batch_size = 16;
    int32_t resolution = 64;
    uint64_t seed = 0;
    std::string output_path;
    while (const auto option = reader.next()) {
        if (*option == "--batch")
            batch_size = reader.integer_value(0, kMaxBatchSize);
        else if (*option == "--resolution")
            resolution = static_cast<int32_t>(reader.integer_value(1, sparsegrid::kMaxShapeResolution));
        else if (*option == "--seed")
            seed = reader.unsigned_value();
        else if (*option == "--output")
            output_path = reader.value();
        else
            reader.unknown(*option);
    }
    if (output_path.empty()) reader.fail("needs --output FILE");

    const auto members = sparsegrid::synthetic_surface_batch(batch_size, resolution, seed);
    sparsegrid::write_voxel_batch(output_path, members);
    int64_t total = 0;
    for (const auto& member : members) total += static_cast<int64_t>(member.size());
    std::cout << "wrote " << members.size() << " members, " << total << " voxels to " << output_path << '\n';
    return kExitSuccess;
}

/// Loads each file with load_mesh and prints its vertex and triangle counts; exit status 1 when a file
/// raised (its error printed). scripts/mesh-fuzz.sh runs this on every file of a corpus in a child
/// process of its own.
int run_mesh(const std::vector<std::string>& args) {
    OptionReader reader("mesh", args);
    std::vector<std::string> paths;
    while (const auto arg = reader.next()) {
        if (arg->rfind("-", 0) == 0) reader.unknown(*arg);
        paths.push_back(*arg);
    }
    if (paths.empty()) reader.fail("needs mesh files: sparsegrid mesh FILE...");
    int status = kExitSuccess;
    for (const std::string& path : paths) {
        try {
            const sparsegrid::TriangleMesh mesh = sparsegrid::load_mesh(path);
            std::cout << path << ": " << mesh.vertices.size() << " vertices, " << mesh.faces.size() << " triangles\n";
        } catch (const sparsegrid::Error& error) {
            std::cout << path << ": error: " << error.what() << '\n';
            status = kExitFailure;
        }
    }
    return status;
}

bool is_help_flag(const std::string& arg) { return arg == "--help" || arg == "-h"; }

int run_command(const std::vector<std::string>& args) {
    if (args.empty()) {
        print_usage(std::cout);
        return kExitSuccess;
    }
    const std::string& command = args.front();
    const std::vector<std::string> rest(args.begin() + 1, args.end());
    if (command == "help" || is_help_flag(command)) {
        print_usage(std::cout);
        return kExitSuccess;
    }
    if (command == "--version") {
        std::cout << "sparsegrid " << SPARSEGRID_VERSION_STRING
                  << "\ncuda: " << (sparsegrid::cuda_backend_available() ? "yes" : "no") << " ("
                  << sparsegrid::cuda_device_count() << " devices)\n";
        return kExitSuccess;
    }
    const bool is_command = command == "bench" || command == "conv" || command == "info" || command == "generate" ||
        command == "mesh";
    if (is_command && std::any_of(rest.begin(), rest.end(), is_help_flag)) {
        print_usage(std::cout);
        return kExitSuccess;
    }
    if (command == "bench") return run_bench(parse_bench_options(command, rest), std::cout);
    if (command == "conv") return run_conv_bench(parse_bench_options(command, rest), std::cout);
    if (command == "info") return run_info(rest);
    if (command == "generate") return run_generate(rest);
    if (command == "mesh") return run_mesh(rest);
    throw UsageError("unknown command '" + command + "'");
}

}  // namespace

}  // namespace sparsegrid_tool

int main(int argc, char** argv) {
    using namespace sparsegrid_tool;
    const std::vector<std::string> args(argv + 1, argv + argc);
    try {
        return run_command(args);
    } catch (const UsageError& error) {
        std::cerr << "sparsegrid: " << error.what() << "\n\n";
        print_usage(std::cerr);
        return kExitUsage;
    } catch (const std::exception& error) {
        std::cerr << "sparsegrid: error: " << error.what() << '\n';
        return kExitFailure;
    }
}
