#include "kernels/mla_prepare_dims.h"

#include "core/error.h"
#include "kernels/fp8_kv_layout.h"

namespace mlaserve {
namespace {

int64_t rows_of(const Tensor& t) { return t.ndim() == 0 || t.dim(-1) == 0 ? 0 : t.numel() / t.dim(-1); }

// A source whose rows hold `width` values from column `col`.
void check_source(const Tensor& src, const char* what, int64_t tokens, int64_t col, int64_t width) {
  MLA_CHECK(src.defined() && src.ndim() >= 2 && rows_of(src) == tokens,
            "mla_prepare: {} {} must have one row for each of the {} tokens", what, shape_str(src.shape()), tokens);
  MLA_CHECK(col >= 0 && col + width <= src.dim(-1), "mla_prepare: {} columns [{}, {}) do not fit its rows of {}", what,
            col, col + width, src.dim(-1));
}

}  // namespace

MlaPrepareDims check_mla_prepare(const MlaPrepare& p, const Tensor& positions, const Tensor& out_slots,
                                 const Tensor& inv_freq, bool q_a_rows_elsewhere) {
  MlaPrepareDims d;
  MLA_CHECK(positions.defined() && positions.dtype() == DType::I32 && positions.ndim() == 1,
            "mla_prepare: positions must be a 1-D I32 tensor");
  MLA_CHECK(inv_freq.defined() && inv_freq.dtype() == DType::F32 && inv_freq.numel() > 0,
            "mla_prepare: inv_freq must be a non-empty F32 tensor");
  d.tokens = positions.numel();
  d.rope = 2 * inv_freq.numel();
  d.latent_write = p.cache.defined();
  d.q_a_norm = p.q_a_out.defined() || (q_a_rows_elsewhere && p.q_a.defined());
  d.q_split = p.q_pe_out.defined();
  if (d.latent_write) {
    MLA_CHECK(p.kv_norm.defined() && p.kv_norm.numel() > 0, "mla_prepare: the latent write needs kv_norm");
    d.latent = p.kv_norm.numel();
    // An FP8 cache (U8) holds Fp8KvLayout slots of the same rows.
    const int64_t slot_width = p.cache.dtype() == DType::U8
                                   ? Fp8KvLayout{int(d.latent), int(d.rope)}.slot_bytes()
                                   : d.latent + d.rope;
    MLA_CHECK(p.cache.ndim() == 2 && p.cache.dim(1) == slot_width,
              "mla_prepare: cache {} {} must be {{slots, {}}} (L {} + R {})", dtype_name(p.cache.dtype()),
              shape_str(p.cache.shape()), slot_width, d.latent, d.rope);
    MLA_CHECK(out_slots.defined() && out_slots.dtype() == DType::I32 && out_slots.numel() == d.tokens,
              "mla_prepare: out_slots must be I32 with one slot for each of the {} tokens", d.tokens);
    check_source(p.kv, "kv", d.tokens, p.kv_col, d.latent + d.rope);
  }
  if (d.q_a_norm) {
    MLA_CHECK(p.q_a_norm.defined() && p.q_a_norm.numel() > 0, "mla_prepare: the q_a norm needs q_a_norm");
    d.q_a = p.q_a_norm.numel();
    if (p.q_a_out.defined())
      MLA_CHECK(rows_of(p.q_a_out) == d.tokens && p.q_a_out.dim(-1) == d.q_a,
                "mla_prepare: q_a_out {} must be {{{}, {}}}", shape_str(p.q_a_out.shape()), d.tokens, d.q_a);
    check_source(p.q_a, "q_a", d.tokens, p.q_a_col, d.q_a);
  } else {
    MLA_CHECK(!p.q_a.defined(), "mla_prepare: q_a without q_a_out (Backend::mla_prepare_q_b takes q_a alone)");
  }
  if (d.q_split) {
    MLA_CHECK(p.q_pe_out.ndim() == 3 && p.q_pe_out.dim(0) == d.tokens && p.q_pe_col >= 0 &&
                  p.q_pe_col + d.rope <= p.q_pe_out.dim(2),
              "mla_prepare: q_pe_out {} must be {{{}, H, W}} with columns [{}, {}) inside W",
              shape_str(p.q_pe_out.shape()), d.tokens, p.q_pe_col, p.q_pe_col + d.rope);
    d.heads = p.q_pe_out.dim(1);
    d.nope = p.nope_dim;
    MLA_CHECK(d.nope >= 0, "mla_prepare: negative nope_dim {}", d.nope);
    check_source(p.q, "q", d.tokens, p.q_col, d.heads * (d.nope + d.rope));
    if (p.q_nope_out.defined())
      MLA_CHECK(p.q_nope_out.ndim() == 3 && p.q_nope_out.dim(0) == d.tokens && p.q_nope_out.dim(1) == d.heads &&
                    p.q_nope_out.dim(2) >= d.nope,
                "mla_prepare: q_nope_out {} must be {{{}, {}, >= {}}}", shape_str(p.q_nope_out.shape()), d.tokens,
                d.heads, d.nope);
  } else {
    MLA_CHECK(!p.q_nope_out.defined(), "mla_prepare: q_nope_out without q_pe_out");
  }
  return d;
}

}  // namespace mlaserve
