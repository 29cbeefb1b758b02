// Error construction shared by every layer: messages assembled from stream fragments, and overflow-checked
// size arithmetic. The operation named in a message is the caller's: front ends pass the name of the
// operation the user called; backends raise messages without one, which the front end prefixes.
#pragma once

#include <sparsegrid/types.h>

#include <sstream>
#include <string>

namespace sparsegrid::detail {

/// Builds an Error message from stream fragments: throw_error("conv_grid: stride[", a, "] must be ...").
template <typename... Parts>
[[noreturn]] void throw_error(const Parts&... parts) {
    std::ostringstream message;
    (message << ... << parts);
    throw Error(message.str());
}

std::string to_string(const Vec3i& v);
std::string to_string(const Vec3d& v);

/// a * b for sizes, raising "<op>: <what> (a x b) overflows int64" instead of wrapping.
int64_t checked_mul(const char* op, const char* what, int64_t a, int64_t b);

}  // namespace sparsegrid::detail
