// DeltaKV (../shared/methods/deltakv.md): full-attention layers keep every token; sparse
// layers keep sinks, references (every stride-th token) and a recent buffer in full
// precision and every other token as a small latent residual against the mean of its k
// nearest references; decode attends, per sparse layer, to the sinks, the buffer and the
// tokens an observation layer selected, reconstructing only those. A model's sliding-window
// layers are neither: they keep their window exact (DeltaKvOptions::window_layer).
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "deltaserve/common/thread_pool.h"
#include "deltaserve/kernels/backend.h"
#include "deltaserve/kernels/deltakv.h"
#include "deltaserve/kvstore/deltakv_hints.h"
#include "deltaserve/kvstore/deltakv_region.h"
#include "deltaserve/kvstore/kv_cache.h"
#include "deltaserve/kvstore/op_array.h"
#include "deltaserve/kvstore/slot_pool.h"

namespace deltaserve::kvstore {

// A profile's compressors as one backend's ops read them (DeltaKvSequenceCache::create):
// per layer the encoder's matrices, the int4 decoder whole and its K rows, the decoder's V
// rows (fp32, [kv_dim][m]).
struct DeltaKvOnBackend {
    kernels::Backend* backend = nullptr;
    std::vector<kernels::DeltaKvLayer> enc;
    std::vector<kernels::Int4DecoderRef> dec, dec_k;
    std::vector<const float*> wd_v;
};
// A device backend's copy is uploaded once (its memory lives as long as the backend) and
// shared by every session on it.
struct DeltaKvUploads {
    std::mutex mu;
    std::vector<std::shared_ptr<const DeltaKvOnBackend>> on;
};

// A model's trained compressors and the settings they were trained with (one compressor
// per layer; full layers do not use theirs; a sliding-window layer may have none).
struct DeltaKvProfile {
    std::string model_id;
    int32_t d = 0, m = 0, k = 4, stride = 10, sinks = 16, window = 64, latent_bits = 4;
    std::vector<kernels::DeltaKvLayer> layers;
    // Layers ordered from the most to the least sensitive to compression (full layers are
    // taken from the front).
    std::vector<int32_t> sensitivity_order;
    // The layer calibration measured to pick best, as the first full layer, what the layers
    // after it attend at decode (-1: none measured); taken as the first full layer.
    int32_t observation_layer = -1;
    std::vector<std::vector<float>> storage;  // what the WeightMatrix pointers point into
    std::vector<kernels::Int4Decoder> int4;   // per layer, for int4 latents (prepare_int4_decoders)
    std::vector<kernels::Int4Decoder> int4_k;  // the same, K rows only (decode steps)
    // Per layer, empty when unknown: the variance of the reconstructed keys' error (before
    // RoPE) per KV head and RoPE pair, the mean of the pair's two dimensions
    // ([n_kv_heads][head_dim / 2]; deltakv_key_error_variance, measured by calibration).
    std::vector<std::vector<float>> key_error_var;
    // The compressors on the device backends sessions used (shared by copies of the profile).
    std::shared_ptr<DeltaKvUploads> uploads = std::make_shared<DeltaKvUploads>();

    // Whether `layer` has a compressor (its matrices set).
    bool has_compressor(int32_t layer) const {
        return layer >= 0 && static_cast<size_t>(layer) < layers.size() &&
               layers[layer].w1.data != nullptr;
    }
};

// Makes profile.int4 and int4_k from the layers' decoders (empty ones for a layer without a
// compressor). Loaders call it once; every session using the profile shares the result.
void prepare_int4_decoders(DeltaKvProfile& profile);

struct DeltaKvOptions {
    int32_t n_layers = 0, n_kv_heads = 0, head_dim = 0;
    float rope_theta = 10000.0f;
    kernels::RopeStyle rope_style = kernels::RopeStyle::kInterleaved;
    // Per layer: 1 = full attention (at least one). Sparse layers before the first full
    // layer have no observation layer: a chunk attends their whole compressed region, a
    // decode step the previous step's selection (see last_select_).
    std::vector<uint8_t> full_layer;
    // Per layer (empty: none): 1 = a sliding-window layer (Gemma 3's local layers), neither
    // full nor sparse: its rows stay exact, but only those its window of `sliding_window`
    // tokens still reaches and kWindowSlack before them (so a turn may rewind that far);
    // the rest are given back. DeltaKV compresses the global layers only.
    std::vector<uint8_t> window_layer;
    int32_t sliding_window = 0;
    // The window layers' RoPE base where it is not rope_theta (Gemma 3's local base; 0: the
    // same). Only the tools' attended_rows reads it: the cache turns no window layer's keys.
    float window_rope_theta = 0.0f;
    int32_t sinks = 16, stride = 10, k = 4;
    int32_t window =
        64;  // the buffer; its oldest `window` tokens are compressed when it reaches 2x (see keep)
    int latent_bits = 4;        // 4 (int4, per-token min/max) or 16 (fp16)
    float select_ratio = 0.1f;  // decode: share of the compressed region attended (and pins)
    // Decode: after a chunk (a prompt or a user's turn), this share of the compressed region
    // is attended at every decode step besides the step's own pick, until the next chunk
    // (ours: SnapKV's observation window, used to select instead of to evict). The pins: the
    // tokens the chunk's last pin_window queries attended most in one sparse layer and head
    // (summed over those queries), each token scored by the best of the tokens up to
    // pin_after positions before it and pin_before after it. 0: off.
    float pin_ratio = 0.1f;
    int32_t pin_window = 16, pin_after = 12, pin_before = 2;
    // Decode (ours): the `follow` latent tokens a step's sparse layers attended most (by
    // their largest attention weight in one layer and head), and the follow_ahead positions
    // after each, are attended by the next step besides its own pick and the pins: generation
    // reads on from where it read, as a copy's next token follows the last. 0: off.
    int32_t follow = 16, follow_ahead = 3;
    // Compression (ours): this share of the tokens a forward call compresses stays exact
    // instead, those its latents reconstruct worst (per judging layer, the K and the V
    // squared error over the plan's mean of each, summed). They become references, which
    // later tokens may name. A rare token (a number, a name) is where a small latent loses
    // most, and in deeper layers than the first. 0: off (the default: at 0.02 the bench's
    // gain on retrieval was within noise, multi-turn lost a little; kvstore/README.md).
    float exact_share = 0.0f;
    // The first this share of the sparse layers (at least one) judge them; the later sparse
    // layers compress what is left. Their rows of the call's blocks ship once the last judge
    // ran, so fewer judges ship sooner.
    float exact_depth = 0.5f;
    // Decode: which layers choose what a step attends to. With 0, the paper's: the
    // observation layer's q . k for its whole group. With N > 0, our departure (README,
    // "Scorer layers"): the first sparse layer after each full layer (and the first of
    // the lead), then every Nth, is a scorer. A scorer reconstructs the keys of every
    // latent token of the region and picks the select_ratio share it scores highest (max
    // over heads); it and the sparse layers up to the next scorer attend that share. A
    // layer's attention is told far better by a layer a few steps earlier than by an early
    // full layer, but each scorer scores the whole region (see score_dims).
    int32_t score_every = 0;
    // A scorer with int4 latents scores in two passes (ours, after SparQ's query-sparse
    // scores): first every latent token with its keys in only this share of each KV head's
    // RoPE pairs, those where the step's queries are largest, picking by that; then only
    // the pick's whole keys, which its attention uses. 1 = whole keys for every token.
    float score_dims = 0.25f;
    // Chunks of 2+ tokens (prefill): how many of that region's tokens to attend, the highest
    // scored; 0 = all of it, as the paper's prefill sees every token before compressing.
    int32_t prefill_select = 0;
    // Target keep ratio (0: none), of the global layers' full KV (a window layer's window is
    // outside it). A full buffer's oldest window is compressed only when
    // the session would exceed it otherwise: the room under the target, a share of the
    // context, keeps as many recent tokens exact (the buffer grows with the session).
    float keep = 0.0f;
    // A reconstructed key k^ = k - e misses the error e, so the weight exp(s q.k^) it gets
    // is, on average over e (zero mean, variance var per dimension, independent of k^),
    // exp(s^2 sum_t q_t^2 var_t / 2) times too small. Attention adds that much, times this
    // factor, to the logits of reconstructed tokens, with the profile's key_error_var (no
    // correction where the profile has none); 0 turns it off.
    float logit_correction = 1.0f;
    int32_t n_ctx = 0;
    // The most tokens one forward call brings: what a window layer holds besides its window
    // (bytes_bound).
    int32_t n_batch = 512;

    bool is_window_layer(int32_t layer) const {
        return !window_layer.empty() && window_layer[static_cast<size_t>(layer)] != 0;
    }
    // The layers that are not window layers: those full_layer chooses among.
    int32_t n_global_layers() const {
        return n_layers - static_cast<int32_t>(
                              std::count(window_layer.begin(), window_layer.end(), uint8_t{1}));
    }

    // kInvalidArgument naming the first setting out of its range (the model's shape, at
    // least one full layer that is not a window layer, window layers with a window, the
    // ranges documented above, and a context whose references
    // fit the 16-bit ordinals latents name them by). Whether a profile fits is
    // DeltaKvSequenceCache::create's to check.
    Status validate() const;
};

// Settings for a target keep ratio: how many layers stay full (at least one, the profile's
// most sensitive first, estimated for a 2k-token context), a coarser stride and smaller buffer
// below 0.25, and the target itself (a longer buffer where it leaves room). The measured
// ratio is bytes() / full_fp16_bytes().
DeltaKvOptions deltakv_options_for_keep(const DeltaKvProfile& profile, float keep,
                                        DeltaKvOptions base);

// The least keep ratio a session with options o (from deltakv_options_for_keep) holds at
// n_tokens: one full layer, and in every sparse layer the references, sinks and a buffer of
// 1.5 windows exact, every other token a latent; metadata counted as bytes() counts it. A
// target below it is held at about it.
double deltakv_keep_floor(const DeltaKvProfile& profile, const DeltaKvOptions& o,
                          int32_t n_tokens = 2048);

// A profile's key_error_var for one layer, measured on x: n rows [K; V] (before RoPE) of one
// sequence, compressed as the cache compresses it (sinks and every stride-th token kept, every
// other token's latent against the mean of its k nearest earlier references, int4 latents
// decoded as a decode step decodes them).
std::vector<float> deltakv_key_error_variance(const DeltaKvProfile& profile, int32_t layer,
                                              const float* x, int32_t n,
                                              const DeltaKvOptions& options, ThreadPool& threads);

class DeltaKvCodec;

class DeltaKvSequenceCache final : public SequenceCache {
  public:
    // With a device backend (one whose memory is not the host's) the cache's rows, its
    // latents and the ops' arrays live in that device's memory and its ops run there (see
    // device()); the positions' bookkeeping, a copy of the latents and the choices (what a
    // step attends, the pins) stay on the host. nullptr or the CPU backend: host memory.
    // Errors: kInvalidArgument for options that do not validate(), or a profile that does
    // not fit them (or lacks its int4 decoders for int4 latents; fp16 latents on a device);
    // the device's, uploading the compressors.
    static Result<std::unique_ptr<DeltaKvSequenceCache>> create(const DeltaKvProfile& profile,
                                                                const DeltaKvOptions& options,
                                                                ThreadPool& threads,
                                                                kernels::Backend* device = nullptr);
    ~DeltaKvSequenceCache() override;

    int32_t n_tokens() const override { return n_tokens_; }
    kernels::Backend* device() const override { return device_; }
    Status reserve(int32_t n_new) override;
    // Also reconstructs, for a sparse layer, the tokens its group selected (into temporary
    // slots) before the layer's view is asked for.
    Status store(int32_t layer, int32_t first, int32_t n, const float* k, const float* v,
                 int64_t ld) override;
    // In a single-token call a sparse layer's view holds its full-precision tokens only (sinks,
    // selected references, the buffer); attend() adds the selected latent tokens.
    kernels::KvView view(int32_t layer, int32_t n_visible_new) const override;
    // A sparse layer in a single-token call: attention over the view, merged with attention
    // over the selected latent tokens, whose keys are reconstructed (K rows of the decoder
    // only) and whose values are never made (kernels::latent_attention). A sparse layer in a
    // chunk, when the profile has key errors: the view's reconstructed tokens attended apart
    // and merged, with the logit correction (DeltaKvOptions::logit_correction). Elsewhere
    // false.
    // Errors here, in observe, store and commit: the device's (an op, a copy, an allocation;
    // in host memory an op fails only on a bug, which aborts).
    Result<bool> attend(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                        int64_t ldq, int32_t n, float* out, int64_t ldo, ThreadPool& pool) override;
    Status observe(int32_t layer, const kernels::AttentionShape& shape, const float* q, int64_t ldq,
                   const float* hidden, int64_t ldh, int32_t n, ThreadPool& pool) override;
    // Compresses what the session's size calls for (plan_compression), unless more of the
    // prompt follows (expect_more): then the chunk stays exact and the prompt is compressed
    // at its last chunk, as one call's prompt is, whatever the chunking.
    Status commit(int32_t n) override;
    void expect_more(int32_t n_more) override { more_ = std::max(0, n_more); }
    // Once window layers gave back rows, a cut whose next query's window reaches them keeps
    // nothing (kept_by_truncate says so).
    void truncate(int32_t n_keep) override;
    int32_t kept_by_truncate(int32_t n_keep) const override;
    // Full layers, full-precision tokens of the sparse layers, latents with their reference
    // ids, the position maps and the window layers' rows; not a chunk's reconstructions
    // (freed at its commit).
    size_t bytes() const override { return bytes_upto(n_tokens_) + window_bytes(); }
    size_t bytes_bound(int32_t n_tokens) const override;
    // The prompt's rows of the sparse layers, exact until its last chunk, and one layer's
    // reconstructions of the region a chunk attends.
    size_t prefill_bytes_bound(int32_t n_tokens, int32_t n_new) const override;
    // Bytes of this cache's slot pools in memory now (SlotPool::resident_bytes): what the
    // system gives it, which bytes() and prefill_bytes_bound() are to bound.
    size_t resident_bytes() const;
    // DeltaKvCodec (src/deltakv_codec.h): the committed tokens in the cache's own form,
    // whole or as layer-wise rows, and the pins.
    SequenceCodec* codec() override;

    int32_t compressed_tokens() const { return region_.n_latents(); }
    int32_t n_full_layers() const { return static_cast<int32_t>(full_layers_.size()); }
    // The first position the window layers hold (0 without window layers).
    int32_t window_first() const { return window_from_; }
    // The latent tokens the current single-token call's layer group attends (after its store).
    int32_t selected_latent_tokens() const { return static_cast<int32_t>(latent_sel_.size()); }
    // Their positions, in order.
    const std::vector<int32_t>& selected_latent_positions() const { return latent_sel_; }
    // The positions the last chunk pinned (DeltaKvOptions::pin_ratio), in order: latent
    // tokens and references of the compressed region.
    const std::vector<int32_t>& pinned() const { return hints_.pins(); }
    // The region's references (exact) the current single-token call's layer group attends.
    const std::vector<int32_t>& selected_exact_positions() const { return selected_; }
    // The position of each entry of view(layer, n_visible_new).
    std::vector<int32_t> view_positions(int32_t layer, int32_t n_visible_new) const;
    // In a chunk, after a sparse layer's store: the region's latent tokens it attends besides
    // its view, and their rows as reconstructed for that layer (slots 0..n-1).
    const std::vector<int32_t>& reconstructed_positions() const { return recon_pos_; }
    kernels::KvView reconstructed_view() const;
    // The latent tokens the last single-token attend() of a sparse layer attended.
    int32_t attended_latent_tokens() const { return attended_latents_; }
    // Layer `layer`'s [K; V] row (K before RoPE) of each of `positions` (below n_tokens()),
    // d floats each into out, as this cache gives them to attention: exact rows as stored,
    // a latent token as a decode step reconstructs it (Dec(z) plus the mean of its
    // references); latent[i] says which (1), or 2 for a window layer's row past its window,
    // which the cache no longer holds (zeros). For the tools: deltactl fidelity compares them
    // with a full KV history's. Between forward calls only (it uses the step's scratch).
    // Errors: the device's.
    Status attended_rows(int32_t layer, std::span<const int32_t> positions, float* out,
                         uint8_t* latent);

  private:
    friend class DeltaKvCodec;
    DeltaKvSequenceCache(const DeltaKvProfile& profile, const DeltaKvOptions& options,
                         ThreadPool& threads);
    static constexpr uint16_t kNoRef = DeltaKvRegion::kNoRef;
    // The public calls' bodies; a failed op inside throws (deltakv_scratch.h: must), and the
    // public call returns its Status.
    bool attend_call(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                     int64_t ldq, int32_t n, float* out, int64_t ldo);
    void observe_call(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                      int64_t ldq, int32_t n);
    void commit_call(int32_t n);
    void attended_rows_call(int32_t layer, std::span<const int32_t> positions, float* out,
                            uint8_t* latent);
    size_t latent_bytes() const;
    // The global layers' bytes of positions [0, n); the window layers' rows held now.
    size_t bytes_upto(int32_t n) const;
    size_t window_bytes() const;
    // Window layers: gives back the rows no query from position `from` on reaches, less the
    // slack (kWindowSlack).
    void drop_window_before(int32_t from);
    // Compression, in three steps: which blocks the commit of a session of n_total tokens
    // compresses (the oldest windows while the buffer holds twice the window) and their
    // references; each sparse layer's latents (from its observe, or at commit); then, at
    // commit, the latents join the region and the tokens' slots are freed.
    void plan_compression(int32_t n_total);
    void compress_layer(int32_t sparse_index);
    // Once the judges (exact_judges) made the plan's latents: the plan's exact_share tokens
    // they reconstruct worst become references (their latents dropped, the ordinals
    // renumbered); the later sparse layers compress the rest.
    void keep_worst_exact();
    // How many sparse layers judge (exact_depth); whether they all compressed the plan (then
    // its tokens' kinds, reference or latent, are final).
    int32_t exact_judges() const;
    // A plan whose tokens kept exact are not chosen yet: its rows are not final.
    bool exact_pending() const;
    // The reconstruction errors of nb tokens' latents (packed, or z for fp16; the tokens at
    // positions pos), x = Dec + rm against the tokens' x (rows of D): their codes into
    // plan_.errors[s] (those of positions a multiple of kErrorSample, 0 for the others,
    // except in a judging layer) and, for a judging layer, every token's K and V squared
    // errors into plan_.err[s].
    void add_errors(int32_t s, const int32_t* pos, const float* x, const float* rm, const float* z,
                    const uint8_t* packed, int64_t nb);
    // Measuring every latent's error would slow compression by about a tenth.
    static constexpr int32_t kErrorSample = 4;
    void finish_compression();
    // Moves the rows of the sparse pool's highest slots into the holes below and gives the
    // pages above back (SlotPool::trim), after a compression or truncation freed slots.
    void compact();
    void drop_plan();
    int32_t region_end() const { return plan_.active ? plan_.end : region_.end; }
    // The current group's selection from offsets into the compressed region (sorted): its
    // references (selected_), its latent tokens apart (latent_sel_ in a single-token call,
    // else recon_pos_, reconstructed a layer at a time).
    void take_selection(const std::vector<int32_t>& idx, int32_t n);
    // attend_chunk(): gives hints_ the attention of the chunk's last queries (rows [n - w, n)
    // of q) to the compressed region (its reconstructed tokens and selected references) and
    // to the tokens this commit compresses, given lse_a_ (the merged lse) and lse_b_.
    void score_pins(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                    int64_t ldq, int32_t n);
    // attend() of a single token: gives hints_ the logs of the attention weights its latent
    // tokens (positions, scores_ [n_heads][positions.size()]) took, given lse_b_raw_, lse_b_
    // and the merged lse_a_.
    void score_follow(int n_heads, const std::vector<int32_t>& positions);
    // The lead's selection for this call (offsets into the region, sorted): see last_select_.
    std::vector<int32_t> lead_selection();
    void reconstruct(int32_t layer);
    // For the latent tokens at `positions` of sparse layer sl: latent_ptrs_, their latent rows
    // (lat_rows_) and angle offsets (lat_at_), every reference of the region by ordinal
    // (ref_pos_: the sinks, then region_.ref_list up to region_.end; their slots ref_slots_)
    // and ref_x_, a row of `dims` values per ordinal (K de-RoPEd, then V when dims is D), and
    // the RoPE angles of every position.
    void gather_refs(int32_t sl, const std::vector<int32_t>& positions, int32_t dims);
    // x += the mean of the references of the latent token at pos (ref_x_ rows of `dims`
    // values, as gather_refs made them); rows (k entries), when given, gets their rows.
    void add_ref_mean(int32_t sl, int32_t pos, int32_t dims, float* x, int32_t* rows) const;
    // For attend(): every head's score of each selected latent token (scores_, [head][token]),
    // its keys reconstructed (K rows of the decoder), after gather_refs; int4 latents on the
    // backend (deltakv_key_scores, leaving codes_ for latent_attention).
    void latent_scores(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                       const std::vector<int32_t>& positions);
    // A scorer's pick (score_every) among latent_sel_, scored in scores_: the select_ratio
    // share with the highest max over heads, into scored_ (in position order); scores_,
    // lat_rows_ and codes_ then hold the pick's only, as latent_scores had scored it.
    void keep_top_scored(int n_heads);
    // scored_ = the select_ratio share of latent_sel_ with the highest top_score_, in
    // position order; top_ = their indices in latent_sel_.
    void pick_top();
    // A scorer's pick from sketched keys (score_dims < 1; src/deltakv_sketch.cpp): the
    // chosen RoPE pairs (sketch_pair_, per KV head), their decoder rows (sketch_dec_) and
    // reference means give every latent token's partial scores, their max over heads
    // top_score_; then pick_top.
    void sketch_pick(int32_t layer, const kernels::AttentionShape& shape, const float* q);
    // Offset in angle_table_ of a position's RoPE angles (cos then sin), computed the first
    // time a step needs them and kept for the next steps (head_dim floats per position, at
    // most the context's; forget_angles at truncate).
    int32_t angles(int32_t pos);
    void forget_angles();
    void release_temp();
    // Whether a layer's reconstructed tokens get the logit correction (logit_correction).
    bool corrects(int32_t layer) const;
    // lse[i * n_heads + h] += the correction for query i's head h (lse of reconstructed tokens).
    void add_logit_correction(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                              int64_t ldq, int32_t n, float* lse) const;
    // A chunk over a sparse layer: the reconstructed tokens attended apart (every query sees
    // all of them), their lse corrected, merged with the view; false when there are none
    // and no pins to score (the caller attends the view).
    bool attend_chunk(int32_t layer, const kernels::AttentionShape& shape, const float* q,
                      int64_t ldq, int32_t n, float* out, int64_t ldo);
    // The backend ops' views of the cache: how they run (the call's threads), RoPE angles at
    // offsets into angle_table_, and the latent tokens of lat_rows_ in sparse layer sl.
    kernels::Exec exec() const { return kernels::Exec{threads_}; }
    // The KV heads' shape, for the ops that read rows only (its query heads unread).
    kernels::AttentionShape kv_shape() const {
        return {options_.n_kv_heads, options_.n_kv_heads, options_.head_dim, 0.0f};
    }
    kernels::RopeAngles rope_angles(const int32_t* at) const;
    kernels::LatentRows latent_rows(int32_t sl) const;
    // On a device: the angle table's and sparse layer sl's latents' and ordinals' mirrors
    // brought up to the host's (sl < 0: the angles only), before ops read them; and every
    // mirror forgotten, after the host's were rewritten (an import).
    void sync_mirrors(int32_t sl);
    void forget_mirrors();
    // q (n rows, ldq apart, in the cache's memory) where host code can read it: q itself in
    // host memory, else a copy (q_host_, rows packed: ld n_heads * head_dim).
    const float* host_q(const kernels::AttentionShape& shape, const float* q, int64_t ldq,
                        int32_t n, int64_t* ld);

    const DeltaKvProfile& profile_;
    DeltaKvOptions options_;
    // The threads of the call in progress: attend() and observe() use the caller's, other
    // calls the pool the cache was made with.
    ThreadPool* threads_;
    // Where compression, the reference rows, latent keys, reconstructions and latent
    // attention run (the CPU backend when the cache's memory is host memory, else device_),
    // and each layer's compressor (its encoder's matrices), int4 decoder (whole and its K
    // rows) and the decoder's V rows (fp32, latent attention's) there.
    kernels::Backend* backend_ = nullptr;
    kernels::Backend* device_ = nullptr;
    std::shared_ptr<const DeltaKvOnBackend> on_;
    const std::vector<kernels::DeltaKvLayer>* enc_ = nullptr;
    const std::vector<kernels::Int4DecoderRef>*dec_ = nullptr, *dec_k_ = nullptr;
    // Which positions of the compressed region are references and latents, and the latents.
    DeltaKvRegion region_;
    // What the commit of the forward call in progress compresses.
    DeltaKvPlan plan_;
    std::vector<int32_t> full_layers_, sparse_layers_, window_layers_;
    std::vector<int32_t> layer_index_;  // layer -> index among full, sparse or window layers
    std::vector<int32_t> group_of_;     // sparse layer -> its observation layer
    // Per layer: a full layer whose next global layer is sparse (it selects for its group).
    std::vector<uint8_t> observes_;
    std::unique_ptr<SlotPool> full_pool_, sparse_pool_, window_pool_;
    std::vector<int32_t> full_slot_;    // position -> slot in the full-layer pool
    std::vector<int32_t> sparse_slot_;  // position -> slot in the sparse pool, -1 if compressed
    // position -> slot in the window layers' pool, -1 below window_from_ (given back).
    std::vector<int32_t> window_slot_;
    int32_t window_from_ = 0;
    int32_t n_tokens_ = 0, n_reserved_ = 0;
    int32_t more_ = 0;  // expect_more: prompt tokens after this call's
    // The current group's selection: the region's references to attend and their slots.
    std::vector<int32_t> selected_, selected_slot_;
    // A chunk's selected latent tokens, and their K and V rows (fp16, one sparse layer's at a
    // time: reconstruct() overwrites them for the next layer) as a KvView's slots 0..n-1.
    std::vector<int32_t> recon_pos_, recon_slots_;
    OpArray<uint8_t> recon_k_, recon_v_;
    // The sparse layers before the first full layer (the lead) have no observation layer. A
    // decode step gives them the selection the first observation layer (first_observation_,
    // -1 when there is no lead) made at the previous single-token step, as offsets into the
    // region then ending at last_select_end_ (0: none; then the whole region).
    bool lead_selected_ = false;
    int32_t first_observation_ = -1, last_select_end_ = 0;
    std::vector<int32_t> last_select_;
    // Pins and following (DeltaKvOptions::pin_ratio, follow): scored here, chosen there.
    DeltaKvHints hints_;
    std::unique_ptr<DeltaKvCodec> codec_;
    std::vector<int32_t> pin_pos_;   // score_pins: the exact tokens scored
    std::vector<uint8_t> pin_rows_;  // on a device: their rows, copied over
    std::vector<float> lse_b_raw_;   // attend_chunk(): lse_b_ before the logit correction
    // score_follow's scratch: one layer's log weight per latent token it attended.
    std::vector<float> follow_best_;
    // In a single-token call the selected latent tokens are apart: attend() takes them.
    std::vector<int32_t> latent_sel_;
    // Per layer: a scorer (score_every). scored_: the last scorer's pick this call.
    std::vector<uint8_t> scorer_;
    std::vector<int32_t> scored_, top_;
    std::vector<float> top_score_;
    // sketch_pick's scratch (kept, as the reconstruction scratch below is).
    std::vector<int32_t> sketch_pair_, sketch_rows_;
    std::vector<std::pair<float, int32_t>> sketch_weight_;
    kernels::Int4Decoder sketch_dec_;
    std::vector<float> sketch_ref_, sketch_near_, near_angles_, sketch_q_;
    int32_t attended_latents_ = 0;
    std::vector<uint8_t> reconstructed_;  // per layer: done for this forward call
    std::vector<int32_t> angle_of_;       // position -> offset in angle_table_, -1 if none
    std::vector<int32_t> angle_pos_;      // the positions that have one
    std::vector<float> angle_table_;
    // On a device: the region's latents and reference ordinals per sparse layer and the angle
    // table as the ops read them there, mirrors of the host's (their first *_synced_
    // elements copied; sync_mirrors()).
    std::vector<OpArray<uint8_t>> latents_on_;
    std::vector<OpArray<uint16_t>> refs_on_;
    std::vector<size_t> latents_synced_, refs_synced_;
    OpArray<float> angles_on_;
    size_t angles_synced_ = 0;
    // Reconstruction scratch, kept between calls so steps do not allocate: the references'
    // positions (by ordinal), and rows of x.
    std::vector<int32_t> ref_pos_, ref_slots_, ref_at_;
    std::vector<const uint8_t*> latent_ptrs_;
    std::vector<int32_t> lat_rows_, lat_at_;
    OpArray<float> ref_x_;
    std::vector<float> z_, x_;
    // attend(): the latents' codes (int4: unpacked once for K and V), and the two halves'
    // outputs and log-sum-exps.
    OpArray<uint8_t> codes_;
    OpArray<float> scores_, out_b_, lse_a_, lse_b_;
    // On a device, host copies of a call's queries (host_q()) for what host code computes
    // from them: the logit correction, the sketches, the pins, an observation's mean query.
    std::vector<float> q_host_;
    // An observation layer's mean query and the region's selection scores; compression's
    // rows (references', tokens', their means), latents, chosen ordinals and stored latents.
    OpArray<float> sel_q_, sel_scores_, enc_ref_x_, enc_x_, enc_rm_, enc_z_;
    OpArray<uint16_t> enc_refs_;
    OpArray<uint8_t> enc_latents_;
    mutable std::vector<int32_t> view_slots_;
};

}  // namespace deltaserve::kvstore
