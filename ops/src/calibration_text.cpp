#include "calibration_text.h"

#include <zlib.h>

#include <algorithm>
#include <array>
#include <fstream>
#include <sstream>

namespace deltaserve::ops {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Result<std::string> read_gzip(const std::string& path) {
    gzFile f = gzopen(path.c_str(), "rb");
    if (f == nullptr) return not_found("cannot open calibration text " + path);
    std::string out;
    std::array<char, 1 << 16> buf;
    int n = 0;
    while ((n = gzread(f, buf.data(), static_cast<unsigned>(buf.size()))) > 0) {
        out.append(buf.data(), static_cast<size_t>(n));
    }
    // A stream cut short reads as far as it goes and leaves Z_BUF_ERROR ("unexpected end of
    // file") behind rather than a negative count.
    int err = Z_OK;
    const char* msg = gzerror(f, &err);
    const std::string why = msg != nullptr ? msg : "";
    gzclose(f);
    if (n < 0 || err != Z_OK) {
        return data_loss("calibration text " + path + " is not readable gzip: " + why);
    }
    return out;
}

}  // namespace

Result<std::string> read_text(const std::string& path) {
    if (ends_with(path, ".gz")) return read_gzip(path);
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot open calibration text " + path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
}

std::vector<TokenSpan> spread_sequences(int64_t n_tokens, int64_t share, int32_t seq_len,
                                        int32_t min_len) {
    std::vector<TokenSpan> out;
    share = std::min(share, n_tokens);
    if (share <= 0 || seq_len <= 0) return out;
    const int64_t n_seq = (share + seq_len - 1) / seq_len;
    for (int64_t i = 0; i < n_seq; ++i) {
        // The share split evenly (the first share % n_seq sequences one token longer).
        const int64_t size = share / n_seq + (i < share % n_seq ? 1 : 0);
        if (size < min_len) continue;
        const int64_t part_begin = i * n_tokens / n_seq, part_end = (i + 1) * n_tokens / n_seq;
        const int64_t begin = part_begin + (part_end - part_begin - size) / 2;
        out.push_back({std::clamp<int64_t>(begin, 0, n_tokens - size), size});
    }
    return out;
}

}  // namespace deltaserve::ops
