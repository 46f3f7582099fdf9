#include <algorithm>

#include "deltaserve/api/node_set.h"

namespace deltaserve::api {
namespace {

class StaticNodeSet final : public NodeSet {
  public:
    StaticNodeSet(std::vector<DecodeNode*> decode, std::vector<PrefillNode*> prefill)
        : decode_(std::move(decode)), prefill_(std::move(prefill)) {}
    std::vector<DecodeNode*> decode() const override { return decode_; }
    std::vector<PrefillNode*> prefill() const override { return prefill_; }
    DecodeNode* decode_named(const std::string& name) const override {
        for (DecodeNode* d : decode_) {
            if (d->name() == name) return d;
        }
        return nullptr;
    }
    bool routable(const DecodeNode* node) const override {
        return std::find(decode_.begin(), decode_.end(), node) != decode_.end();
    }

  private:
    const std::vector<DecodeNode*> decode_;
    const std::vector<PrefillNode*> prefill_;
};

}  // namespace

std::unique_ptr<NodeSet> static_node_set(std::vector<DecodeNode*> decode,
                                         std::vector<PrefillNode*> prefill) {
    return std::make_unique<StaticNodeSet>(std::move(decode), std::move(prefill));
}

}  // namespace deltaserve::api
