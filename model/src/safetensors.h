// A memory-mapped reader of Hugging Face safetensors files (private to model/).
//
// Layout: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [rows, cols], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the data buffer; offsets are relative to its start.
// A model is either one model.safetensors or shards listed by model.safetensors.index.json
// ({"weight_map": {"name": "model-00001-of-00002.safetensors", ...}}).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "deltaserve/common/mapped_file.h"
#include "deltaserve/common/status.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::model {

// One tensor, pointing into its file's mapping.
struct SafetensorsTensor {
    std::string dtype;           // as written: "F32", "BF16", "I8", ...
    std::vector<int64_t> shape;  // row-major, last dimension contiguous
    const uint8_t* data = nullptr;
    size_t n_bytes = 0;

    // The element type when deltaserve computes with it (F32, F16, BF16). Errors:
    // kUnimplemented naming `name` and the dtype for anything else.
    Result<kernels::DType> compute_type(std::string_view name) const;
};

// One safetensors file. Open validates the whole header: its length lies within the file,
// every entry has a known dtype, a non-negative shape and offsets inside the data buffer
// whose length equals the element count times the element size. Movable; the tensors'
// data pointers stay valid across moves (the mapping does not move).
class SafetensorsFile {
  public:
    // Errors: kNotFound (missing file), kDataLoss (truncated: shorter than its header
    // says), kInvalidArgument (malformed header), kUnimplemented (an unknown dtype).
    // Messages name the file and, where one is at fault, the tensor.
    static Result<SafetensorsFile> open(const std::string& path);

    // nullptr when absent.
    const SafetensorsTensor* find(std::string_view name) const;
    const std::map<std::string, SafetensorsTensor, std::less<>>& tensors() const {
        return tensors_;
    }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    const std::string& path() const { return file_.path(); }

    // Hands the mapping over (e.g. to ModelWeights::files); tensors keep pointing into it.
    MappedFile release_mapping() { return std::move(file_); }

  private:
    MappedFile file_;
    std::map<std::string, SafetensorsTensor, std::less<>> tensors_;
    std::map<std::string, std::string> metadata_;
};

// The safetensors of a model directory: model.safetensors, or the shards named by
// model.safetensors.index.json (which wins when both exist).
class SafetensorsModel {
  public:
    // Errors: kNotFound when the directory has neither file or a shard is missing; the
    // errors of SafetensorsFile::open; kInvalidArgument for a malformed index (including a
    // shard name that leaves the directory).
    static Result<SafetensorsModel> open_dir(const std::string& dir);

    // The tensor `name`, or kNotFound naming the tensor and the file(s) searched.
    Result<const SafetensorsTensor*> get(std::string_view name) const;
    bool contains(std::string_view name) const;
    // The file holding `name` (for messages); "" when absent.
    std::string file_of(std::string_view name) const;

    // Moves every mapping into `out`; the tensors stay valid as long as `out` holds them,
    // but this object must not be used afterwards.
    void release_mappings(std::vector<MappedFile>& out);

  private:
    std::vector<SafetensorsFile> files_;
    // name -> index into files_ (sharded: from the index; single: every tensor of file 0).
    std::map<std::string, size_t, std::less<>> where_;
    std::string description_;  // "model.safetensors" or the index path, for messages
};

}  // namespace deltaserve::model
