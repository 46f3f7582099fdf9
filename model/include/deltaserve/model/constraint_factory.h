// The token constraints of turns that ask for structured output, for one model's vocabulary:
// the vocabulary's tables are made once (at the first such turn, some milliseconds), each
// schema's grammar once while it is among the last few asked for. Thread-safe.
#pragma once

#include <cstddef>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "deltaserve/common/status.h"
#include "deltaserve/model/json_schema_grammar.h"
#include "deltaserve/model/token_constraint.h"

namespace deltaserve::model {

class ConstraintFactory {
  public:
    explicit ConstraintFactory(const Tokenizer& tokenizer, size_t kept_grammars = 32)
        : tokenizer_(tokenizer), kept_(kept_grammars) {}

    // A constraint to the values of `json_schema`, between `prefix` and `suffix`
    // (json_schema_grammar's errors).
    Result<std::unique_ptr<TokenConstraint>> make(std::string_view json_schema,
                                                  std::string_view prefix = "",
                                                  std::string_view suffix = "");

  private:
    const Tokenizer& tokenizer_;
    const size_t kept_;
    std::mutex mu_;
    std::shared_ptr<const GrammarVocab> vocab_;
    // By schema, prefix and suffix (each length-prefixed), the newest first.
    std::list<std::pair<std::string, std::shared_ptr<const Grammar>>> grammars_;
};

}  // namespace deltaserve::model
