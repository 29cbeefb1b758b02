// The mesh file formats load_mesh reads, parsed from the file's bytes in memory: Wavefront OBJ, Object
// File Format (OFF), STL (ASCII and binary) and PLY (ASCII, binary little and big endian). Each parser
// checks every count against the bytes that remain before it allocates, reads numbers without
// overflow, refuses non-finite coordinates, triangulates polygons as fans and leaves points and lines
// out; it raises Error with the reason (and a line or element where that helps) but without the file
// name, which load_mesh puts in front.
#pragma once

#include <sparsegrid/mesh_io.h>

#include <string>
#include <string_view>
#include <vector>

namespace sparsegrid::detail {

/// The formats by file extension (lower case, with the dot).
enum class MeshFormat { Obj, Off, Stl, Ply };

/// The format of a file name's extension (case-insensitive); raises naming the extension and the
/// supported ones otherwise.
MeshFormat mesh_format_of(const std::string& path);

/// The extensions load_mesh reads, for messages: ".obj, .off, .ply, .stl".
const char* supported_mesh_extensions();

TriangleMesh parse_mesh(MeshFormat format, std::string_view bytes);

TriangleMesh parse_obj(std::string_view text);
TriangleMesh parse_off(std::string_view text);
TriangleMesh parse_stl(std::string_view bytes);
TriangleMesh parse_ply(std::string_view bytes);

}  // namespace sparsegrid::detail
