#include "deltaserve/common/args.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace deltaserve {
namespace {

// Parses `args` (no program name) into p.
Status parse(ArgParser& p, std::vector<std::string> args) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    return p.parse(static_cast<int>(argv.size()), argv.data());
}

TEST(ArgParserTest, AListFlagTakesEveryOccurrenceAndCommaSeparatedValues) {
    ArgParser p("t", "test");
    std::vector<std::string> keys;
    p.add_list("api-key", &keys, "keys");
    ASSERT_TRUE(parse(p, {"--api-key", "k1", "--api-key=k2, k3", "--api-key", ",k4,,"}).ok());
    EXPECT_EQ(keys, (std::vector<std::string>{"k1", "k2", "k3", "k4"}));
    EXPECT_TRUE(p.given("api-key"));
    EXPECT_NE(p.usage().find("more than once"), std::string::npos);
}

TEST(ArgParserTest, AnyOtherFlagGivenTwiceIsRefusedByName) {
    std::string s;
    int32_t i = 0;
    uint64_t u = 0;
    float f = 0;
    bool b = false;
    const std::vector<std::vector<std::string>> twice = {{"--name", "a", "--name", "b"},
                                                         {"--n=1", "--n", "1"},
                                                         {"--u", "1", "--u=2"},
                                                         {"--f", "0.5", "--f", "0.5"},
                                                         {"--b", "--b"}};
    for (const auto& args : twice) {
        ArgParser p("t", "test");
        p.add("name", &s, "");
        p.add("n", &i, "");
        p.add("u", &u, "");
        p.add("f", &f, "");
        p.add_switch("b", &b, "");
        const Status st = parse(p, args);
        ASSERT_FALSE(st.ok()) << args[0];
        EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
        const std::string name = args[0].substr(0, args[0].find('='));
        EXPECT_NE(st.message().find(name + " is given twice"), std::string::npos) << st.message();
    }
    ArgParser p("t", "test");
    p.add("name", &s, "");
    p.add("n", &i, "");
    ASSERT_TRUE(parse(p, {"--name", "a", "--n", "3"}).ok());
    EXPECT_EQ(s, "a");
    EXPECT_EQ(i, 3);
}

}  // namespace
}  // namespace deltaserve
