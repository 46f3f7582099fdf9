#include "deltaserve/api/member_nodes.h"

#include <spdlog/spdlog.h>

namespace deltaserve::api {

// One member's node object: bound to the member's connection while it has one; otherwise its
// calls fail with kUnavailable naming why.
template <typename Node>
class MemberBinding {
  public:
    struct Current {
        std::shared_ptr<RpcClient> client;  // keeps the node alive through the call
        Node* node = nullptr;
        Status why;  // when node is null
    };
    Current current() const {
        std::lock_guard<std::mutex> lock(mu_);
        if (node_ == nullptr) return {nullptr, nullptr, unavailable(why_)};
        return {client_, node_, Status()};
    }
    void bind(std::shared_ptr<RpcClient> client, Node* node, MemberRecord record) {
        std::lock_guard<std::mutex> lock(mu_);
        client_ = std::move(client);
        node_ = node;
        record_ = std::move(record);
    }
    // Drops the connection (the last call that holds it closes it).
    std::shared_ptr<RpcClient> unbind(std::string why) {
        std::lock_guard<std::mutex> lock(mu_);
        why_ = std::move(why);
        node_ = nullptr;
        return std::move(client_);
    }
    MemberRecord record() const {
        std::lock_guard<std::mutex> lock(mu_);
        return record_;
    }
    void set_record(MemberRecord record) {
        std::lock_guard<std::mutex> lock(mu_);
        record_ = std::move(record);
    }

  private:
    mutable std::mutex mu_;
    std::shared_ptr<RpcClient> client_;
    Node* node_ = nullptr;
    MemberRecord record_;
    std::string why_ = "not connected yet";
};

class MemberDecodeNode final : public DecodeNode, public MemberBinding<DecodeNode> {
  public:
    explicit MemberDecodeNode(std::string name) : name_(std::move(name)) {}
    std::string name() const override { return name_; }
    Result<decode::TurnPlan> start_turn(decode::TurnSpec spec,
                                        std::shared_ptr<decode::TurnSink> sink) override {
        auto c = current();
        if (!c.node) return c.why;
        return c.node->start_turn(std::move(spec), std::move(sink));
    }
    void cancel(uint64_t turn_id, Status why) override {
        if (auto c = current(); c.node) c.node->cancel(turn_id, std::move(why));
    }
    Result<decode::DecodeStats> stats() override {
        auto c = current();
        if (!c.node) return c.why;
        return c.node->stats();
    }
    void drop_session(const std::string& id) override {
        if (auto c = current(); c.node) c.node->drop_session(id);
    }
    Result<std::vector<decode::SessionKv>> session_kv(
        const std::vector<std::string>& ids) override {
        auto c = current();
        if (!c.node) return c.why;
        return c.node->session_kv(ids);
    }
    Result<std::string> checkpoint(const std::string& name) override {
        auto c = current();
        if (!c.node) return c.why;
        return c.node->checkpoint(name);
    }
    Status evict_session(const std::string& id) override {
        auto c = current();
        return c.node ? c.node->evict_session(id) : c.why;
    }
    Result<decode::SessionBlocks> session_blocks(const std::string& id) override {
        auto c = current();
        if (!c.node) return c.why;
        return c.node->session_blocks(id);
    }
    Result<std::string> read_block(uint64_t key, uint64_t limit) override {
        auto c = current();
        if (!c.node) return c.why;
        return c.node->read_block(key, limit);
    }
    Status pin_session(const std::string& id, bool pinned, const std::string& scope) override {
        auto c = current();
        return c.node ? c.node->pin_session(id, pinned, scope) : c.why;
    }
    std::string data_address() const override { return record().data; }
    std::string rpc_address() const override { return record().rpc; }
    std::string version() const override { return record().version; }

  private:
    const std::string name_;
};

class MemberPrefillNode final : public PrefillNode, public MemberBinding<PrefillNode> {
  public:
    explicit MemberPrefillNode(std::string name) : name_(std::move(name)) {}
    std::string name() const override { return name_; }
    Result<prefill::PrefillResult> prefill(const prefill::PrefillRequest& request) override {
        auto c = current();
        if (!c.node) return c.why;
        return c.node->prefill(request);
    }
    void cancel(uint64_t turn_id) override {
        if (auto c = current(); c.node) c.node->cancel(turn_id);
    }
    Result<prefill::PrefillStats> stats() override {
        auto c = current();
        if (!c.node) return c.why;
        return c.node->stats();
    }
    std::string rpc_address() const override { return record().rpc; }
    std::string version() const override { return record().version; }

  private:
    const std::string name_;
};

struct MemberNodes::Slot {
    MemberRole role = MemberRole::kDecode;
    std::unique_ptr<MemberDecodeNode> decode;
    std::unique_ptr<MemberPrefillNode> prefill;
    MemberRecord record;  // as etcd lists it now
    bool listed = false;  // in etcd now
    bool usable = false;  // connected, of our model
};

namespace {

std::string slot_key(MemberRole role, const std::string& name) {
    return std::string(member_role_name(role)) + "/" + name;
}

}  // namespace

MemberNodes::MemberNodes(EtcdClient& etcd, MemberNodesOptions options)
    : options_(std::move(options)) {
    connector_ = std::thread([this] { connect_loop(); });
    table_ = std::make_unique<MemberTable>(etcd, options_.prefix,
                                           [this](const MemberChange& c) { on_change(c); });
}

MemberNodes::~MemberNodes() {
    table_.reset();  // no more changes
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    connector_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [key, slot] : slots_) {
        if (slot->decode) slot->decode->unbind("the gateway stops");
        if (slot->prefill) slot->prefill->unbind("the gateway stops");
    }
}

void MemberNodes::on_change(const MemberChange& change) {
    const MemberRecord& r = change.member.record;
    const std::string key = slot_key(r.role, r.name);
    std::shared_ptr<RpcClient> dropped;  // closed after the lock
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(key);
    if (it == slots_.end()) {
        if (change.kind == MemberChange::kRemoved) return;
        if (slots_.size() >= options_.max_members) {
            spdlog::warn("gateway: member {} not taken: the set holds {} already", key,
                         options_.max_members);
            return;
        }
        auto slot = std::make_unique<Slot>();
        slot->role = r.role;
        if (r.role == MemberRole::kDecode)
            slot->decode = std::make_unique<MemberDecodeNode>(r.name);
        if (r.role == MemberRole::kPrefill)
            slot->prefill = std::make_unique<MemberPrefillNode>(r.name);
        it = slots_.emplace(key, std::move(slot)).first;
    }
    Slot& slot = *it->second;
    const MemberRecord before = slot.record;
    const bool was_listed = slot.listed;
    if (change.kind == MemberChange::kRemoved) {
        slot.listed = false;
        slot.usable = false;
        const std::string why = "member " + key + " left the cluster";
        if (slot.decode) dropped = slot.decode->unbind(why);
        if (slot.prefill) dropped = slot.prefill->unbind(why);
        spdlog::info("gateway: {} left", key);
        return;
    }
    slot.record = r;
    slot.listed = true;
    if (r.role == MemberRole::kGateway) return;  // gateways are not routed to
    if (r.model != options_.model_id) {
        slot.usable = false;
        spdlog::warn("gateway: member {} serves {}, not {}: not used", key, r.model,
                     options_.model_id);
        return;
    }
    // A new member, or one at another address: a connection. A draining flag alone: none.
    if (!was_listed || !slot.usable || before.rpc != r.rpc || before.data != r.data) {
        slot.usable = false;
        if (slot.decode) dropped = slot.decode->unbind("member " + key + " is connecting");
        if (slot.prefill) dropped = slot.prefill->unbind("member " + key + " is connecting");
        pending_.push_back(change.member);
        cv_.notify_all();
    } else {
        if (slot.decode) slot.decode->set_record(r);
        if (slot.prefill) slot.prefill->set_record(r);
    }
}

bool MemberNodes::connect(const Member& m) {
    const MemberRecord& r = m.record;
    const std::string key = slot_key(r.role, r.name);
    Result<std::unique_ptr<RpcClient>> client =
        RpcClient::connect(r.rpc, options_.connect_wait, options_.cluster_token);
    Status why;
    std::shared_ptr<RpcClient> shared;
    DecodeNode* d = nullptr;
    PrefillNode* p = nullptr;
    if (!client.ok()) {
        why = client.status();
    } else if ((*client)->info().model_id != options_.model_id) {
        why = failed_precondition("it serves " + (*client)->info().model_id);
    } else {
        shared = std::move(*client);
        if (r.role == MemberRole::kDecode) {
            Result<DecodeNode*> n = shared->decode_node();
            if (n.ok()) {
                d = *n;
            } else {
                why = n.status();
            }
        } else {
            Result<PrefillNode*> n = shared->prefill_node();
            if (n.ok()) {
                p = *n;
            } else {
                why = n.status();
            }
        }
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(key);
    if (it == slots_.end() || !it->second->listed || it->second->record.rpc != r.rpc) {
        return true;  // gone or moved meanwhile: its newer change is queued
    }
    Slot& slot = *it->second;
    if (!why.ok()) {
        spdlog::warn("gateway: member {} at {}: {}", key, r.rpc, why.message());
        return why.code() == StatusCode::kFailedPrecondition ||
               why.code() == StatusCode::kUnauthenticated;  // tried again only when unreachable
    }
    if (slot.decode) slot.decode->bind(shared, d, slot.record);
    if (slot.prefill) slot.prefill->bind(shared, p, slot.record);
    slot.usable = true;
    spdlog::info("gateway: {} joined at {}", key, r.rpc);
    return true;
}

void MemberNodes::connect_loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
        cv_.wait(lock, [&] { return stop_ || !pending_.empty(); });
        if (stop_) return;
        Member m = std::move(pending_.front());
        pending_.pop_front();
        ++connecting_;
        lock.unlock();
        const bool done = connect(m);
        lock.lock();
        --connecting_;
        tried_.insert(slot_key(m.record.role, m.record.name));
        cv_.notify_all();
        if (!done && !stop_) {
            // Unreachable for now: again in a while, if it is still listed at that address.
            cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stop_; });
            auto it = slots_.find(slot_key(m.record.role, m.record.name));
            if (it != slots_.end() && it->second->listed && !it->second->usable &&
                it->second->record.rpc == m.record.rpc) {
                pending_.push_back(std::move(m));
            }
        }
    }
}

bool MemberNodes::wait_synced(std::chrono::milliseconds limit) {
    const auto until = std::chrono::steady_clock::now() + limit;
    while (!table_->synced()) {
        if (std::chrono::steady_clock::now() >= until) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    std::unique_lock<std::mutex> lock(mu_);
    // Members tried once and unreachable are not waited for again.
    return cv_.wait_until(lock, until, [&] {
        if (connecting_ > 0) return false;
        for (const Member& m : pending_) {
            if (tried_.count(slot_key(m.record.role, m.record.name)) == 0) return false;
        }
        return true;
    });
}

std::vector<DecodeNode*> MemberNodes::decode() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<DecodeNode*> out;
    for (const auto& [key, slot] : slots_) {
        if (slot->decode && slot->usable && !slot->record.draining)
            out.push_back(slot->decode.get());
    }
    return out;
}

std::vector<PrefillNode*> MemberNodes::prefill() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<PrefillNode*> out;
    for (const auto& [key, slot] : slots_) {
        if (slot->prefill && slot->usable && !slot->record.draining) {
            out.push_back(slot->prefill.get());
        }
    }
    return out;
}

DecodeNode* MemberNodes::decode_named(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = slots_.find(slot_key(MemberRole::kDecode, name));
    return it == slots_.end() ? nullptr : it->second->decode.get();
}

bool MemberNodes::routable(const DecodeNode* node) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, slot] : slots_) {
        if (slot->decode.get() == node) return slot->usable && !slot->record.draining;
    }
    return false;
}

size_t MemberNodes::usable_decode() const { return decode().size(); }
size_t MemberNodes::usable_prefill() const { return prefill().size(); }

}  // namespace deltaserve::api
