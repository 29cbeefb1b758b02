#include "api/mesh_formats.h"

#include "core/errors.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace sparsegrid::detail {

namespace {

/// A token for a message: at most 40 characters, anything unprintable as '?'.
std::string quoted(std::string_view token) {
    std::string out = "'";
    for (size_t i = 0; i < token.size() && i < 40; ++i)
        out += std::isprint(static_cast<unsigned char>(token[i])) ? token[i] : '?';
    if (token.size() > 40) out += "...";
    return out + "'";
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v' || c == '\n'; }

/// Lines of a text (without their "\n" or "\r\n"), numbered from 1.
class Lines {
public:
    explicit Lines(std::string_view text) : m_text(text) {}
    bool next(std::string_view& line) {
        if (m_position >= m_text.size()) return false;
        size_t end = m_text.find('\n', m_position);
        if (end == std::string_view::npos) end = m_text.size();
        line = m_text.substr(m_position, end - m_position);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        m_position = end + 1;
        ++m_number;
        return true;
    }
    int64_t number() const { return m_number; }
    /// Lines not yet returned (an upper bound on the records that can follow).
    int64_t remaining() const {
        if (m_position >= m_text.size()) return 0;
        const auto newlines = std::count(m_text.begin() + static_cast<std::ptrdiff_t>(m_position), m_text.end(), '\n');
        return newlines + (m_text.back() == '\n' ? 0 : 1);
    }
    size_t position() const { return m_position; }

private:
    std::string_view m_text;
    size_t m_position = 0;
    int64_t m_number = 0;
};

/// Whitespace-separated tokens of a string.
class Tokens {
public:
    explicit Tokens(std::string_view text) : m_text(text) {}
    bool next(std::string_view& token) {
        while (m_position < m_text.size() && is_space(m_text[m_position])) ++m_position;
        if (m_position >= m_text.size()) return false;
        const size_t start = m_position;
        while (m_position < m_text.size() && !is_space(m_text[m_position])) ++m_position;
        token = m_text.substr(start, m_position - start);
        return true;
    }

private:
    std::string_view m_text;
    size_t m_position = 0;
};

std::string_view without_comment(std::string_view line) {
    const size_t hash = line.find('#');
    return hash == std::string_view::npos ? line : line.substr(0, hash);
}

/// A whole token as a number (a leading '+' allowed; out of range fails), for double and int64_t.
template <typename Number>
bool parse_number(std::string_view token, Number& value) {
    if (!token.empty() && token.front() == '+') token.remove_prefix(1);
    const auto [end, status] = std::from_chars(token.data(), token.data() + token.size(), value);
    return status == std::errc() && end == token.data() + token.size() && !token.empty();
}

bool parse_double(std::string_view token, double& value) { return parse_number(token, value); }
bool parse_integer(std::string_view token, int64_t& value) { return parse_number(token, value); }

/// The mesh as it is read: vertices checked finite, polygons fanned into triangles, every index checked
/// against the vertex count at the end (OBJ may refer to vertices defined later).
class MeshBuilder {
public:
    /// `where` describes the record for a message ("line 12").
    template <typename Where>
    void vertex(double x, double y, double z, Where&& where) {
        if (!(std::isfinite(x) && std::isfinite(y) && std::isfinite(z)))
            throw_error("vertex ", m_mesh.vertices.size(), " (", where(), ") is not finite (", x, ", ", y, ", ", z,
                        ")");
        if (m_mesh.vertices.size() >= static_cast<size_t>(INT32_MAX)) throw_error("more than 2^31 - 1 vertices");
        m_mesh.vertices.push_back({x, y, z});
    }

    std::vector<int64_t>& corners() { return m_corners; }

    /// The polygon in corners() as a fan of triangles (none for fewer than three corners: points and
    /// lines are left out).
    template <typename Where>
    void polygon(Where&& where) {
        for (const int64_t corner : m_corners)
            if (corner < 0 || corner >= INT32_MAX)
                throw_error("a face (", where(), ") refers to vertex ", corner, ", outside [0, 2^31 - 1)");
        for (size_t k = 2; k < m_corners.size(); ++k) {
            if (m_mesh.faces.size() >= static_cast<size_t>(INT32_MAX)) throw_error("more than 2^31 - 1 triangles");
            m_mesh.faces.push_back({static_cast<int32_t>(m_corners[0]), static_cast<int32_t>(m_corners[k - 1]),
                                    static_cast<int32_t>(m_corners[k])});
        }
        m_corners.clear();
    }

    size_t vertex_count() const { return m_mesh.vertices.size(); }

    TriangleMesh finish() {
        const auto count = static_cast<int64_t>(m_mesh.vertices.size());
        for (size_t f = 0; f < m_mesh.faces.size(); ++f)
            for (const int32_t corner : m_mesh.faces[f])
                if (corner >= count) throw_error("triangle ", f, " refers to vertex ", corner, " of ", count);
        if (m_mesh.faces.empty()) throw_error("holds no triangles");
        return std::move(m_mesh);
    }

private:
    TriangleMesh m_mesh;
    std::vector<int64_t> m_corners;
};

// ---- binary reading -------------------------------------------------------------------------------

/// Bytes read front to back, every read checked against the end.
class Cursor {
public:
    Cursor(std::string_view bytes, bool big_endian) : m_bytes(bytes), m_big_endian(big_endian) {}
    size_t remaining() const { return m_bytes.size() - m_position; }
    /// `count` bytes, in little-endian order.
    void read(unsigned char* out, size_t count, const char* what) {
        if (count > remaining()) throw_error("the file ends inside ", what);
        std::memcpy(out, m_bytes.data() + m_position, count);
        if (m_big_endian) std::reverse(out, out + count);
        m_position += count;
    }
    void skip(size_t count, const char* what) {
        if (count > remaining()) throw_error("the file ends inside ", what);
        m_position += count;
    }

private:
    std::string_view m_bytes;
    size_t m_position = 0;
    bool m_big_endian = false;
};

template <typename T>
T from_little_endian(const unsigned char* bytes) {
    std::array<unsigned char, sizeof(T)> ordered{};
    for (size_t i = 0; i < sizeof(T); ++i) ordered[i] = bytes[i];
    if constexpr (sizeof(T) > 1) {
        const uint16_t probe = 1;
        unsigned char first = 0;
        std::memcpy(&first, &probe, 1);
        if (first == 0) std::reverse(ordered.begin(), ordered.end());  // a big-endian host
    }
    T value;
    std::memcpy(&value, ordered.data(), sizeof(T));
    return value;
}

// ---- PLY ------------------------------------------------------------------------------------------

enum class PlyType { Int8, UInt8, Int16, UInt16, Int32, UInt32, Float32, Float64 };

bool ply_type(std::string_view name, PlyType& type) {
    static constexpr std::pair<std::string_view, PlyType> kNames[] = {
        {"char", PlyType::Int8},      {"int8", PlyType::Int8},       {"uchar", PlyType::UInt8},
        {"uint8", PlyType::UInt8},    {"short", PlyType::Int16},     {"int16", PlyType::Int16},
        {"ushort", PlyType::UInt16},  {"uint16", PlyType::UInt16},   {"int", PlyType::Int32},
        {"int32", PlyType::Int32},    {"uint", PlyType::UInt32},     {"uint32", PlyType::UInt32},
        {"float", PlyType::Float32},  {"float32", PlyType::Float32}, {"double", PlyType::Float64},
        {"float64", PlyType::Float64}};
    for (const auto& [text, value] : kNames)
        if (name == text) {
            type = value;
            return true;
        }
    return false;
}

size_t ply_size(PlyType type) {
    switch (type) {
    case PlyType::Int8:
    case PlyType::UInt8:
        return 1;
    case PlyType::Int16:
    case PlyType::UInt16:
        return 2;
    case PlyType::Int32:
    case PlyType::UInt32:
    case PlyType::Float32:
        return 4;
    case PlyType::Float64:
        return 8;
    }
    return 8;
}

bool ply_is_integer(PlyType type) { return type != PlyType::Float32 && type != PlyType::Float64; }

struct PlyProperty {
    std::string name;
    bool is_list = false;
    PlyType count_type = PlyType::UInt8;
    PlyType type = PlyType::Float32;
};

struct PlyElement {
    std::string name;
    int64_t count = 0;
    std::vector<PlyProperty> properties;
};

/// Values of a PLY body, ASCII or binary, as doubles.
class PlyReader {
public:
    PlyReader(std::string_view body, bool ascii, bool big_endian)
        : m_ascii(ascii), m_tokens(body), m_cursor(body, big_endian), m_size(body.size()) {}

    double value(PlyType type, const char* what) {
        if (m_ascii) {
            std::string_view token;
            if (!m_tokens.next(token)) throw_error("the file ends inside ", what);
            double v = 0.0;
            if (!parse_double(token, v)) throw_error(quoted(token), " in ", what, " is not a number");
            if (ply_is_integer(type) && v != std::floor(v))
                throw_error(quoted(token), " in ", what, " is not an integer");
            return v;
        }
        unsigned char bytes[8];
        m_cursor.read(bytes, ply_size(type), what);
        switch (type) {
        case PlyType::Int8:
            return static_cast<double>(static_cast<int8_t>(bytes[0]));
        case PlyType::UInt8:
            return static_cast<double>(bytes[0]);
        case PlyType::Int16:
            return from_little_endian<int16_t>(bytes);
        case PlyType::UInt16:
            return from_little_endian<uint16_t>(bytes);
        case PlyType::Int32:
            return from_little_endian<int32_t>(bytes);
        case PlyType::UInt32:
            return from_little_endian<uint32_t>(bytes);
        case PlyType::Float32:
            return static_cast<double>(from_little_endian<float>(bytes));
        case PlyType::Float64:
            return from_little_endian<double>(bytes);
        }
        return 0.0;
    }

    /// A list's length: a non-negative integer that the rest of the file can hold.
    int64_t list_length(const PlyProperty& property, const char* what) {
        const double v = value(property.count_type, what);
        const double item_bytes = m_ascii ? 1.0 : static_cast<double>(ply_size(property.type));
        if (!(v >= 0.0) || v * item_bytes > static_cast<double>(m_size))
            throw_error("a list in ", what, " has length ", v, ", more than the file holds");
        return static_cast<int64_t>(v);
    }

    /// Bytes (binary) or characters (ASCII) the body has: an upper bound on the values that remain.
    size_t size() const { return m_size; }

private:
    bool m_ascii;
    Tokens m_tokens;
    Cursor m_cursor;
    size_t m_size;
};

}  // namespace

// ---- formats ----------------------------------------------------------------------------------------

const char* supported_mesh_extensions() { return ".obj, .off, .ply, .stl"; }

MeshFormat mesh_format_of(const std::string& path) {
    const size_t slash = path.find_last_of('/');
    const size_t dot = path.find_last_of('.');
    std::string extension;
    if (dot != std::string::npos && (slash == std::string::npos || dot > slash)) extension = path.substr(dot);
    std::transform(extension.begin(), extension.end(), extension.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (extension == ".obj") return MeshFormat::Obj;
    if (extension == ".off") return MeshFormat::Off;
    if (extension == ".stl") return MeshFormat::Stl;
    if (extension == ".ply") return MeshFormat::Ply;
    throw_error("the file format ", extension.empty() ? std::string("(no extension)") : quoted(extension),
                " is not supported; supported: ", supported_mesh_extensions());
}

TriangleMesh parse_mesh(MeshFormat format, std::string_view bytes) {
    switch (format) {
    case MeshFormat::Obj:
        return parse_obj(bytes);
    case MeshFormat::Off:
        return parse_off(bytes);
    case MeshFormat::Stl:
        return parse_stl(bytes);
    case MeshFormat::Ply:
        return parse_ply(bytes);
    }
    throw_error("unknown mesh format");
}

TriangleMesh parse_obj(std::string_view text) {
    MeshBuilder builder;
    Lines lines(text);
    std::string_view line, token;
    auto where = [&] { return "line " + std::to_string(lines.number()); };
    while (lines.next(line)) {
        Tokens tokens(without_comment(line));
        if (!tokens.next(token)) continue;
        if (token == "v") {
            double c[3];
            for (double& value : c)
                if (!tokens.next(token) || !parse_double(token, value))
                    throw_error(where(), ": a vertex needs three numbers");
            builder.vertex(c[0], c[1], c[2], where);
        } else if (token == "f") {
            while (tokens.next(token)) {
                int64_t index = 0;
                if (!parse_integer(token.substr(0, token.find('/')), index) || index == 0)
                    throw_error(where(), ": ", quoted(token),
                                " is not a vertex reference (from 1, or negative counting back)");
                const int64_t resolved = index > 0 ? index - 1 : static_cast<int64_t>(builder.vertex_count()) + index;
                if (resolved < 0)
                    throw_error(where(), ": vertex reference ", index, " reaches before the first vertex");
                builder.corners().push_back(resolved);
            }
            builder.polygon(where);
        }
        // Everything else (texture coordinates, normals, groups, materials, lines, points) is not geometry
        // a voxeliser needs.
    }
    return builder.finish();
}

TriangleMesh parse_off(std::string_view text) {
    MeshBuilder builder;
    Lines lines(text);
    std::string_view line, token;
    auto where = [&] { return "line " + std::to_string(lines.number()); };
    // The next line with content, comments removed.
    auto next_record = [&](Tokens& tokens) {
        while (lines.next(line)) {
            const std::string_view content = without_comment(line);
            if (content.find_first_not_of(" \t\r\f\v") != std::string_view::npos) {
                tokens = Tokens(content);
                return true;
            }
        }
        return false;
    };
    Tokens tokens("");
    if (!next_record(tokens)) throw_error("is empty");
    tokens.next(token);
    int64_t counts[2] = {0, 0};
    if (token.size() >= 3 && token.substr(token.size() - 3) == "OFF") {
        const std::string_view prefix = token.substr(0, token.size() - 3);
        if (prefix.find('4') != std::string_view::npos || prefix.find('n') != std::string_view::npos)
            throw_error("the header ", quoted(token), " declares a 4D or nD OFF file; only 3D OFF is supported");
        if (prefix.find_first_not_of("STCN") != std::string_view::npos)
            throw_error("the header ", quoted(token), " is not an OFF header");
        // The counts follow on the header's line or on the next one with content.
        if (!tokens.next(token) && (!next_record(tokens) || !tokens.next(token)))
            throw_error("ends before its vertex and face counts");
    }  // else no header: the first line holds the counts
    for (int i = 0; i < 2; ++i) {
        if (i > 0 && !tokens.next(token)) throw_error(where(), ": the counts need a vertex and a face count");
        if (!parse_integer(token, counts[i]) || counts[i] < 0)
            throw_error(where(), ": ", quoted(token), " is not a count");
    }
    const int64_t vertices = counts[0], faces = counts[1];
    if (vertices > INT32_MAX) throw_error("declares ", vertices, " vertices, more than 2^31 - 1");
    if (faces > lines.remaining() - vertices)
        throw_error("declares ", vertices, " vertices and ", faces, " faces, more than its remaining ",
                    lines.remaining(), " lines hold");
    for (int64_t v = 0; v < vertices; ++v) {
        if (!next_record(tokens)) throw_error("ends after ", v, " of ", vertices, " vertices");
        double c[3];
        for (double& value : c)
            if (!tokens.next(token) || !parse_double(token, value))
                throw_error(where(), ": a vertex needs three numbers");
        builder.vertex(c[0], c[1], c[2], where);
    }
    for (int64_t f = 0; f < faces; ++f) {
        if (!next_record(tokens)) throw_error("ends after ", f, " of ", faces, " faces");
        int64_t corners = 0;
        if (!tokens.next(token) || !parse_integer(token, corners) || corners < 0)
            throw_error(where(), ": a face starts with its vertex count");
        for (int64_t k = 0; k < corners; ++k) {
            int64_t index = 0;
            if (!tokens.next(token) || !parse_integer(token, index))
                throw_error(where(), ": the face lists ", k, " of its ", corners, " vertex indices");
            if (index < 0 || index >= vertices)
                throw_error(where(), ": the face refers to vertex ", index, " of ", vertices);
            builder.corners().push_back(index);
        }
        builder.polygon(where);  // colour values after the indices are ignored
    }
    return builder.finish();
}

TriangleMesh parse_stl(std::string_view bytes) {
    MeshBuilder builder;
    const size_t first = std::min(bytes.size(), bytes.find_first_not_of(" \t\r\n"));
    const bool solid = bytes.substr(first, 5) == "solid";
    if (bytes.size() >= 84) {
        const auto triangles = from_little_endian<uint32_t>(reinterpret_cast<const unsigned char*>(bytes.data()) + 80);
        const uint64_t expected = 84 + 50 * uint64_t{triangles};
        if (bytes.size() == expected || (!solid && bytes.size() >= expected)) {
            if (uint64_t{triangles} * 3 > static_cast<uint64_t>(INT32_MAX))
                throw_error("declares ", triangles, " triangles, more than 2^31 - 1 vertices");
            const auto* data = reinterpret_cast<const unsigned char*>(bytes.data());
            for (uint32_t t = 0; t < triangles; ++t) {
                const unsigned char* record = data + 84 + 50 * uint64_t{t};
                for (int corner = 0; corner < 3; ++corner) {
                    const unsigned char* xyz = record + 12 + 12 * corner;
                    builder.vertex(from_little_endian<float>(xyz), from_little_endian<float>(xyz + 4),
                                   from_little_endian<float>(xyz + 8), [&] { return "triangle " + std::to_string(t); });
                    builder.corners().push_back(static_cast<int64_t>(builder.vertex_count()) - 1);
                }
                builder.polygon([&] { return "triangle " + std::to_string(t); });
            }
            return builder.finish();
        }
        if (!solid)
            throw_error("is not ASCII STL, and as binary STL its header declares ", triangles, " triangles (", expected,
                        " bytes) but it has ", bytes.size(), " bytes");
    }
    if (!solid) throw_error("is neither ASCII STL (starting with 'solid') nor binary STL (84 bytes or more)");
    Lines lines(bytes);
    std::string_view line, token;
    auto where = [&] { return "line " + std::to_string(lines.number()); };
    bool in_loop = false;
    while (lines.next(line)) {
        Tokens tokens(line);
        while (tokens.next(token)) {
            if (token == "vertex") {
                if (!in_loop) throw_error(where(), ": a vertex outside 'outer loop'");
                double c[3];
                for (double& value : c)
                    if (!tokens.next(token) || !parse_double(token, value))
                        throw_error(where(), ": a vertex needs three numbers");
                builder.vertex(c[0], c[1], c[2], where);
                builder.corners().push_back(static_cast<int64_t>(builder.vertex_count()) - 1);
            } else if (token == "loop") {
                in_loop = true;
                builder.corners().clear();
            } else if (token == "endloop") {
                if (!in_loop) throw_error(where(), ": 'endloop' without 'outer loop'");
                if (builder.corners().size() < 3)
                    throw_error(where(), ": a facet with ", builder.corners().size(), " vertices");
                builder.polygon(where);
                in_loop = false;
            }
            // solid / facet / normal / outer / endfacet / endsolid, names and normal components: skipped.
        }
    }
    if (in_loop) throw_error("ends inside a facet");
    return builder.finish();
}

TriangleMesh parse_ply(std::string_view bytes) {
    Lines lines(bytes);
    std::string_view line, token;
    auto where = [&] { return "header line " + std::to_string(lines.number()); };
    if (!lines.next(line) || line != "ply") throw_error("does not start with the line 'ply'");
    bool ascii = false, big_endian = false, have_format = false;
    std::vector<PlyElement> elements;
    bool ended = false;
    while (!ended && lines.next(line)) {
        Tokens tokens(line);
        if (!tokens.next(token) || token == "comment" || token == "obj_info") continue;
        if (token == "format") {
            std::string_view version;
            if (!tokens.next(token) || !tokens.next(version) || version != "1.0")
                throw_error(where(), ": expected 'format <ascii|binary_little_endian|binary_big_endian> 1.0'");
            if (token == "ascii")
                ascii = true;
            else if (token == "binary_big_endian")
                big_endian = true;
            else if (token != "binary_little_endian")
                throw_error(where(), ": unknown format ", quoted(token));
            have_format = true;
        } else if (token == "element") {
            PlyElement element;
            std::string_view name, count;
            if (!tokens.next(name) || !tokens.next(count) || !parse_integer(count, element.count) || element.count < 0)
                throw_error(where(), ": expected 'element <name> <count>'");
            element.name = std::string(name);
            elements.push_back(std::move(element));
        } else if (token == "property") {
            if (elements.empty()) throw_error(where(), ": a property before any element");
            PlyProperty property;
            std::string_view type, name;
            if (!tokens.next(type)) throw_error(where(), ": expected a property type");
            if (type == "list") {
                std::string_view count_type;
                property.is_list = true;
                if (!tokens.next(count_type) || !ply_type(count_type, property.count_type) ||
                    !ply_is_integer(property.count_type) || !tokens.next(type))
                    throw_error(where(), ": expected 'property list <integer type> <type> <name>'");
            }
            if (!ply_type(type, property.type)) throw_error(where(), ": unknown property type ", quoted(type));
            if (!tokens.next(name)) throw_error(where(), ": a property needs a name");
            property.name = std::string(name);
            elements.back().properties.push_back(std::move(property));
        } else if (token == "end_header") {
            ended = true;
        }
        // Any other header line is a note of the writer (Blender 2.4 wrote "Created by ..." without
        // "comment"): skipped.
    }
    if (!ended) throw_error("has no 'end_header' line");
    if (!have_format) throw_error("has no 'format' line");
    PlyReader reader(bytes.substr(lines.position() <= bytes.size() ? lines.position() : bytes.size()), ascii,
                     big_endian);
    MeshBuilder builder;
    bool have_vertices = false;
    int64_t vertex_total = 0;
    for (const PlyElement& element : elements) {
        // Every instance takes at least one value (a byte, or a character in ASCII) when the element has
        // properties: a count beyond the body's size is a lie, refused before any work.
        if (!element.properties.empty() && static_cast<uint64_t>(element.count) > reader.size())
            throw_error("element '", element.name, "' declares ", element.count, " entries, more than the file holds");
        const bool is_vertex = element.name == "vertex", is_face = element.name == "face";
        int xyz[3] = {-1, -1, -1};
        int indices = -1;
        for (size_t p = 0; p < element.properties.size(); ++p) {
            const PlyProperty& property = element.properties[p];
            if (is_vertex && !property.is_list) {
                if (property.name == "x") xyz[0] = static_cast<int>(p);
                if (property.name == "y") xyz[1] = static_cast<int>(p);
                if (property.name == "z") xyz[2] = static_cast<int>(p);
            }
            if (is_face && property.is_list && (property.name == "vertex_indices" || property.name == "vertex_index"))
                indices = static_cast<int>(p);
        }
        if (is_vertex && (xyz[0] < 0 || xyz[1] < 0 || xyz[2] < 0))
            throw_error("element 'vertex' lacks one of the properties x, y, z");
        if (is_face && indices < 0) throw_error("element 'face' has no list property vertex_indices");
        if (is_vertex) {
            if (have_vertices) throw_error("has two 'vertex' elements");
            if (element.count > INT32_MAX) throw_error("declares ", element.count, " vertices, more than 2^31 - 1");
            have_vertices = true;
            vertex_total = element.count;
        }
        if (element.properties.empty()) continue;  // no data, whatever its count says
        const std::string what = "element '" + element.name + "'";
        for (int64_t i = 0; i < element.count; ++i) {
            double c[3] = {0.0, 0.0, 0.0};
            for (size_t p = 0; p < element.properties.size(); ++p) {
                const PlyProperty& property = element.properties[p];
                if (!property.is_list) {
                    const double v = reader.value(property.type, what.c_str());
                    for (int a = 0; a < 3; ++a)
                        if (static_cast<int>(p) == xyz[a]) c[a] = v;
                    continue;
                }
                const int64_t length = reader.list_length(property, what.c_str());
                const bool corners = static_cast<int>(p) == indices;
                for (int64_t k = 0; k < length; ++k) {
                    const double v = reader.value(property.type, what.c_str());
                    if (!corners) continue;
                    if (v != std::floor(v) || v < 0.0 || v >= static_cast<double>(vertex_total) || !have_vertices)
                        throw_error("face ", i, " refers to vertex ", v, " of ", vertex_total);
                    builder.corners().push_back(static_cast<int64_t>(v));
                }
            }
            if (is_vertex)
                builder.vertex(c[0], c[1], c[2], [&] { return "vertex element entry " + std::to_string(i); });
            if (is_face) builder.polygon([&] { return "face " + std::to_string(i); });
        }
    }
    return builder.finish();
}

}  // namespace sparsegrid::detail
