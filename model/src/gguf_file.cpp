#include "gguf_file.h"

#include <cstring>

namespace deltaserve::model {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr uint64_t kMaxStringBytes = 1ull << 30;
constexpr uint64_t kMaxArrayElems = 1ull << 31;
constexpr uint32_t kMaxDims = 4;

// Bounds-checked little-endian reader over the mapping.
class Reader {
  public:
    Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

    size_t offset() const { return pos_; }
    const uint8_t* ptr() const { return data_ + pos_; }

    template <typename T>
    bool read(T* out) {
        if (size_ - pos_ < sizeof(T)) return false;
        std::memcpy(out, data_ + pos_, sizeof(T));
        pos_ += sizeof(T);
        return true;
    }
    bool skip(uint64_t n) {
        if (n > size_ - pos_) return false;
        pos_ += n;
        return true;
    }
    bool read_string(std::string_view* out) {
        uint64_t len;
        if (!read(&len) || len > kMaxStringBytes || len > size_ - pos_) return false;
        *out = std::string_view(reinterpret_cast<const char*>(data_ + pos_), len);
        pos_ += len;
        return true;
    }

  private:
    const uint8_t* data_;
    size_t size_;
    size_t pos_ = 0;
};

int scalar_size(GgufType t) {
    switch (t) {
        case GgufType::kU8:
        case GgufType::kI8:
        case GgufType::kBool:
            return 1;
        case GgufType::kU16:
        case GgufType::kI16:
            return 2;
        case GgufType::kU32:
        case GgufType::kI32:
        case GgufType::kF32:
            return 4;
        case GgufType::kU64:
        case GgufType::kI64:
        case GgufType::kF64:
            return 8;
        default:
            return 0;
    }
}

// Decodes a scalar at p into v (type already set).
void decode_scalar(const uint8_t* p, GgufValue* v) {
    switch (v->type) {
        case GgufType::kU8:
            v->u = p[0];
            v->i = p[0];
            v->f = p[0];
            break;
        case GgufType::kBool:
            v->u = p[0] != 0;
            break;
        case GgufType::kI8: {
            int8_t x;
            std::memcpy(&x, p, 1);
            v->i = x;
            v->f = x;
            break;
        }
        case GgufType::kU16: {
            uint16_t x;
            std::memcpy(&x, p, 2);
            v->u = x;
            v->i = x;
            v->f = x;
            break;
        }
        case GgufType::kI16: {
            int16_t x;
            std::memcpy(&x, p, 2);
            v->i = x;
            v->f = x;
            break;
        }
        case GgufType::kU32: {
            uint32_t x;
            std::memcpy(&x, p, 4);
            v->u = x;
            v->i = x;
            v->f = x;
            break;
        }
        case GgufType::kI32: {
            int32_t x;
            std::memcpy(&x, p, 4);
            v->i = x;
            v->f = x;
            break;
        }
        case GgufType::kF32: {
            float x;
            std::memcpy(&x, p, 4);
            v->f = x;
            break;
        }
        case GgufType::kU64: {
            uint64_t x;
            std::memcpy(&x, p, 8);
            v->u = x;
            v->i = static_cast<int64_t>(x);
            v->f = static_cast<double>(x);
            break;
        }
        case GgufType::kI64: {
            int64_t x;
            std::memcpy(&x, p, 8);
            v->i = x;
            v->f = static_cast<double>(x);
            break;
        }
        case GgufType::kF64: {
            double x;
            std::memcpy(&x, p, 8);
            v->f = x;
            break;
        }
        default:
            break;
    }
}

bool is_integer(GgufType t) {
    return t == GgufType::kU8 || t == GgufType::kI8 || t == GgufType::kU16 || t == GgufType::kI16 ||
           t == GgufType::kU32 || t == GgufType::kI32 || t == GgufType::kU64 || t == GgufType::kI64;
}

// Reads one value (type tag already consumed). Arrays of strings are walked to validate.
bool read_value(Reader& r, GgufType type, GgufValue* v, int depth) {
    v->type = type;
    if (type == GgufType::kString) return r.read_string(&v->str);
    if (type == GgufType::kArray) {
        uint32_t et;
        if (depth > 2 || !r.read(&et) || !r.read(&v->count) || v->count > kMaxArrayElems) {
            return false;
        }
        v->elem_type = static_cast<GgufType>(et);
        v->elems = r.ptr();
        const int es = scalar_size(v->elem_type);
        if (es > 0) return r.skip(v->count * static_cast<uint64_t>(es));
        for (uint64_t k = 0; k < v->count; ++k) {
            GgufValue elem;
            if (!read_value(r, v->elem_type, &elem, depth + 1)) return false;
        }
        return true;
    }
    const int sz = scalar_size(type);
    if (sz == 0) return false;
    const uint8_t* p = r.ptr();
    if (!r.skip(static_cast<uint64_t>(sz))) return false;
    decode_scalar(p, v);
    return true;
}

}  // namespace

Result<GgufFile> GgufFile::open(const std::string& path) {
    DS_ASSIGN_OR_RETURN(MappedFile mapped, MappedFile::open(path));
    GgufFile g;
    g.file_ = std::move(mapped);
    Reader r(g.file_.data(), g.file_.size());
    auto corrupt = [&](const std::string& what) {
        return data_loss(path + ": corrupt or truncated GGUF (" + what + " at byte " +
                         std::to_string(r.offset()) + ")");
    };

    uint32_t magic;
    if (!r.read(&magic) || magic != kGgufMagic) {
        return invalid_argument(path + ": not a GGUF file (bad magic)");
    }
    if (!r.read(&g.version_)) return corrupt("header");
    if (g.version_ != 2 && g.version_ != 3) {
        return unimplemented(path + ": GGUF version " + std::to_string(g.version_) +
                             " is not supported (2 and 3 are)");
    }
    uint64_t n_tensors, n_kv;
    if (!r.read(&n_tensors) || !r.read(&n_kv)) return corrupt("header");
    if (n_tensors > (1u << 20) || n_kv > (1u << 20)) return corrupt("implausible counts");

    for (uint64_t k = 0; k < n_kv; ++k) {
        std::string_view key;
        uint32_t type;
        if (!r.read_string(&key) || !r.read(&type)) return corrupt("metadata key");
        GgufValue v;
        if (!read_value(r, static_cast<GgufType>(type), &v, 0)) {
            return corrupt("metadata value of '" + std::string(key) + "'");
        }
        g.kv_[std::string(key)] = v;
    }

    uint64_t alignment = 32;
    if (const GgufValue* a = g.find("general.alignment")) {
        if (a->type != GgufType::kU32 || a->u == 0 || (a->u & (a->u - 1)) != 0) {
            return corrupt("general.alignment must be a power-of-two u32");
        }
        alignment = a->u;
    }

    std::vector<uint64_t> offsets;
    for (uint64_t t = 0; t < n_tensors; ++t) {
        std::string_view name;
        uint32_t n_dims;
        if (!r.read_string(&name) || !r.read(&n_dims)) return corrupt("tensor info");
        if (n_dims == 0 || n_dims > kMaxDims)
            return corrupt("tensor '" + std::string(name) + "' dims");
        GgufTensorInfo info;
        info.name = std::string(name);
        uint64_t n_elems = 1;
        for (uint32_t d = 0; d < n_dims; ++d) {
            int64_t ne;
            if (!r.read(&ne) || ne <= 0 || ne > (1ll << 40))
                return corrupt("tensor '" + info.name + "' shape");
            info.ne.push_back(ne);
            n_elems *= static_cast<uint64_t>(ne);
            if (n_elems > (1ull << 40)) return corrupt("tensor '" + info.name + "' size");
        }
        uint32_t type;
        uint64_t offset;
        if (!r.read(&type) || !r.read(&offset)) return corrupt("tensor '" + info.name + "' info");
        const kernels::DTypeTraits* traits = kernels::dtype_traits(type);
        if (traits == nullptr || !traits->supported) {
            return unimplemented(path + ": tensor '" + info.name + "' has type " +
                                 (traits ? std::string(traits->name) : std::to_string(type)) +
                                 ", which deltaserve does not support");
        }
        info.type = static_cast<kernels::DType>(type);
        if (info.ne[0] % traits->block_elems != 0) {
            return corrupt("tensor '" + info.name + "' row not a multiple of its block size");
        }
        info.bytes = n_elems / traits->block_elems * traits->block_bytes;
        offsets.push_back(offset);
        g.tensors_.push_back(std::move(info));
    }

    const uint64_t data_start = (r.offset() + alignment - 1) / alignment * alignment;
    for (size_t t = 0; t < g.tensors_.size(); ++t) {
        GgufTensorInfo& info = g.tensors_[t];
        const uint64_t off = offsets[t];
        // Compared in an order where no sum can wrap around (a huge offset did).
        const uint64_t size = g.file_.size();
        if (off % alignment != 0 || data_start > size || off > size - data_start ||
            info.bytes > size - data_start - off) {
            return data_loss(path + ": tensor '" + info.name +
                             "' lies outside the file (truncated download?)");
        }
        info.data = g.file_.data() + data_start + off;
    }
    return g;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
    for (const auto& t : tensors_) {
        if (t.name == name) return &t;
    }
    return nullptr;
}

const GgufValue* GgufFile::find(std::string_view key) const {
    auto it = kv_.find(key);
    return it == kv_.end() ? nullptr : &it->second;
}

namespace {
Status wrong_type(const std::string& path, std::string_view key, const char* want) {
    return invalid_argument(path + ": metadata '" + std::string(key) + "' is not " + want);
}
Status missing(const std::string& path, std::string_view key) {
    return not_found(path + ": metadata '" + std::string(key) + "' is missing");
}
}  // namespace

Result<int64_t> GgufFile::get_int(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return missing(path(), key);
    if (!is_integer(v->type)) return wrong_type(path(), key, "an integer");
    return v->i;
}

Result<double> GgufFile::get_float(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return missing(path(), key);
    if (v->type != GgufType::kF32 && v->type != GgufType::kF64 && !is_integer(v->type)) {
        return wrong_type(path(), key, "a number");
    }
    return v->f;
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return missing(path(), key);
    if (v->type != GgufType::kBool) return wrong_type(path(), key, "a bool");
    return v->u != 0;
}

Result<std::string> GgufFile::get_string(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return missing(path(), key);
    if (v->type != GgufType::kString) return wrong_type(path(), key, "a string");
    return std::string(v->str);
}

Result<std::vector<std::string>> GgufFile::get_string_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return missing(path(), key);
    if (v->type != GgufType::kArray || v->elem_type != GgufType::kString) {
        return wrong_type(path(), key, "a string array");
    }
    std::vector<std::string> out;
    out.reserve(v->count);
    Reader r(v->elems, file_.size() - static_cast<size_t>(v->elems - file_.data()));
    for (uint64_t k = 0; k < v->count; ++k) {
        std::string_view s;
        if (!r.read_string(&s)) return data_loss(path() + ": bad string array " + std::string(key));
        out.emplace_back(s);
    }
    return out;
}

Result<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return missing(path(), key);
    if (v->type != GgufType::kArray || v->elem_type != GgufType::kF32) {
        return wrong_type(path(), key, "an f32 array");
    }
    std::vector<float> out(v->count);
    std::memcpy(out.data(), v->elems, v->count * sizeof(float));
    return out;
}

Result<std::vector<int32_t>> GgufFile::get_int_array(std::string_view key) const {
    const GgufValue* v = find(key);
    if (!v) return missing(path(), key);
    if (v->type != GgufType::kArray || !is_integer(v->elem_type)) {
        return wrong_type(path(), key, "an integer array");
    }
    const int es = scalar_size(v->elem_type);
    std::vector<int32_t> out(v->count);
    for (uint64_t k = 0; k < v->count; ++k) {
        GgufValue e;
        e.type = v->elem_type;
        decode_scalar(v->elems + k * es, &e);
        out[k] = static_cast<int32_t>(e.i);
    }
    return out;
}

}  // namespace deltaserve::model
