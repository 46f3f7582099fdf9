#include "deltaserve/model/constraint_factory.h"

namespace deltaserve::model {

Result<std::unique_ptr<TokenConstraint>> ConstraintFactory::make(std::string_view json_schema,
                                                                 std::string_view prefix,
                                                                 std::string_view suffix) {
    std::string key;
    for (std::string_view part : {json_schema, prefix, suffix}) {
        key += std::to_string(part.size()) + ":";
        key += part;
    }
    std::shared_ptr<const Grammar> grammar;
    std::shared_ptr<const GrammarVocab> vocab;
    {
        std::lock_guard<std::mutex> lock(mu_);
        for (auto it = grammars_.begin(); it != grammars_.end(); ++it) {
            if (it->first == key) {
                grammars_.splice(grammars_.begin(), grammars_, it);
                grammar = it->second;
                break;
            }
        }
        if (vocab_ == nullptr) vocab_ = std::make_shared<const GrammarVocab>(tokenizer_);
        vocab = vocab_;
    }
    if (grammar == nullptr) {
        DS_ASSIGN_OR_RETURN(grammar, json_schema_grammar(json_schema, prefix, suffix));
        std::lock_guard<std::mutex> lock(mu_);
        grammars_.emplace_front(std::move(key), grammar);
        if (grammars_.size() > kept_) grammars_.pop_back();
    }
    return std::make_unique<TokenConstraint>(std::move(grammar), std::move(vocab));
}

}  // namespace deltaserve::model
