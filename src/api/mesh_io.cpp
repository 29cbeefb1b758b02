#include <sparsegrid/mesh_io.h>

#include "api/mesh_formats.h"
#include "core/errors.h"

#include <filesystem>
#include <fstream>
#include <string>

namespace sparsegrid {

using detail::throw_error;

bool mesh_loading_available() { return true; }

TriangleMesh load_mesh(const std::string& path) {
    constexpr const char* op = "load_mesh";
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error))
        throw_error(op, ": '", path, "' is not a readable file (missing, or not a regular file)");
    try {
        const detail::MeshFormat format = detail::mesh_format_of(path);
        std::ifstream in(path, std::ios::binary);
        if (!in) throw_error("cannot be opened");
        in.seekg(0, std::ios::end);
        const std::streamoff size = in.tellg();
        if (size < 0) throw_error("cannot be read");
        std::string bytes(static_cast<size_t>(size), '\0');
        in.seekg(0, std::ios::beg);
        if (!in.read(bytes.data(), size)) throw_error("cannot be read to its end");
        return detail::parse_mesh(format, bytes);
    } catch (const Error& reason) {
        throw Error(std::string(op) + ": '" + path + "': " + reason.what());
    } catch (const std::bad_alloc&) {
        throw Error(std::string(op) + ": '" + path + "': out of memory while reading it");
    }
}

}  // namespace sparsegrid
