// Forward::logits_out: the logits rows from a device backend's memory to the host, whole or
// as the candidates (the largest of each row, and the logits sampling also needs) of the
// sequences that want them.
#include <algorithm>
#include <limits>
#include <utility>

#include "deltaserve/model/forward.h"

namespace deltaserve::model {

namespace k = deltaserve::kernels;

Status Forward::logits_out(std::span<const SequenceInput> batch, int64_t n_out,
                           std::vector<float>& logits, std::vector<RowCandidates>* candidates) {
    const int64_t nv = cfg_.n_vocab;
    const k::Exec all = exec(pool_);
    // Whole rows for the sequences that want them; the largest of every row once, for those
    // that want candidates.
    if (candidates == nullptr) {
        return backend_.copy_out(logits.data(), logits_.data(),
                                 static_cast<size_t>(n_out * nv) * sizeof(float), all);
    }
    const auto wants = [](const SequenceInput& s) { return !s.all_logits && s.want.top > 0; };
    int32_t k_max = 0;
    int64_t row = 0, run = 0;  // rows [run, row) come over whole, in one copy
    gather_.clear();           // `also`'s logits: their offsets in logits_
    const auto whole = [&]() -> Status {
        const int64_t from = std::exchange(run, row);
        if (from == row) return Status();
        return backend_.copy_out(logits.data() + from * nv, logits_.f32() + from * nv,
                                 static_cast<size_t>((row - from) * nv) * sizeof(float), all);
    };
    for (const auto& s : batch) {
        const int64_t n = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
        if (wants(s)) {
            DS_RETURN_IF_ERROR(whole());
            run = row + n;
            k_max = std::max(k_max, static_cast<int32_t>(std::min<int64_t>(s.want.top, nv)));
            for (int32_t id : s.want.also) {
                if (id < 0 || id >= nv || (row + 1) * nv > std::numeric_limits<int32_t>::max())
                    return invalid_argument("forward: a candidate outside the logits");
                gather_.push_back(static_cast<int32_t>(row * nv + id));
            }
        }
        row += n;
    }
    DS_RETURN_IF_ERROR(whole());
    if (k_max == 0) return Status();
    top_ids_.resize(static_cast<size_t>(n_out * k_max));
    top_values_.resize(top_ids_.size());
    DS_RETURN_IF_ERROR(
        backend_.top_k(logits_.f32(), nv, n_out, k_max, top_ids_.data(), top_values_.data(), all));
    also_values_.resize(gather_.size());
    if (!gather_.empty()) {
        const size_t bytes = gather_.size() * sizeof(float);
        if (also_.bytes() < bytes) {
            also_ = k::Buffer();
            DS_ASSIGN_OR_RETURN(also_, backend_.alloc(bytes));
        }
        DS_RETURN_IF_ERROR(backend_.copy_rows(static_cast<uint8_t*>(also_.data()), sizeof(float),
                                              nullptr, static_cast<const uint8_t*>(logits_.data()),
                                              sizeof(float), gather_.data(), sizeof(float),
                                              static_cast<int64_t>(gather_.size()), all));
        DS_RETURN_IF_ERROR(backend_.copy_out(also_values_.data(), also_.data(), bytes, all));
    }
    row = 0;
    size_t next_also = 0;
    for (size_t i = 0; i < batch.size(); ++i) {
        const SequenceInput& s = batch[i];
        const int64_t n = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
        if (wants(s)) {
            RowCandidates& c = (*candidates)[i];
            const auto top = static_cast<size_t>(std::min<int64_t>(s.want.top, nv));
            const auto at = static_cast<size_t>(row * k_max);
            c.ids.assign(top_ids_.begin() + at, top_ids_.begin() + at + top);
            c.logits.assign(top_values_.begin() + at, top_values_.begin() + at + top);
            for (int32_t id : s.want.also) {
                c.ids.push_back(id);
                c.logits.push_back(also_values_[next_also++]);
            }
        }
        row += n;
    }
    return Status();
}

}  // namespace deltaserve::model
