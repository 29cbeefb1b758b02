// GridBatch front end: validation, the choice of algorithm (order-preserving fast paths for factors
// 2^p), output transforms and boxes, then one backend call per operation.
#include <sparsegrid/grid_batch.h>

#include "api/dispatch.h"
#include "api/front_end.h"
#include "api/validation.h"

#include <algorithm>
#include <atomic>

namespace sparsegrid {

using detail::GridStorage;
using detail::GridTopology;
using detail::make_grid;
using detail::on_backend;
using detail::throw_error;

namespace {

std::vector<MemberTransform> map_transforms(const std::vector<MemberTransform>& in,
                                            MemberTransform (*fn)(const MemberTransform&, const Vec3i&),
                                            const Vec3i& arg) {
    std::vector<MemberTransform> out;
    out.reserve(in.size());
    for (const MemberTransform& t : in) out.push_back(fn(t, arg));
    return out;
}

MemberTransform scale_up(const MemberTransform& t, const Vec3i& stride) {
    MemberTransform out = t;
    for (int a = 0; a < 3; ++a) out.voxel_size[a] = t.voxel_size[a] * stride[a];
    return out;
}

MemberTransform scale_down(const MemberTransform& t, const Vec3i& stride) {
    MemberTransform out = t;
    for (int a = 0; a < 3; ++a) out.voxel_size[a] = t.voxel_size[a] / stride[a];
    return out;
}

MemberTransform coarsen_transform(const MemberTransform& t, const Vec3i& factor) {
    MemberTransform out;
    for (int a = 0; a < 3; ++a) {
        out.voxel_size[a] = t.voxel_size[a] * factor[a];
        out.origin[a] = t.origin[a] + (factor[a] - 1) * t.voxel_size[a] / 2.0;
    }
    return out;
}

MemberTransform refine_transform(const MemberTransform& t, const Vec3i& factor) {
    MemberTransform out;
    for (int a = 0; a < 3; ++a) {
        out.voxel_size[a] = t.voxel_size[a] / factor[a];
        out.origin[a] = t.origin[a] - (factor[a] - 1) * out.voxel_size[a] / 2.0;
    }
    return out;
}

}  // namespace

namespace detail {

namespace {
std::atomic<int64_t> g_lookup_builds{0};
}  // namespace

int64_t lookup_builds() { return g_lookup_builds.load(std::memory_order_relaxed); }
void count_lookup_build() { g_lookup_builds.fetch_add(1, std::memory_order_relaxed); }

GridBatch make_grid(GridTopology topology, std::vector<MemberTransform> transforms, const Context& ctx) {
    // Outputs whose size is known only once built (conv_grid, merged_grid, from_points, ...).
    check_grid_voxels("GridBatch", "new", topology.offsets.empty() ? 0 : topology.offsets.back());
    auto storage = std::make_shared<GridStorage>();
    storage->topology = std::move(topology);
    storage->transforms = std::move(transforms);
    storage->context = ctx;
    return GridBatch(std::move(storage));
}

GridBatch generate_conv_grid(const char* op, const GridBatch& grid, const ConvGeometry& g) {
    if (g.is_uniform(1, 1)) return grid;
    const CoordBox out_box = conv_grid_box(op, grid.coordinate_box(), g);
    const GridStorage& storage = grid.storage();
    // K = S = 2 on every axis: pb = 0 and each fine voxel has exactly one parent, floor(f / 2).
    const bool halving = g.is_uniform(2, 2);
    if (!halving) checked_mul(op, "candidate count", grid.num_voxels(), conv_grid_candidates_per_voxel(g));
    GridTopology topology = on_backend(op, grid.device(), [&](auto backend) {
        return halving ? backend.coarsened_by_power_of_two(storage, 1, out_box)
                       : backend.conv_grid(storage, g, out_box);
    });
    return make_grid(std::move(topology), map_transforms(grid.transforms(), scale_up, stride_of(g)), grid.context());
}

GridBatch generate_conv_transpose_grid(const char* op, const GridBatch& grid, const ConvGeometry& g) {
    if (g.is_uniform(1, 1)) return grid;
    const CoordBox out_box = conv_transpose_grid_box(op, grid.coordinate_box(), g);
    const GridStorage& storage = grid.storage();
    // K = S = 2 on every axis: pb = 0, the output is the subdivision by 2.
    const bool doubling = g.is_uniform(2, 2);
    const int64_t count = checked_mul(op, doubling ? "output voxel count" : "candidate count", grid.num_voxels(),
                                      g.kernel_volume());
    if (doubling) check_grid_voxels(op, "output", count);
    GridTopology topology = on_backend(op, grid.device(), [&](auto backend) {
        return doubling ? backend.refined_by_power_of_two(storage, 1, out_box)
                        : backend.conv_transpose_grid(storage, g, out_box);
    });
    return make_grid(std::move(topology), map_transforms(grid.transforms(), scale_down, stride_of(g)), grid.context());
}

Vec3i kernel_size_of(const ConvGeometry& g) { return {g.kernel[0], g.kernel[1], g.kernel[2]}; }
Vec3i stride_of(const ConvGeometry& g) { return {g.stride[0], g.stride[1], g.stride[2]}; }

}  // namespace detail

GridBatch::GridBatch() {
    GridTopology topology;
    topology.offsets = {0};
    topology.offsets_buffer = Buffer<int64_t>::from_host(topology.offsets, Context{});
    *this = detail::make_grid(std::move(topology), {}, Context{});
}

GridBatch::GridBatch(std::shared_ptr<const GridStorage> storage) : m_storage(std::move(storage)) {}

// ---- constructors ---------------------------------------------------------------------------------

GridBatch GridBatch::from_ijk(Span<const int32_t> ijk, const std::vector<int64_t>& member_offsets,
                              const std::vector<MemberTransform>& transforms, const Context& ctx) {
    constexpr const char* op = "GridBatch::from_ijk";
    if (ijk.size % 3 != 0) throw_error(op, ": ijk must hold (i, j, k) triples, got ", ijk.size, " values");
    if (ijk.size > 0 && ijk.data == nullptr) throw_error(op, ": ijk data is null for ", ijk.size, " values");
    detail::check_offsets(op, "member_offsets", member_offsets, ijk.size / 3);
    detail::check_grid_voxels(op, "input", ijk.size / 3);
    const int64_t batch_size = static_cast<int64_t>(member_offsets.size()) - 1;
    std::vector<MemberTransform> resolved = detail::resolve_transforms(op, transforms, batch_size, true);
    GridTopology topology = on_backend(
        op, ctx.device, [&](auto backend) { return backend.build_from_ijk(ijk.data, member_offsets, ctx); });
    return make_grid(std::move(topology), std::move(resolved), ctx);
}

GridBatch GridBatch::from_ijk(const std::vector<std::vector<Vec3i>>& members,
                              const std::vector<MemberTransform>& transforms, const Context& ctx) {
    if (members.empty()) throw_error("GridBatch::from_ijk: members must hold at least one member, got 0");
    std::vector<int64_t> offsets{0};
    std::vector<int32_t> flat;
    for (const auto& member : members) {
        for (const Vec3i& v : member) flat.insert(flat.end(), v.begin(), v.end());
        offsets.push_back(static_cast<int64_t>(flat.size() / 3));
    }
    Buffer<int32_t> on_device = Buffer<int32_t>::from_host(flat, ctx);
    return from_ijk(Span<const int32_t>(on_device.data(), on_device.size()), offsets, transforms, ctx);
}

GridBatch GridBatch::from_points(Span<const double> xyz, const std::vector<int64_t>& member_offsets,
                                 const std::vector<MemberTransform>& transforms, const Context& ctx) {
    constexpr const char* op = "GridBatch::from_points";
    if (xyz.size % 3 != 0) throw_error(op, ": xyz must hold (x, y, z) triples, got ", xyz.size, " values");
    if (xyz.size > 0 && xyz.data == nullptr) throw_error(op, ": xyz data is null for ", xyz.size, " values");
    detail::check_offsets(op, "member_offsets", member_offsets, xyz.size / 3);
    const int64_t batch_size = static_cast<int64_t>(member_offsets.size()) - 1;
    std::vector<MemberTransform> resolved = detail::resolve_transforms(op, transforms, batch_size, false);
    int64_t bad = -1;
    Buffer<int32_t> ijk = on_backend(op, ctx.device, [&](auto backend) {
        return backend.points_to_ijk(xyz.data, member_offsets, resolved, &bad, ctx);
    });
    if (bad >= 0) {
        const int64_t member = std::upper_bound(member_offsets.begin(), member_offsets.end(), bad) -
            member_offsets.begin() - 1;
        double point[3];
        detail::copy_bytes(point, Device::cpu(), xyz.data + 3 * bad, ctx.device, sizeof(point), ctx.stream);
        throw_error(op, ": xyz point ", bad, " (member ", member, ") = (", point[0], ", ", point[1], ", ", point[2],
                    ") must be finite and map to a voxel index within int32 range");
    }
    return from_ijk(Span<const int32_t>(ijk.data(), ijk.size()), member_offsets, resolved, ctx);
}

GridBatch GridBatch::from_points(const std::vector<std::vector<Vec3d>>& members,
                                 const std::vector<MemberTransform>& transforms, const Context& ctx) {
    if (members.empty()) throw_error("GridBatch::from_points: members must hold at least one member, got 0");
    std::vector<int64_t> offsets{0};
    std::vector<double> flat;
    for (const auto& member : members) {
        for (const Vec3d& p : member) flat.insert(flat.end(), p.begin(), p.end());
        offsets.push_back(static_cast<int64_t>(flat.size() / 3));
    }
    Buffer<double> on_device = Buffer<double>::from_host(flat, ctx);
    return from_points(Span<const double>(on_device.data(), on_device.size()), offsets, transforms, ctx);
}

GridBatch GridBatch::from_mesh(Span<const double> vertices, const std::vector<int64_t>& vertex_offsets,
                               Span<const int32_t> faces, const std::vector<int64_t>& face_offsets,
                               const std::vector<MemberTransform>& transforms, const Context& ctx) {
    constexpr const char* op = "GridBatch::from_mesh";
    if (vertices.size % 3 != 0)
        throw_error(op, ": vertices must hold (x, y, z) triples, got ", vertices.size, " values");
    if (faces.size % 3 != 0) throw_error(op, ": faces must hold vertex index triples, got ", faces.size, " values");
    if ((vertices.size > 0 && !vertices.data) || (faces.size > 0 && !faces.data))
        throw_error(op, ": vertices or faces data is null");
    detail::check_offsets(op, "vertex_offsets", vertex_offsets, vertices.size / 3);
    detail::check_offsets(op, "face_offsets", face_offsets, faces.size / 3);
    if (vertex_offsets.size() != face_offsets.size())
        throw_error(op, ": vertex_offsets and face_offsets must describe the same number of members, got ",
                    vertex_offsets.size() - 1, " and ", face_offsets.size() - 1);
    const int64_t batch_size = static_cast<int64_t>(face_offsets.size()) - 1;
    std::vector<MemberTransform> resolved = detail::resolve_transforms(op, transforms, batch_size, false);
    // Face indices and vertex values live on ctx.device: the backend checks them (same errors on both).
    GridTopology topology = on_backend(op, ctx.device, [&](auto backend) {
        return backend.from_mesh(vertices.data, vertex_offsets, faces.data, face_offsets, resolved, ctx);
    });
    return make_grid(std::move(topology), std::move(resolved), ctx);
}

// ---- accessors ------------------------------------------------------------------------------------

int64_t GridBatch::batch_size() const { return m_storage->batch_size(); }
int64_t GridBatch::num_voxels() const { return m_storage->num_voxels(); }

int64_t GridBatch::num_voxels(int64_t member) const {
    if (member < 0 || member >= batch_size())
        throw_error("GridBatch::num_voxels: member must be in [0, ", batch_size(), "), got ", member);
    return m_storage->topology.offsets[member + 1] - m_storage->topology.offsets[member];
}

const std::vector<int64_t>& GridBatch::voxel_offsets() const { return m_storage->topology.offsets; }
const Buffer<int64_t>& GridBatch::voxel_offsets_buffer() const { return m_storage->topology.offsets_buffer; }
const Buffer<int32_t>& GridBatch::ijk() const { return m_storage->topology.ijk; }
const CoordBox& GridBatch::coordinate_box() const { return m_storage->topology.box; }
Device GridBatch::device() const { return m_storage->context.device; }
const Context& GridBatch::context() const { return m_storage->context; }
const std::vector<MemberTransform>& GridBatch::transforms() const { return m_storage->transforms; }

std::vector<Vec3i> GridBatch::ijk_host() const {
    const std::vector<int32_t> flat = ijk().to_host(context().stream);
    std::vector<Vec3i> out(flat.size() / 3);
    for (size_t n = 0; n < out.size(); ++n) out[n] = {flat[3 * n], flat[3 * n + 1], flat[3 * n + 2]};
    return out;
}

const Vec3d& GridBatch::voxel_size(int64_t member) const {
    if (member < 0 || member >= batch_size())
        throw_error("GridBatch::voxel_size: member must be in [0, ", batch_size(), "), got ", member);
    return m_storage->transforms[member].voxel_size;
}

const Vec3d& GridBatch::origin(int64_t member) const {
    if (member < 0 || member >= batch_size())
        throw_error("GridBatch::origin: member must be in [0, ", batch_size(), "), got ", member);
    return m_storage->transforms[member].origin;
}

Vec3d GridBatch::index_to_world(int64_t member, const Vec3d& ijk_value) const {
    const Vec3d& h = voxel_size(member);
    const Vec3d& o = origin(member);
    return {o[0] + h[0] * ijk_value[0], o[1] + h[1] * ijk_value[1], o[2] + h[2] * ijk_value[2]};
}

Vec3d GridBatch::world_to_index(int64_t member, const Vec3d& xyz) const {
    const Vec3d& h = voxel_size(member);
    const Vec3d& o = origin(member);
    return {(xyz[0] - o[0]) / h[0], (xyz[1] - o[1]) / h[1], (xyz[2] - o[2]) / h[2]};
}

Buffer<int64_t> GridBatch::ijk_to_index(Span<const int32_t> query_ijk,
                                        const std::vector<int64_t>& query_offsets) const {
    constexpr const char* op = "GridBatch::ijk_to_index";
    if (query_ijk.size % 3 != 0)
        throw_error(op, ": query_ijk must hold (i, j, k) triples, got ", query_ijk.size, " values");
    if (query_ijk.size > 0 && query_ijk.data == nullptr) throw_error(op, ": query_ijk data is null");
    detail::check_offsets(op, "query_offsets", query_offsets, query_ijk.size / 3);
    if (static_cast<int64_t>(query_offsets.size()) - 1 != batch_size())
        throw_error(op, ": query_offsets must describe ", batch_size(), " members (", batch_size() + 1,
                    " entries), got ", query_offsets.size(), " entries");
    return on_backend(op, device(),
                      [&](auto backend) { return backend.ijk_to_index(*m_storage, query_ijk.data, query_offsets); });
}

std::vector<int64_t> GridBatch::ijk_to_index(const std::vector<std::vector<Vec3i>>& queries) const {
    if (static_cast<int64_t>(queries.size()) != batch_size())
        throw_error("GridBatch::ijk_to_index: queries must hold one list per member (", batch_size(), "), got ",
                    queries.size());
    std::vector<int64_t> offsets{0};
    std::vector<int32_t> flat;
    for (const auto& member : queries) {
        for (const Vec3i& v : member) flat.insert(flat.end(), v.begin(), v.end());
        offsets.push_back(static_cast<int64_t>(flat.size() / 3));
    }
    Buffer<int32_t> on_device = Buffer<int32_t>::from_host(flat, context());
    return ijk_to_index(Span<const int32_t>(on_device.data(), on_device.size()), offsets).to_host(context().stream);
}

// ---- topology operations --------------------------------------------------------------------------

GridBatch GridBatch::conv_grid(const Vec3i& kernel_size, const Vec3i& stride) const {
    constexpr const char* op = "conv_grid";
    return detail::generate_conv_grid(op, *this, detail::make_conv_geometry(op, kernel_size, stride));
}

GridBatch GridBatch::conv_grid(int32_t kernel_size, int32_t stride) const {
    return conv_grid(Vec3i{kernel_size, kernel_size, kernel_size}, Vec3i{stride, stride, stride});
}

GridBatch GridBatch::conv_transpose_grid(const Vec3i& kernel_size, const Vec3i& stride) const {
    constexpr const char* op = "conv_transpose_grid";
    return detail::generate_conv_transpose_grid(op, *this, detail::make_conv_geometry(op, kernel_size, stride));
}

GridBatch GridBatch::conv_transpose_grid(int32_t kernel_size, int32_t stride) const {
    return conv_transpose_grid(Vec3i{kernel_size, kernel_size, kernel_size}, Vec3i{stride, stride, stride});
}

namespace {

/// The geometry of `inner` followed by `outer`, as one strided convolution of the grid `inner` reads:
/// c reaches S_o c + t_o - p_o through outer and from there S_i (S_o c + t_o - p_o) + t_i - p_i, a
/// contiguous range of fine coordinates over (t_o, t_i) when K_i >= S_i. False when not contiguous or
/// when a size passes int32.
bool compose_geometry(const detail::ConvGeometry& inner, const detail::ConvGeometry& outer, detail::ConvGeometry* out) {
    int64_t volume = 1;
    for (int a = 0; a < 3; ++a) {
        if (inner.kernel[a] < inner.stride[a]) return false;
        const int64_t kernel = int64_t{inner.stride[a]} * (outer.kernel[a] - 1) + inner.kernel[a];
        const int64_t stride = int64_t{inner.stride[a]} * outer.stride[a];
        const int64_t pad = int64_t{inner.stride[a]} * outer.pad[a] + inner.pad[a];
        if (kernel > INT32_MAX || stride > INT32_MAX || pad > INT32_MAX) return false;
        volume *= kernel;
        out->kernel[a] = static_cast<int32_t>(kernel);
        out->stride[a] = static_cast<int32_t>(stride);
        out->pad[a] = static_cast<int32_t>(pad);
    }
    return volume <= INT32_MAX;
}

}  // namespace

GridPyramid GridBatch::pyramid(const Vec3i& kernel_size, const Vec3i& stride, int32_t levels,
                               const std::vector<Vec3i>& coarsening_factors) const {
    constexpr const char* op = "pyramid";
    const detail::ConvGeometry g = detail::make_conv_geometry(op, kernel_size, stride);
    if (levels < 0) throw_error(op, ": levels must be >= 0, got ", levels);
    for (const Vec3i& factor : coarsening_factors) detail::check_positive(op, "coarsening factor", factor);

    // What is built from this grid in one pass, and where each result goes.
    std::vector<detail::ConvGeometry> geometries;
    std::vector<CoordBox> boxes;
    std::vector<std::vector<MemberTransform>> built_transforms;
    GridPyramid out;
    out.levels.resize(static_cast<size_t>(levels));
    out.coarsened.resize(coarsening_factors.size());
    std::vector<GridBatch*> destination;

    // Levels while they compose into one strided convolution of this grid; the rest from the level before.
    int32_t composed_levels = 0;
    if (!g.is_uniform(1, 1)) {
        detail::ConvGeometry composed = g;
        CoordBox box = coordinate_box();
        std::vector<MemberTransform> level_transforms = transforms();
        for (int32_t l = 0; l < levels; ++l) {
            if (l > 0 && !compose_geometry(composed, g, &composed)) break;
            // Boxes and transforms level by level, as the calls replaced compute them.
            box = detail::conv_grid_box(op, box, g);
            level_transforms = map_transforms(level_transforms, scale_up, detail::stride_of(g));
            detail::checked_mul(op, "candidate count", num_voxels(), detail::conv_grid_candidates_per_voxel(composed));
            geometries.push_back(composed);
            boxes.push_back(box);
            built_transforms.push_back(level_transforms);
            destination.push_back(&out.levels[static_cast<size_t>(l)]);
            ++composed_levels;
        }
    }
    for (size_t i = 0; i < coarsening_factors.size(); ++i) {
        const Vec3i& factor = coarsening_factors[i];
        if (factor == Vec3i{1, 1, 1}) {
            out.coarsened[i] = *this;
            continue;
        }
        // floor(ijk / f): the strided convolution of kernel f, stride f and no padding.
        detail::ConvGeometry coarsen{};
        for (int a = 0; a < 3; ++a) {
            coarsen.kernel[a] = factor[a];
            coarsen.stride[a] = factor[a];
            coarsen.pad[a] = 0;
        }
        geometries.push_back(coarsen);
        boxes.push_back(detail::coarsened_box(coordinate_box(), factor));
        built_transforms.push_back(map_transforms(transforms(), coarsen_transform, factor));
        destination.push_back(&out.coarsened[i]);
    }
    std::vector<GridTopology> topologies = on_backend(
        op, device(), [&](auto backend) { return backend.conv_grids(*m_storage, geometries, boxes); });
    for (size_t i = 0; i < topologies.size(); ++i)
        *destination[i] = detail::make_grid(std::move(topologies[i]), std::move(built_transforms[i]), context());
    for (int32_t l = composed_levels; l < levels; ++l)
        out.levels[static_cast<size_t>(l)] =
            (l == 0 ? *this : out.levels[static_cast<size_t>(l) - 1]).conv_grid(kernel_size, stride);
    return out;
}

GridBatch GridBatch::coarsened_grid(const Vec3i& factor) const {
    constexpr const char* op = "coarsened_grid";
    detail::check_positive(op, "factor", factor);
    if (factor == Vec3i{1, 1, 1}) return *this;
    const CoordBox out_box = detail::coarsened_box(coordinate_box(), factor);
    int32_t log2_factor = 0;
    const bool sorted = detail::uniform_power_of_two(factor, &log2_factor);
    GridTopology topology = on_backend(op, device(), [&](auto backend) {
        return sorted ? backend.coarsened_by_power_of_two(*m_storage, log2_factor, out_box)
                      : backend.coarsened_grid(*m_storage, factor, out_box);
    });
    return make_grid(std::move(topology), map_transforms(transforms(), coarsen_transform, factor), context());
}

GridBatch GridBatch::coarsened_grid(int32_t factor) const { return coarsened_grid(Vec3i{factor, factor, factor}); }

GridBatch GridBatch::refined_grid(const Vec3i& factor, Span<const uint8_t> mask) const {
    constexpr const char* op = "refined_grid";
    detail::check_positive(op, "factor", factor);
    if (mask.size != 0 || mask.data != nullptr) {
        detail::check_mask(op, mask, num_voxels());
        // Pruning first gives the exact box of the kept voxels, so only they are checked for overflow.
        return pruned_grid(mask).refined_grid(factor);
    }
    if (factor == Vec3i{1, 1, 1}) return *this;
    const CoordBox out_box = detail::refined_box(op, coordinate_box(), factor);
    const int64_t children = detail::checked_mul(op, "factor product", int64_t{factor[0]} * factor[1], factor[2]);
    detail::check_grid_voxels(op, "output", detail::checked_mul(op, "output voxel count", num_voxels(), children));
    int32_t log2_factor = 0;
    const bool sorted = detail::uniform_power_of_two(factor, &log2_factor);
    GridTopology topology = on_backend(op, device(), [&](auto backend) {
        return sorted ? backend.refined_by_power_of_two(*m_storage, log2_factor, out_box)
                      : backend.refined_grid(*m_storage, factor, out_box);
    });
    return make_grid(std::move(topology), map_transforms(transforms(), refine_transform, factor), context());
}

GridBatch GridBatch::refined_grid(int32_t factor, Span<const uint8_t> mask) const {
    return refined_grid(Vec3i{factor, factor, factor}, mask);
}

GridBatch GridBatch::dilated_grid(int32_t distance) const {
    constexpr const char* op = "dilated_grid";
    if (distance < 0 || distance > max_dilation_distance)
        throw_error(op, ": distance must be in [0, ", max_dilation_distance, "], got ", distance);
    // The Chebyshev ball of radius d is the stride-1 conv grid of the odd kernel 2d + 1 (same transforms).
    const int32_t k = 2 * distance + 1;
    return detail::generate_conv_grid(op, *this, detail::make_conv_geometry(op, {k, k, k}, {1, 1, 1}));
}

GridBatch GridBatch::pruned_grid(Span<const uint8_t> mask) const {
    constexpr const char* op = "pruned_grid";
    detail::check_mask(op, mask, num_voxels());
    GridTopology topology = on_backend(
        op, device(), [&](auto backend) { return backend.pruned_grid(*m_storage, mask.data, nullptr); });
    return make_grid(std::move(topology), transforms(), context());
}

SelectedGrid GridBatch::pruned_grid_with_index(Span<const uint8_t> mask) const {
    constexpr const char* op = "pruned_grid_with_index";
    detail::check_mask(op, mask, num_voxels());
    Buffer<int64_t> kept_index;
    GridTopology topology = on_backend(
        op, device(), [&](auto backend) { return backend.pruned_grid(*m_storage, mask.data, &kept_index); });
    return SelectedGrid{make_grid(std::move(topology), transforms(), context()), std::move(kept_index)};
}

GridBatch GridBatch::merged_grid(const GridBatch& other) const {
    constexpr const char* op = "merged_grid";
    if (other.batch_size() != batch_size())
        throw_error(op, ": other must have the same batch size (", batch_size(), "), got ", other.batch_size());
    if (other.device() != device())
        throw_error(op, ": other must be on the same device (", device().str(), "), got ", other.device().str());
    for (int64_t m = 0; m < batch_size(); ++m)
        if (transforms()[m] != other.transforms()[m])
            throw_error(op, ": member ", m, " has different transforms (voxel size ", detail::to_string(voxel_size(m)),
                        " origin ", detail::to_string(origin(m)), " vs voxel size ",
                        detail::to_string(other.voxel_size(m)), " origin ", detail::to_string(other.origin(m)),
                        "); merged grids must share voxel size and origin exactly");
    const CoordBox out_box = detail::union_box(coordinate_box(), other.coordinate_box());
    GridTopology topology = on_backend(
        op, device(), [&](auto backend) { return backend.merged_grid(*m_storage, other.storage(), out_box); });
    return make_grid(std::move(topology), transforms(), context());
}

ClippedGrid GridBatch::clipped_grid(const std::vector<Vec3i>& ijk_min, const std::vector<Vec3i>& ijk_max) const {
    constexpr const char* op = "clipped_grid";
    const int64_t members = batch_size();
    for (const auto* bound : {&ijk_min, &ijk_max}) {
        const int64_t count = static_cast<int64_t>(bound->size());
        if (count != 1 && count != members)
            throw_error(op, ": ", bound == &ijk_min ? "ijk_min" : "ijk_max", " must hold 1 or batch_size (", members,
                        ") coordinates, got ", count);
    }
    std::vector<int32_t> boxes(static_cast<size_t>(6 * members));
    for (int64_t m = 0; m < members; ++m) {
        const Vec3i& lo = ijk_min[ijk_min.size() == 1 ? 0 : m];
        const Vec3i& hi = ijk_max[ijk_max.size() == 1 ? 0 : m];
        for (int a = 0; a < 3; ++a) {
            boxes[6 * m + a] = lo[a];
            boxes[6 * m + 3 + a] = hi[a];
        }
    }
    const Buffer<int32_t> device_boxes = Buffer<int32_t>::from_host(boxes, context());
    Buffer<int64_t> kept_index;
    GridTopology topology = on_backend(
        op, device(), [&](auto backend) { return backend.clipped_grid(*m_storage, device_boxes.data(), &kept_index); });
    return ClippedGrid{make_grid(std::move(topology), transforms(), context()), std::move(kept_index)};
}

Buffer<int32_t> GridBatch::bbox() const {
    return on_backend("bbox", device(), [&](auto backend) { return backend.bbox(*m_storage); });
}

std::vector<CoordBox> GridBatch::bbox_host() const {
    const std::vector<int32_t> flat = bbox().to_host(context().stream);
    std::vector<CoordBox> boxes(static_cast<size_t>(batch_size()));
    for (size_t m = 0; m < boxes.size(); ++m) {
        boxes[m].lo = {flat[6 * m], flat[6 * m + 1], flat[6 * m + 2]};
        boxes[m].hi = {flat[6 * m + 3], flat[6 * m + 4], flat[6 * m + 5]};
    }
    return boxes;
}

}  // namespace sparsegrid
