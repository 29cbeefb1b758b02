#include "bench.h"

#include "naive_reference.h"

#include <sparsegrid/buffer.h>
#include <sparsegrid/grid_batch.h>
#include <sparsegrid/io.h>
#include <sparsegrid/kernel_map.h>
#include <sparsegrid/shapes.h>
#include <sparsegrid/version.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <vector>

namespace sparsegrid_tool {

namespace {

using sparsegrid::Buffer;
using sparsegrid::Context;
using sparsegrid::GridBatch;
using sparsegrid::KernelMap;
using sparsegrid::MapDirection;
using sparsegrid::Span;

// The naive reference is slow (hundreds of ms per run): fewer runs still give a stable median.
constexpr int kMaxBaselineRepeats = 5;
constexpr int kMaxBaselineWarmup = 1;

const Vec3i kK1{1, 1, 1};
const Vec3i kK2{2, 2, 2};
const Vec3i kK3{3, 3, 3};

// ---- timing --------------------------------------------------------------------------------------

struct Timing {
    double median_ms = 0.0;
    double min_ms = 0.0;
};

/// Device memory the library holds through this allocator: current and peak bytes since reset().
class TrackingAllocator final : public sparsegrid::Allocator {
public:
    explicit TrackingAllocator(sparsegrid::Device device) : m_inner(sparsegrid::default_allocator(device)) {}
    void* allocate(std::size_t bytes, sparsegrid::Device device, void* stream) override {
        void* ptr = m_inner.allocate(bytes, device, stream);
        m_current += bytes;
        m_peak = std::max(m_peak, m_current);
        return ptr;
    }
    void deallocate(void* ptr, std::size_t bytes, sparsegrid::Device device, void* stream) noexcept override {
        m_inner.deallocate(ptr, bytes, device, stream);
        m_current -= bytes;
    }
    void reset_peak() { m_peak = m_current; }
    std::size_t current() const { return m_current; }
    std::size_t peak() const { return m_peak; }

private:
    sparsegrid::Allocator& m_inner;
    std::size_t m_current = 0;
    std::size_t m_peak = 0;
};

/// Median and min over `repeats` runs after `warmup` runs, timed on the context's stream (CUDA events
/// on a GPU, so asynchronous work is counted in full).
template <typename Fn>
Timing measure(const Context& context, int warmup, int repeats, Fn&& run_once) {
    for (int i = 0; i < warmup; ++i) run_once();
    sparsegrid::synchronize(context);
    sparsegrid::StreamTimer timer(context);
    std::vector<double> samples_ms;
    for (int i = 0; i < repeats; ++i) {
        timer.start();
        run_once();
        samples_ms.push_back(timer.stop_ms());
    }
    std::sort(samples_ms.begin(), samples_ms.end());
    const std::size_t n = samples_ms.size();
    const double median = n % 2 ? samples_ms[n / 2] : 0.5 * (samples_ms[n / 2 - 1] + samples_ms[n / 2]);
    return {median, samples_ms.front()};
}

// ---- the workload --------------------------------------------------------------------------------

/// Everything the cases read, built once before any timing.
struct Workload {
    std::shared_ptr<TrackingAllocator> allocator;  // every buffer of the library goes through it
    Context context;
    std::string description;
    HostBatch input;                   // input lists as given (not in voxel order), flattened
    Buffer<int32_t> input_ijk;         // the same coordinates on the device
    GridBatch grid;                    // from_ijk(input)
    HostBatch grid_host;               // grid's voxels in voxel order
    bool reference_available = false;  // the naive reference can represent this batch

    Buffer<uint8_t> even_mask;  // keeps voxels with even index ("half mask")
    Buffer<uint8_t> odd_mask;   // keeps the others
    GridBatch even_half;        // pruned_grid(even_mask)
    GridBatch odd_half;         // pruned_grid(odd_mask): merged with the even half gives `grid` again
    GridBatch coarse;           // conv_grid(2, 2): target of the k2s2 forward map
    KernelMap map_k3s1;         // same-grid k3s1 map: input of pairs_by_tap

    Span<const int32_t> input_span() const { return {input_ijk.data(), input_ijk.size()}; }
    Span<const int32_t> grid_ijk_span() const { return {grid.ijk().data(), grid.ijk().size()}; }
    void* stream() const { return context.stream; }
};

/// All members in one, member m shifted along i past the previous ones (8 voxels apart), so the
/// voxel count and every member's local structure stay the same.
std::vector<std::vector<Vec3i>> side_by_side(const std::vector<std::vector<Vec3i>>& members) {
    std::vector<Vec3i> merged;
    int64_t next_i = 0;
    for (const auto& member : members) {
        if (member.empty()) continue;
        int32_t lo = member.front()[0], hi = member.front()[0];
        for (const Vec3i& v : member) {
            lo = std::min(lo, v[0]);
            hi = std::max(hi, v[0]);
        }
        const int64_t shift = next_i - lo;
        for (const Vec3i& v : member) merged.push_back({static_cast<int32_t>(v[0] + shift), v[1], v[2]});
        next_i += int64_t{hi} - lo + 9;
    }
    return {merged};
}

std::vector<int32_t> flat_coordinates(const HostBatch& batch) {
    std::vector<int32_t> flat;
    flat.reserve(batch.voxels.size() * 3);
    for (const Vec3i& v : batch.voxels) flat.insert(flat.end(), v.begin(), v.end());
    return flat;
}

/// A pruning mask over `num_voxels` voxels: 1 where the voxel index has the given parity.
Buffer<uint8_t> parity_mask(int64_t num_voxels, int parity, const Context& context) {
    std::vector<uint8_t> mask(static_cast<std::size_t>(num_voxels));
    for (int64_t v = 0; v < num_voxels; ++v) mask[v] = (v % 2) == parity;
    return Buffer<uint8_t>::from_host(mask, context);
}

Span<const uint8_t> span_of(const Buffer<uint8_t>& mask) { return {mask.data(), mask.size()}; }

Workload make_workload(const BenchOptions& options) {
    Workload w;
    w.context.device = options.device;
    w.allocator = std::make_shared<TrackingAllocator>(options.device);
    w.context.allocator = w.allocator.get();
    std::vector<std::vector<Vec3i>> members = load_members(options, w.description);
    if (options.as_one_member) {
        members = side_by_side(members);
        w.description += ", side by side in one member";
    }
    w.input = flatten(members);
    w.input_ijk = Buffer<int32_t>::from_host(flat_coordinates(w.input), w.context);
    w.grid = GridBatch::from_ijk(w.input_span(), w.input.offsets, {}, w.context);
    w.grid_host = host_copy(w.grid);
    w.reference_available = keys_can_represent(w.input);

    w.even_mask = parity_mask(w.grid.num_voxels(), 0, w.context);
    w.odd_mask = parity_mask(w.grid.num_voxels(), 1, w.context);
    w.even_half = w.grid.pruned_grid(span_of(w.even_mask));
    w.odd_half = w.grid.pruned_grid(span_of(w.odd_mask));
    w.coarse = w.grid.conv_grid(2, 2);
    w.map_k3s1 = sparsegrid::neighbour_map(w.grid, w.grid, kK3, kK1);
    return w;
}

// ---- cases ---------------------------------------------------------------------------------------

/// One row of the table. `run` executes the library operation to completion and returns its output
/// size; `check` (optional) returns "" when the result equals the naive reference, else what differs;
/// `baseline` (optional) runs the naive reference once.
struct BenchCase {
    std::string operation;
    std::function<int64_t()> run;
    std::function<std::string()> check;
    std::function<std::size_t()> baseline;
};

std::string compare_grid(const GridBatch& result, const KeySet& expected, int64_t batch_size) {
    if (result.batch_size() != batch_size)
        return "batch size " + std::to_string(result.batch_size()) + ", expected " + std::to_string(batch_size);
    const HostBatch host = host_copy(result);
    if (!is_morton_ordered(host)) return "voxels not in strictly increasing Morton order";
    if (packed_keys(host) != expected)
        return std::to_string(host.num_voxels()) + " voxels, expected " + std::to_string(expected.size()) +
            (static_cast<std::size_t>(host.num_voxels()) == expected.size() ? " (different voxels)" : "");
    return "";
}

using GridOp = std::function<GridBatch()>;
using KeyReference = std::function<KeySet()>;

BenchCase grid_case(const Workload& w, std::string operation, GridOp op, KeyReference reference, bool timed_baseline) {
    BenchCase c;
    c.operation = std::move(operation);
    c.run = [op] {
        const GridBatch result = op();
        return result.num_voxels();
    };
    if (w.reference_available) {
        c.check = [&w, op, reference] { return compare_grid(op(), reference(), w.grid.batch_size()); };
        if (timed_baseline) c.baseline = [reference] { return reference().size(); };
    }
    return c;
}

using MapOp = std::function<KernelMap()>;
using MapReference = std::function<std::vector<int32_t>()>;

BenchCase map_case(const Workload& w, std::string operation, MapOp op, MapReference reference, bool timed_baseline) {
    BenchCase c;
    c.operation = std::move(operation);
    c.run = [&w, op] {
        const KernelMap map = op();
        return map.num_target();
    };
    if (w.reference_available) {
        c.check = [&w, op, reference] {
            const std::vector<int32_t> expected = reference();
            const std::vector<int32_t> actual = op().neighbour_map().to_host(w.stream());
            if (actual.size() != expected.size())
                return std::to_string(actual.size()) + " map entries, expected " + std::to_string(expected.size());
            const auto first = std::mismatch(actual.begin(), actual.end(), expected.begin());
            if (first.first == actual.end()) return std::string();
            const std::size_t entry = static_cast<std::size_t>(first.first - actual.begin());
            return "entry " + std::to_string(entry) + " is " + std::to_string(*first.first) + ", expected " +
                std::to_string(*first.second);
        };
        if (timed_baseline) c.baseline = [reference] { return reference().size(); };
    }
    return c;
}

BenchCase from_ijk_case(const Workload& w) {
    return grid_case(
        w, "from_ijk", [&w] { return GridBatch::from_ijk(w.input_span(), w.input.offsets, {}, w.context); },
        [&w] { return packed_keys(w.input); }, true);
}

BenchCase ijk_to_index_case(const Workload& w) {
    BenchCase c;
    c.operation = "ijk_to_index (all voxels)";
    const auto lookup = [&w] { return w.grid.ijk_to_index(w.grid_ijk_span(), w.grid.voxel_offsets()); };
    c.run = [&w, lookup] {
        const Buffer<int64_t> indices = lookup();
        return indices.size();
    };
    c.check = [&w, lookup] {
        const std::vector<int64_t> indices = lookup().to_host(w.stream());
        if (static_cast<int64_t>(indices.size()) != w.grid.num_voxels())
            return std::to_string(indices.size()) + " results, expected " + std::to_string(w.grid.num_voxels());
        for (std::size_t v = 0; v < indices.size(); ++v)
            if (indices[v] != static_cast<int64_t>(v))
                return "voxel " + std::to_string(v) + " maps to " + std::to_string(indices[v]);
        return std::string();
    };
    return c;
}

BenchCase pairs_by_tap_case(const Workload& w) {
    BenchCase c;
    c.operation = "pairs_by_tap (k3s1 map)";
    c.run = [&w] {
        const sparsegrid::PairLists pairs = w.map_k3s1.pairs_by_tap();
        return pairs.num_pairs();
    };
    c.check = [&w] {
        const sparsegrid::PairLists pairs = w.map_k3s1.pairs_by_tap();
        const HostPairLists actual{pairs.tap_offsets, pairs.source_index.to_host(w.stream()),
                                   pairs.target_index.to_host(w.stream())};
        const HostPairLists expected = naive_pairs_by_tap(w.map_k3s1.neighbour_map().to_host(w.stream()),
                                                          w.map_k3s1.kernel_volume());
        if (actual == expected) return std::string();
        return std::to_string(actual.source_index.size()) + " pairs, expected " +
            std::to_string(expected.source_index.size()) +
            (actual.tap_offsets == expected.tap_offsets ? " (same tap offsets, different pairs)"
                                                        : " (different tap offsets)");
    };
    return c;
}

/// The voxels with even index, as pruned_grid(even_mask) should return them.
HostBatch even_index_voxels(const HostBatch& batch) {
    HostBatch even;
    for (int64_t member = 0; member < batch.batch_size(); ++member) {
        for (int64_t v = batch.offsets[member]; v < batch.offsets[member + 1]; ++v)
            if (v % 2 == 0) even.voxels.push_back(batch.voxels[v]);
        even.offsets.push_back(even.num_voxels());
    }
    return even;
}

/// The lower half (along i) of the batch's box, one box for every member: what clipped_grid keeps.
std::pair<Vec3i, Vec3i> lower_half_box(const sparsegrid::CoordBox& box) {
    Vec3i hi = box.hi;
    hi[0] = box.lo[0] + (box.hi[0] - box.lo[0]) / 2;
    return {box.lo, hi};
}

HostBatch voxels_inside(const HostBatch& batch, const Vec3i& lo, const Vec3i& hi) {
    HostBatch inside;
    for (int64_t member = 0; member < batch.batch_size(); ++member) {
        for (int64_t v = batch.offsets[member]; v < batch.offsets[member + 1]; ++v) {
            const Vec3i& x = batch.voxels[v];
            if (lo[0] <= x[0] && x[0] <= hi[0] && lo[1] <= x[1] && x[1] <= hi[1] && lo[2] <= x[2] && x[2] <= hi[2])
                inside.voxels.push_back(x);
        }
        inside.offsets.push_back(inside.num_voxels());
    }
    return inside;
}

BenchCase bbox_case(const Workload& w) {
    BenchCase c;
    c.operation = "bbox";
    c.run = [&w] {
        const Buffer<int32_t> boxes = w.grid.bbox();
        return boxes.size() / 6;
    };
    c.check = [&w] {
        const std::vector<sparsegrid::CoordBox> boxes = w.grid.bbox_host();
        const HostBatch& host = w.grid_host;
        for (int64_t m = 0; m < host.batch_size(); ++m) {
            sparsegrid::CoordBox expected;
            for (int64_t v = host.offsets[m]; v < host.offsets[m + 1]; ++v)
                for (int a = 0; a < 3; ++a) {
                    const bool first = v == host.offsets[m];
                    expected.lo[a] = first ? host.voxels[v][a] : std::min(expected.lo[a], host.voxels[v][a]);
                    expected.hi[a] = first ? host.voxels[v][a] : std::max(expected.hi[a], host.voxels[v][a]);
                }
            if (boxes[m] != expected) return "member " + std::to_string(m) + " has a different box";
        }
        return std::string();
    };
    return c;
}

std::vector<BenchCase> topology_cases(const Workload& w) {
    std::vector<BenchCase> cases;
    cases.push_back(from_ijk_case(w));
    cases.push_back(grid_case(
        w, "conv_grid(2,2)", [&w] { return w.grid.conv_grid(2, 2); },
        [&w] { return naive_conv_grid(w.grid_host, kK2, kK2); }, true));
    cases.push_back(grid_case(
        w, "conv_grid(3,2)", [&w] { return w.grid.conv_grid(3, 2); },
        [&w] { return naive_conv_grid(w.grid_host, kK3, kK2); }, false));
    cases.push_back(grid_case(
        w, "conv_grid(3,1)", [&w] { return w.grid.conv_grid(3, 1); },
        [&w] { return naive_conv_grid(w.grid_host, kK3, kK1); }, true));
    cases.push_back(grid_case(
        w, "conv_transpose_grid(2,2)", [&w] { return w.grid.conv_transpose_grid(2, 2); },
        [&w] { return naive_conv_transpose_grid(w.grid_host, kK2, kK2); }, true));
    cases.push_back(grid_case(
        w, "conv_transpose_grid(3,2)", [&w] { return w.grid.conv_transpose_grid(3, 2); },
        [&w] { return naive_conv_transpose_grid(w.grid_host, kK3, kK2); }, false));
    cases.push_back(grid_case(
        w, "coarsened_grid(2)", [&w] { return w.grid.coarsened_grid(2); },
        [&w] { return naive_coarsened_grid(w.grid_host, 2); }, false));
    {
        // An encoder's four k3s2 levels and a decoder's three coarsened targets in one call (one sync on
        // CUDA); checked at its third level against a naive k3s2 of the library's second.
        BenchCase pyramid = grid_case(
            w, "pyramid(3,2, 4 levels + 3 coarsened)",
            [&w] {
                return w.grid.pyramid(kK3, kK2, 4, {{8, 8, 8}, {4, 4, 4}, {2, 2, 2}}).levels[2];
            },
            [&w] { return naive_conv_grid(host_copy(w.grid.conv_grid(3, 2).conv_grid(3, 2)), kK3, kK2); }, false);
        pyramid.run = [&w] {
            const sparsegrid::GridPyramid built = w.grid.pyramid(kK3, kK2, 4, {{8, 8, 8}, {4, 4, 4}, {2, 2, 2}});
            int64_t voxels = 0;
            for (const auto* grids : {&built.levels, &built.coarsened})
                for (const GridBatch& g : *grids) voxels += g.num_voxels();
            return voxels;
        };
        cases.push_back(std::move(pyramid));
    }
    cases.push_back(grid_case(
        w, "refined_grid(2)", [&w] { return w.grid.refined_grid(2); },
        [&w] { return naive_refined_grid(w.grid_host, 2); }, false));
    cases.push_back(grid_case(
        w, "dilated_grid(1)", [&w] { return w.grid.dilated_grid(1); },
        [&w] { return naive_conv_transpose_grid(w.grid_host, kK3, kK1); }, false));
    cases.push_back(grid_case(
        w, "pruned_grid(half mask)", [&w] { return w.grid.pruned_grid(span_of(w.even_mask)); },
        [&w] { return packed_keys(even_index_voxels(w.grid_host)); }, false));
    cases.push_back(grid_case(
        w, "merged_grid(two halves)", [&w] { return w.even_half.merged_grid(w.odd_half); },
        [&w] { return packed_keys(w.grid_host); }, false));
    cases.push_back(grid_case(
        w, "clipped_grid(lower half)",
        [&w] {
            const auto [lo, hi] = lower_half_box(w.grid.coordinate_box());
            return w.grid.clipped_grid({lo}, {hi}).grid;
        },
        [&w] {
            const auto [lo, hi] = lower_half_box(w.grid.coordinate_box());
            return packed_keys(voxels_inside(w.grid_host, lo, hi));
        },
        false));
    cases.push_back(bbox_case(w));
    return cases;
}

std::vector<BenchCase> lookup_cases(const Workload& w) {
    std::vector<BenchCase> cases;
    cases.push_back(ijk_to_index_case(w));
    cases.push_back(map_case(
        w, "neighbour_map k3s1", [&w] { return sparsegrid::neighbour_map(w.grid, w.grid, kK3, kK1); },
        [&w] { return naive_neighbour_map(w.grid_host, w.grid_host, kK3, kK1, MapDirection::Forward); }, true));
    cases.push_back(map_case(
        w, "neighbour_map k2s2 forward", [&w] { return sparsegrid::neighbour_map(w.grid, w.coarse, kK2, kK2); },
        [&w] { return naive_neighbour_map(w.grid_host, host_copy(w.coarse), kK2, kK2, MapDirection::Forward); },
        false));
    cases.push_back(map_case(
        w, "transposed plan k2s2 (grid + map)",
        [&w] { return sparsegrid::conv_transpose_grid_and_map(w.grid, kK2, kK2).map; },
        [&w] {
            const HostBatch fine = host_copy(w.grid.conv_transpose_grid(2, 2));
            return naive_neighbour_map(w.grid_host, fine, kK2, kK2, MapDirection::Transposed);
        },
        false));
    cases.push_back(pairs_by_tap_case(w));
    return cases;
}

// ---- running -------------------------------------------------------------------------------------

struct BenchRow {
    std::string operation;
    int64_t output_voxels = 0;
    Timing timing;
    int64_t host_syncs = 0;      // host synchronisations of one run
    std::size_t peak_bytes = 0;  // library memory held at the peak of one run, above what it held before
    std::optional<Timing> baseline;
    std::string check = "-";  // "ok", "MISMATCH" or "-" (not checked)
    std::string mismatch;     // what differs, for MISMATCH
};

volatile std::size_t g_baseline_sink = 0;  // keeps the reference's work observable

BenchRow run_case(const BenchCase& c, const BenchOptions& options, const Workload& w) {
    BenchRow row;
    row.operation = c.operation;
    row.timing = measure(w.context, options.warmup, options.repeats, [&] { row.output_voxels = c.run(); });
    // One more run, counted rather than timed.
    sparsegrid::synchronize(w.context);
    w.allocator->reset_peak();
    const std::size_t held_before = w.allocator->current();
    const int64_t syncs_before = sparsegrid::host_synchronizations();
    c.run();
    row.host_syncs = sparsegrid::host_synchronizations() - syncs_before;
    row.peak_bytes = w.allocator->peak() - held_before;
    if (options.check && c.check) {
        row.mismatch = c.check();
        row.check = row.mismatch.empty() ? "ok" : "MISMATCH";
    }
    if (c.baseline) {
        const int warmup = std::min(options.warmup, kMaxBaselineWarmup);
        const int repeats = std::min(options.repeats, kMaxBaselineRepeats);
        const Context host;
        row.baseline = measure(host, warmup, repeats, [&] { g_baseline_sink = g_baseline_sink + c.baseline(); });
    }
    return row;
}

// ---- reporting -----------------------------------------------------------------------------------

std::string format_fixed(double value, int decimals) {
    char text[64];
    std::snprintf(text, sizeof(text), "%.*f", decimals, value);
    return text;
}

double voxels_per_second_millions(const BenchRow& row) {
    return row.timing.median_ms > 0.0 ? static_cast<double>(row.output_voxels) / row.timing.median_ms / 1e3 : 0.0;
}

std::optional<double> baseline_ratio(const BenchRow& row) {
    if (!row.baseline || row.timing.median_ms <= 0.0) return std::nullopt;
    return row.baseline->median_ms / row.timing.median_ms;
}

/// Columns padded to their widest cell: the first left-aligned, the others right-aligned.
class TextTable {
public:
    explicit TextTable(std::vector<std::string> header) { m_rows.push_back(std::move(header)); }
    void add_row(std::vector<std::string> cells) { m_rows.push_back(std::move(cells)); }

    void print(std::ostream& out) const {
        std::vector<std::size_t> widths(m_rows.front().size(), 0);
        for (const auto& row : m_rows)
            for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
        for (std::size_t r = 0; r < m_rows.size(); ++r) {
            print_row(out, m_rows[r], widths);
            if (r == 0) print_rule(out, widths);
        }
    }

private:
    static void print_row(std::ostream& out, const std::vector<std::string>& cells,
                          const std::vector<std::size_t>& widths) {
        for (std::size_t c = 0; c < cells.size(); ++c) {
            const std::string padding(widths[c] - cells[c].size(), ' ');
            if (c > 0) out << " | ";
            out << (c == 0 ? cells[c] + padding : padding + cells[c]);
        }
        out << '\n';
    }
    static void print_rule(std::ostream& out, const std::vector<std::size_t>& widths) {
        for (std::size_t c = 0; c < widths.size(); ++c) out << (c > 0 ? "-|-" : "") << std::string(widths[c], '-');
        out << '\n';
    }

    std::vector<std::vector<std::string>> m_rows;
};

void print_table(const std::vector<BenchRow>& rows, std::ostream& out) {
    TextTable table({"operation", "output voxels", "median ms", "min ms", "M voxels/s", "syncs", "peak MB",
                     "baseline ms", "baseline/sparsegrid", "check"});
    for (const BenchRow& row : rows) {
        const std::optional<double> ratio = baseline_ratio(row);
        table.add_row({row.operation, std::to_string(row.output_voxels), format_fixed(row.timing.median_ms, 3),
                       format_fixed(row.timing.min_ms, 3), format_fixed(voxels_per_second_millions(row), 1),
                       std::to_string(row.host_syncs), format_fixed(static_cast<double>(row.peak_bytes) / 1e6, 2),
                       row.baseline ? format_fixed(row.baseline->median_ms, 3) : "",
                       ratio ? format_fixed(*ratio, 2) + "x" : "", row.check});
    }
    table.print(out);
}

void print_mismatches(const std::vector<BenchRow>& rows, std::ostream& out) {
    for (const BenchRow& row : rows)
        if (!row.mismatch.empty()) out << "MISMATCH " << row.operation << ": " << row.mismatch << '\n';
}

int effective_threads() { return sparsegrid::cpu_threads(); }

void print_header(const BenchOptions& options, const Workload& w, std::ostream& out) {
    out << "sparsegrid " << SPARSEGRID_VERSION_STRING << " bench\n"
        << "batch:    " << w.description << '\n'
        << "voxels:   " << w.grid.batch_size() << " members, " << w.input.num_voxels() << " input voxels, "
        << w.grid.num_voxels() << " in the grid\n"
        << "device:   " << options.device.str() << ", " << effective_threads() << " OpenMP threads\n"
        << "timing:   median and min of " << options.repeats << " runs after " << options.warmup
        << " warm-up runs (CUDA events on a GPU, steady_clock on the CPU); syncs and peak MB\n"
        << "          (library memory above what it held before) from one further run\n";
    if (w.reference_available)
        out << "baseline: naive single-threaded reference in this tool (sort + unique of packed 64-bit keys;\n"
            << "          std::unordered_map lookups), median of up to " << kMaxBaselineRepeats << " runs\n";
    else
        out << "baseline: none (coordinates beyond +-16000 or more than 65536 members: the naive reference's\n"
            << "          packed keys cannot hold them; results are not checked)\n";
    out << '\n';
}

// ---- JSON ----------------------------------------------------------------------------------------

std::string json_string(const std::string& text) {
    std::string quoted = "\"";
    for (char ch : text) {
        const unsigned char c = static_cast<unsigned char>(ch);
        if (ch == '"' || ch == '\\') {
            quoted += '\\';
            quoted += ch;
        } else if (c < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof(escaped), "\\u%04x", c);
            quoted += escaped;
        } else {
            quoted += ch;
        }
    }
    return quoted + "\"";
}

std::string json_number(double value) {
    char text[32];
    std::snprintf(text, sizeof(text), "%.6g", value);
    return text;
}

std::string json_optional(const std::optional<double>& value) { return value ? json_number(*value) : "null"; }

void write_json(const std::string& path, const BenchOptions& options, const Workload& w,
                const std::vector<BenchRow>& rows) {
    std::ofstream file(path, std::ios::trunc);
    if (!file) throw sparsegrid::Error("bench: cannot create --json file '" + path + "'");
    file << "{\n"
         << "  \"version\": " << json_string(SPARSEGRID_VERSION_STRING) << ",\n"
         << "  \"batch\": " << json_string(w.description) << ",\n"
         << "  \"input\": " << (options.input_path.empty() ? "null" : json_string(options.input_path)) << ",\n"
         << "  \"resolution\": " << (options.input_path.empty() ? std::to_string(options.resolution) : "null") << ",\n"
         << "  \"seed\": " << (options.input_path.empty() ? std::to_string(options.seed) : "null") << ",\n"
         << "  \"batch_size\": " << w.grid.batch_size() << ",\n"
         << "  \"input_voxels\": " << w.input.num_voxels() << ",\n"
         << "  \"grid_voxels\": " << w.grid.num_voxels() << ",\n"
         << "  \"device\": " << json_string(options.device.str()) << ",\n"
         << "  \"threads\": " << effective_threads() << ",\n"
         << "  \"repeats\": " << options.repeats << ",\n"
         << "  \"warmup\": " << options.warmup << ",\n"
         << "  \"rows\": [\n";
    for (std::size_t r = 0; r < rows.size(); ++r) {
        const BenchRow& row = rows[r];
        std::optional<double> baseline_ms;
        if (row.baseline) baseline_ms = row.baseline->median_ms;
        file << "    {\"operation\": " << json_string(row.operation) << ", \"output_voxels\": " << row.output_voxels
             << ", \"median_ms\": " << json_number(row.timing.median_ms)
             << ", \"min_ms\": " << json_number(row.timing.min_ms)
             << ", \"mvoxels_per_s\": " << json_number(voxels_per_second_millions(row))
             << ", \"host_syncs\": " << row.host_syncs << ", \"peak_bytes\": " << row.peak_bytes
             << ", \"baseline_median_ms\": " << json_optional(baseline_ms)
             << ", \"baseline_ratio\": " << json_optional(baseline_ratio(row))
             << ", \"check\": " << json_string(row.check) << "}" << (r + 1 < rows.size() ? "," : "") << '\n';
    }
    file << "  ]\n}\n";
    file.close();
    if (!file) throw sparsegrid::Error("bench: cannot write --json file '" + path + "'");
}

void configure_threads(int threads) {
    if (threads > 0) sparsegrid::set_cpu_threads(threads);
}

}  // namespace

std::vector<std::vector<sparsegrid::Vec3i>> load_members(const BenchOptions& options, std::string& description) {
    if (options.input_path.empty()) {
        description = std::to_string(options.batch_size) + " synthetic surface shapes, resolution " +
            std::to_string(options.resolution) + ", seed " + std::to_string(options.seed);
        return sparsegrid::synthetic_surface_batch(options.batch_size, options.resolution, options.seed);
    }
    std::vector<std::vector<Vec3i>> members = sparsegrid::read_voxel_batch(options.input_path);
    const int64_t available = static_cast<int64_t>(members.size());
    if (available == 0) throw sparsegrid::Error("bench: '" + options.input_path + "' holds no members");
    const int64_t count = options.members < 0 ? available : options.members;
    if (count < 1 || count > available)
        throw UsageError("bench: --members must be in [1, " + std::to_string(available) + "] for '" +
                         options.input_path + "', got " + std::to_string(count));
    description = "first " + std::to_string(count) + " of " + std::to_string(available) + " members of " +
        options.input_path;
    return sparsegrid::first_members(members, count);
}

int run_bench(const BenchOptions& options, std::ostream& out) {
    if (options.device.is_cuda() && !sparsegrid::cuda_backend_available())
        throw sparsegrid::Error(
            "bench: --device cuda needs the CUDA backend, but this build of sparsegrid has none "
            "(configure with -DSPARSEGRID_WITH_CUDA=ON on a machine with the CUDA toolkit)");
    configure_threads(options.threads);

    const Workload workload = make_workload(options);
    print_header(options, workload, out);
    out.flush();

    std::vector<BenchCase> cases = topology_cases(workload);
    for (BenchCase& c : lookup_cases(workload)) cases.push_back(std::move(c));
    std::vector<BenchRow> rows;
    for (const BenchCase& c : cases) rows.push_back(run_case(c, options, workload));

    print_table(rows, out);
    print_mismatches(rows, out);
    if (!options.json_path.empty()) {
        write_json(options.json_path, options, workload, rows);
        out << "\nwrote " << options.json_path << '\n';
    }
    const auto has_mismatch = [](const BenchRow& row) { return !row.mismatch.empty(); };
    const bool any_mismatch = std::any_of(rows.begin(), rows.end(), has_mismatch);
    return any_mismatch ? 1 : 0;
}

}  // namespace sparsegrid_tool
