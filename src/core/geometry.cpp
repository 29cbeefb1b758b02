#include "core/geometry.h"

#include <algorithm>

namespace sparsegrid::detail {

CoordBox union_box(const CoordBox& a, const CoordBox& b) {
    if (a.empty()) return b;
    if (b.empty()) return a;
    CoordBox out;
    for (int d = 0; d < 3; ++d) {
        out.lo[d] = std::min(a.lo[d], b.lo[d]);
        out.hi[d] = std::max(a.hi[d], b.hi[d]);
    }
    return out;
}

KeyCodec make_codec(const CoordBox& box, int64_t batch_size) {
    KeyCodec codec;
    codec.coord_bits = 1;
    if (!box.empty()) {
        for (int a = 0; a < 3; ++a) {
            while (true) {
                const int64_t half = int64_t{1} << (codec.coord_bits - 1);
                if (box.lo[a] >= -half && box.hi[a] < half) break;
                ++codec.coord_bits;
            }
        }
    }
    codec.member_bits = 0;
    while (codec.member_bits < 32 && (int64_t{1} << codec.member_bits) < batch_size) ++codec.member_bits;
    return codec;
}

bool uniform_power_of_two(const Vec3i& factor, int32_t* log2_factor) {
    if (factor[0] != factor[1] || factor[0] != factor[2] || factor[0] < 1) return false;
    const int32_t f = factor[0];
    if ((f & (f - 1)) != 0) return false;
    int32_t p = 0;
    while ((1 << p) < f) ++p;
    *log2_factor = p;
    return true;
}

}  // namespace sparsegrid::detail
