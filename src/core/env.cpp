#include "core/env.h"

#include <cstdlib>

namespace sparsegrid::detail {

std::string env_string(const char* name) {
    const char* value = std::getenv(name);
    return value ? std::string(value) : std::string();
}

bool env_switch(const char* name, bool default_value) {
    const std::string value = env_string(name);
    if (value.empty()) return default_value;
    return value != "0";
}

}  // namespace sparsegrid::detail
