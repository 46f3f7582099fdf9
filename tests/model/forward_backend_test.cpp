// The forward pass on a backend whose memory is not the host's, as a GPU's is not.
//
// No GPU runs here, so the backend below stands in for one where this machine can check the
// forward pass's side of the contract: its memory is its own (allocated, uploaded) and every
// pointer an op gets must lie in it, except those the interface says are host memory
// (positions, tokens). A pointer from elsewhere fails the op, as a host pointer would fault
// on a device. The arithmetic is the CPU backend's, so the logits must be the CPU backend's
// bits: any row copied wrong, skipped or read from stale memory shows.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "default_model.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/model/inference_context.h"
#include "test_paths.h"

namespace deltaserve::model {
namespace {

namespace k = deltaserve::kernels;

class OwnMemoryBackend final : public k::Backend {
  public:
    std::string_view name() const override { return "own-memory"; }
    bool available() const override { return true; }

    int uploads() const { return uploads_.load(); }
    // The pointer check after `n` more pass fails, and its op (negative: none does).
    void fail_after(int n) { fail_after_.store(n); }

    Status copy_in(void* dst, const void* src, size_t bytes, const k::Exec& e) override {
        DS_RETURN_IF_ERROR(check("copy_in", dst, bytes));
        return cpu_.copy_in(dst, src, bytes, e);
    }
    Status copy_out(void* dst, const void* src, size_t bytes, const k::Exec& e) override {
        DS_RETURN_IF_ERROR(check("copy_out", src, bytes));
        return cpu_.copy_out(dst, src, bytes, e);
    }
    Status copy(void* dst, const void* src, size_t bytes, const k::Exec& e) override {
        DS_RETURN_IF_ERROR(check("copy", dst, bytes));
        DS_RETURN_IF_ERROR(check("copy", src, bytes));
        return cpu_.copy(dst, src, bytes, e);
    }
    Result<k::WeightMatrix> upload_weight(const k::WeightMatrix& host) override {
        ++uploads_;
        const size_t bytes = static_cast<size_t>(host.rows) * host.row_stride();
        void* mem = allocate(bytes);
        if (mem == nullptr) return resource_exhausted("own-memory: upload");
        std::memcpy(mem, host.data, bytes);
        k::WeightMatrix w = host;
        w.data = mem;
        return w;
    }
    Status rms_norm_rows(const float* x, int64_t ldx, const float* weight, int64_t d, int64_t n,
                         float eps, float* out, int64_t ldo, const k::Exec& e) override {
        DS_RETURN_IF_ERROR(rows("rms_norm_rows", x, ldx, d, n));
        DS_RETURN_IF_ERROR(rows("rms_norm_rows", out, ldo, d, n));
        DS_RETURN_IF_ERROR(check("rms_norm_rows", weight, d * 4));
        return cpu_.rms_norm_rows(x, ldx, weight, d, n, eps, out, ldo, e);
    }
    Status matmul(const k::WeightMatrix& w, const float* x, int64_t ldx, int64_t n, float* y,
                  int64_t ldy, const k::Exec& e) override {
        DS_RETURN_IF_ERROR(weight("matmul", w));
        DS_RETURN_IF_ERROR(rows("matmul", x, ldx, w.cols, n));
        DS_RETURN_IF_ERROR(rows("matmul", y, ldy, w.rows, n));
        return cpu_.matmul(w, x, ldx, n, y, ldy, e);
    }
    Status matmul_shared_input(std::span<const k::MatmulOutput> outputs, const float* x,
                               int64_t ldx, int64_t n, const k::Exec& e) override {
        for (const k::MatmulOutput& o : outputs) {
            DS_RETURN_IF_ERROR(weight("matmul_shared_input", *o.w));
            DS_RETURN_IF_ERROR(rows("matmul_shared_input", x, ldx, o.w->cols, n));
            DS_RETURN_IF_ERROR(rows("matmul_shared_input", o.y, o.ldy, o.w->rows, n));
        }
        return cpu_.matmul_shared_input(outputs, x, ldx, n, e);
    }
    Status rope_rows(float* x, int64_t ldx, int64_t n, int n_heads, int head_dim,
                     const int32_t* positions, float base, k::RopeStyle style,
                     const k::Exec& e) override {
        DS_RETURN_IF_ERROR(rows("rope_rows", x, ldx, int64_t{n_heads} * head_dim, n));
        return cpu_.rope_rows(x, ldx, n, n_heads, head_dim, positions, base, style, e);
    }
    Status silu_mul(float* out, const float* gate, const float* up, int64_t n,
                    const k::Exec& e) override {
        DS_RETURN_IF_ERROR(check("silu_mul", out, n * 4));
        DS_RETURN_IF_ERROR(check("silu_mul", gate, n * 4));
        DS_RETURN_IF_ERROR(check("silu_mul", up, n * 4));
        return cpu_.silu_mul(out, gate, up, n, e);
    }
    Status add(float* y, const float* x, int64_t n, const k::Exec& e) override {
        DS_RETURN_IF_ERROR(check("add", y, n * 4));
        DS_RETURN_IF_ERROR(check("add", x, n * 4));
        return cpu_.add(y, x, n, e);
    }
    Status embed_rows(const k::WeightMatrix& table, const int32_t* tokens, int64_t n, float* out,
                      const k::Exec& e) override {
        DS_RETURN_IF_ERROR(weight("embed_rows", table));
        DS_RETURN_IF_ERROR(check("embed_rows", out, n * table.cols * 4));
        return cpu_.embed_rows(table, tokens, n, out, e);
    }
    Status attention(const k::AttentionShape& shape, const k::KvView& kv, const float* q,
                     int64_t ldq, int32_t n_q, float* out, int64_t ldo, const k::Exec& e) override {
        // The caches are host memory: their attention never comes here.
        DS_RETURN_IF_ERROR(check("attention", kv.k, 1));
        return cpu_.attention(shape, kv, q, ldq, n_q, out, ldo, e);
    }

  protected:
    void* allocate(size_t bytes) override {
        void* p = ::operator new(bytes, std::nothrow);
        if (p != nullptr) {
            std::memset(p, 0xff, bytes);  // NaN: a read before a write shows in the logits
            std::lock_guard lock(mu_);
            ranges_[reinterpret_cast<uintptr_t>(p)] = bytes;
        }
        return p;
    }
    void deallocate(void* data, size_t) override {
        {
            std::lock_guard lock(mu_);
            ranges_.erase(reinterpret_cast<uintptr_t>(data));
        }
        ::operator delete(data);
    }

  private:
    // [p, p + bytes) lies in one allocation of this backend; and the injected failure.
    Status check(const char* op, const void* p, int64_t bytes) {
        if (fail_after_.load() >= 0 && fail_after_.fetch_sub(1) == 0)
            return internal_error(std::string("own-memory: ") + op + ": injected failure");
        const auto a = reinterpret_cast<uintptr_t>(p);
        std::lock_guard lock(mu_);
        auto it = ranges_.upper_bound(a);
        if (it != ranges_.begin()) {
            --it;
            if (a + static_cast<uintptr_t>(bytes) <= it->first + it->second) return Status();
        }
        return invalid_argument(std::string("own-memory: ") + op +
                                " got memory this backend does not own");
    }
    Status rows(const char* op, const float* p, int64_t ld, int64_t width, int64_t n) {
        return check(op, p, ((n - 1) * ld + width) * 4);
    }
    Status weight(const char* op, const k::WeightMatrix& w) {
        return check(op, w.data,
                     static_cast<int64_t>(static_cast<size_t>(w.rows) * w.row_stride()));
    }

    k::Backend& cpu_ = *k::find_backend("cpu");
    std::mutex mu_;
    std::map<uintptr_t, size_t> ranges_;
    std::atomic<int> uploads_{0};
    std::atomic<int> fail_after_{-1};
};

class ForwardBackendTest : public testing::DefaultModelTest {
  protected:
    ContextOptions options(const std::string& policy, k::Backend* backend) const {
        ContextOptions co;
        co.n_ctx = 1024;
        co.n_batch = 96;  // the prompt in several chunks
        co.threads = threads_;
        co.kv.policy = policy;
        co.kv.keep = policy == "full" ? 1.0f : 0.3f;
        if (policy == "deltakv") co.kv_profile = testing::default_deltakv_profile();
        co.backend = backend;
        return co;
    }
    static int32_t greedy(std::span<const float> l) {
        return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    }
    std::shared_ptr<ThreadPool> threads_ = std::make_shared<ThreadPool>(2);
    // As a registered backend, it outlives the model that keeps its weights.
    static inline OwnMemoryBackend& own_ = *new OwnMemoryBackend();
};

TEST_F(ForwardBackendTest, TheCpuBackendsBitsFromMemoryOfItsOwn) {
    const std::vector<int32_t> prompt = text_tokens(300, 0, true);
    for (const std::string policy : {"full", "deltakv", "snapkv"}) {
        auto cpu = InferenceContext::create(*model_, options(policy, nullptr));
        auto own = InferenceContext::create(*model_, options(policy, &own_));
        ASSERT_TRUE(cpu.ok() && own.ok()) << policy;
        auto a = (*cpu)->eval(prompt);
        auto b = (*own)->eval(prompt);
        ASSERT_TRUE(a.ok()) << a.error().to_string();
        ASSERT_TRUE(b.ok()) << policy << ": " << b.error().to_string();
        for (int step = 0; step < 12; ++step) {
            ASSERT_EQ(a->size(), b->size());
            ASSERT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0)
                << policy << ", step " << step;
            const int32_t next = greedy(*a);
            a = (*cpu)->eval(std::span<const int32_t>(&next, 1));
            b = (*own)->eval(std::span<const int32_t>(&next, 1));
            ASSERT_TRUE(a.ok() && b.ok()) << policy << ", step " << step;
        }
        EXPECT_EQ((*cpu)->n_past(), (*own)->n_past());
        EXPECT_EQ((*cpu)->kv_bytes(), (*own)->kv_bytes()) << policy;
    }
}

TEST_F(ForwardBackendTest, ABatchOnTheBackendAndWeightsUploadedOnce) {
    // The weights live with the model: a test before this one in the process may have made
    // them already.
    const bool made_before = model_->on_backends.find(&own_) != nullptr;
    const int uploads_before = own_.uploads();
    std::vector<std::unique_ptr<InferenceContext>> cpu, own;
    for (int i = 0; i < 3; ++i) {
        // nullptr and the CPU backend named are the same backend to a runner.
        auto c = InferenceContext::create(
            *model_, options("full", i == 1 ? k::find_backend("cpu") : nullptr));
        auto o = InferenceContext::create(*model_, options("full", &own_));
        ASSERT_TRUE(c.ok() && o.ok());
        const std::vector<int32_t> p = text_tokens(40 + 17 * i, 50 * i, true);
        ASSERT_TRUE((*c)->eval(p).ok());
        ASSERT_TRUE((*o)->eval(p).ok());
        cpu.push_back(std::move(*c));
        own.push_back(std::move(*o));
    }
    // Every matrix once for this model and backend, however many contexts (tied output: the
    // embedding's).
    const int matrices = 1 + (model_->weights.output.data != model_->weights.token_embd.data) +
                         7 * model_->config.n_layers;
    EXPECT_EQ(own_.uploads() - uploads_before, made_before ? 0 : matrices);
    EXPECT_NE(model_->on_backends.find(&own_), nullptr);

    BatchRunner cpu_runner(*model_, threads_, AttentionNumerics::kNative);
    BatchRunner own_runner(*model_, threads_, AttentionNumerics::kNative, &own_);
    std::vector<InferenceContext*> cs, os;
    for (auto& c : cpu) cs.push_back(c.get());
    for (auto& o : own) os.push_back(o.get());
    const int32_t next[] = {42, 1000, 7};
    const std::span<const int32_t> tokens[] = {{&next[0], 1}, {&next[1], 1}, {&next[2], 1}};
    std::vector<float> a, b;
    ASSERT_TRUE(cpu_runner.run(cs, tokens, a).ok());
    const Status st = own_runner.run(os, tokens, b);
    ASSERT_TRUE(st.ok()) << st.to_string();
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
    // Contexts on another backend than the runner's are refused.
    EXPECT_EQ(cpu_runner.run(os, tokens, b).code(), StatusCode::kInvalidArgument);
    std::vector<InferenceContext*> mixed = {cs[0], os[1]};
    const std::span<const int32_t> two[] = {tokens[0], tokens[1]};
    EXPECT_EQ(eval_batch(mixed, two, b).code(), StatusCode::kInvalidArgument);
}

TEST_F(ForwardBackendTest, ABackendErrorKeepsNothingAndTheNextTurnIsRight) {
    auto cpu = InferenceContext::create(*model_, options("full", nullptr));
    auto own = InferenceContext::create(*model_, options("full", &own_));
    ASSERT_TRUE(cpu.ok() && own.ok());
    const std::vector<int32_t> first = text_tokens(120, 0, true), second = text_tokens(70, 120);
    ASSERT_TRUE((*cpu)->eval(first).ok());
    ASSERT_TRUE((*own)->eval(first).ok());
    for (int after : {0, 5, 200}) {  // the first op, one in the first layer, one deep
        own_.fail_after(after);
        auto failed = (*own)->eval(second);
        own_.fail_after(-1);
        ASSERT_FALSE(failed.ok()) << after;
        EXPECT_NE(failed.error().message().find("injected failure"), std::string::npos)
            << failed.error().to_string();
        EXPECT_EQ((*own)->n_past(), 120) << after;
    }
    auto a = (*cpu)->eval(second);
    auto b = (*own)->eval(second);
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(std::memcmp(a->data(), b->data(), a->size() * sizeof(float)), 0);
}

TEST_F(ForwardBackendTest, LlamaCppsRoundingNeedsTheCpu) {
    ContextOptions co = options("full", &own_);
    co.attention = AttentionNumerics::kGgml;
    auto ctx = InferenceContext::create(*model_, co);
    ASSERT_FALSE(ctx.ok());
    EXPECT_EQ(ctx.error().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(ctx.error().message().find("CPU only"), std::string::npos);
}

TEST(ChooseBackend, NamesAndTheDefault) {
    auto cpu = k::choose_backend("cpu");
    ASSERT_TRUE(cpu.ok());
    EXPECT_EQ((*cpu)->name(), "cpu");
    EXPECT_EQ(k::choose_backend("gpu").status().code(), StatusCode::kInvalidArgument);
    k::Backend* cuda = k::find_backend("cuda");
    auto chosen = k::choose_backend("");
    ASSERT_TRUE(chosen.ok());
    auto asked = k::choose_backend("cuda");
    if (cuda != nullptr && cuda->available()) {
        EXPECT_EQ(*chosen, cuda);
        EXPECT_TRUE(asked.ok());
    } else {
        EXPECT_EQ((*chosen)->name(), "cpu");
        ASSERT_FALSE(asked.ok());
        EXPECT_EQ(asked.error().code(), StatusCode::kUnavailable);
        EXPECT_NE(asked.error().message().find("--device cuda"), std::string::npos)
            << asked.error().to_string();
    }
}

}  // namespace
}  // namespace deltaserve::model
