#include "deltaserve/api/cluster_nodes.h"

namespace deltaserve::api {

namespace {

class LocalDecodeNode final : public DecodeNode {
  public:
    LocalDecodeNode(std::string name, decode::DecodeWorker& w, std::string address)
        : name_(std::move(name)), w_(w), address_(std::move(address)) {}
    std::string name() const override { return name_; }
    Result<decode::TurnPlan> start_turn(decode::TurnSpec spec,
                                        std::shared_ptr<decode::TurnSink> sink) override {
        return w_.start_turn(std::move(spec), std::move(sink));
    }
    void cancel(uint64_t turn_id, Status why) override { w_.cancel(turn_id, std::move(why)); }
    Result<decode::DecodeStats> stats() override { return w_.stats(); }
    void drop_session(const std::string& id) override { w_.drop_session(id); }
    Result<std::vector<decode::SessionKv>> session_kv(
        const std::vector<std::string>& ids) override {
        if (ids.size() > kMaxSessionKvIds) return invalid_argument("too many session ids");
        return w_.session_kv(ids);
    }
    Status evict_session(const std::string& id) override { return w_.evict_session(id); }
    Result<decode::SessionBlocks> session_blocks(const std::string& id) override {
        return w_.session_blocks(id);
    }
    Result<std::string> read_block(uint64_t key, uint64_t limit) override {
        return w_.read_block(key, limit);
    }
    Status pin_session(const std::string& id, bool pinned, const std::string& scope) override {
        return w_.pin_session(id, pinned, scope);
    }
    Result<std::string> checkpoint(const std::string& name) override { return w_.checkpoint(name); }
    std::string data_address() const override { return address_; }

  private:
    std::string name_;
    decode::DecodeWorker& w_;
    std::string address_;
};

class LocalPrefillNode final : public PrefillNode {
  public:
    LocalPrefillNode(std::string name, prefill::PrefillWorker& w) : name_(std::move(name)), w_(w) {}
    std::string name() const override { return name_; }
    Result<prefill::PrefillResult> prefill(const prefill::PrefillRequest& request) override {
        return w_.prefill(request);
    }
    void cancel(uint64_t turn_id) override { w_.cancel(turn_id); }
    Result<prefill::PrefillStats> stats() override { return w_.stats(); }

  private:
    std::string name_;
    prefill::PrefillWorker& w_;
};

}  // namespace

std::unique_ptr<DecodeNode> local_decode_node(std::string name, decode::DecodeWorker& worker,
                                              std::string data_address) {
    return std::make_unique<LocalDecodeNode>(std::move(name), worker, std::move(data_address));
}

std::unique_ptr<PrefillNode> local_prefill_node(std::string name, prefill::PrefillWorker& worker) {
    return std::make_unique<LocalPrefillNode>(std::move(name), worker);
}

}  // namespace deltaserve::api
