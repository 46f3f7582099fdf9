// The cost of structured output's token masks beside the decode step they slow down.
//
// B sequences decode together (model::eval_batch, one thread pool, as the decode worker runs
// them) from chat prompts asking for JSON; each step samples every sequence's next token at
// temperature 0.8, once freely and once through its response schema's mask (a corpus of
// four: an object with required properties, one with an enum and optional ones, an array of
// $defs objects, json_object), in the same run. A sequence whose value is whole starts a new
// one with a fresh constraint, whose masks are not cached yet, as a new turn's are. Prints
// the forward step, the sampling and the masks' time per step, and the masks' share of a
// constrained step.
//
//   deltaserve-bench-constraint --model FILE [--threads 2] [--batch 8] [--steps 96] [--json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "deltaserve/common/status.h"
#include "deltaserve/common/thread_pool.h"
#include "deltaserve/model/chat_template.h"
#include "deltaserve/model/constraint_factory.h"
#include "deltaserve/model/inference_context.h"
#include "deltaserve/model/model.h"
#include "deltaserve/model/sampler.h"

using namespace deltaserve;
using namespace deltaserve::model;

namespace {

const char* const kSchemas[] = {
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
    "city":{"type":["string","null"]}},"required":["name","age","city"],
    "additionalProperties":false})",
    R"({"type":"object","properties":{"sky":{"enum":["sunny","cloudy","rain"]},
    "temperature":{"type":"number"},"windy":{"type":"boolean"},"note":{"type":"string"}},
    "required":["sky","temperature"]})",
    R"({"type":"object","properties":{"items":{"type":"array","items":{"$ref":"#/$defs/i"},
    "maxItems":4}},"required":["items"],"additionalProperties":false,"$defs":{"i":{
    "type":"object","properties":{"what":{"type":"string"},"count":{"type":"integer"}},
    "required":["what","count"],"additionalProperties":false}}})",
    R"({"type":"object"})",
};
const char* const kPrompts[] = {
    "Describe a famous scientist as JSON.",
    "What is the weather like in Paris? Answer as JSON.",
    "Write a short shopping list as JSON.",
    "Describe your favourite book as a JSON object.",
};

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

struct Options {
    std::string model;
    int32_t threads = 2, batch = 8, steps = 96;
    bool json = false;
};

struct Timing {
    double forward_s = 0, sample_s = 0, mask_s = 0;
    int32_t steps = 0, values = 0;
    uint64_t masks = 0, stacks_made = 0;
};

Result<Timing> run(const Options& o, const Model& model, bool constrained) {
    auto pool = std::make_shared<ThreadPool>(o.threads);
    ConstraintFactory factory(*model.tokenizer);
    std::vector<std::unique_ptr<InferenceContext>> owned;
    std::vector<InferenceContext*> ctxs;
    std::vector<std::unique_ptr<TokenConstraint>> cons(o.batch);
    std::vector<Sampler> samplers;
    std::vector<int32_t> next(o.batch);
    for (int32_t b = 0; b < o.batch; ++b) {
        ContextOptions co{.n_ctx = 1024, .n_threads = o.threads, .n_batch = 512, .threads = pool};
        DS_ASSIGN_OR_RETURN(auto ctx, InferenceContext::create(model, co));
        std::vector<ChatMessage> chat = {{"user", kPrompts[b % 4]}};
        DS_ASSIGN_OR_RETURN(auto prompt,
                            encode_chat(*model.tokenizer, model.chat_template, chat, {}));
        DS_ASSIGN_OR_RETURN(auto logits, ctx->eval(prompt));
        SamplingParams sp;
        sp.seed = 1000 + b;
        samplers.emplace_back(sp);
        if (constrained) {
            DS_ASSIGN_OR_RETURN(cons[b], factory.make(kSchemas[b % 4]));
        }
        next[b] = constrained ? samplers[b].sample(logits, cons[b]->allowed())
                              : samplers[b].sample(logits);
        if (constrained && !cons[b]->accept(next[b])) return internal_error("first token refused");
        ctxs.push_back(ctx.get());
        owned.push_back(std::move(ctx));
    }
    Timing t;
    std::vector<std::span<const int32_t>> spans(o.batch);
    std::vector<float> logits;
    const size_t nv = static_cast<size_t>(model.config.n_vocab);
    for (int32_t step = 0; step < o.steps; ++step) {
        for (int32_t b = 0; b < o.batch; ++b) spans[b] = std::span<const int32_t>(&next[b], 1);
        const double t0 = now_s();
        DS_RETURN_IF_ERROR(eval_batch(ctxs, spans, logits));
        t.forward_s += now_s() - t0;
        for (int32_t b = 0; b < o.batch; ++b) {
            const std::span<const float> row(logits.data() + b * nv, nv);
            if (!constrained) {
                const double s0 = now_s();
                next[b] = samplers[b].sample(row);
                t.sample_s += now_s() - s0;
                continue;
            }
            TokenConstraint& c = *cons[b];
            const double m0 = now_s();
            const std::span<const uint64_t> mask = c.allowed();
            const double s0 = now_s();
            int32_t id = samplers[b].sample(row, mask);
            const double s1 = now_s();
            if (id < 0 || !c.accept(id)) return internal_error("a sampled token was refused");
            const double m1 = now_s();
            t.mask_s += (s0 - m0) + (m1 - s1);
            t.sample_s += s1 - s0;
            if (model.tokenizer->is_eog(id) || c.must_end()) {
                // The value is whole: a new turn, with a new constraint.
                ++t.values;
                t.masks += c.stats().masks;
                t.stacks_made += c.stats().stacks_made;
                DS_ASSIGN_OR_RETURN(cons[b], factory.make(kSchemas[b % 4]));
                const double f0 = now_s();
                id = samplers[b].sample(row, cons[b]->allowed());
                if (id < 0 || !cons[b]->accept(id)) return internal_error("refused");
                t.mask_s += now_s() - f0;
            }
            next[b] = id;
        }
        ++t.steps;
        if (ctxs[0]->n_past() + 2 >= ctxs[0]->n_ctx()) break;
    }
    for (auto& c : cons) {
        if (c == nullptr) continue;
        t.masks += c->stats().masks;
        t.stacks_made += c->stats().stacks_made;
    }
    return t;
}

}  // namespace

int main(int argc, char** argv) {
    Options o;
    for (int i = 1; i < argc; ++i) {
        const std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", a.c_str());
                std::exit(2);
            }
            return argv[++i];
        };
        if (a == "--model") {
            o.model = value();
        } else if (a == "--threads") {
            o.threads = std::atoi(value().c_str());
        } else if (a == "--batch") {
            o.batch = std::atoi(value().c_str());
        } else if (a == "--steps") {
            o.steps = std::atoi(value().c_str());
        } else if (a == "--json") {
            o.json = true;
        } else {
            std::fprintf(stderr, "unknown argument %s\n", a.c_str());
            return 2;
        }
    }
    if (o.model.empty() || o.threads < 1 || o.batch < 1 || o.steps < 1) {
        std::fprintf(stderr, "usage: %s --model FILE [--threads N] [--batch B] [--steps S]\n",
                     argv[0]);
        return 2;
    }
    auto model = load_model(o.model, {.show_progress = false});
    if (!model.ok()) {
        std::fprintf(stderr, "%s\n", model.status().to_string().c_str());
        return 1;
    }
    auto free = run(o, **model, false);
    auto con = run(o, **model, true);
    if (!free.ok() || !con.ok()) {
        std::fprintf(stderr, "%s\n",
                     (free.ok() ? con.status() : free.status()).to_string().c_str());
        return 1;
    }
    const auto per_step = [](double s, int32_t steps) { return 1000.0 * s / steps; };
    const double step_free = per_step(free->forward_s + free->sample_s, free->steps);
    const double step_con = per_step(con->forward_s + con->sample_s + con->mask_s, con->steps);
    const double mask = per_step(con->mask_s, con->steps);
    nlohmann::ordered_json out = {
        {"model", o.model},
        {"threads", o.threads},
        {"batch", o.batch},
        {"steps", con->steps},
        {"free_step_ms", step_free},
        {"free_forward_ms", per_step(free->forward_s, free->steps)},
        {"free_sample_ms", per_step(free->sample_s, free->steps)},
        {"constrained_step_ms", step_con},
        {"constrained_forward_ms", per_step(con->forward_s, con->steps)},
        {"constrained_sample_ms", per_step(con->sample_s, con->steps)},
        {"mask_ms_per_step", mask},
        {"mask_us_per_token", 1000.0 * mask / o.batch},
        {"mask_share_of_step", mask / step_con},
        {"constrained_over_free", step_con / step_free},
        {"values_completed", con->values},
        {"masks", con->masks},
        {"stack_masks_computed", con->stacks_made},
    };
    if (o.json) {
        std::printf("%s\n", out.dump(1).c_str());
    } else {
        std::printf(
            "batch %d: step %.2f ms free, %.2f ms constrained (%.3fx); masks %.3f ms a step "
            "(%.1f us a token, %.1f%% of the step); %d values, %llu stack masks computed for %llu "
            "masks\n",
            o.batch, step_free, step_con, step_con / step_free, mask, 1000.0 * mask / o.batch,
            100.0 * mask / step_con, con->values, static_cast<unsigned long long>(con->stacks_made),
            static_cast<unsigned long long>(con->masks));
    }
    return 0;
}
