#include "core/errors.h"

namespace sparsegrid::detail {

std::string to_string(const Vec3i& v) {
    std::ostringstream s;
    s << "(" << v[0] << ", " << v[1] << ", " << v[2] << ")";
    return s.str();
}

std::string to_string(const Vec3d& v) {
    std::ostringstream s;
    s << "(" << v[0] << ", " << v[1] << ", " << v[2] << ")";
    return s.str();
}

int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b) {
    int64_t result = 0;
    if (__builtin_mul_overflow(a, b, &result)) throw_error(op, ": ", what, " (", a, " x ", b, ") overflows int64");
    return result;
}

}  // namespace sparsegrid::detail
