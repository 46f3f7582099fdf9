// Host side of DeltaKV's decode-step ops on the "cuda" backend (latent_ops.h).
#include "latent_ops.h"

#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "deltakv.h"
#include "op_status.h"
#include "stream_buffer.h"

namespace deltaserve::kernels::cuda {

namespace {

// Host int32 lists of n values each, staged in one copy; lists()[i] is list i on the device.
class StagedLists {
  public:
    static Result<StagedLists> create(
        std::initializer_list<std::pair<const int32_t*, int64_t>> lists, cudaStream_t stream) {
        StagedLists s;
        std::vector<int32_t> host;
        std::vector<size_t> at;
        for (const auto& [p, n] : lists) {
            at.push_back(host.size());
            if (n > 0) host.insert(host.end(), p, p + n);
        }
        DS_ASSIGN_OR_RETURN(
            s.buf_, StreamBuffer::copy_of(host.data(), host.size() * sizeof(int32_t), stream));
        for (size_t off : at) s.lists_.push_back(s.buf_.as<int32_t>() + off);
        return s;
    }
    const int32_t* operator[](size_t i) const { return lists_[i]; }

  private:
    StreamBuffer buf_;
    std::vector<const int32_t*> lists_;
};

AnglesLaunch angles_of(const RopeAngles& a, const int32_t* at) {
    AnglesLaunch l;
    l.table = a.table;
    l.at = at;
    l.n_heads = a.n_heads;
    l.head_dim = a.head_dim;
    l.interleaved = a.style == RopeStyle::kInterleaved;
    return l;
}

LatentsLaunch latents_of(const LatentRows& lat, const int32_t* rows) {
    LatentsLaunch l;
    l.n = lat.n;
    l.rows = rows;
    l.latents = lat.latents;
    l.stride = lat.stride;
    l.m = lat.m;
    l.m16 = int4_code_stride(lat.m);
    l.refs = lat.refs;
    l.k = lat.k;
    l.int4 = lat.int4;
    return l;
}

RowSource row_source(const LatentDecodeInputs& in, const int32_t* angle_at) {
    RowSource src;
    src.dec_w = in.dec.w;
    src.dec_scale = in.dec.scale;
    src.dec_row_sum = in.dec.row_sum;
    src.rows = in.dec.d;
    src.ref_x = in.ref_x;
    src.angles = angles_of(in.angles, angle_at);
    return src;
}

}  // namespace

Status run_max_head_scores(const AttentionShape& shape, const float* q, const PoolKeys& keys,
                           float* scores, cudaStream_t stream) {
    DS_RETURN_IF_ERROR(validate(shape, keys));
    DS_RETURN_IF_ERROR(need_arrays("max_head_scores", keys.n, {q, scores}));
    if (keys.n == 0) return Status();
    if (keys.n > kMaxRows) return invalid("max_head_scores", "n > 2^31 - 1");
    DS_ASSIGN_OR_RETURN(StagedLists lists, StagedLists::create({{keys.slots, keys.n}}, stream));
    HeadScoresLaunch a;
    a.q = q;
    a.n_heads = shape.n_heads;
    a.n_kv_heads = shape.n_kv_heads;
    a.head_dim = shape.head_dim;
    a.k = keys.k;
    a.row_stride = keys.row_stride;
    a.slots = lists[0];
    a.n = keys.n;
    a.scores = scores;
    return launched(launch_max_head_scores(a, stream), "max_head_scores");
}

Status run_deltakv_pool_rows(const PoolRows& rows, float* out, cudaStream_t stream) {
    DS_RETURN_IF_ERROR(validate(rows));
    DS_RETURN_IF_ERROR(need_arrays("deltakv_pool_rows", rows.n, {out}));
    if (rows.n == 0) return Status();
    if (rows.n > kMaxRows) return invalid("deltakv_pool_rows", "n > 2^31 - 1");
    DS_ASSIGN_OR_RETURN(
        StagedLists lists,
        StagedLists::create({{rows.slots, rows.n}, {rows.angles.at, rows.n}}, stream));
    PoolRowsLaunch a;
    a.k = rows.k;
    a.v = rows.v;
    a.row_stride = rows.row_stride;
    a.slots = lists[0];
    a.n = rows.n;
    a.width = rows.width;
    a.angles = angles_of(rows.angles, lists[1]);
    a.out = out;
    return launched(launch_pool_rows(a, stream), "deltakv_pool_rows");
}

Status run_deltakv_key_scores(const AttentionShape& shape, const LatentRows& lat,
                              const LatentDecodeInputs& in, const float* q, float* scores,
                              int64_t lds, uint8_t* codes, cudaStream_t stream) {
    DS_RETURN_IF_ERROR(validate(shape, lat, in, false));
    DS_RETURN_IF_ERROR(need_arrays("deltakv_key_scores", lat.n, {q, scores, codes}));
    if (lat.n == 0) return Status();
    if (lat.n > kMaxRows) return invalid("deltakv_key_scores", "n > 2^31 - 1");
    if (lds < lat.n) return invalid("deltakv_key_scores", "lds < n");
    DS_ASSIGN_OR_RETURN(StagedLists lists,
                        StagedLists::create({{lat.rows, lat.n}, {in.angles.at, lat.n}}, stream));
    KeyScoresLaunch a;
    a.lat = latents_of(lat, lists[0]);
    a.src = row_source(in, lists[1]);
    a.q = q;
    a.n_heads = shape.n_heads;
    a.n_kv_heads = shape.n_kv_heads;
    a.head_dim = shape.head_dim;
    a.scale = shape.scale;
    a.scores = scores;
    a.lds = lds;
    a.codes = codes;
    return launched(launch_key_scores(a, stream), "deltakv_key_scores");
}

Status run_deltakv_reconstruct(const AttentionShape& shape, const LatentRows& lat,
                               const LatentDecodeInputs& in, uint8_t* k_out, uint8_t* v_out,
                               size_t out_stride, cudaStream_t stream) {
    DS_RETURN_IF_ERROR(validate(shape, lat, in, true));
    DS_RETURN_IF_ERROR(need_arrays("deltakv_reconstruct", lat.n, {k_out, v_out}));
    if (lat.n == 0) return Status();
    if (lat.n > kMaxRows) return invalid("deltakv_reconstruct", "n > 2^31 - 1");
    if (out_stride < static_cast<size_t>(in.dec.d) || out_stride % 2 != 0)
        return invalid("deltakv_reconstruct", "output rows closer than their size, or odd");
    DS_ASSIGN_OR_RETURN(StagedLists lists,
                        StagedLists::create({{lat.rows, lat.n}, {in.angles.at, lat.n}}, stream));
    ReconstructLaunch a;
    a.lat = latents_of(lat, lists[0]);
    a.src = row_source(in, lists[1]);
    a.k_out = k_out;
    a.v_out = v_out;
    a.out_stride = out_stride;
    return launched(launch_reconstruct(a, stream), "deltakv_reconstruct");
}

Status run_latent_attention(const AttentionShape& shape, const LatentRows& lat, const float* scores,
                            const LatentValueInputs& in, float* out, float* lse,
                            cudaStream_t stream) {
    DS_RETURN_IF_ERROR(validate(shape, lat, in));
    DS_RETURN_IF_ERROR(need_arrays("latent_attention", 1, {out, lse}));
    DS_RETURN_IF_ERROR(need_arrays("latent_attention", lat.n, {scores}));
    if (lat.n > kMaxRows) return invalid("latent_attention", "n > 2^31 - 1");
    DS_ASSIGN_OR_RETURN(
        StagedLists lists,
        StagedLists::create({{lat.rows, lat.n}, {in.ref_slots, in.n_refs}}, stream));
    const int64_t pieces = latent_pieces(lat.n);
    const size_t stats = 2 * static_cast<size_t>(shape.n_heads);
    const size_t partial = static_cast<size_t>(shape.n_heads) * static_cast<size_t>(pieces) *
                           static_cast<size_t>(lat.m + shape.head_dim + 1);
    DS_ASSIGN_OR_RETURN(StreamBuffer scratch,
                        StreamBuffer::create((stats + partial) * sizeof(float), stream));
    LatentAttentionLaunch a;
    a.lat = latents_of(lat, lists[0]);
    a.scores = scores;
    a.codes = lat.int4 ? in.codes : nullptr;
    a.wd_v = in.wd_v;
    a.ref_v = in.ref_v;
    a.ref_stride = in.ref_stride;
    a.ref_slots = lists[1];
    a.n_heads = shape.n_heads;
    a.n_kv_heads = shape.n_kv_heads;
    a.head_dim = shape.head_dim;
    a.out = out;
    a.lse = lse;
    a.head_stats = scratch.as<float>();
    a.partial = scratch.as<float>() + stats;
    return launched(launch_latent_attention(a, stream), "latent_attention");
}

Status run_merge_attention(float* out, float* lse, const float* out_b, const float* lse_b,
                           int n_rows, int head_dim, cudaStream_t stream) {
    if (n_rows < 0 || head_dim <= 0) return invalid("merge_attention", "bad shape");
    return launched(launch_merge_attention(out, lse, out_b, lse_b, n_rows, head_dim, stream),
                    "merge_attention");
}

}  // namespace deltaserve::kernels::cuda
