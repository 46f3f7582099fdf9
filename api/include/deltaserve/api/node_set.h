// The nodes a gateway may run turns on, as they are now: the config's static list
// (static_node_set) or the members etcd lists (member_nodes.h). The nodes a set hands out live
// as long as the set: a node that left stays an object whose calls fail (kUnavailable), so a
// session that names it can be moved, never left pointing at freed memory.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "deltaserve/api/cluster_nodes.h"

namespace deltaserve::api {

class NodeSet {
  public:
    virtual ~NodeSet() = default;
    // The decode nodes a new turn may go to (live and not draining), and the prefill nodes.
    virtual std::vector<DecodeNode*> decode() const = 0;
    virtual std::vector<PrefillNode*> prefill() const = 0;
    // The decode node of that name, whether it may take turns now or not (a session's home,
    // an operator's call); null for a name the set does not know.
    virtual DecodeNode* decode_named(const std::string& name) const = 0;
    // Whether a new turn may go to `node`.
    virtual bool routable(const DecodeNode* node) const = 0;
};

// A fixed list (the config's, or serve's own workers); the nodes must outlive the set.
std::unique_ptr<NodeSet> static_node_set(std::vector<DecodeNode*> decode,
                                         std::vector<PrefillNode*> prefill);

}  // namespace deltaserve::api
