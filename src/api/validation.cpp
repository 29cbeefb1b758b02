#include "api/validation.h"

#include <climits>
#include <cmath>

namespace sparsegrid::detail {

void check_mask(const char* op, Span<const uint8_t> mask, int64_t num_voxels) {
    if (mask.size != num_voxels)
        throw_error(op, ": mask must hold one byte per voxel (", num_voxels, "), got ", mask.size);
    if (mask.size > 0 && mask.data == nullptr) throw_error(op, ": mask data is null for ", mask.size, " entries");
}

void check_grid_voxels(const char* op, const char* what, int64_t count) {
    if (count > kMaxGridVoxels)
        throw_error(op, ": the ", what, " grid would have ", count,
                    " voxels, more than the 2^31 - 1 = ", kMaxGridVoxels,
                    " a grid can hold (kernel maps index voxels with int32)");
}

void check_positive(const char* op, const char* name, const Vec3i& values) {
    for (int a = 0; a < 3; ++a)
        if (values[a] < 1) throw_error(op, ": ", name, "[", a, "] must be >= 1, got ", values[a]);
}

ConvGeometry make_conv_geometry(const char* op, const Vec3i& kernel_size, const Vec3i& stride) {
    check_positive(op, "kernel_size", kernel_size);
    check_positive(op, "stride", stride);
    const int64_t volume = int64_t{kernel_size[0]} * kernel_size[1] * kernel_size[2];
    if (volume > INT32_MAX)
        throw_error(op, ": kernel_size ", to_string(kernel_size), " has ", volume,
                    " taps; at most 2^31 - 1 are supported");
    ConvGeometry g{};
    for (int a = 0; a < 3; ++a) {
        g.kernel[a] = kernel_size[a];
        g.stride[a] = stride[a];
        g.pad[a] = (kernel_size[a] - 1) / 2;
    }
    return g;
}

void check_offsets(const char* op, const char* name, const std::vector<int64_t>& offsets, int64_t expected_total) {
    if (offsets.size() < 2) throw_error(op, ": ", name, " must hold batch_size + 1 >= 2 entries, got ", offsets.size());
    if (offsets.size() - 1 > static_cast<size_t>(INT32_MAX))
        throw_error(op, ": batch size must be < 2^31, got ", offsets.size() - 1);
    if (offsets[0] != 0) throw_error(op, ": ", name, "[0] must be 0, got ", offsets[0]);
    for (size_t m = 1; m < offsets.size(); ++m)
        if (offsets[m] < offsets[m - 1])
            throw_error(op, ": ", name, " must be non-decreasing, got ", name, "[", m - 1, "] = ", offsets[m - 1],
                        " > ", name, "[", m, "] = ", offsets[m]);
    if (offsets.back() != expected_total)
        throw_error(op, ": ", name, "[", offsets.size() - 1, "] must equal the number of entries (", expected_total,
                    "), got ", offsets.back());
}

std::vector<MemberTransform> resolve_transforms(const char* op, const std::vector<MemberTransform>& transforms,
                                                int64_t batch_size, bool allow_empty) {
    if (transforms.empty() && allow_empty) return std::vector<MemberTransform>(static_cast<size_t>(batch_size));
    if (static_cast<int64_t>(transforms.size()) != batch_size)
        throw_error(op, ": transforms must hold one entry per member (", batch_size, "), got ", transforms.size());
    for (size_t m = 0; m < transforms.size(); ++m) {
        for (int a = 0; a < 3; ++a) {
            const double h = transforms[m].voxel_size[a];
            if (!(std::isfinite(h) && h > 0.0))
                throw_error(op, ": transforms[", m, "].voxel_size[", a, "] must be finite and > 0, got ", h);
            if (!std::isfinite(transforms[m].origin[a]))
                throw_error(op, ": transforms[", m, "].origin[", a, "] must be finite, got ", transforms[m].origin[a]);
        }
    }
    return transforms;
}

namespace {

int32_t checked_coordinate(const char* op, int axis, int64_t value) {
    if (value < INT32_MIN || value > INT32_MAX)
        throw_error(op, ": output coordinate ", value, " on axis ", axis,
                    " does not fit int32 (coordinates must lie in [-2^31, 2^31 - 1])");
    return static_cast<int32_t>(value);
}

}  // namespace

CoordBox conv_grid_box(const char* op, const CoordBox& box, const ConvGeometry& g) {
    if (box.empty()) return CoordBox{};
    CoordBox out;
    for (int a = 0; a < 3; ++a) {
        int64_t lo = 0, hi = 0, unused = 0;
        g.coarse_range(a, box.lo[a], &lo, &unused);
        g.coarse_range(a, box.hi[a], &unused, &hi);
        out.lo[a] = checked_coordinate(op, a, lo);
        out.hi[a] = checked_coordinate(op, a, hi);
    }
    return out;
}

CoordBox conv_transpose_grid_box(const char* op, const CoordBox& box, const ConvGeometry& g) {
    if (box.empty()) return CoordBox{};
    CoordBox out;
    for (int a = 0; a < 3; ++a) {
        out.lo[a] = checked_coordinate(op, a, g.fine_of(a, box.lo[a], 0));
        out.hi[a] = checked_coordinate(op, a, g.fine_of(a, box.hi[a], g.kernel[a] - 1));
    }
    return out;
}

CoordBox coarsened_box(const CoordBox& box, const Vec3i& factor) {
    if (box.empty()) return CoordBox{};
    CoordBox out;
    for (int a = 0; a < 3; ++a) {
        out.lo[a] = static_cast<int32_t>(floor_div(box.lo[a], factor[a]));
        out.hi[a] = static_cast<int32_t>(floor_div(box.hi[a], factor[a]));
    }
    return out;
}

CoordBox refined_box(const char* op, const CoordBox& box, const Vec3i& factor) {
    if (box.empty()) return CoordBox{};
    CoordBox out;
    for (int a = 0; a < 3; ++a) {
        out.lo[a] = checked_coordinate(op, a, int64_t{factor[a]} * box.lo[a]);
        out.hi[a] = checked_coordinate(op, a, int64_t{factor[a]} * box.hi[a] + factor[a] - 1);
    }
    return out;
}

}  // namespace sparsegrid::detail
