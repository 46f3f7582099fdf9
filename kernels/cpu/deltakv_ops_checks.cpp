// The DeltaKV ops' argument checks (deltakv_ops.h), shared by every backend.
#include <string>

#include "deltaserve/kernels/deltakv_ops.h"

namespace deltaserve::kernels {

namespace {

Status bad(const char* op, const std::string& what) {
    return invalid_argument(std::string(op) + ": " + what);
}

Status check_angles(const char* op, const RopeAngles& a, int64_t n, int width) {
    if (n > 0 && (a.table == nullptr || a.at == nullptr)) return bad(op, "rows without angles");
    if (a.head_dim < 2 || a.head_dim % 2 != 0 || a.n_heads < 0 || a.n_heads * a.head_dim > width) {
        return bad(op, "RoPE of " + std::to_string(a.n_heads) + " heads of " +
                           std::to_string(a.head_dim) + " in rows of " + std::to_string(width));
    }
    return Status();
}

Status check_latents(const char* op, const AttentionShape& s, const LatentRows& lat) {
    if (lat.n < 0) return bad(op, "n < 0");
    if (lat.n > 0 && (lat.rows == nullptr || lat.latents == nullptr || lat.refs == nullptr))
        return bad(op, "latent rows without their lists");
    if (lat.k < 0 || lat.k > 16) return bad(op, "at most 16 references per latent");
    if (lat.m < 1 || lat.m > kMaxLatent) {
        return bad(op, "latent size " + std::to_string(lat.m) + " outside [1, " +
                           std::to_string(kMaxLatent) + "]");
    }
    const size_t bytes = lat.int4 ? int4_bytes(lat.m) : static_cast<size_t>(lat.m) * 2;
    if (lat.stride < bytes) return bad(op, "latents closer than their size");
    if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0 || s.n_heads > 64 ||
        s.head_dim % 8 != 0 || s.head_dim <= 0 || s.head_dim > 256 ||
        s.n_kv_heads * s.head_dim > 2048) {
        return bad(op, "unsupported attention shape");
    }
    return Status();
}

}  // namespace

Status need_arrays(const char* op, int64_t n, std::initializer_list<const void*> arrays) {
    if (n <= 0) return Status();
    for (const void* a : arrays) {
        if (a == nullptr) return bad(op, "a null array");
    }
    return Status();
}

Status validate(const PoolRows& p) {
    constexpr const char* op = "deltakv_pool_rows";
    if (p.n < 0) return bad(op, "n < 0");
    if (p.width <= 0 || p.row_stride < static_cast<size_t>(p.width) * 2)
        return bad(op, "rows of " + std::to_string(p.width) + " fp16 values do not fit");
    DS_RETURN_IF_ERROR(need_arrays(op, p.n, {p.k, p.slots}));
    return check_angles(op, p.angles, p.n, p.width);
}

Status validate(const AttentionShape& s, const PoolKeys& keys) {
    constexpr const char* op = "max_head_scores";
    if (keys.n < 0) return bad(op, "n < 0");
    if (s.n_kv_heads <= 0 || s.n_heads % s.n_kv_heads != 0 || s.n_heads > 64 || s.head_dim <= 0 ||
        s.head_dim % 8 != 0 || s.head_dim > 256 || s.n_kv_heads * s.head_dim > 2048) {
        return bad(op, "unsupported attention shape");
    }
    if (keys.n > 0 && keys.row_stride < static_cast<size_t>(s.n_kv_heads * s.head_dim) * 2)
        return bad(op, "rows closer than their size");
    return need_arrays(op, keys.n, {keys.k, keys.slots});
}

Status validate(const AttentionShape& s, const LatentRows& lat, const LatentDecodeInputs& in,
                bool whole) {
    const char* op = whole ? "deltakv_reconstruct" : "deltakv_key_scores";
    DS_RETURN_IF_ERROR(check_latents(op, s, lat));
    if (!lat.int4) return bad(op, "int4 latents only");
    const int width = s.n_kv_heads * s.head_dim;
    if (in.dec.d != (whole ? 2 : 1) * width || in.dec.m != lat.m ||
        in.dec.m16 != int4_code_stride(lat.m)) {
        return bad(op, whole ? "the decoder is not 2 x the K width by m"
                             : "the decoder is not the K width by m");
    }
    if (lat.n > 0 && in.n_refs > 0 && in.ref_x == nullptr) return bad(op, "no reference rows");
    return check_angles(op, in.angles, lat.n, width);
}

Status validate(const AttentionShape& s, const LatentRows& lat, const LatentValueInputs& in) {
    constexpr const char* op = "latent_attention";
    DS_RETURN_IF_ERROR(check_latents(op, s, lat));
    if (in.wd_v == nullptr) return bad(op, "no decoder");
    if (in.n_refs < 0 || (in.n_refs > 0 && (in.ref_v == nullptr || in.ref_slots == nullptr)))
        return bad(op, "references without their rows");
    if (in.n_refs > 0 && in.ref_stride < static_cast<size_t>(s.n_kv_heads * s.head_dim) * 2)
        return bad(op, "reference rows closer than their size");
    return Status();
}

Status validate(const LatentEncodeInputs& in, const float* x, int64_t n,
                const LatentEncodeOutputs& out) {
    constexpr const char* op = "deltakv_encode";
    if (n < 0) return bad(op, "n < 0");
    if (in.w == nullptr) return bad(op, "no compressor");
    const WeightMatrix &w1 = in.w->w1, &w2 = in.w->w2, &w3 = in.w->w3;
    const int64_t d = w1.cols, hidden = w1.rows, m = w3.rows;
    if (d <= 0 || hidden <= 0 || w2.rows != hidden || w2.cols != d || w3.cols != hidden)
        return bad(op, "the compressor's matrices do not chain (D -> hidden -> m)");
    if (m < 1 || m > kMaxLatent) {
        return bad(op, "latent size " + std::to_string(m) + " outside [1, " +
                           std::to_string(kMaxLatent) + "]");
    }
    if (in.k < 1 || in.k > 16) return bad(op, "1 to 16 references per token");
    if (in.n_refs < 0 || in.n_refs > kNoLatentRef)
        return bad(op, "references beyond 16-bit ordinals");
    if (in.n_refs > 0 && in.ref_x == nullptr) return bad(op, "no reference rows");
    const size_t bytes = out.int4 ? int4_bytes(static_cast<int>(m)) : static_cast<size_t>(m) * 2;
    if (out.stride < bytes) return bad(op, "latents closer than their size");
    DS_RETURN_IF_ERROR(need_arrays(op, n, {x, in.n_cand, out.refs, out.rm, out.z, out.latents}));
    for (int64_t i = 0; i < n; ++i) {
        if (in.n_cand[i] < 0 || in.n_cand[i] > in.n_refs)
            return bad(op, "token " + std::to_string(i) + "'s candidates are not references");
    }
    return Status();
}

}  // namespace deltaserve::kernels
