// Text voxel batches. The whole file is read at once and parsed with std::from_chars: the reference
// batch (443k lines) parses in tens of milliseconds, and every error can name its line.
#include <sparsegrid/io.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string_view>

namespace sparsegrid {

namespace {

constexpr int64_t kMaxMemberCount = int64_t{1} << 40;  // far above any real batch; keeps B + 1 exact

/// Walks a text line by line, counting lines from 1.
class LineReader {
public:
    explicit LineReader(std::string_view text) : m_text(text) {}

    /// The next line without its terminator ("\n" or "\r\n"); false at the end of the text.
    bool next(std::string_view& line) {
        if (m_position >= m_text.size()) return false;
        const std::size_t end = m_text.find('\n', m_position);
        const std::size_t stop = end == std::string_view::npos ? m_text.size() : end;
        line = m_text.substr(m_position, stop - m_position);
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        m_position = end == std::string_view::npos ? m_text.size() : end + 1;
        ++m_line_number;
        return true;
    }
    /// Number of the line last returned by next() (0 before the first).
    int64_t line_number() const { return m_line_number; }

private:
    std::string_view m_text;
    std::size_t m_position = 0;
    int64_t m_line_number = 0;
};

bool is_blank(char c) { return c == ' ' || c == '\t'; }

bool is_blank_line(std::string_view line) {
    for (char c : line)
        if (!is_blank(c)) return false;
    return true;
}

/// Splits a line into blank-separated tokens, one at a time.
class TokenReader {
public:
    explicit TokenReader(std::string_view line) : m_line(line) {}

    bool next(std::string_view& token) {
        while (m_position < m_line.size() && is_blank(m_line[m_position])) ++m_position;
        if (m_position >= m_line.size()) return false;
        const std::size_t start = m_position;
        while (m_position < m_line.size() && !is_blank(m_line[m_position])) ++m_position;
        token = m_line.substr(start, m_position - start);
        return true;
    }

private:
    std::string_view m_line;
    std::size_t m_position = 0;
};

/// Parsing context of one file: turns problems into Errors that name the file and the line.
class FileParser {
public:
    FileParser(std::string path, std::string_view text) : m_path(std::move(path)), m_lines(text) {}

    /// Fails at the line last read (line 1 when nothing was read: an empty file).
    [[noreturn]] void fail(const std::string& problem) const { fail_at(m_lines.line_number(), problem); }
    [[noreturn]] void fail_at(int64_t line_number, const std::string& problem) const {
        throw Error("read_voxel_batch: " + m_path + ":" + std::to_string(std::max<int64_t>(line_number, 1)) + ": " +
                    problem);
    }
    int64_t line_number() const { return m_lines.line_number(); }

    bool next_line(std::string_view& line) { return m_lines.next(line); }

    /// A whole token as a decimal integer in [lo, hi]; `what` names the value in messages.
    int64_t parse_integer(std::string_view token, const char* what, int64_t lo, int64_t hi) const {
        int64_t value = 0;
        const char* first = token.data();
        const char* last = token.data() + token.size();
        const auto [end, status] = std::from_chars(first, last, value);
        if (status == std::errc::result_out_of_range)
            fail(std::string(what) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" +
                 std::string(token) + "'");
        if (status != std::errc() || end != last)
            fail(std::string(what) + " must be an integer, got '" + std::string(token) + "'");
        if (value < lo || value > hi)
            fail(std::string(what) + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                 std::to_string(value));
        return value;
    }

private:
    std::string m_path;
    LineReader m_lines;
};

std::string read_whole_file(const std::string& path) {
    std::error_code ignored;
    if (std::filesystem::is_directory(path, ignored))
        throw Error("read_voxel_batch: cannot read '" + path + "': it is a directory");
    std::ifstream file(path, std::ios::binary);
    if (!file) throw Error("read_voxel_batch: cannot open '" + path + "': " + std::strerror(errno));
    std::ostringstream contents;
    contents << file.rdbuf();
    if (file.bad()) throw Error("read_voxel_batch: cannot read '" + path + "'");
    return contents.str();
}

int64_t parse_member_count(FileParser& parser) {
    std::string_view line;
    if (!parser.next_line(line)) parser.fail("missing member count (the file is empty)");
    TokenReader tokens(line);
    std::string_view token, extra;
    if (!tokens.next(token)) parser.fail("member count must be an integer, got an empty line");
    const int64_t count = parser.parse_integer(token, "member count", 0, kMaxMemberCount);
    if (tokens.next(extra)) parser.fail("expected only the member count, got extra text '" + std::string(extra) + "'");
    return count;
}

std::vector<int64_t> parse_offsets(FileParser& parser, int64_t member_count) {
    std::string_view line;
    if (!parser.next_line(line)) parser.fail("missing member offsets line (the file ends after the member count)");
    const int64_t expected = member_count + 1;
    std::vector<int64_t> offsets;
    TokenReader tokens(line);
    std::string_view token;
    while (tokens.next(token)) {
        if (static_cast<int64_t>(offsets.size()) == expected)
            parser.fail("expected " + std::to_string(expected) + " member offsets (member count + 1), got more");
        const int64_t offset = parser.parse_integer(token, "member offset", 0, std::numeric_limits<int64_t>::max());
        if (offsets.empty() && offset != 0) parser.fail("first member offset must be 0, got " + std::to_string(offset));
        if (!offsets.empty() && offset < offsets.back())
            parser.fail("member offsets must be non-decreasing, got " + std::to_string(offset) + " after " +
                        std::to_string(offsets.back()) + " (offset " + std::to_string(offsets.size()) + ")");
        offsets.push_back(offset);
    }
    if (static_cast<int64_t>(offsets.size()) != expected)
        parser.fail("expected " + std::to_string(expected) + " member offsets (member count + 1), got " +
                    std::to_string(offsets.size()));
    return offsets;
}

Vec3i parse_voxel(FileParser& parser, std::string_view line) {
    constexpr int64_t lo = std::numeric_limits<int32_t>::min();
    constexpr int64_t hi = std::numeric_limits<int32_t>::max();
    static const char* const kNames[3] = {"coordinate i", "coordinate j", "coordinate k"};
    TokenReader tokens(line);
    std::string_view token;
    Vec3i voxel{};
    for (int a = 0; a < 3; ++a) {
        if (!tokens.next(token)) parser.fail("expected three integers 'i j k', got '" + std::string(line) + "'");
        voxel[a] = static_cast<int32_t>(parser.parse_integer(token, kNames[a], lo, hi));
    }
    if (tokens.next(token)) parser.fail("expected three integers 'i j k', got '" + std::string(line) + "'");
    return voxel;
}

std::vector<Vec3i> parse_voxels(FileParser& parser, int64_t num_voxels, std::size_t text_size) {
    std::vector<Vec3i> voxels;
    // Each voxel line takes at least 6 bytes: never reserve more than the text can hold.
    voxels.reserve(static_cast<std::size_t>(std::min<int64_t>(num_voxels, static_cast<int64_t>(text_size / 6 + 1))));
    std::string_view line;
    int64_t first_blank_line = 0;  // blank lines may only trail the voxel lines
    while (parser.next_line(line)) {
        if (is_blank_line(line)) {
            if (first_blank_line == 0) first_blank_line = parser.line_number();
            continue;
        }
        if (static_cast<int64_t>(voxels.size()) == num_voxels)
            parser.fail("too many voxel lines: the last member offset is " + std::to_string(num_voxels));
        if (first_blank_line != 0) parser.fail_at(first_blank_line, "blank line between voxel lines");
        voxels.push_back(parse_voxel(parser, line));
    }
    if (static_cast<int64_t>(voxels.size()) != num_voxels)
        parser.fail("too few voxel lines: the last member offset is " + std::to_string(num_voxels) +
                    " but the file has " + std::to_string(voxels.size()));
    return voxels;
}

std::vector<std::vector<Vec3i>> split_members(const std::vector<Vec3i>& voxels, const std::vector<int64_t>& offsets) {
    std::vector<std::vector<Vec3i>> members(offsets.size() - 1);
    for (std::size_t m = 0; m + 1 < offsets.size(); ++m)
        members[m].assign(voxels.begin() + offsets[m], voxels.begin() + offsets[m + 1]);
    return members;
}

void append_integer(std::string& out, int64_t value) {
    char digits[24];
    const auto result = std::to_chars(digits, digits + sizeof(digits), value);
    out.append(digits, result.ptr);
}

}  // namespace

std::vector<std::vector<Vec3i>> read_voxel_batch(const std::string& path) {
    const std::string text = read_whole_file(path);
    FileParser parser(path, text);
    const int64_t member_count = parse_member_count(parser);
    const std::vector<int64_t> offsets = parse_offsets(parser, member_count);
    const std::vector<Vec3i> voxels = parse_voxels(parser, offsets.back(), text.size());
    return split_members(voxels, offsets);
}

void write_voxel_batch(const std::string& path, const std::vector<std::vector<Vec3i>>& members) {
    std::string text;
    int64_t total = 0;
    for (const auto& member : members) total += static_cast<int64_t>(member.size());
    text.reserve(static_cast<std::size_t>(total) * 12 + members.size() * 8 + 32);

    append_integer(text, static_cast<int64_t>(members.size()));
    text += '\n';
    int64_t offset = 0;
    append_integer(text, offset);
    for (const auto& member : members) {
        offset += static_cast<int64_t>(member.size());
        text += ' ';
        append_integer(text, offset);
    }
    text += '\n';
    for (const auto& member : members)
        for (const Vec3i& voxel : member) {
            append_integer(text, voxel[0]);
            text += ' ';
            append_integer(text, voxel[1]);
            text += ' ';
            append_integer(text, voxel[2]);
            text += '\n';
        }

    std::ofstream file(path, std::ios::binary | std::ios::trunc);
    if (!file) throw Error("write_voxel_batch: cannot create '" + path + "': " + std::strerror(errno));
    file.write(text.data(), static_cast<std::streamsize>(text.size()));
    file.close();
    if (!file) throw Error("write_voxel_batch: cannot write '" + path + "'");
}

std::vector<std::vector<Vec3i>> first_members(const std::vector<std::vector<Vec3i>>& members, int64_t count) {
    const int64_t available = static_cast<int64_t>(members.size());
    if (count < 0 || count > available)
        throw Error("first_members: count must be in [0, " + std::to_string(available) + "], got " +
                    std::to_string(count));
    return std::vector<std::vector<Vec3i>>(members.begin(), members.begin() + count);
}

}  // namespace sparsegrid
