// The parsers of etcd's gateway answers on etcd's own bytes (taken from etcd 3.4.23) and on
// answers that are not what etcd would send.
#include "etcd_json.h"
#include "etcd_http.h"

#include <gtest/gtest.h>

namespace deltaserve::api::etcd {
namespace {

constexpr char kHeader[] =
    R"("header":{"cluster_id":"324952591200643719","member_id":"3319814642761637952","revision":"4","raft_term":"2"})";

TEST(EtcdJsonTest, ReadsEtcdsOwnAnswers) {
    auto range = parse_range(
        std::string("{") + kHeader +
        R"(,"kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"3","version":"2","value":"YmF6","lease":"7587879473127052548"}],"count":"1"})");
    ASSERT_TRUE(range.ok()) << range.error().message();
    EXPECT_EQ(range->revision, 4);
    ASSERT_EQ(range->kvs.size(), 1u);
    EXPECT_EQ(range->kvs[0].key, "foo");
    EXPECT_EQ(range->kvs[0].value, "baz");
    EXPECT_EQ(range->kvs[0].create_revision, 2);
    EXPECT_EQ(range->kvs[0].mod_revision, 3);
    EXPECT_EQ(range->kvs[0].lease, 7587879473127052548);
    EXPECT_TRUE(parse_range(std::string("{") + kHeader + "}")->kvs.empty());

    EXPECT_EQ(
        *parse_lease_id(std::string("{") + kHeader + R"(,"ID":"2324035813476956679","TTL":"5"})"),
        2324035813476956679);
    EXPECT_EQ(
        *parse_keep_alive(std::string(R"({"result":{)") + kHeader + R"(,"ID":"9","TTL":"5"}})"), 5);
    EXPECT_EQ(parse_keep_alive(std::string(R"({"result":{)") + kHeader + R"(,"ID":"9"}})")
                  .status()
                  .code(),
              StatusCode::kNotFound);
    EXPECT_EQ(
        *parse_time_left(std::string("{") + kHeader + R"(,"ID":"9","TTL":"4","grantedTTL":"5"})"),
        4);
    EXPECT_EQ(
        parse_time_left(std::string("{") + kHeader + R"(,"ID":"9","TTL":"-1"})").status().code(),
        StatusCode::kNotFound);

    auto failed = parse_swap(
        std::string("{") + kHeader +
        R"(,"responses":[{"response_range":{"header":{"revision":"2"},"kvs":[{"key":"Zm9v","mod_revision":"2","value":"YmFy"}],"count":"1"}}]})");
    ASSERT_TRUE(failed.ok()) << failed.error().message();
    EXPECT_FALSE(failed->done);
    EXPECT_EQ(failed->current.value, "bar");
    auto done = parse_swap(std::string("{") + kHeader +
                           R"(,"succeeded":true,"responses":[{"response_put":{}}]})");
    EXPECT_TRUE(done->done);

    auto created =
        parse_watch_message(std::string(R"({"result":{)") + kHeader + R"(,"created":true}})");
    EXPECT_TRUE(created->created);
    auto events = parse_watch_message(
        std::string(R"({"result":{)") + kHeader +
        R"(,"events":[{"kv":{"key":"Zm9v","mod_revision":"3","value":"YmF6"}},{"type":"DELETE","kv":{"key":"Zm9v","mod_revision":"4"}}]}})");
    ASSERT_TRUE(events.ok()) << events.error().message();
    ASSERT_EQ(events->events.size(), 2u);
    EXPECT_FALSE(events->events[0].deleted);
    EXPECT_TRUE(events->events[1].deleted);
    EXPECT_EQ(events->events[1].kv.mod_revision, 4);
    auto compacted = parse_watch_message(std::string(R"({"result":{)") + kHeader +
                                         R"(,"canceled":true,"compact_revision":"3"}})");
    EXPECT_TRUE(compacted->canceled);
    EXPECT_EQ(compacted->compact_revision, 3);
    EXPECT_EQ(*parse_token(R"({"header":{},"token":"abc.12"})"), "abc.12");
}

TEST(EtcdJsonTest, ErrorsKeepEtcdsMessageAndCode) {
    Status s = error_of(400, R"({"error":"illegal base64","message":"illegal base64","code":3})");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("illegal base64"), std::string::npos);
    EXPECT_EQ(error_of(503, R"({"message":"etcdserver: no leader","code":14})").code(),
              StatusCode::kUnavailable);
    Status token = error_of(401, R"({"message":"etcdserver: invalid auth token","code":16})");
    EXPECT_TRUE(is_token_refused(token));
    EXPECT_FALSE(is_token_refused(s));
    EXPECT_EQ(error_of(404, "<html>").code(), StatusCode::kUnavailable);
    // A streamed call's error.
    EXPECT_FALSE(
        parse_watch_message(R"({"error":{"message":"etcdserver: permission denied","code":7}})")
            .ok());
}

TEST(EtcdJsonTest, AnswersThatAreNotEtcdsAreErrorsNotCrashes) {
    for (const char* bad :
         {"", "[]", "null", "{", R"({"kvs":[]})", R"({"header":{"revision":1.5}})",
          R"({"header":{"revision":"12x"}})", R"({"header":{"revision":"99999999999999999999"}})",
          R"({"header":{},"kvs":{}})", R"({"header":{},"kvs":[1]})",
          R"({"header":{},"kvs":[{"key":5}]})", R"({"header":{},"kvs":[{"key":"Zg"}]})",
          R"({"header":{},"kvs":[{"key":"Zg==","version":true}]})"}) {
        EXPECT_FALSE(parse_range(bad).ok()) << bad;
    }
    for (const char* bad : {R"({"result":{"header":{},"events":[{"type":"MOVE","kv":{}}]}})",
                            R"({"result":{"header":{},"events":[{}]}})",
                            R"({"result":{"header":{},"events":{}}})", R"({"result":5})", "{}"}) {
        EXPECT_FALSE(parse_watch_message(bad).ok()) << bad;
    }
    EXPECT_FALSE(parse_swap(R"({"header":{}})").ok());
    EXPECT_FALSE(
        parse_swap(
            R"({"header":{},"responses":[{"response_range":{"kvs":[{"key":"YQ=="},{"key":"Yg=="}]}}]})")
            .ok());
    EXPECT_FALSE(parse_lease_id(R"({"header":{}})").ok());
    EXPECT_FALSE(parse_token(R"({"token":""})").ok());
}

TEST(EtcdJsonTest, PrefixesEndWhereEtcdsClientEndsThem) {
    EXPECT_EQ(prefix_end("/ds/"), "/ds0");
    EXPECT_EQ(prefix_end(std::string("a\xff", 2)), "b");
    EXPECT_EQ(prefix_end(std::string("\xff\xff", 2)), std::string(1, '\0'));
    EXPECT_EQ(prefix_end(""), std::string(1, '\0'));
}

TEST(EtcdJsonTest, EndpointsAreHostAndPort) {
    EXPECT_EQ(parse_endpoint("http://10.0.0.1:2379/")->port, "2379");
    EXPECT_EQ(parse_endpoint("[::1]:2379")->host, "::1");
    EXPECT_EQ(parse_endpoint("etcd-0.etcd:2379")->host, "etcd-0.etcd");
    for (const char* bad : {"", ":2379", "host:", "host:abc", "host:70000", "h/x:1", "user@h:1"}) {
        EXPECT_FALSE(parse_endpoint(bad).ok()) << bad;
    }
}

}  // namespace
}  // namespace deltaserve::api::etcd
