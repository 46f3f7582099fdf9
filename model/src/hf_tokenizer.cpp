// Hugging Face tokenizer.json -> Vocab -> tokenizer: BPE models with a ByteLevel
// pre-tokenizer (no normalizer, or NFC) as byte-level BPE; BPE with byte fallback and spaces
// as U+2581 (Gemma's) as SentencePiece-style, by the file's merge ranks. nlohmann::json exceptions
// stay inside this file.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "deltaserve/model/tokenizer.h"
#include "pre_tokenizer.h"

namespace deltaserve::model {
namespace {

using nlohmann::json;

// The Split regexes of the pre-tokenizers deltaserve implements by hand.
constexpr std::string_view kLlama3Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
constexpr std::string_view kQwen2Regex =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

Result<json> read_json(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot open " + path);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    json doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (doc.is_discarded()) return invalid_argument(path + ": malformed JSON");
    return doc;
}

std::string type_of(const json& node) {
    if (node.is_object() && node.contains("type") && node["type"].is_string()) {
        return node["type"].get<std::string>();
    }
    return {};
}

std::string split_regex(const json& node) {
    if (type_of(node) != "Split" || !node.contains("pattern")) return {};
    const json& pattern = node["pattern"];
    if (pattern.is_object() && pattern.contains("Regex") && pattern["Regex"].is_string()) {
        return pattern["Regex"].get<std::string>();
    }
    return {};
}

// Recognises the pre_tokenizer config as one of the pre-tokenizers of pre_tokenizer.h.
Result<std::string> detect_pre(const json& pre) {
    const std::string type = type_of(pre);
    const json* byte_level = type == "ByteLevel" ? &pre : nullptr;
    if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array() &&
        !pre["pretokenizers"].empty()) {
        byte_level = &pre["pretokenizers"].back();
    }
    if (byte_level != nullptr && byte_level->value("add_prefix_space", false)) {
        return unimplemented("ByteLevel pre-tokenizer with add_prefix_space");
    }
    if (type == "ByteLevel") {
        if (pre.value("use_regex", true)) return std::string("gpt2");
    } else if (type == "Sequence" && pre.contains("pretokenizers") &&
               pre["pretokenizers"].is_array()) {
        const json& seq = pre["pretokenizers"];
        if (seq.size() == 2 && type_of(seq[0]) == "Digits" &&
            seq[0].value("individual_digits", false) && type_of(seq[1]) == "ByteLevel" &&
            seq[1].value("use_regex", true)) {
            return std::string("smollm");
        }
        if (seq.size() == 2 && type_of(seq[1]) == "ByteLevel" && !seq[1].value("use_regex", true)) {
            const std::string regex = split_regex(seq[0]);
            if (regex == kLlama3Regex) return std::string("llama3");
            if (regex == kQwen2Regex) return std::string("qwen2");
        }
    }
    return unimplemented("unsupported pre_tokenizer " + pre.dump().substr(0, 300));
}

// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::string token_text(const json& node) {
    if (node.is_string()) return node.get<std::string>();
    if (node.is_object() && node.contains("content") && node["content"].is_string()) {
        return node["content"].get<std::string>();
    }
    return {};
}

int32_t find_id(const Vocab& vocab, const std::string& text) {
    if (text.empty()) return -1;
    for (size_t id = 0; id < vocab.tokens.size(); ++id) {
        if (vocab.tokens[id] == text) return static_cast<int32_t>(id);
    }
    return -1;
}

Status set_token(Vocab* vocab, int64_t id, std::string text, TokenType type) {
    if (id < 0 || id > (1 << 24)) return invalid_argument("token id " + std::to_string(id));
    if (static_cast<size_t>(id) >= vocab->tokens.size()) {
        vocab->tokens.resize(id + 1);
        vocab->types.resize(id + 1, TokenType::kUnused);  // holes stay unused
    }
    vocab->tokens[id] = std::move(text);
    vocab->types[id] = type;
    return {};
}

// The SentencePiece-style BPE (Gemma's): spaces made U+2581 by a Replace normalizer, no
// split (a Split on " " finds none after it), byte fallback, and the decoder undoing that.
Status check_byte_fallback_shape(const json& doc) {
    const json replace_space = {
        {"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
    const json split_space = {{"type", "Split"},
                              {"pattern", {{"String", " "}}},
                              {"behavior", "MergedWithPrevious"},
                              {"invert", false}};
    const json decoder = {
        {"type", "Sequence"},
        {"decoders",
         {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
          {{"type", "ByteFallback"}},
          {{"type", "Fuse"}}}}};
    auto get = [&](const char* key) { return doc.contains(key) ? doc[key] : json(); };
    if (get("normalizer") != replace_space) {
        return unimplemented("byte-fallback BPE with normalizer " + get("normalizer").dump());
    }
    if (!get("pre_tokenizer").is_null() && get("pre_tokenizer") != split_space) {
        return unimplemented("byte-fallback BPE with pre_tokenizer " +
                             get("pre_tokenizer").dump().substr(0, 300));
    }
    if (get("decoder") != decoder) {
        return unimplemented("byte-fallback BPE with decoder " + get("decoder").dump());
    }
    const json& model = doc["model"];
    if (model.value("ignore_merges", false) || !model.value("dropout", json()).is_null()) {
        return unimplemented("byte-fallback BPE with ignore_merges or dropout");
    }
    return {};
}

// *spm: the vocabulary is SentencePiece-style (byte fallback), else byte-level BPE.
Result<Vocab> vocab_from_json(const json& doc, bool* spm) {
    if (!doc.is_object() || !doc.contains("model") || !doc["model"].is_object()) {
        return invalid_argument("no \"model\" object");
    }
    const json& model = doc["model"];
    const std::string model_type = type_of(model);
    if (model_type != "BPE") {
        return unimplemented("model type \"" + model_type + "\" (only BPE is supported)");
    }
    if (!model.contains("vocab") || !model["vocab"].is_object()) {
        return invalid_argument("model.vocab is not an object");
    }
    Vocab vocab;
    for (const auto& [text, id] : model["vocab"].items()) {
        if (!id.is_number_integer()) return invalid_argument("vocab entry \"" + text + "\"");
        DS_RETURN_IF_ERROR(set_token(&vocab, id.get<int64_t>(), text, TokenType::kNormal));
    }
    if (model.contains("merges") && model["merges"].is_array()) {
        for (const json& merge : model["merges"]) {
            if (merge.is_string()) {
                vocab.merges.push_back(merge.get<std::string>());
            } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
                       merge[1].is_string()) {
                vocab.merges.push_back(merge[0].get<std::string>() + " " +
                                       merge[1].get<std::string>());
            } else {
                return invalid_argument("merge " + std::to_string(vocab.merges.size()) +
                                        " is neither \"a b\" nor [a, b]");
            }
        }
    }
    if (doc.contains("added_tokens") && doc["added_tokens"].is_array()) {
        for (const json& added : doc["added_tokens"]) {
            if (!added.is_object() || !added.contains("id") || !added["id"].is_number_integer() ||
                !added.contains("content") || !added["content"].is_string()) {
                return invalid_argument("malformed added_tokens entry " + added.dump());
            }
            const TokenType type =
                added.value("special", false) ? TokenType::kControl : TokenType::kUserDefined;
            DS_RETURN_IF_ERROR(set_token(&vocab, added["id"].get<int64_t>(),
                                         added["content"].get<std::string>(), type));
        }
    }
    if (vocab.tokens.empty()) return invalid_argument("empty vocabulary");
    *spm = model.value("byte_fallback", false);
    if (*spm) {
        DS_RETURN_IF_ERROR(check_byte_fallback_shape(doc));
        for (size_t id = 0; id < vocab.tokens.size(); ++id) {
            if (vocab.types[id] == TokenType::kNormal && parse_byte_token(vocab.tokens[id]) >= 0) {
                vocab.types[id] = TokenType::kByte;
            }
        }
        if (model.contains("unk_token") && model["unk_token"].is_string()) {
            vocab.unk_id = find_id(vocab, model["unk_token"].get<std::string>());
        }
        vocab.pre = "default";
        vocab.add_space_prefix = false;
        return vocab;
    }
    const json pre = doc.contains("pre_tokenizer") ? doc["pre_tokenizer"] : json();
    DS_ASSIGN_OR_RETURN(vocab.pre, detect_pre(pre));
    // A normalizer changes the ids: none, or NFC (Qwen2's); others are refused.
    const json normalizer = doc.contains("normalizer") ? doc["normalizer"] : json();
    if (type_of(normalizer) == "NFC") {
        vocab.nfc = true;
    } else if (!normalizer.is_null()) {
        return unimplemented("unsupported normalizer " + normalizer.dump().substr(0, 300));
    }
    vocab.add_bos = vocab.pre == "llama3";  // llama.cpp's default for the pre type
    vocab.add_space_prefix = false;
    return vocab;
}

// tokenizer_config.json beside tokenizer.json: special tokens and add_bos_token.
Status apply_config(const std::string& config_path, Vocab* vocab) {
    DS_ASSIGN_OR_RETURN(const json config, read_json(config_path));
    if (!config.is_object()) return invalid_argument(config_path + ": not a JSON object");
    auto id_of = [&](const char* key) {
        return config.contains(key) ? find_id(*vocab, token_text(config[key])) : -1;
    };
    if (int32_t id = id_of("bos_token"); id >= 0) vocab->bos_id = id;
    if (int32_t id = id_of("eos_token"); id >= 0) vocab->eos_id = id;
    if (int32_t id = id_of("unk_token"); id >= 0) vocab->unk_id = id;
    if (int32_t id = id_of("pad_token"); id >= 0) vocab->pad_id = id;
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
        vocab->add_bos = config["add_bos_token"].get<bool>();
    }
    return {};
}

// load_hf_tokenizer without the exception boundary.
Result<std::unique_ptr<Tokenizer>> load(const std::string& tokenizer_json_path) {
    Result<json> doc = read_json(tokenizer_json_path);
    if (!doc.ok()) return doc.error();
    bool spm = false;
    Result<Vocab> vocab = vocab_from_json(*doc, &spm);
    if (!vocab.ok()) return vocab.error().with_context(tokenizer_json_path);
    if (vocab->eos_id < 0) vocab->eos_id = find_id(*vocab, "<|endoftext|>");
    const std::filesystem::path config =
        std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
    std::error_code ec;
    if (std::filesystem::exists(config, ec)) {
        DS_RETURN_IF_ERROR(apply_config(config.string(), &*vocab));
    }
    if (vocab->add_bos && vocab->bos_id < 0) vocab->add_bos = false;
    Result<std::unique_ptr<Tokenizer>> tok =
        spm ? make_spm_tokenizer(std::move(*vocab)) : make_bpe_tokenizer(std::move(*vocab));
    if (!tok.ok()) return tok.error().with_context(tokenizer_json_path);
    return tok;
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& tokenizer_json_path) {
    try {
        return load(tokenizer_json_path);
    } catch (const nlohmann::json::exception& e) {  // a value of an unexpected type
        return invalid_argument(tokenizer_json_path + ": " + e.what());
    }
}

}  // namespace deltaserve::model
