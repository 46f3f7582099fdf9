#include "tokenize_answer.h"

#include <vector>

#include "deltaserve/api/openai_protocol.h"
#include "deltaserve/model/chat_template.h"
#include "json_body.h"
#include "json_fields.h"

namespace deltaserve::api {

namespace {

constexpr size_t kMaxTokenizeBytes = size_t{1} << 20;  // tokenized on the I/O thread

Result<std::vector<int32_t>> chat_tokens(const model::Model& model, std::string_view body,
                                         const RequestJson& j) {
    // The chat as a turn renders it (the same checks as a chat request's).
    DS_ASSIGN_OR_RETURN(ChatRequest chat, parse_chat_request(body, model::SamplingParams{}));
    bool generation_prompt = true;
    DS_RETURN_IF_ERROR(
        boolean_field(j, "add_generation_prompt", "add_generation_prompt", generation_prompt));
    model::ChatRenderOptions render;
    render.add_generation_prompt = generation_prompt;
    render.kwargs_json = chat.chat_template_kwargs;
    render.tools_json = chat.tools_json;
    return model::encode_chat(*model.tokenizer, model.chat_template, chat.messages, render);
}

}  // namespace

Result<std::string> tokenize_answer(const model::Model& model, std::string_view body) {
    DS_ASSIGN_OR_RETURN(RequestJson j, parse_ordered_json_body(body));
    if (!j.is_object()) return invalid_argument("the body must be a JSON object");
    const model::Tokenizer& tok = *model.tokenizer;
    std::vector<int32_t> ids;
    if (field_of(j, "messages") != nullptr) {
        DS_ASSIGN_OR_RETURN(ids, chat_tokens(model, body, j));
    } else {
        std::string text;
        bool given = false;
        DS_RETURN_IF_ERROR(string_field(j, "content", "content", kMaxTokenizeBytes, text, given));
        const char* field = "content";
        if (!given) {
            DS_RETURN_IF_ERROR(string_field(j, "prompt", "prompt", kMaxTokenizeBytes, text, given));
            field = "prompt";
        }
        if (!given) return invalid_argument("give 'content', 'prompt' or 'messages'");
        // llama-server adds no BOS unless add_special; vLLM adds it unless add_special_tokens
        // is false. Either only where the model's tokenizer adds one (add_bos_token), as a
        // completion's prompt gets it.
        bool add_special = std::string(field) == "prompt";
        DS_RETURN_IF_ERROR(boolean_field(j, "add_special", "add_special", add_special));
        DS_RETURN_IF_ERROR(
            boolean_field(j, "add_special_tokens", "add_special_tokens", add_special));
        DS_ASSIGN_OR_RETURN(ids, tok.encode(text, add_special && tok.vocab().add_bos, true));
    }
    bool with_pieces = false;
    DS_RETURN_IF_ERROR(boolean_field(j, "with_pieces", "with_pieces", with_pieces));
    nlohmann::json tokens = nlohmann::json::array();
    int32_t prev = -1;
    for (int32_t id : ids) {
        if (!with_pieces) {
            tokens.push_back(id);
            continue;
        }
        const std::string piece = tok.token_to_piece(id, prev, true);
        prev = id;
        if (model::find_invalid_utf8(piece) < 0) {
            tokens.push_back({{"id", id}, {"piece", piece}});
        } else {
            std::vector<int> bytes(piece.begin(), piece.end());
            for (int& b : bytes) b &= 0xFF;
            tokens.push_back({{"id", id}, {"piece", bytes}});
        }
    }
    return nlohmann::json{{"tokens", std::move(tokens)},
                          {"count", ids.size()},
                          {"max_model_len", model.config.n_ctx_train}}
        .dump();
}

Result<std::string> detokenize_answer(const model::Model& model, std::string_view body) {
    DS_ASSIGN_OR_RETURN(RequestJson j, parse_ordered_json_body(body));
    if (!j.is_object()) return invalid_argument("the body must be a JSON object");
    const RequestJson* t = field_of(j, "tokens");
    if (t == nullptr || !t->is_array()) return bad_field("tokens", "must be an array of token ids");
    const model::Tokenizer& tok = *model.tokenizer;
    std::vector<int32_t> ids;
    for (const RequestJson& id : *t) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 ||
            id.get<int64_t>() >= tok.vocab_size()) {
            return bad_field("tokens",
                             "must hold ids in [0, " + std::to_string(tok.vocab_size()) + ")");
        }
        ids.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
    const std::string text = tok.decode(ids, true);
    return nlohmann::json{{"content", text}, {"prompt", text}}.dump();
}

std::string tokenizer_info_answer(const model::Model& model) {
    const model::Tokenizer& tok = *model.tokenizer;
    const auto text = [&](int32_t id) -> nlohmann::json {
        if (id < 0 || id >= tok.vocab_size()) return nullptr;
        return model::special_token_text(tok, id);
    };
    const model::ChatTemplate& tmpl = model.chat_template;
    return nlohmann::json{
        {"tokenizer_class", "deltaserve"},
        {"bos_token", text(tok.bos_id())},
        {"eos_token", text(tok.eos_id())},
        {"pad_token", nullptr},
        {"unk_token", nullptr},
        {"add_bos_token", tok.vocab().add_bos},
        {"chat_template", tmpl.is_default() ? nlohmann::json() : nlohmann::json(tmpl.source())},
        {"model_max_length", model.config.n_ctx_train}}
        .dump();
}

}  // namespace deltaserve::api
