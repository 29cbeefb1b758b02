// GridBatch front end: validation, output transforms and boxes, backend dispatch.
#include <sparsegrid/grid_batch.h>

#include "core/backend.h"
#include "core/checks.h"
#include "cpu/mesh_cpu.h"
#if defined(SPARSEGRID_WITH_CUDA)
#include "cuda/mesh_cuda.h"
#endif

#include <cmath>

namespace sparsegrid {

using detail::GridStorage;
using detail::GridTopology;
using detail::throw_error;

namespace {

std::shared_ptr<const GridStorage> make_storage(GridTopology topology, std::vector<MemberTransform> transforms,
                                                const Context& ctx) {
    auto storage = std::make_shared<GridStorage>();
    storage->topology = std::move(topology);
    storage->transforms = std::move(transforms);
    storage->context = ctx;
    return storage;
}

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

void check_mask(const char* op, Span<const uint8_t> mask, int64_t num_voxels) {
    if (mask.size != num_voxels)
        throw_error(op, ": mask must hold one byte per voxel (", num_voxels, "), got ", mask.size);
    if (mask.size > 0 && mask.data == nullptr) throw_error(op, ": mask data is null for ", mask.size, " entries");
}

}  // namespace

GridBatch::GridBatch() {
    GridTopology topology;
    topology.offsets = {0};
    topology.offsets_buffer = Buffer<int64_t>::from_host(topology.offsets, Context{});
    m_storage = make_storage(std::move(topology), {}, Context{});
}

GridBatch::GridBatch(std::shared_ptr<const GridStorage> storage) : m_storage(std::move(storage)) {}

// ---- constructors ---------------------------------------------------------------------------------

GridBatch GridBatch::from_ijk(Span<const int32_t> ijk, const std::vector<int64_t>& member_offsets,
                              const std::vector<MemberTransform>& transforms, const Context& ctx) {
    constexpr const char* op = "GridBatch::from_ijk";
    if (ijk.size % 3 != 0) throw_error(op, ": ijk must hold (i, j, k) triples, got ", ijk.size, " values");
    if (ijk.size > 0 && ijk.data == nullptr) throw_error(op, ": ijk data is null for ", ijk.size, " values");
    detail::check_offsets(op, "member_offsets", member_offsets, ijk.size / 3);
    const int64_t batch_size = static_cast<int64_t>(member_offsets.size()) - 1;
    std::vector<MemberTransform> resolved = detail::resolve_transforms(op, transforms, batch_size, true);
    GridTopology topology = SPARSEGRID_DISPATCH(op, ctx, build_from_ijk(ijk.data, member_offsets, ctx));
    return GridBatch(make_storage(std::move(topology), std::move(resolved), ctx));
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
    Buffer<int32_t> ijk = SPARSEGRID_DISPATCH(op, ctx, points_to_ijk(xyz.data, member_offsets, resolved, ctx));
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
    GridTopology topology = SPARSEGRID_DISPATCH(
        op, ctx, from_mesh(vertices.data, vertex_offsets, faces.data, face_offsets, resolved, ctx));
    return GridBatch(make_storage(std::move(topology), std::move(resolved), ctx));
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
    const Context& ctx = context();
    return SPARSEGRID_DISPATCH(op, ctx, ijk_to_index(*m_storage, query_ijk.data, query_offsets));
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
    const detail::ConvGeometry g = detail::make_conv_geometry(op, kernel_size, stride);
    if (g.is_uniform(1, 1)) return *this;
    const CoordBox out_box = detail::conv_grid_box(op, coordinate_box(), g);
    const Context& ctx = context();
    GridTopology topology = SPARSEGRID_DISPATCH(op, ctx, conv_grid(*m_storage, g, out_box));
    return GridBatch(make_storage(std::move(topology), map_transforms(transforms(), scale_up, stride), ctx));
}

GridBatch GridBatch::conv_grid(int32_t kernel_size, int32_t stride) const {
    return conv_grid(Vec3i{kernel_size, kernel_size, kernel_size}, Vec3i{stride, stride, stride});
}

GridBatch GridBatch::conv_transpose_grid(const Vec3i& kernel_size, const Vec3i& stride) const {
    constexpr const char* op = "conv_transpose_grid";
    const detail::ConvGeometry g = detail::make_conv_geometry(op, kernel_size, stride);
    if (g.is_uniform(1, 1)) return *this;
    const CoordBox out_box = detail::conv_transpose_grid_box(op, coordinate_box(), g);
    const Context& ctx = context();
    GridTopology topology = SPARSEGRID_DISPATCH(op, ctx, conv_transpose_grid(*m_storage, g, out_box));
    return GridBatch(make_storage(std::move(topology), map_transforms(transforms(), scale_down, stride), ctx));
}

GridBatch GridBatch::conv_transpose_grid(int32_t kernel_size, int32_t stride) const {
    return conv_transpose_grid(Vec3i{kernel_size, kernel_size, kernel_size}, Vec3i{stride, stride, stride});
}

GridBatch GridBatch::coarsened_grid(const Vec3i& factor) const {
    constexpr const char* op = "coarsened_grid";
    detail::check_positive(op, "factor", factor);
    if (factor == Vec3i{1, 1, 1}) return *this;
    const CoordBox out_box = detail::coarsened_box(coordinate_box(), factor);
    const Context& ctx = context();
    GridTopology topology = SPARSEGRID_DISPATCH(op, ctx, coarsened_grid(*m_storage, factor, out_box));
    return GridBatch(make_storage(std::move(topology), map_transforms(transforms(), coarsen_transform, factor), ctx));
}

GridBatch GridBatch::coarsened_grid(int32_t factor) const { return coarsened_grid(Vec3i{factor, factor, factor}); }

GridBatch GridBatch::refined_grid(const Vec3i& factor, Span<const uint8_t> mask) const {
    constexpr const char* op = "refined_grid";
    detail::check_positive(op, "factor", factor);
    if (mask.size != 0 || mask.data != nullptr) {
        check_mask(op, mask, num_voxels());
        // Pruning first gives the exact box of the kept voxels, so only they are checked for overflow.
        return pruned_grid(mask).refined_grid(factor);
    }
    if (factor == Vec3i{1, 1, 1}) return *this;
    const CoordBox out_box = detail::refined_box(op, coordinate_box(), factor);
    const Context& ctx = context();
    GridTopology topology = SPARSEGRID_DISPATCH(op, ctx, refined_grid(*m_storage, factor, out_box));
    return GridBatch(make_storage(std::move(topology), map_transforms(transforms(), refine_transform, factor), ctx));
}

GridBatch GridBatch::refined_grid(int32_t factor, Span<const uint8_t> mask) const {
    return refined_grid(Vec3i{factor, factor, factor}, mask);
}

GridBatch GridBatch::dilated_grid(int32_t distance) const {
    constexpr const char* op = "dilated_grid";
    // The Chebyshev ball of radius d is the stride-1 conv grid of the odd kernel 2d + 1, whose tap
    // count (2d + 1)^3 must fit int32: d <= 645.
    constexpr int32_t max_distance = 645;
    if (distance < 0 || distance > max_distance)
        throw_error(op, ": distance must be in [0, ", max_distance, "], got ", distance);
    if (distance == 0) return *this;
    const int32_t k = 2 * distance + 1;
    const detail::ConvGeometry g = detail::make_conv_geometry(op, {k, k, k}, {1, 1, 1});
    const CoordBox out_box = detail::conv_grid_box(op, coordinate_box(), g);
    const Context& ctx = context();
    GridTopology topology = SPARSEGRID_DISPATCH(op, ctx, conv_grid(*m_storage, g, out_box));
    return GridBatch(make_storage(std::move(topology), transforms(), ctx));
}

GridBatch GridBatch::pruned_grid(Span<const uint8_t> mask) const {
    constexpr const char* op = "pruned_grid";
    check_mask(op, mask, num_voxels());
    const Context& ctx = context();
    GridTopology topology = SPARSEGRID_DISPATCH(op, ctx, pruned_grid(*m_storage, mask.data));
    return GridBatch(make_storage(std::move(topology), transforms(), ctx));
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
    const Context& ctx = context();
    GridTopology topology = SPARSEGRID_DISPATCH(op, ctx, merged_grid(*m_storage, other.storage(), out_box));
    return GridBatch(make_storage(std::move(topology), transforms(), ctx));
}

}  // namespace sparsegrid
