#include "live_admin.h"

#include <capnp/ez-rpc.h>
#include <kj/exception.h>

#include "chat.capnp.h"
#include "deltaserve/api/rpc_convert.h"

namespace deltaserve::ops {

namespace rpc = api::rpc;

struct LiveAdmin::Impl {
    std::string address;
    std::unique_ptr<capnp::EzRpcClient> client;
    std::unique_ptr<rpc::Admin::Client> admin;

    Status lost(const kj::Exception& e) const {
        return unavailable("the server at " + address +
                           " did not answer: " + std::string(e.getDescription().cStr()));
    }
};

LiveAdmin::LiveAdmin(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LiveAdmin::~LiveAdmin() = default;

Result<std::unique_ptr<LiveAdmin>> LiveAdmin::connect(const std::string& host_port,
                                                      const std::string& admin_key) {
    const size_t colon = host_port.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == host_port.size())
        return invalid_argument("--server must be HOST:PORT, not '" + host_port + "'");
    const std::string host = host_port.substr(0, colon);
    int port = 0;
    try {
        port = std::stoi(host_port.substr(colon + 1));
    } catch (const std::exception&) {
        port = -1;
    }
    if (port < 1 || port > 65535)
        return invalid_argument("--server must be HOST:PORT, not '" + host_port + "'");
    auto impl = std::make_unique<Impl>();
    impl->address = host_port;
    try {
        impl->client = std::make_unique<capnp::EzRpcClient>(host, static_cast<uint16_t>(port));
        auto& ws = impl->client->getWaitScope();
        auto req = impl->client->getMain<rpc::Gateway>().adminRequest();
        req.setAdminKey(admin_key);
        auto r = req.send().wait(ws);
        if (r.hasError()) {
            const Status s = rpc::from_capnp(r.getError());
            return Status(s.code(), "the server at " + host_port + ": " + s.message());
        }
        impl->admin = std::make_unique<rpc::Admin::Client>(r.getAdmin());
    } catch (const kj::Exception& e) {
        return impl->lost(e);
    }
    return std::unique_ptr<LiveAdmin>(new LiveAdmin(std::move(impl)));
}

Result<std::vector<api::SessionRow>> LiveAdmin::sessions(int32_t page_size) {
    std::vector<api::SessionRow> out;
    std::string after;
    try {
        auto& ws = impl_->client->getWaitScope();
        for (;;) {
            auto req = impl_->admin->sessionPageRequest();
            req.setAfter(after);
            req.setLimit(page_size);
            auto r = req.send().wait(ws);
            for (auto s : r.getSessions()) {
                api::SessionRow row;
                row.info.id = s.getId().cStr();
                row.info.tenant = s.getTenant().cStr();
                row.key = row.info.tenant + "/" + row.info.id;
                row.node = s.getNode().cStr();
                row.info.turns = s.getTurns();
                row.info.messages = s.getMessages();
                row.info.tokens = s.getTokens();
                row.info.running = s.getRunning();
                row.last_use_unix = s.getLastUseUnix();
                row.ttl_left_seconds = s.getTtlLeftSeconds();
                row.in_memory = s.getInMemory();
                row.kv = rpc::from_capnp(s.getKv());
                out.push_back(std::move(row));
            }
            after = r.getNext().cStr();
            if (after.empty()) break;
        }
    } catch (const kj::Exception& e) {
        return impl_->lost(e);
    }
    return out;
}

namespace {

api::NodeStats node_of(rpc::NodeStats::Reader n) {
    api::NodeStats s;
    s.name = n.getName().cStr();
    s.rpc_address = n.getRpcAddress().cStr();
    s.data_address = n.getDataAddress().cStr();
    s.version = n.getVersion().cStr();
    if (n.hasError()) s.status = rpc::from_capnp(n.getError());
    s.stats = rpc::from_capnp(n.getStats());
    return s;
}

}  // namespace

Result<std::vector<api::NodeStats>> LiveAdmin::nodes() {
    std::vector<api::NodeStats> out;
    try {
        auto r = impl_->admin->nodesRequest().send().wait(impl_->client->getWaitScope());
        for (auto n : r.getNodes()) out.push_back(node_of(n));
    } catch (const kj::Exception& e) {
        return impl_->lost(e);
    }
    return out;
}

Result<std::vector<std::string>> LiveAdmin::checkpoint(const std::string& name) {
    std::vector<std::string> out;
    try {
        auto req = impl_->admin->checkpointRequest();
        req.setName(name);
        auto r = req.send().wait(impl_->client->getWaitScope());
        if (r.hasError()) {
            const Status s = rpc::from_capnp(r.getError());
            return Status(s.code(), "the server at " + impl_->address + ": " + s.message());
        }
        for (auto p : r.getPaths()) out.emplace_back(p.cStr());
    } catch (const kj::Exception& e) {
        return impl_->lost(e);
    }
    return out;
}

// An act on one session: its request sent, its error (if any) the result.
template <typename Request>
Status LiveAdmin::act(Request req, const std::string& tenant, const std::string& id) {
    try {
        req.setTenant(tenant);
        req.setId(id);
        auto r = req.send().wait(impl_->client->getWaitScope());
        return r.hasError() ? rpc::from_capnp(r.getError()) : Status();
    } catch (const kj::Exception& e) {
        return impl_->lost(e);
    }
}

Status LiveAdmin::drop(const std::string& tenant, const std::string& id) {
    return act(impl_->admin->dropSessionRequest(), tenant, id);
}

Status LiveAdmin::evict(const std::string& tenant, const std::string& id) {
    return act(impl_->admin->evictSessionRequest(), tenant, id);
}

Status LiveAdmin::pin(const std::string& tenant, const std::string& id, bool pinned) {
    auto req = impl_->admin->pinSessionRequest();
    req.setPinned(pinned);
    return act(std::move(req), tenant, id);
}

Result<decode::SessionBlocks> LiveAdmin::session_blocks(const std::string& tenant,
                                                        const std::string& id, std::string* node) {
    try {
        auto req = impl_->admin->sessionBlocksRequest();
        req.setTenant(tenant);
        req.setId(id);
        auto r = req.send().wait(impl_->client->getWaitScope());
        if (r.hasError()) return rpc::from_capnp(r.getError());
        *node = r.getNode().cStr();
        return rpc::from_capnp(r.getBlocks());
    } catch (const kj::Exception& e) {
        return impl_->lost(e);
    }
}

Result<std::vector<uint8_t>> LiveAdmin::read_block(const std::string& node, uint64_t key,
                                                   uint64_t limit) {
    try {
        auto req = impl_->admin->readBlockRequest();
        req.setNode(node);
        req.setKey(key);
        req.setLimit(limit);
        auto r = req.send().wait(impl_->client->getWaitScope());
        if (r.hasError()) return rpc::from_capnp(r.getError());
        const auto b = r.getBytes();
        return std::vector<uint8_t>(b.begin(), b.end());
    } catch (const kj::Exception& e) {
        return impl_->lost(e);
    }
}

Result<api::ClusterView> LiveAdmin::cluster() {
    api::ClusterView v;
    try {
        auto r = impl_->admin->clusterRequest().send().wait(impl_->client->getWaitScope());
        v.version = r.getVersion().cStr();
        v.model_id = r.getModel().cStr();
        for (auto n : r.getDecode()) v.decode.push_back(node_of(n));
        for (auto n : r.getPrefill()) {
            api::PrefillNodeStats p;
            p.name = n.getName().cStr();
            p.rpc_address = n.getRpcAddress().cStr();
            p.version = n.getVersion().cStr();
            if (n.hasError()) p.status = rpc::from_capnp(n.getError());
            p.stats = rpc::from_capnp(n.getStats());
            v.prefill.push_back(std::move(p));
        }
    } catch (const kj::Exception& e) {
        return impl_->lost(e);
    }
    return v;
}

}  // namespace deltaserve::ops
