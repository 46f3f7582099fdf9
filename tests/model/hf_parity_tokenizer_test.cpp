// Tokenizers against Hugging Face `tokenizers` on a multilingual, code and emoji corpus:
// tests/data/tokenizers/cases.json (the texts) and one <vocabulary>.json of HF's ids and
// decodes each (tests/golden/make_hf_tokenizer_goldens.py; tests/golden/README.md). Each
// vocabulary is loaded through the GGUF loader and, where the golden script saved it beside
// the GGUF, through the tokenizer.json loader too; every text must encode to HF's ids exactly
// (special tokens in the text matched, and not), decode to HF's bytes (special tokens
// rendered, and skipped), and round-trip where HF's does; and seeded id sequences that no
// text encodes to must decode to HF's bytes.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "../../model/src/loader_common.h"
#include "deltaserve/model/tokenizer.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

using Ids = std::vector<int32_t>;
using nlohmann::json;

json read_json(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in.good()) << "cannot open " << path;
    return in.good() ? json::parse(in) : json();
}

std::string ids_text(const Ids& ids) {
    std::ostringstream out;
    for (size_t i = 0; i < ids.size(); ++i) out << (i ? "," : "") << ids[i];
    return out.str();
}

// What matched, per check, over a vocabulary's texts.
struct Tally {
    int texts = 0, encode = 0, plain = 0, decode = 0, decode_skip = 0, round_trips = 0,
        round_trip = 0;
};

// Checks every text of cases against golden; prints the tally and at most a few failures
// of each kind (all of them count).
Tally check_all(const Tokenizer& tok, const json& cases, const json& golden,
                const std::string& label) {
    Tally t;
    const json& texts = cases["cases"];
    const json& entries = golden["cases"];
    EXPECT_EQ(texts.size(), entries.size()) << label << ": cases.json and the golden disagree";
    int reported = 0;
    auto report = [&](bool ok, const std::string& what, size_t i, const std::string& detail) {
        if (!ok && reported++ < 12) {
            ADD_FAILURE() << label << " text " << i << " " << what << ": "
                          << json(texts[i].get<std::string>()).dump() << "\n"
                          << detail;
        }
        return ok ? 1 : 0;
    };
    for (size_t i = 0; i < texts.size() && i < entries.size(); ++i) {
        const std::string text = texts[i];
        const json& e = entries[i];
        const Ids want = e["ids"].get<Ids>();
        const Ids want_plain = e.contains("plain") ? e["plain"].get<Ids>() : want;
        const std::string want_decode = e.value("decode", text);
        const std::string want_skip = e.value("decode_skip", want_decode);
        ++t.texts;
        auto ids = tok.encode(text, /*add_bos=*/false, /*parse_special=*/true);
        auto plain = tok.encode(text, false, /*parse_special=*/false);
        if (!ids.ok() || !plain.ok()) {
            ADD_FAILURE() << label << " text " << i << " not encoded";
            continue;
        }
        t.encode += report(*ids == want, "encode", i,
                           "  got  " + ids_text(*ids) + "\n  want " + ids_text(want));
        t.plain += report(*plain == want_plain, "encode (parse_special off)", i,
                          "  got  " + ids_text(*plain) + "\n  want " + ids_text(want_plain));
        const std::string decoded = tok.decode(want, /*render_special=*/true);
        t.decode +=
            report(decoded == want_decode, "decode", i,
                   "  got  " + json(decoded).dump(-1, ' ', false, json::error_handler_t::replace) +
                       "\n  want " + json(want_decode).dump());
        const std::string skipped = tok.decode(want, /*render_special=*/false);
        t.decode_skip +=
            report(skipped == want_skip, "decode (special skipped)", i,
                   "  got  " + json(skipped).dump(-1, ' ', false, json::error_handler_t::replace) +
                       "\n  want " + json(want_skip).dump());
        if (want_decode == text) {  // HF round-trips this text
            ++t.round_trips;
            t.round_trip += report(tok.decode(*ids, true) == text, "round trip", i, "");
        }
    }
    std::printf(
        "[ parity ] %s: %d texts; encode %d, encode without special %d, decode %d, decode "
        "skipping special %d identical; round trip %d of the %d HF round-trips\n",
        label.c_str(), t.texts, t.encode, t.plain, t.decode, t.decode_skip, t.round_trip,
        t.round_trips);
    return t;
}

// HF's decodes of id sequences no text encodes to (broken UTF-8, special tokens, any ids).
void check_decodes(const Tokenizer& tok, const json& golden, const std::string& label) {
    int same = 0, total = 0;
    for (const json& e : golden["decodes"]) {
        const Ids ids = e["ids"].get<Ids>();
        const std::string decoded = tok.decode(ids, /*render_special=*/true);
        const std::string skipped = tok.decode(ids, /*render_special=*/false);
        const bool ok = decoded == e["decode"].get<std::string>() &&
                        skipped == e["decode_skip"].get<std::string>();
        EXPECT_TRUE(ok) << label << " decode of " << ids_text(ids) << "\n  got  "
                        << json(decoded).dump(-1, ' ', false, json::error_handler_t::replace)
                        << " / "
                        << json(skipped).dump(-1, ' ', false, json::error_handler_t::replace)
                        << "\n  want " << e["decode"].dump() << " / " << e["decode_skip"].dump();
        same += ok ? 1 : 0;
        ++total;
    }
    EXPECT_GT(total, 0);
    std::printf("[ parity ] %s: %d of %d id sequences decode identically\n", label.c_str(), same,
                total);
}

void expect_all(const Tally& t) {
    EXPECT_EQ(t.encode, t.texts);
    EXPECT_EQ(t.plain, t.texts);
    EXPECT_EQ(t.decode, t.texts);
    EXPECT_EQ(t.decode_skip, t.texts);
    EXPECT_EQ(t.round_trip, t.round_trips);
}

class HfParityTest : public ::testing::TestWithParam<const char*> {
  protected:
    void SetUp() override {
        const std::string dir = testing::test_data_dir() + "/tokenizers/";
        cases_ = read_json(dir + "cases.json");
        golden_ = read_json(dir + GetParam() + ".json");
        ASSERT_TRUE(golden_.is_object());
        vocab_path_ = testing::models_dir() + "/" + golden_["vocab"].get<std::string>();
    }

    json cases_, golden_;
    std::string vocab_path_;
};

TEST_P(HfParityTest, GgufVocabularyMatchesHf) {
    DS_REQUIRE_FILE(vocab_path_, "vocabulary (deploy/setup.sh fetches it)");
    ASSERT_EQ(std::filesystem::file_size(vocab_path_), golden_["vocab_bytes"].get<uint64_t>())
        << vocab_path_ << " is not the file the golden was made from";
    auto tok = load_gguf_tokenizer(vocab_path_);
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    expect_all(check_all(**tok, cases_, golden_, std::string(GetParam()) + " (GGUF)"));
    check_decodes(**tok, golden_, std::string(GetParam()) + " (GGUF)");
}

// The tokenizer.json transformers' converter made (saved by the golden script, not by setup).
TEST_P(HfParityTest, TokenizerJsonMatchesHf) {
    const std::string json_path =
        std::filesystem::path(vocab_path_).replace_extension(".tokenizer.json").string();
    DS_REQUIRE_FILE(json_path, "tokenizer.json (make_hf_tokenizer_goldens.py writes it)");
    auto tok = load_hf_tokenizer(json_path);
    ASSERT_TRUE(tok.ok()) << tok.error().to_string();
    expect_all(check_all(**tok, cases_, golden_, std::string(GetParam()) + " (tokenizer.json)"));
    check_decodes(**tok, golden_, std::string(GetParam()) + " (tokenizer.json)");
}

INSTANTIATE_TEST_SUITE_P(Vocabularies, HfParityTest,
                         ::testing::Values("llama_bpe", "qwen2", "gemma3", "smollm2"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace deltaserve::model
