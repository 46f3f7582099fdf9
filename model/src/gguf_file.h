// A validated, memory-mapped view of a GGUF (v2/v3) file: metadata and tensor infos.
// Private to model/.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/mapped_file.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::model {

enum class GgufType : uint32_t {
    kU8 = 0,
    kI8 = 1,
    kU16 = 2,
    kI16 = 3,
    kU32 = 4,
    kI32 = 5,
    kF32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kU64 = 10,
    kI64 = 11,
    kF64 = 12,
};

// One metadata value. Scalars are decoded; strings and arrays point into the mapping.
struct GgufValue {
    GgufType type = GgufType::kU8;
    uint64_t u = 0;  // unsigned and bool
    int64_t i = 0;   // signed
    double f = 0;    // float
    std::string_view str;
    GgufType elem_type = GgufType::kU8;  // arrays
    uint64_t count = 0;
    const uint8_t* elems = nullptr;  // first array element
};

struct GgufTensorInfo {
    std::string name;
    std::vector<int64_t> ne;  // ne[0] is the contiguous dimension
    kernels::DType type = kernels::DType::kF32;
    const uint8_t* data = nullptr;
    size_t bytes = 0;
};

class GgufFile {
  public:
    // Maps and validates path: magic, version 2 or 3, every length and offset in bounds,
    // known tensor types, data inside the file. Errors name the file and the problem.
    static Result<GgufFile> open(const std::string& path);

    uint32_t version() const { return version_; }
    const std::string& path() const { return file_.path(); }
    const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
    const GgufTensorInfo* find_tensor(std::string_view name) const;
    bool has(std::string_view key) const { return kv_.count(std::string(key)) != 0; }
    const GgufValue* find(std::string_view key) const;
    // Every metadata key, in order.
    const std::map<std::string, GgufValue, std::less<>>& metadata() const { return kv_; }

    // Typed getters: kNotFound when absent, kInvalidArgument when of another type.
    Result<int64_t> get_int(std::string_view key) const;
    Result<double> get_float(std::string_view key) const;
    Result<bool> get_bool(std::string_view key) const;
    Result<std::string> get_string(std::string_view key) const;
    Result<std::vector<std::string>> get_string_array(std::string_view key) const;
    Result<std::vector<float>> get_float_array(std::string_view key) const;
    Result<std::vector<int32_t>> get_int_array(std::string_view key) const;

    // Hands the mapping over (to keep weights alive after the file object is gone).
    MappedFile release_mapping() { return std::move(file_); }

  private:
    MappedFile file_;
    uint32_t version_ = 0;
    std::map<std::string, GgufValue, std::less<>> kv_;
    std::vector<GgufTensorInfo> tensors_;
};

}  // namespace deltaserve::model
