// load_tokenizer_file: picks the tokenizer format from the file's first bytes.
#include <cctype>
#include <fstream>

#include "deltaserve/model/tokenizer.h"
#include "loader_common.h"

namespace deltaserve::model {

Result<std::unique_ptr<Tokenizer>> load_tokenizer_file(const std::string& path, int32_t n_vocab) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return not_found("cannot open tokenizer " + path);
    char head[4096];
    in.read(head, sizeof(head));
    const size_t n = static_cast<size_t>(in.gcount());
    if (n == 0) return invalid_argument("tokenizer " + path + " is empty");
    if (n >= 4 && std::string_view(head, 4) == "GGUF") return load_gguf_tokenizer(path);
    // tokenizer.json: the first non-space byte opens an object. A llama2.c tokenizer.bin
    // starts with a little-endian u32 (the longest token's length); should its low byte be
    // '{', the zero byte after it tells it apart from JSON.
    size_t i = 0;
    while (i < n && std::isspace(static_cast<unsigned char>(head[i]))) ++i;
    if (i < n && head[i] == '{' && !(i + 1 < n && head[i + 1] == '\0')) {
        return load_hf_tokenizer(path);
    }
    return load_llama2c_tokenizer(path, n_vocab);
}

}  // namespace deltaserve::model
