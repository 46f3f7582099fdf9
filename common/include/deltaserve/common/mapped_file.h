// A read-only memory-mapped file (RAII). Model weights are used in place from the mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "deltaserve/common/status.h"

namespace deltaserve {

class MappedFile {
  public:
    // Maps the whole file read-only. Errors: kNotFound (missing), kInvalidArgument (a
    // directory or an empty file), kInternal (mmap failure).
    static Result<MappedFile> open(const std::string& path);

    MappedFile() = default;
    MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }
    MappedFile& operator=(MappedFile&& other) noexcept;
    MappedFile(const MappedFile&) = delete;
    MappedFile& operator=(const MappedFile&) = delete;
    ~MappedFile();

    const uint8_t* data() const { return data_; }
    size_t size() const { return size_; }
    std::span<const uint8_t> bytes() const { return {data_, size_}; }
    const std::string& path() const { return path_; }
    // Whether [p, p + n) lies in the mapping.
    bool contains(const void* p, size_t n) const;
    // Gives the pages wholly inside [p, p + n) back to the kernel (madvise DONTNEED): bytes
    // copied elsewhere stop counting as resident. Reading them again maps them in again.
    void release(const void* p, size_t n) const;

  private:
    const uint8_t* data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

// Reads a whole (small) file into a string.
Result<std::string> read_text_file(const std::string& path);

}  // namespace deltaserve
