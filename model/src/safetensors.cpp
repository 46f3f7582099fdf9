#include "safetensors.h"

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

namespace deltaserve::model {

namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Element sizes of every dtype the safetensors format defines with whole-byte elements.
// Known ones are validated even when deltaserve cannot compute with them.
int dtype_size(std::string_view dtype) {
    static constexpr struct {
        std::string_view name;
        int size;
    } kTable[] = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
        {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
        {"F32", 4},  {"I64", 8}, {"U64", 8}, {"F64", 8},
    };
    for (const auto& e : kTable) {
        if (e.name == dtype) return e.size;
    }
    return 0;
}

uint64_t read_u64_le(const uint8_t* p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

std::string shape_string(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

// Validates one header entry against the data buffer of `data_size` bytes at `data`.
Result<SafetensorsTensor> parse_entry(const std::string& name, const json& entry,
                                      const uint8_t* data, uint64_t data_size) {
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object()) return invalid_argument(where + ": header entry is not an object");
    auto dtype_it = entry.find("dtype");
    auto shape_it = entry.find("shape");
    auto offsets_it = entry.find("data_offsets");
    if (dtype_it == entry.end() || !dtype_it->is_string()) {
        return invalid_argument(where + ": missing or non-string \"dtype\"");
    }
    if (shape_it == entry.end() || !shape_it->is_array()) {
        return invalid_argument(where + ": missing or non-array \"shape\"");
    }
    if (offsets_it == entry.end() || !offsets_it->is_array() || offsets_it->size() != 2 ||
        !(*offsets_it)[0].is_number_unsigned() || !(*offsets_it)[1].is_number_unsigned()) {
        return invalid_argument(where + ": \"data_offsets\" must be two non-negative integers");
    }
    SafetensorsTensor t;
    t.dtype = dtype_it->get<std::string>();
    const int elem_size = dtype_size(t.dtype);
    if (elem_size == 0) return unimplemented(where + ": unsupported dtype \"" + t.dtype + "\"");

    uint64_t n_elems = 1;
    for (const json& d : *shape_it) {
        if (!d.is_number_unsigned()) {
            return invalid_argument(where + ": shape entries must be non-negative integers");
        }
        const uint64_t dim = d.get<uint64_t>();
        if (dim > static_cast<uint64_t>(INT64_MAX) ||
            __builtin_mul_overflow(n_elems, dim, &n_elems)) {
            return invalid_argument(where + ": shape is too large");
        }
        t.shape.push_back(static_cast<int64_t>(dim));
    }
    uint64_t expected_bytes = 0;
    if (__builtin_mul_overflow(n_elems, static_cast<uint64_t>(elem_size), &expected_bytes)) {
        return invalid_argument(where + ": shape is too large");
    }
    const uint64_t begin = (*offsets_it)[0].get<uint64_t>();
    const uint64_t end = (*offsets_it)[1].get<uint64_t>();
    if (begin > end) {
        return invalid_argument(where + ": data_offsets [" + std::to_string(begin) + ", " +
                                std::to_string(end) + "] are reversed");
    }
    if (end - begin != expected_bytes) {
        return invalid_argument(where + ": data_offsets span " + std::to_string(end - begin) +
                                " bytes but " + t.dtype + " " + shape_string(t.shape) + " needs " +
                                std::to_string(expected_bytes));
    }
    if (end > data_size) {
        return data_loss(where + ": data_offsets end " + std::to_string(end) +
                         " lies past the data buffer (" + std::to_string(data_size) +
                         " bytes): the file is truncated");
    }
    t.data = data + begin;
    t.n_bytes = static_cast<size_t>(expected_bytes);
    return t;
}

Result<json> parse_json(std::string_view text, const std::string& what) {
    json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) return invalid_argument(what + " is not valid JSON");
    if (!j.is_object()) return invalid_argument(what + " is not a JSON object");
    return j;
}

}  // namespace

Result<kernels::DType> SafetensorsTensor::compute_type(std::string_view name) const {
    if (dtype == "F32") return kernels::DType::kF32;
    if (dtype == "F16") return kernels::DType::kF16;
    if (dtype == "BF16") return kernels::DType::kBF16;
    return unimplemented("tensor '" + std::string(name) + "' has dtype " + dtype +
                         "; only F32, F16 and BF16 are supported");
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
    SafetensorsFile f;
    DS_ASSIGN_OR_RETURN(f.file_, MappedFile::open(path));
    const uint8_t* base = f.file_.data();
    const uint64_t size = f.file_.size();
    if (size < 8) {
        return data_loss(path + ": " + std::to_string(size) +
                         " bytes is too short for a safetensors header");
    }
    const uint64_t header_len = read_u64_le(base);
    if (header_len > size - 8) {
        return data_loss(path + ": header length " + std::to_string(header_len) +
                         " runs past the end of the file (" + std::to_string(size) +
                         " bytes): truncated or not a safetensors file");
    }
    const std::string_view header(reinterpret_cast<const char*>(base + 8), header_len);
    const uint8_t* data = base + 8 + header_len;
    const uint64_t data_size = size - 8 - header_len;
    try {
        auto parsed = parse_json(header, path + ": header");
        if (!parsed) return parsed.error();
        for (const auto& [name, entry] : parsed->items()) {
            if (name == "__metadata__") {
                if (!entry.is_object()) {
                    return invalid_argument(path + ": __metadata__ is not an object");
                }
                for (const auto& [k, v] : entry.items()) {
                    f.metadata_[k] = v.is_string() ? v.get<std::string>() : v.dump();
                }
                continue;
            }
            auto tensor = parse_entry(name, entry, data, data_size);
            if (!tensor) return tensor.error().with_context(path);
            f.tensors_.emplace(name, std::move(tensor).value());
        }
    } catch (const json::exception& e) {
        return invalid_argument(path + ": malformed header: " + e.what());
    }
    return f;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
    auto it = tensors_.find(name);
    return it == tensors_.end() ? nullptr : &it->second;
}

Result<SafetensorsModel> SafetensorsModel::open_dir(const std::string& dir) {
    SafetensorsModel m;
    const fs::path root(dir);
    const fs::path index_path = root / "model.safetensors.index.json";
    const fs::path single_path = root / "model.safetensors";
    std::error_code ec;
    if (!fs::exists(index_path, ec)) {
        if (!fs::exists(single_path, ec)) {
            return not_found(dir + ": neither model.safetensors nor " +
                             "model.safetensors.index.json found");
        }
        DS_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::open(single_path.string()));
        for (const auto& [name, t] : file.tensors()) m.where_.emplace(name, 0);
        m.files_.push_back(std::move(file));
        m.description_ = single_path.string();
        return m;
    }

    m.description_ = index_path.string();
    DS_ASSIGN_OR_RETURN(std::string text, read_text_file(index_path.string()));
    std::map<std::string, size_t> shard_index;  // shard file name -> files_ index
    try {
        auto parsed = parse_json(text, m.description_);
        if (!parsed) return parsed.error();
        auto map_it = parsed->find("weight_map");
        if (map_it == parsed->end() || !map_it->is_object()) {
            return invalid_argument(m.description_ + ": missing \"weight_map\" object");
        }
        for (const auto& [name, shard_json] : map_it->items()) {
            if (!shard_json.is_string()) {
                return invalid_argument(m.description_ + ": weight_map entry '" + name +
                                        "' is not a file name");
            }
            const std::string shard = shard_json.get<std::string>();
            const fs::path rel(shard);
            bool escapes = shard.empty() || rel.is_absolute();
            for (const auto& part : rel) escapes = escapes || part == "..";
            if (escapes) {
                return invalid_argument(m.description_ + ": shard name '" + shard + "' (for '" +
                                        name + "') leaves the model directory");
            }
            auto [it, inserted] = shard_index.emplace(shard, m.files_.size());
            if (inserted) {
                auto file = SafetensorsFile::open((root / rel).string());
                if (!file) return file.error().with_context(m.description_);
                m.files_.push_back(std::move(file).value());
            }
            if (m.files_[it->second].find(name) == nullptr) {
                return not_found(m.description_ + " maps tensor '" + name + "' to " +
                                 m.files_[it->second].path() + ", which does not contain it");
            }
            m.where_.emplace(name, it->second);
        }
    } catch (const json::exception& e) {
        return invalid_argument(m.description_ + ": malformed index: " + e.what());
    }
    if (m.files_.empty()) return invalid_argument(m.description_ + ": empty weight_map");
    return m;
}

Result<const SafetensorsTensor*> SafetensorsModel::get(std::string_view name) const {
    auto it = where_.find(name);
    if (it == where_.end()) {
        return not_found("tensor '" + std::string(name) + "' not found in " + description_);
    }
    return files_[it->second].find(name);
}

bool SafetensorsModel::contains(std::string_view name) const { return where_.contains(name); }

std::string SafetensorsModel::file_of(std::string_view name) const {
    auto it = where_.find(name);
    return it == where_.end() ? std::string() : files_[it->second].path();
}

void SafetensorsModel::release_mappings(std::vector<MappedFile>& out) {
    for (auto& f : files_) out.push_back(f.release_mapping());
}

}  // namespace deltaserve::model
