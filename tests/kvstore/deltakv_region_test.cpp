#include "deltaserve/kvstore/deltakv_region.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace deltaserve::kvstore {
namespace {

// A region of 4 sinks and stride 3 over 20 positions, compressed up to 16: references at 4,
// 7, 10, 13; the others latents, numbered in position order, one byte each in two layers.
DeltaKvRegion compressed_region() {
    DeltaKvRegion r(/*sinks=*/4, /*stride=*/3, /*n_sparse_layers=*/2);
    for (int i = 0; i < 20; ++i) r.add_position();
    r.choose_refs(4, 16);
    int32_t latent = 0;
    for (int32_t p = 4; p < 16; ++p) {
        if (r.is_ref(p)) continue;
        r.latent_of[p] = latent++;
        for (size_t sl = 0; sl < 2; ++sl) {
            r.latents[sl].push_back(static_cast<uint8_t>(p));
            r.refs[sl].push_back(0);  // k = 1: the first sink
        }
    }
    r.end = 16;
    return r;
}

TEST(DeltaKvRegion, OrdinalsCountTheSinksThenTheReferencesInOrder) {
    const DeltaKvRegion r = compressed_region();
    EXPECT_EQ(r.ref_list, (std::vector<int32_t>{4, 7, 10, 13}));
    EXPECT_EQ(r.n_refs(), 4);
    EXPECT_EQ(r.n_latents(), 8);
    EXPECT_TRUE(r.is_ref(0));  // a sink
    EXPECT_FALSE(r.is_ref(5));
    EXPECT_EQ(r.ref_position(2), 2);
    EXPECT_EQ(r.ref_position(4), 4);
    EXPECT_EQ(r.ref_position(7), 13);
    EXPECT_EQ(r.ref_position(DeltaKvRegion::kNoRef), -1);
}

// A truncation keeps the latents of the positions it keeps, in both layers, and the region
// ends at the cut.
TEST(DeltaKvRegion, TruncateKeepsTheLatentsBeforeTheCut) {
    DeltaKvRegion r = compressed_region();
    r.truncate(9, /*latent_bytes=*/1, /*k=*/1);
    EXPECT_EQ(r.end, 9);
    EXPECT_EQ(r.ref_list, (std::vector<int32_t>{4, 7}));
    // Latents at 5, 6 and 8 stay.
    for (size_t sl = 0; sl < 2; ++sl) {
        EXPECT_EQ(r.latents[sl], (std::vector<uint8_t>{5, 6, 8}));
        EXPECT_EQ(r.refs[sl].size(), 3u);
    }
    EXPECT_EQ(r.n_latents(), 3);
    // Below the sinks the region is empty, not negative.
    r.truncate(2, 1, 1);
    EXPECT_EQ(r.end, 4);
    EXPECT_EQ(r.n_latents(), 0);
    EXPECT_TRUE(r.latents[0].empty());
}

// Flags set by hand (a token kept exact) are what sync_ref_list lists.
TEST(DeltaKvRegion, SyncRefListFollowsTheFlags) {
    DeltaKvRegion r = compressed_region();
    r.ref_flag[5] = 1;
    r.ref_flag[10] = 0;
    r.sync_ref_list();
    EXPECT_EQ(r.ref_list, (std::vector<int32_t>{4, 5, 7, 13}));
}

TEST(DeltaKvPlan, ExactCountCarriesTheFractionLeftOver) {
    DeltaKvPlan plan(2);
    EXPECT_EQ(plan.exact_count(10, 0.25f), 2u);  // 2.5: two now
    plan.exact_carry = 0.5;                      // the half left over
    EXPECT_EQ(plan.exact_count(10, 0.25f), 3u);
    EXPECT_EQ(plan.exact_count(2, 1.0f), 2u);  // never more than the plan's tokens
    plan.start(100, 16);
    EXPECT_TRUE(plan.active);
    EXPECT_EQ(plan.carry_before, 0.5);
    EXPECT_FALSE(plan.decided(1));
    plan.done[0] = 1;
    EXPECT_TRUE(plan.decided(1));
    EXPECT_FALSE(plan.decided(2));
}

}  // namespace
}  // namespace deltaserve::kvstore
