#include "table.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>

namespace deltaserve::ops {

void Table::print(std::FILE* out) const {
    std::vector<size_t> width;
    for (const auto& row : rows_) {
        if (width.size() < row.size()) width.resize(row.size(), 0);
        for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
    }
    for (const auto& row : rows_) {
        std::string line;
        for (size_t c = 0; c < row.size(); ++c) {
            line += row[c];
            if (c + 1 < row.size()) line.append(width[c] - row[c].size() + 2, ' ');
        }
        while (!line.empty() && line.back() == ' ') line.pop_back();  // an empty last cell
        std::fprintf(out, "%s\n", line.c_str());
    }
}

std::string short_hash(uint64_t h) { return hex64(h).substr(0, 12); }

std::string hex64(uint64_t h) {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016" PRIx64, h);
    return buf;
}

std::string human_bytes(uint64_t bytes) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double v = static_cast<double>(bytes);
    int u = 0;
    while (v >= 1024.0 && u < 4) {
        v /= 1024.0;
        ++u;
    }
    char buf[32];
    if (u == 0) {
        std::snprintf(buf, sizeof(buf), "%" PRIu64 " B", bytes);
    } else {
        std::snprintf(buf, sizeof(buf), "%.1f %s", v, units[u]);
    }
    return buf;
}

std::string human_age(int64_t t, int64_t now) {
    if (t <= 0) return kUnknown;
    const int64_t s = std::max<int64_t>(0, now - t);
    char buf[32];
    if (s < 120) {
        std::snprintf(buf, sizeof(buf), "%" PRId64 "s", s);
    } else if (s < 2 * 3600) {
        std::snprintf(buf, sizeof(buf), "%" PRId64 "m", s / 60);
    } else if (s < 2 * 86400) {
        std::snprintf(buf, sizeof(buf), "%" PRId64 "h", s / 3600);
    } else {
        std::snprintf(buf, sizeof(buf), "%" PRId64 "d", s / 86400);
    }
    return buf;
}

std::string fixed3(double x) {
    if (std::isnan(x)) return kUnknown;
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.3f", x);
    return buf;
}

}  // namespace deltaserve::ops
