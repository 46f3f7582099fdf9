// The token mask of constrained decoding on the default model's vocabulary: it lets through
// exactly the tokens whose bytes continue the grammar (checked against trying every token),
// and any walk through it ends in a text the schema admits.
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "default_model.h"
#include "deltaserve/model/json_schema_grammar.h"
#include "deltaserve/model/sampler.h"
#include "deltaserve/model/token_constraint.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

class TokenConstraintTest : public ::testing::Test {
  protected:
    static void SetUpTestSuite() {
        model_.reset(testing::load_default_model());
        if (model_ != nullptr) vocab_ = std::make_shared<GrammarVocab>(*model_->tokenizer);
    }
    static void TearDownTestSuite() {
        vocab_.reset();
        model_.reset();
    }
    void SetUp() override { DS_REQUIRE_FILE(testing::default_gguf_model(), "SmolLM2 GGUF"); }

    static bool allowed(std::span<const uint64_t> mask, int32_t id) {
        return (mask[id / 64] >> (id % 64)) & 1;
    }

    // Walks `steps` tokens chosen at random among those allowed (the end when it may end
    // and the draw says so), checking each mask against every token tried alone; returns
    // the text.
    std::string walk(const std::string& schema, uint64_t seed, int steps, bool brute_force) {
        auto g = json_schema_grammar(schema);
        EXPECT_TRUE(g.ok()) << g.status().to_string();
        if (!g.ok()) return "";
        TokenConstraint c(*g, vocab_);
        GrammarMatcher text_matcher(*g);
        std::mt19937_64 rng(seed);
        std::string text;
        const Tokenizer& tok = *model_->tokenizer;
        for (int step = 0; step < steps && !c.must_end(); ++step) {
            const std::span<const uint64_t> mask = c.allowed();
            std::vector<int32_t> ids;
            for (int32_t id = 0; id < tok.vocab_size(); ++id) {
                if (allowed(mask, id)) ids.push_back(id);
            }
            if (brute_force) {
                for (int32_t id = 0; id < tok.vocab_size(); ++id) {
                    GrammarMatcher m = text_matcher;
                    const bool eog = tok.is_eog(id);
                    const std::string& p = vocab_->piece(id);
                    const bool can = eog ? m.can_end() : !p.empty() && m.accept(p);
                    EXPECT_EQ(allowed(mask, id), can)
                        << "token " << id << " '" << p << "' after '" << text << "'";
                }
            }
            EXPECT_FALSE(ids.empty()) << "nothing can follow '" << text << "'";
            if (ids.empty()) break;
            const int32_t pick = ids[rng() % ids.size()];
            if (tok.is_eog(pick)) break;
            EXPECT_TRUE(c.accept(pick));
            EXPECT_TRUE(text_matcher.accept(vocab_->piece(pick)));
            text += vocab_->piece(pick);
        }
        return text;
    }

    static std::unique_ptr<Model> model_;
    static std::shared_ptr<const GrammarVocab> vocab_;
};

std::unique_ptr<Model> TokenConstraintTest::model_;
std::shared_ptr<const GrammarVocab> TokenConstraintTest::vocab_;

const char* const kPerson =
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
    "pets":{"type":"array","items":{"enum":["cat","dog"]},"maxItems":3},
    "score":{"type":["number","null"]}},"required":["name","age","pets","score"],
    "additionalProperties":false})";

// Under a sanitizer (time_scale() > 1) the walks are shorter and fewer.
int steps(int n) { return testing::time_scale() > 1 ? n / 3 : n; }

TEST_F(TokenConstraintTest, MaskIsExactlyTheTokensThatContinue) {
    walk(kPerson, 1, steps(24), true);
    walk(R"({"type":"object"})", 2, steps(24), true);
    walk(R"({"type":"array","items":{"type":"string"},"minItems":1})", 3, steps(16), true);
}

TEST_F(TokenConstraintTest, WalksEndInTextsTheSchemaAdmits) {
    int whole = 0;
    for (uint64_t seed = 0; seed < static_cast<uint64_t>(steps(40)); ++seed) {
        auto g = json_schema_grammar(kPerson);
        ASSERT_TRUE(g.ok());
        const std::string text = walk(kPerson, seed, 400, false);
        GrammarMatcher m(*g);
        ASSERT_TRUE(m.accept(text)) << text;
        if (!m.can_end()) continue;  // cut at 400 tokens
        ++whole;
        const nlohmann::json v = nlohmann::json::parse(text, nullptr, false);
        ASSERT_FALSE(v.is_discarded()) << text;
        ASSERT_TRUE(v.is_object()) << text;
        EXPECT_TRUE(v["name"].is_string()) << text;
        EXPECT_TRUE(v["age"].is_number_integer()) << text;
        EXPECT_TRUE(v["pets"].is_array() && v["pets"].size() <= 3) << text;
        EXPECT_TRUE(v["score"].is_number() || v["score"].is_null()) << text;
        EXPECT_EQ(v.size(), 4u) << text;
    }
    EXPECT_GT(whole, 0);
}

TEST_F(TokenConstraintTest, EndOnlyWhereTheValueIsWhole) {
    auto g = json_schema_grammar(R"({"enum":[true]})");
    ASSERT_TRUE(g.ok());
    TokenConstraint c(*g, vocab_);
    const Tokenizer& tok = *model_->tokenizer;
    std::vector<int32_t> eog;
    for (int32_t id = 0; id < tok.vocab_size(); ++id)
        if (tok.is_eog(id)) eog.push_back(id);
    ASSERT_FALSE(eog.empty());
    EXPECT_FALSE(allowed(c.allowed(), eog[0]));
    auto ids = tok.encode("true", false, false);
    ASSERT_TRUE(ids.ok());
    for (int32_t id : *ids) ASSERT_TRUE(c.accept(id));
    EXPECT_TRUE(c.must_end());  // whole, and nothing can follow it
    const auto mask = c.allowed();
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
        EXPECT_EQ(allowed(mask, id), tok.is_eog(id)) << id;
    }
    EXPECT_FALSE(c.accept((*ids)[0]));
    EXPECT_TRUE(c.accept(eog[0]));

    // A number may end after any digit, or go on.
    auto n = json_schema_grammar(R"({"type":"integer"})");
    ASSERT_TRUE(n.ok());
    TokenConstraint d(*n, vocab_);
    auto one = tok.encode("1", false, false);
    ASSERT_TRUE(one.ok());
    ASSERT_TRUE(d.accept((*one)[0]));
    EXPECT_FALSE(d.must_end());
    const auto after = d.allowed();
    EXPECT_TRUE(allowed(after, eog[0]));
    EXPECT_TRUE(allowed(after, (*one)[0]));
}

TEST_F(TokenConstraintTest, SamplerPicksOnlyAllowedTokens) {
    auto g = json_schema_grammar(R"({"type":"integer"})");
    ASSERT_TRUE(g.ok());
    TokenConstraint c(*g, vocab_);
    const Tokenizer& tok = *model_->tokenizer;
    std::vector<float> logits(tok.vocab_size(), 0.0f);
    auto letter = tok.encode("x", false, false);
    ASSERT_TRUE(letter.ok());
    logits[(*letter)[0]] = 100.0f;  // the model wants a letter
    SamplingParams greedy;
    greedy.temperature = 0;
    Sampler s(greedy);
    const int32_t id = s.sample(logits, c.allowed());
    ASSERT_GE(id, 0);
    const std::string p = vocab_->piece(id);
    ASSERT_FALSE(p.empty());
    EXPECT_TRUE(p[0] == '-' || (p[0] >= '0' && p[0] <= '9')) << p;
    std::vector<uint64_t> none(c.allowed().size(), 0);
    EXPECT_EQ(s.sample(logits, none), -1);
}

}  // namespace
}  // namespace deltaserve::model
