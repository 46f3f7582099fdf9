// DeltaKV's codec (SequenceCodec): a session's committed tokens out of the cache and back,
// in the cache's own representation (full layers' fp16 rows; in the sparse layers the
// full-precision tokens' rows, the latents and the ordinals of their references), never
// the reconstructed or full KV. Whole (src/deltakv_shipping.cpp) or as layer-wise rows
// while a prefill runs (src/deltakv_rows.cpp). Reads and writes the cache it belongs to;
// not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "byte_io.h"
#include "deltaserve/kvstore/deltakv_cache.h"

namespace deltaserve::kvstore {

// Appends the K rows then the V rows of `slots` of a pool's layer to w (SlotPool::read_rows).
Status append_pool_rows(ByteWriter& w, const SlotPool& pool, int32_t layer,
                        std::span<const int32_t> slots);

class DeltaKvCodec final : public SequenceCodec {
  public:
    explicit DeltaKvCodec(DeltaKvSequenceCache& cache) : c_(cache) {}

    // State: the token count, the compressed region's end, the settings a receiver must
    // share (with the layers' roles, a byte each: 0 sparse, 1 full, 2 window; when a layer is
    // a window layer, the window and the layer count after them, int32s), and which tokens of
    // the region
    // are references (a bitmap). A full layer: every token's K rows then V rows (fp16). A
    // sparse layer: the full-precision tokens' K then V rows, the latents, their reference
    // positions, their error codes (a byte each, deltakv_error_code). A window layer: the
    // first position it holds (int32), then those positions' K then V rows.
    Result<std::vector<uint8_t>> export_state() const override;
    Result<std::vector<uint8_t>> export_layer(int32_t layer) const override;
    Status import_state(std::span<const uint8_t> state) override;
    Status import_layer(int32_t layer, std::span<const uint8_t> part) override;
    // The pins: their count, then their positions (int32).
    std::vector<uint8_t> export_hints() const override;
    Status import_hints(std::span<const uint8_t> hints) override;
    // Rows: the rows state is the state's settings without a region; a full layer's rows are
    // K then V rows; a sparse layer's are the region's end after this call's commit, a bitmap
    // of which of the range's region tokens are references, the full-precision tokens' K
    // then V rows, the latents, their reference positions and error codes. The importer learns each
    // token's kind from the first sparse layer that ships it and refuses parts that disagree.
    bool ships_rows() const override { return true; }
    int32_t rows_final_end(int32_t layer, bool last) const override;
    Result<std::vector<uint8_t>> export_rows_state(int32_t n_tokens) const override;
    Result<std::vector<uint8_t>> export_rows(int32_t layer, int32_t begin,
                                             int32_t end) const override;
    Status import_rows(int32_t layer, int32_t begin, int32_t end,
                       std::span<const uint8_t> part) override;
    // Full and window layers NaN; a sparse layer's from its latents' error codes (a latent imported
    // without them, as from a state whose layer has not come, is not measured).
    std::vector<float> rows_error(int32_t begin, int32_t end) const override;

  private:
    static constexpr uint16_t kNoRef = DeltaKvRegion::kNoRef;
    // The region end a rows state carries instead of one (no region yet).
    static constexpr int32_t kRowsState = -1;
    // A state's fixed part: the token count, the region end (or kRowsState), the settings
    // a receiver must share, the layer roles (and the window).
    std::vector<uint8_t> state_head(int32_t n_tokens, int32_t region_end) const;
    std::vector<uint8_t> roles() const;
    // A window layer's part of positions [begin, end): the first it holds, then their rows.
    // The importer refuses (kDataLoss) a part without every row the cache holds, and takes
    // only those.
    Result<std::vector<uint8_t>> export_window_rows(int32_t layer, int32_t begin,
                                                    int32_t end) const;
    Status import_window_rows(int32_t layer, int32_t begin, int32_t end,
                              std::span<const uint8_t> part);
    // Zeros in every held row: what attention over a layer not yet imported reads.
    Status zero_rows();
    Status begin_rows_import(int32_t n);

    DeltaKvSequenceCache& c_;
    // A rows import: tokens of [sinks, kinds_end_) have their kind (reference or latent),
    // latents counted; per sparse layer, the first token it took as the buffer.
    bool rows_import_ = false;
    int32_t kinds_end_ = 0, rows_latents_ = 0;
    std::vector<int32_t> buffer_from_;
};

}  // namespace deltaserve::kvstore
