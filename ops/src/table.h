// deltactl's output: kubectl's habits. One-line rows in aligned columns under an upper-case
// header; a value not known is "--" (never 0); hashes cut to 12 hex digits; byte sizes and
// ages in human units. --json prints the raw numbers instead (null where not known).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

namespace deltaserve::ops {

class Table {
  public:
    explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
    void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
    size_t rows() const { return rows_.size() - 1; }
    // Columns two spaces apart, each as wide as its widest cell; the last not padded.
    void print(std::FILE* out = stdout) const;

  private:
    std::vector<std::vector<std::string>> rows_;
};

inline constexpr const char* kUnknown = "--";

// 12 hex digits of a 64-bit hash.
std::string short_hash(uint64_t h);
// The full 16.
std::string hex64(uint64_t h);
// 1.5 KiB, 12.0 MiB, 3.2 GiB (binary units, as the server's flags take them).
std::string human_bytes(uint64_t bytes);
// 45s, 12m, 3h, 2d: how long ago a unix time was (kUnknown for <= 0).
std::string human_age(int64_t unix_seconds, int64_t now_unix_seconds);
// "0.083", or kUnknown for NaN.
std::string fixed3(double x);

}  // namespace deltaserve::ops
