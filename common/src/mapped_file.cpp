#include "deltaserve/common/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

namespace deltaserve {

Result<MappedFile> MappedFile::open(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno == ENOENT) return not_found("no such file: " + path);
        return invalid_argument("cannot open " + path + ": " + std::strerror(errno));
    }
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        return invalid_argument(path + " is not a regular file");
    }
    if (st.st_size == 0) {
        ::close(fd);
        return invalid_argument(path + " is empty");
    }
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (p == MAP_FAILED) return internal_error("mmap " + path + ": " + std::strerror(errno));
    MappedFile f;
    f.data_ = static_cast<const uint8_t*>(p);
    f.size_ = static_cast<size_t>(st.st_size);
    f.path_ = path;
    return f;
}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
    if (this != &other) {
        if (data_) munmap(const_cast<uint8_t*>(data_), size_);
        data_ = other.data_;
        size_ = other.size_;
        path_ = std::move(other.path_);
        other.data_ = nullptr;
        other.size_ = 0;
    }
    return *this;
}

MappedFile::~MappedFile() {
    if (data_) munmap(const_cast<uint8_t*>(data_), size_);
}

bool MappedFile::contains(const void* p, size_t n) const {
    const auto* b = static_cast<const uint8_t*>(p);
    return data_ != nullptr && b >= data_ && n <= size_ &&
           static_cast<size_t>(b - data_) <= size_ - n;
}

void MappedFile::release(const void* p, size_t n) const {
    if (!contains(p, n)) return;
    const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
    const auto begin = (reinterpret_cast<uintptr_t>(p) + page - 1) / page * page;
    const auto end = (reinterpret_cast<uintptr_t>(p) + n) / page * page;
    if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_DONTNEED);
}

Result<std::string> read_text_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot read " + path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

}  // namespace deltaserve
