// The policy registry (kvstore/kv_policy.h): every policy is found by its name and declares
// what its cache does; unknown names and keep ratios a policy cannot take are refused with
// the names that exist.
#include "deltaserve/kvstore/kv_policy.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

namespace deltaserve::kvstore {
namespace {

TEST(KvPolicy, EveryPolicyIsFoundByItsNameOnce) {
    std::set<std::string> names;
    for (const KvPolicyInfo& p : kv_policies()) {
        EXPECT_TRUE(names.insert(std::string(p.name)).second) << p.name;
        auto found = find_kv_policy(p.name);
        ASSERT_TRUE(found.ok()) << p.name;
        EXPECT_EQ(*found, &p);
        EXPECT_FALSE(p.summary.empty()) << p.name;
        EXPECT_NE(kv_policy_names().find(p.name), std::string::npos) << p.name;
    }
    EXPECT_EQ(kv_policies().front().name, "full");
    auto unknown = find_kv_policy("fulll");
    ASSERT_FALSE(unknown.ok());
    EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(unknown.status().message().find("deltakv"), std::string::npos);
}

TEST(KvPolicy, CapabilitiesAreConsistent) {
    for (const KvPolicyInfo& p : kv_policies()) {
        // What a node can share, page or store, it can also ship; what ships has a codec.
        if (p.shareable || p.storable) EXPECT_TRUE(p.shippable) << p.name;
        EXPECT_EQ(p.shippable, p.codec != KvCodecId::kNone) << p.name;
        // A compressing cache's prefix depends on what came after it.
        if (p.compresses) EXPECT_FALSE(p.shareable) << p.name;
        if (p.paged) EXPECT_EQ(p.kind, KvCacheKind::kFull) << p.name;
        if (p.kind == KvCacheKind::kEvicting) EXPECT_FALSE(p.shippable) << p.name;
    }
    const KvPolicyInfo& full = **find_kv_policy("full");
    EXPECT_TRUE(full.paged && full.shareable && full.ggml_attention && !full.compresses);
    const KvPolicyInfo& deltakv = **find_kv_policy("deltakv");
    EXPECT_EQ(deltakv.kind, KvCacheKind::kDeltaKv);
    EXPECT_EQ(deltakv.codec, KvCodecId::kDeltaKv);
    EXPECT_EQ(deltakv.profile_file, "deltakv.json");
    EXPECT_EQ((*find_kv_policy("trimkv"))->profile_file, "trimkv.json");
}

TEST(KvPolicy, ValidateRefusesWhatAPolicyCannotTake) {
    EvictionConfig c;
    EXPECT_TRUE(c.validate().ok());
    c.keep = 0.5f;
    EXPECT_EQ(c.validate().code(), StatusCode::kInvalidArgument) << "full keeps every token";
    c.policy = "h2o";
    EXPECT_TRUE(c.validate().ok());
    for (float keep : {0.0f, -1.0f, 1.5f}) {
        c.keep = keep;
        EXPECT_EQ(c.validate().code(), StatusCode::kInvalidArgument) << keep;
    }
    c.keep = 0.5f;
    c.window = 0;
    EXPECT_EQ(c.validate().code(), StatusCode::kInvalidArgument);
    c.window = 32;
    c.policy = "nope";
    EXPECT_EQ(c.validate().code(), StatusCode::kInvalidArgument);
}

TEST(KvPolicy, EveryEvictingPolicyMakesItsEvictionPolicy) {
    for (const KvPolicyInfo& p : kv_policies()) {
        EvictionConfig c;
        c.policy = std::string(p.name);
        c.keep = p.compresses ? 0.5f : 1.0f;
        auto made = make_eviction_policy(c);
        if (p.kind != KvCacheKind::kEvicting) {
            EXPECT_FALSE(made.ok()) << p.name;
        } else if (!p.profile_file.empty()) {
            ASSERT_FALSE(made.ok()) << p.name;  // its gates are missing
            EXPECT_NE(made.status().message().find(std::string(p.profile_file)), std::string::npos);
        } else {
            EXPECT_TRUE(made.ok()) << p.name << ": " << made.status().message();
        }
    }
}

}  // namespace
}  // namespace deltaserve::kvstore
