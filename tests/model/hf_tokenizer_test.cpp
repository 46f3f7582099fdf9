// Hugging Face tokenizer.json: fixtures written to a temp folder, a tiny handmade one and
// one built from SmolLM2's GGUF vocabulary (which must tokenize exactly like the GGUF).
#include <gtest/gtest.h>

#include <unistd.h>
#include <cstdio>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "../../model/src/loader_common.h"
#include "../../model/src/unicode.h"
#include "deltaserve/model/tokenizer.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Ids = std::vector<int32_t>;

constexpr const char* kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

std::string mapped_byte(int b) {
    std::string out;
    unicode::append_utf8(unicode::byte_to_codepoint(static_cast<uint8_t>(b)), &out);
    return out;
}

class HfTokenizerTest : public ::testing::Test {
  protected:
    void SetUp() override {
        dir_ = fs::temp_directory_path() /
               ("ds_hf_tok_" + std::to_string(getpid()) + "_" +
                ::testing::UnitTest::GetInstance()->current_test_info()->name());
        fs::create_directories(dir_);
    }
    void TearDown() override { fs::remove_all(dir_); }

    std::string write(const std::string& name, const std::string& text) {
        const std::string path = (dir_ / name).string();
        std::ofstream(path) << text;
        return path;
    }

    // 256 byte tokens, "ab" (256), <|endoftext|> (257, special), <tool> (258, not special).
    static json tiny_tokenizer() {
        json vocab = json::object();
        for (int b = 0; b < 256; ++b) vocab[mapped_byte(b)] = b;
        vocab["ab"] = 256;
        return {
            {"version", "1.0"},
            {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({{"a", "b"}})}}},
            {"added_tokens",
             {{{"id", 257}, {"content", "<|endoftext|>"}, {"special", true}},
              {{"id", 258}, {"content", "<tool>"}, {"special", false}}}},
            {"pre_tokenizer",
             {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
        };
    }

    Result<std::unique_ptr<Tokenizer>> load(const json& doc) {
        return load_hf_tokenizer(write("tokenizer.json", doc.dump()));
    }

    fs::path dir_;
};

TEST_F(HfTokenizerTest, TinyTokenizer) {
    auto tok = load(tiny_tokenizer());
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    const Vocab& v = (*tok)->vocab();
    EXPECT_EQ((*tok)->vocab_size(), 259);
    EXPECT_EQ(v.pre, "gpt2");
    EXPECT_EQ(v.types[257], TokenType::kControl);
    EXPECT_EQ(v.types[258], TokenType::kUserDefined);
    EXPECT_EQ((*tok)->eos_id(), 257);  // <|endoftext|> when no config says otherwise
    EXPECT_TRUE((*tok)->is_eog(257));
    EXPECT_FALSE(v.add_bos);
    auto ids = (*tok)->encode("ab<tool>b<|endoftext|>", false, true);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(*ids, (Ids{256, 258, 'b', 257}));
    EXPECT_EQ((*tok)->decode(*ids), "ab<tool>b");
}

// Gemma's shape: spaces as U+2581, byte fallback, merges by rank (ids as HF tokenizers 0.23
// gives them for this file).
TEST_F(HfTokenizerTest, ByteFallbackBpe) {
    json vocab = {{"<unk>", 0}};
    char hex[8];
    for (int b = 0; b < 256; ++b) {
        std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
        vocab[hex] = b + 1;
    }
    const std::string sp = "\xE2\x96\x81";
    vocab.update({{sp, 257},
                  {"a", 258},
                  {"b", 259},
                  {"ab", 260},
                  {sp + "a", 261},
                  {"ba", 262},
                  {"\n", 263}});
    json doc = {
        {"model",
         {{"type", "BPE"},
          {"unk_token", "<unk>"},
          {"byte_fallback", true},
          {"fuse_unk", true},
          {"vocab", vocab},
          // "ba" before "ab" before "▁a": not the ids' order
          {"merges", json::array({{"b", "a"}, {"a", "b"}, {sp, "a"}})}}},
        {"added_tokens",
         {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
          {{"id", 263}, {"content", "\n"}, {"special", false}}}},
        {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}}},
        {"pre_tokenizer", nullptr},
        {"decoder",
         {{"type", "Sequence"},
          {"decoders",
           {{{"type", "Replace"}, {"pattern", {{"String", sp}}}, {"content", " "}},
            {{"type", "ByteFallback"}},
            {{"type", "Fuse"}}}}}}};
    auto tok = load(doc);
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    EXPECT_EQ((*tok)->vocab().types[1 + 'x'], TokenType::kByte);
    for (const auto& [text, ids] :
         std::vector<std::pair<std::string, Ids>>{{"aba b\n", {258, 262, 257, 259, 263}},
                                                  {" ab \xC3\xA9", {257, 260, 257, 196, 170}},
                                                  {"<unk>x", {0, 121}}}) {
        auto got = (*tok)->encode(text, false, true);
        ASSERT_TRUE(got.ok());
        EXPECT_EQ(*got, ids) << text;
        EXPECT_EQ((*tok)->decode(ids, true), text);
    }
    doc["decoder"] = nullptr;  // a decoder of another shape would decode otherwise
    EXPECT_EQ(load(doc).error().code(), StatusCode::kUnimplemented);
}

TEST_F(HfTokenizerTest, ReadsTokenizerConfig) {
    json doc = tiny_tokenizer();
    doc["added_tokens"].push_back({{"id", 259}, {"content", "<s>"}, {"special", true}});
    write("tokenizer_config.json", json{{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                                        {"eos_token", "<tool>"},
                                        {"add_bos_token", true},
                                        {"chat_template", "{{ messages }}"}}
                                       .dump());
    auto tok = load(doc);
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    EXPECT_EQ((*tok)->bos_id(), 259);
    EXPECT_EQ((*tok)->eos_id(), 258);
    EXPECT_TRUE((*tok)->vocab().add_bos);
}

TEST_F(HfTokenizerTest, RecognisesPreTokenizers) {
    json doc = tiny_tokenizer();
    doc["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"},
           {"pattern", {{"Regex", kLlama3Regex}}},
           {"behavior", "Isolated"},
           {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
    auto tok = load(doc);
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    EXPECT_EQ((*tok)->vocab().pre, "llama3");
    doc["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Digits"}, {"individual_digits", true}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}};
    tok = load(doc);
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    EXPECT_EQ((*tok)->vocab().pre, "smollm");
}

TEST_F(HfTokenizerTest, Errors) {
    auto code = [&](const std::string& text) {
        auto tok = load_hf_tokenizer(write("tokenizer.json", text));
        EXPECT_FALSE(tok.ok()) << text;
        if (!tok.ok()) {
            EXPECT_NE(tok.error().message().find("tokenizer.json"), std::string::npos)
                << tok.error().message();
        }
        return tok.ok() ? StatusCode::kOk : tok.error().code();
    };
    EXPECT_EQ(load_hf_tokenizer((dir_ / "absent.json").string()).error().code(),
              StatusCode::kNotFound);
    EXPECT_EQ(code("{\"model\": {\"type\": \"BPE\", "), StatusCode::kInvalidArgument);
    EXPECT_EQ(code("[1, 2, 3]"), StatusCode::kInvalidArgument);
    EXPECT_EQ(code(R"({"model": {"type": "Unigram", "vocab": []}})"), StatusCode::kUnimplemented);
    EXPECT_EQ(code(R"({"model": {"type": "BPE", "vocab": [1]}})"), StatusCode::kInvalidArgument);

    json doc = tiny_tokenizer();
    doc["pre_tokenizer"] = {{"type", "Whitespace"}};
    EXPECT_EQ(code(doc.dump()), StatusCode::kUnimplemented);
    doc = tiny_tokenizer();
    doc["pre_tokenizer"]["use_regex"] = "yes";  // a value of the wrong type
    EXPECT_EQ(code(doc.dump()), StatusCode::kInvalidArgument);
    doc = tiny_tokenizer();
    doc["normalizer"] = {{"type", "NFKC"}};  // would change the ids: refused, not ignored
    EXPECT_EQ(code(doc.dump()), StatusCode::kUnimplemented);
    doc = tiny_tokenizer();
    doc["added_tokens"].push_back({{"id", "x"}});
    EXPECT_EQ(code(doc.dump()), StatusCode::kInvalidArgument);
    doc = tiny_tokenizer();
    doc["model"]["merges"] = json::array({42});
    EXPECT_EQ(code(doc.dump()), StatusCode::kInvalidArgument);

    doc = tiny_tokenizer();
    write("tokenizer_config.json", "{not json");
    auto tok = load(doc);
    ASSERT_FALSE(tok.ok());
    EXPECT_NE(tok.error().message().find("tokenizer_config.json"), std::string::npos);
}

// SmolLM2's vocabulary written as tokenizer.json tokenizes exactly like the GGUF.
TEST_F(HfTokenizerTest, SmolLM2FromGgufVocabulary) {
    const std::string model = testing::default_gguf_model();
    DS_REQUIRE_FILE(model, "SmolLM2 GGUF");
    auto gguf = load_gguf_tokenizer(model);
    ASSERT_TRUE(gguf.ok()) << gguf.error().to_string();
    const Vocab& v = (*gguf)->vocab();

    json vocab = json::object();
    json added = json::array();
    for (size_t id = 0; id < v.tokens.size(); ++id) {
        if (!v.types.empty() && v.types[id] == TokenType::kControl) {
            added.push_back({{"id", id}, {"content", v.tokens[id]}, {"special", true}});
        }
        vocab[v.tokens[id]] = id;  // added tokens are in the model vocab too, as in HF files
    }
    json merges = json::array();
    for (const std::string& m : v.merges) {  // the newer [a, b] form
        const size_t space = m.find(' ', 1);
        merges.push_back({m.substr(0, space), m.substr(space + 1)});
    }
    json doc = {
        {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}},
        {"added_tokens", added},
        {"pre_tokenizer",
         {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Digits"}, {"individual_digits", true}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}}}}},
    };
    write("tokenizer_config.json",
          json{{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}}.dump());
    auto hf = load(doc);
    ASSERT_TRUE(hf.ok()) << hf.error().to_string();
    EXPECT_EQ((*hf)->vocab_size(), (*gguf)->vocab_size());
    EXPECT_EQ((*hf)->bos_id(), 1);
    EXPECT_EQ((*hf)->eos_id(), 2);
    EXPECT_TRUE((*hf)->is_eog(2));

    std::ifstream in(testing::test_data_dir() + "/smollm2_tokenize.json");
    const json golden = json::parse(in);
    for (const auto& e : golden["entries"]) {
        const std::string text = e["text"];
        auto ids = (*hf)->encode(text, false, e["parse_special"].get<bool>());
        ASSERT_TRUE(ids.ok());
        EXPECT_EQ(*ids, e["ids"].get<Ids>()) << "text: " << text;
        EXPECT_EQ((*hf)->decode(*ids, true), text);
    }
}

}  // namespace
}  // namespace deltaserve::model
