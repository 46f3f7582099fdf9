// A model's weights as a kernels::Backend's ops read them. The CPU backend's are the model's
// own arrays; a device backend's are uploaded once per model and backend (the matrices
// through upload_weight, the norm and bias vectors into the backend's Buffers) and shared by
// every forward pass on that backend. The backend must outlive the model (registered
// backends live until the process exits).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/dtype.h"

namespace deltaserve::model {

struct Model;

struct LayerOnBackend {
    const float* attn_norm = nullptr;
    const float* ffn_norm = nullptr;
    const float* bq = nullptr;  // Qwen2 biases; nullptr without them
    const float* bk = nullptr;
    const float* bv = nullptr;
    const float* q_norm = nullptr;  // Qwen3's per-head norms; nullptr without them
    const float* k_norm = nullptr;
    const float* attn_post_norm = nullptr;  // Gemma 3's output norms; nullptr without them
    const float* ffn_post_norm = nullptr;
    kernels::WeightMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
};

class BackendWeights {
  public:
    // The model's weights on `backend`: made at the first call for that backend and kept in
    // the model (Model::on_backends). Errors: the backend's (an unsupported weight type,
    // kResourceExhausted when device memory runs out), with nothing kept.
    static Result<std::shared_ptr<const BackendWeights>> of(const Model& model,
                                                            kernels::Backend& backend);

    kernels::WeightMatrix token_embd;
    kernels::WeightMatrix output;
    const float* output_norm = nullptr;
    std::vector<LayerOnBackend> layers;

  private:
    static Result<std::shared_ptr<const BackendWeights>> make(const Model& model,
                                                              kernels::Backend& backend);
    // A host vector in the backend's memory (on the CPU backend, the vector itself).
    Result<const float*> vector_on(kernels::Backend& backend, const std::vector<float>& host);

    std::vector<kernels::Buffer> buffers_;
};

// The sets of BackendWeights a model has made, one per backend.
class BackendWeightsCache {
  public:
    using Set = std::shared_ptr<const BackendWeights>;
    // The set for `backend`, made by `make` when there is none (one at a time: a second
    // caller waits and shares it; an error keeps nothing).
    Result<Set> get(const kernels::Backend* backend, const std::function<Result<Set>()>& make);
    // Null when none was made.
    Set find(const kernels::Backend* backend) const;

  private:
    mutable std::mutex mu_;
    std::vector<std::pair<const kernels::Backend*, Set>> sets_;
};

}  // namespace deltaserve::model
