// Calibration text: reading the files (plain or gzip, as Debian ships its documentation)
// and choosing which stretches of each one calibration runs the model over.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"

namespace deltaserve::ops {

// A file's text; a name ending in ".gz" is decompressed. Errors name the path.
Result<std::string> read_text(const std::string& path);

// A stretch of a text's tokens.
struct TokenSpan {
    int64_t begin = 0;
    int64_t size = 0;
};

// The sequences calibration takes from a text of n_tokens tokens: `share` tokens in all (or
// the whole text, if shorter) in sequences of at most seq_len, each centred in its own
// equal part of the text, so a manual is sampled past its table of contents and a long text
// along its length. Sequences shorter than min_len are left out.
std::vector<TokenSpan> spread_sequences(int64_t n_tokens, int64_t share, int32_t seq_len,
                                        int32_t min_len);

}  // namespace deltaserve::ops
