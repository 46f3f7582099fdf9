#include "deltaserve/model/token_constraint.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace deltaserve::model {

namespace {

constexpr uint8_t kStringStates = 14;  // json_string's states 0..13
// The stack masks one turn keeps: 4 MiB (128 masks of a 262144-token vocabulary, 682 of a
// 49152-token one), emptied when full.
constexpr size_t kCacheBytes = size_t{4} << 20;

void set_bit(std::vector<uint64_t>& mask, int32_t id) {
    mask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
}

std::string key_of(const GrammarStack& stack) {
    std::string key(stack.size() * sizeof(uint32_t), '\0');
    if (!stack.empty()) std::memcpy(key.data(), stack.data(), key.size());
    return key;
}

}  // namespace

GrammarVocab::GrammarVocab(const Tokenizer& tokenizer) {
    const int32_t n = tokenizer.vocab_size();
    pieces_.resize(n);
    // A token as it follows another inside the answer (not the first after BOS).
    const int32_t after = n;
    for (int32_t id = 0; id < n; ++id) {
        if (tokenizer.is_eog(id)) {
            eog_.push_back(id);
            continue;
        }
        pieces_[id] = tokenizer.token_to_piece(id, after, false);
        if (!pieces_[id].empty()) sorted_.push_back(id);
    }
    std::sort(sorted_.begin(), sorted_.end(),
              [&](int32_t a, int32_t b) { return pieces_[a] < pieces_[b]; });
    lcp_.resize(sorted_.size(), 0);
    for (size_t i = 1; i < sorted_.size(); ++i) {
        const std::string& a = pieces_[sorted_[i - 1]];
        const std::string& b = pieces_[sorted_[i]];
        uint32_t l = 0;
        while (l < a.size() && l < b.size() && a[l] == b[l]) ++l;
        lcp_[i] = l;
    }
    size_t i = 0;
    for (unsigned b = 0; b < 256; ++b) {
        while (i < sorted_.size() && static_cast<unsigned char>(pieces_[sorted_[i]][0]) <= b) ++i;
        byte_end_[b] = i;
    }
    stay_.assign(kStringStates, std::vector<uint64_t>(words(), 0));
    close_.assign(kStringStates, {});
    for (uint8_t s0 = 0; s0 < kStringStates; ++s0) {
        for (int32_t id : sorted_) {
            const std::string& p = pieces_[id];
            uint8_t s = s0;
            size_t k = 0;
            for (; k < p.size(); ++k) {
                s = json_string::next(s, static_cast<unsigned char>(p[k]));
                if (s == json_string::kDead || s == json_string::kClosed) break;
            }
            if (s == json_string::kClosed) {
                close_[s0].push_back({id, static_cast<uint32_t>(k + 1)});
            } else if (s != json_string::kDead) {
                set_bit(stay_[s0], id);
            }
        }
    }
}

TokenConstraint::TokenConstraint(std::shared_ptr<const Grammar> grammar,
                                 std::shared_ptr<const GrammarVocab> vocab)
    : vocab_(std::move(vocab)), matcher_(std::move(grammar)), mask_(vocab_->words(), 0) {}

std::span<const uint64_t> TokenConstraint::allowed() {
    ++stats_.masks;
    std::fill(mask_.begin(), mask_.end(), 0);
    for (const GrammarStack& s : matcher_.stacks()) {
        const std::vector<uint64_t>& m = stack_mask(s);
        for (size_t w = 0; w < mask_.size(); ++w) mask_[w] |= m[w];
    }
    return mask_;
}

bool TokenConstraint::accept(int32_t token) {
    if (token < 0 || static_cast<size_t>(token) >= vocab_->size()) return false;
    const std::vector<int32_t>& eog = vocab_->eog();
    if (std::find(eog.begin(), eog.end(), token) != eog.end()) return matcher_.can_end();
    const std::string& p = vocab_->piece(token);
    return !p.empty() && matcher_.accept(p);
}

const std::vector<uint64_t>& TokenConstraint::stack_mask(const GrammarStack& stack) {
    std::string key = key_of(stack);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    if ((cache_.size() + 1) * vocab_->words() * sizeof(uint64_t) > kCacheBytes) cache_.clear();
    ++stats_.stacks_made;
    std::vector<uint64_t> mask(vocab_->words(), 0);
    if (stack.empty()) {
        for (int32_t id : vocab_->eog()) set_bit(mask, id);
    } else if (matcher_.grammar().elements()[stack.back() >> 4].kind ==
               GrammarElement::Kind::kJsonString) {
        close_string(stack, mask);
    } else {
        walk_vocab(stack, mask);
    }
    return cache_.emplace(std::move(key), std::move(mask)).first->second;
}

void TokenConstraint::close_string(const GrammarStack& stack, std::vector<uint64_t>& mask) {
    const uint8_t s = static_cast<uint8_t>(stack.back() & 15);
    mask = vocab_->stay_in_string(s);
    // Past the closing quote.
    std::vector<GrammarStack> after;
    GrammarStack closed = stack;
    closed.back() = ((stack.back() >> 4) + 1) << 4;
    matcher_.expand(std::move(closed), after);
    for (const auto& [id, from] : vocab_->close_string(s)) {
        const std::string& p = vocab_->piece(id);
        if (matches(after, std::string_view(p).substr(from))) set_bit(mask, id);
    }
}

bool TokenConstraint::matches(const std::vector<GrammarStack>& from, std::string_view bytes) {
    if (bytes.empty()) return !from.empty();
    scratch_a_ = from;
    for (char c : bytes) {
        matcher_.advance_all(scratch_a_, static_cast<unsigned char>(c), scratch_b_);
        if (scratch_b_.empty()) return false;
        scratch_a_.swap(scratch_b_);
    }
    return true;
}

void TokenConstraint::walk_vocab(const GrammarStack& stack, std::vector<uint64_t>& mask) {
    const std::vector<int32_t>& sorted = vocab_->sorted();
    if (levels_.empty()) levels_.resize(1);
    levels_[0].assign(1, stack);
    size_t valid = 0;  // levels_[0..valid] hold the states after the current token's bytes
    size_t dead = std::numeric_limits<size_t>::max();  // the prefix this long matches nothing
    for (size_t i = 0; i < sorted.size();) {
        const std::string& p = vocab_->piece(sorted[i]);
        if (vocab_->lcp(i) >= dead) {
            ++i;
            continue;
        }
        dead = std::numeric_limits<size_t>::max();
        valid = std::min<size_t>(valid, vocab_->lcp(i));
        if (levels_.size() < p.size() + 1) levels_.resize(p.size() + 1);
        for (size_t d = valid; d < p.size(); ++d) {
            matcher_.advance_all(levels_[d], static_cast<unsigned char>(p[d]), levels_[d + 1]);
            if (levels_[d + 1].empty()) {
                dead = d + 1;
                break;
            }
            valid = d + 1;
        }
        if (dead == 1) {
            // No token starting with this byte can come.
            i = vocab_->first_byte_end(static_cast<unsigned char>(p[0]));
            continue;
        }
        if (dead == std::numeric_limits<size_t>::max()) set_bit(mask, sorted[i]);
        ++i;
    }
}

}  // namespace deltaserve::model
