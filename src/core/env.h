// Environment switches of the library (measurement and debugging toggles). Every switch is read once,
// by the caller, into a function-local static; results never depend on them unless documented.
#pragma once

#include <string>

namespace sparsegrid::detail {

/// The value of environment variable `name`, or "" when unset.
std::string env_string(const char* name);

/// A boolean switch: `default_value` when unset or empty, false for "0", true for any other value.
bool env_switch(const char* name, bool default_value);

}  // namespace sparsegrid::detail
