// Dispatcher for the model ops of core/ops.h: every argument check lives here
// (dtypes, shapes, devices, aliasing), so the backends can assume well-formed
// operands; then the op goes to the backend of the tensors' device. Checks
// that need the tensors' contents (token and target ranges) are the
// backend's, since only it can read them cheaply; both backends raise the
// same message for them.
#include <cmath>
#include <initializer_list>

#include "core/cpu/nn_cpu.h"
#include "core/cuda/ops_cuda.h"
#include "core/ops.h"
#include "core/profile.h"

namespace st::ops {

namespace {

// A tensor with the argument name an error message should use for it.
struct Arg {
  const char* name;
  const Tensor& t;
};

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16; }

void check_defined(const char* op, const Arg& a) {
  ST_CHECK(a.t.defined(), "{}: {} is an undefined tensor", op, a.name);
}

void check_float(const char* op, const Arg& a) {
  check_defined(op, a);
  ST_CHECK(is_float(a.t.dtype()), "{}: {} must be F32 or BF16, got {} (shape {})", op, a.name, a.t.dtype(),
           shape_str(a.t.shape()));
}

void check_dtype(const char* op, const Arg& a, DType dtype, const char* why) {
  check_defined(op, a);
  ST_CHECK(a.t.dtype() == dtype, "{}: {} must be {} ({}), got {} (shape {})", op, a.name, dtype, why, a.t.dtype(),
           shape_str(a.t.shape()));
}

void check_dim(const char* op, const Arg& a, int64_t dim, const char* layout) {
  ST_CHECK(a.t.dim() == dim, "{}: {} must be {}-D {}, got shape {}", op, a.name, dim, layout, shape_str(a.t.shape()));
}

// `a` must have exactly the shape of `like`.
void check_same_shape(const char* op, const Arg& a, const Arg& like) {
  ST_CHECK(a.t.shape() == like.t.shape(), "{}: {} has shape {} but {} has shape {}; they must match", op, a.name,
           shape_str(a.t.shape()), like.name, shape_str(like.t.shape()));
}

// `a` must hold the same rows as `like`: same last dimension and numel, so a
// [B, T, D] tensor and an [N, D] one with N = B*T are interchangeable.
void check_same_rows(const char* op, const Arg& a, const Arg& like) {
  ST_CHECK(a.t.dim() >= 1 && like.t.dim() >= 1 && a.t.numel() == like.t.numel() && a.t.size(-1) == like.t.size(-1),
           "{}: {} has shape {} but {} has shape {}; they must have the same last dimension and element count", op,
           a.name, shape_str(a.t.shape()), like.name, shape_str(like.t.shape()));
}

void check_same_numel(const char* op, const Arg& a, const Arg& like) {
  ST_CHECK(a.t.numel() == like.t.numel(), "{}: {} has shape {} ({} elements) but {} has shape {} ({} elements)", op,
           a.name, shape_str(a.t.shape()), a.t.numel(), like.name, shape_str(like.t.shape()), like.t.numel());
}

// All operands on one device; returns it.
Device check_devices(const char* op, std::initializer_list<Arg> args) {
  const Arg& first = *args.begin();
  for (const Arg& a : args) {
    ST_CHECK(a.t.device() == first.t.device(), "{}: {} is on {} but {} is on {}; move one with Tensor::to()", op,
             a.name, a.t.device(), first.name, first.t.device());
  }
  return first.t.device();
}

// True when the two tensors' bytes intersect (views of one storage).
bool overlaps(const Tensor& x, const Tensor& y) { return x.shares_storage_with(y) && memory_overlaps(x, y); }

// An output written while `in` is still read elsewhere must not touch it.
void check_no_overlap(const char* op, const Arg& out, const Arg& in) {
  ST_CHECK(!overlaps(out.t, in.t), "{}: {} ({}) overlaps {} ({}); it must be a separate buffer", op, out.name,
           out.t.str(), in.name, in.t.str());
}

// Element- or row-wise kernels read each element (row) before writing it, so
// an output that is exactly an input is fine; a shifted or reinterpreted
// overlap is not.
void check_alias_ok(const char* op, const Arg& out, const Arg& in) {
  const bool identical =
      out.t.raw_data() == in.t.raw_data() && out.t.dtype() == in.t.dtype() && out.t.numel() == in.t.numel();
  ST_CHECK(identical || !overlaps(out.t, in.t),
           "{}: {} ({}) partly overlaps {} ({}); an output may only alias an input exactly", op, out.name, out.t.str(),
           in.name, in.t.str());
}

// Last dimension of a tensor holding rows of width D; at least one dim.
int64_t row_width(const char* op, const Arg& a) {
  ST_CHECK(a.t.dim() >= 1, "{}: {} must have at least one dimension, got shape {}", op, a.name, shape_str(a.t.shape()));
  return a.t.size(-1);
}

}  // namespace

// ---------------------------------------------------------------- embedding

void embedding_forward(const Tensor& tokens, const Tensor& weight, const Tensor& out) {
  const char* op = "embedding_forward";
  const Arg a_tok{"tokens", tokens}, a_w{"weight", weight}, a_out{"out", out};
  check_dtype(op, a_tok, DType::I32, "token ids");
  check_float(op, a_w);
  check_float(op, a_out);
  check_dim(op, a_w, 2, "[V, D]");
  const int64_t d = weight.size(1);
  ST_CHECK(out.dim() >= 1 && out.size(-1) == d && out.numel() == tokens.numel() * d,
           "embedding_forward: out has shape {} but tokens has shape {} and weight has shape {}; out must be [N, {}] "
           "with N = {} tokens",
           shape_str(out.shape()), shape_str(tokens.shape()), shape_str(weight.shape()), d, tokens.numel());
  check_no_overlap(op, a_out, a_w);
  check_no_overlap(op, a_out, a_tok);
  if (check_devices(op, {a_tok, a_w, a_out}).is_cpu()) {
    profile::op(profile::Activity::Ops, "embedding forward", 0, [&] { cpu::embedding_forward(tokens, weight, out); });
  } else {
    st::cuda::embedding_forward(tokens, weight, out);
  }
}

void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dweight) {
  const char* op = "embedding_backward";
  const Arg a_tok{"tokens", tokens}, a_dout{"dout", dout}, a_dw{"dweight", dweight};
  check_dtype(op, a_tok, DType::I32, "token ids");
  check_float(op, a_dout);
  check_float(op, a_dw);
  check_dim(op, a_dw, 2, "[V, D]");
  const int64_t d = dweight.size(1);
  ST_CHECK(dout.dim() >= 1 && dout.size(-1) == d && dout.numel() == tokens.numel() * d,
           "embedding_backward: dout has shape {} but tokens has shape {} and dweight has shape {}; dout must be "
           "[N, {}] with N = {} tokens",
           shape_str(dout.shape()), shape_str(tokens.shape()), shape_str(dweight.shape()), d, tokens.numel());
  check_no_overlap(op, a_dw, a_dout);
  check_no_overlap(op, a_dw, a_tok);
  if (check_devices(op, {a_tok, a_dout, a_dw}).is_cpu()) {
    profile::op(profile::Activity::Ops, "embedding backward", 0,
                [&] { cpu::embedding_backward(tokens, dout, dweight); });
  } else {
    st::cuda::embedding_backward(tokens, dout, dweight);
  }
}

// ---------------------------------------------------------------- RMSNorm

namespace {

// x [..., D], weight [D], rstd F32 with one element per row of x.
void check_rmsnorm_common(const char* op, const Arg& x, const Arg& w, const Arg& rstd) {
  check_float(op, x);
  check_float(op, w);
  check_dtype(op, rstd, DType::F32, "a saved statistic");
  const int64_t d = row_width(op, x);
  ST_CHECK(w.t.dim() == 1 && w.t.size(0) == d && d > 0,
           "{}: weight has shape {} but x has shape {}; weight must be [{}] (the last dimension of x, non-zero)", op,
           shape_str(w.t.shape()), shape_str(x.t.shape()), d);
  ST_CHECK(rstd.t.numel() * d == x.t.numel(),
           "{}: rstd has shape {} but x has shape {}; rstd needs one F32 element per row of x ({} rows)", op,
           shape_str(rstd.t.shape()), shape_str(x.t.shape()), x.t.numel() / d);
}

}  // namespace

void rmsnorm_forward(const Tensor& x, const Tensor& weight, float eps, const Tensor& out, const Tensor& rstd) {
  const char* op = "rmsnorm_forward";
  const Arg a_x{"x", x}, a_w{"weight", weight}, a_out{"out", out}, a_rstd{"rstd", rstd};
  check_rmsnorm_common(op, a_x, a_w, a_rstd);
  check_float(op, a_out);
  check_same_rows(op, a_out, a_x);
  ST_CHECK(std::isfinite(eps) && eps >= 0.0f, "rmsnorm_forward: eps must be finite and >= 0, got {}", eps);
  check_alias_ok(op, a_out, a_x);
  check_no_overlap(op, a_out, a_w);
  check_no_overlap(op, a_rstd, a_x);
  check_no_overlap(op, a_rstd, a_w);
  check_no_overlap(op, a_rstd, a_out);
  if (check_devices(op, {a_x, a_w, a_out, a_rstd}).is_cpu()) {
    profile::op(profile::Activity::Ops, "rmsnorm forward", 0, [&] { cpu::rmsnorm_forward(x, weight, eps, out, rstd); });
  } else {
    st::cuda::rmsnorm_forward(x, weight, eps, out, rstd);
  }
}

namespace {

// The checks of rmsnorm_backward, plus those of a residual added into dx
// (rmsnorm_backward_add) when one is given; returns the operands' device.
Device check_rmsnorm_backward(const char* op, const Tensor& dout, const Tensor& x, const Tensor& weight,
                              const Tensor& rstd, const Tensor* residual, const Tensor& dx, const Tensor& dweight) {
  const Arg a_dout{"dout", dout}, a_x{"x", x}, a_w{"weight", weight}, a_rstd{"rstd", rstd}, a_dx{"dx", dx},
      a_dw{"dweight", dweight};
  check_rmsnorm_common(op, a_x, a_w, a_rstd);
  check_float(op, a_dout);
  check_float(op, a_dx);
  check_float(op, a_dw);
  check_same_rows(op, a_dout, a_x);
  check_same_rows(op, a_dx, a_x);
  check_same_shape(op, a_dw, a_w);
  check_alias_ok(op, a_dx, a_dout);
  check_alias_ok(op, a_dx, a_x);
  check_no_overlap(op, a_dx, a_w);
  check_no_overlap(op, a_dx, a_rstd);
  for (const Arg& in : {a_dout, a_x, a_w, a_rstd, a_dx}) check_no_overlap(op, a_dw, in);
  if (residual == nullptr) return check_devices(op, {a_dout, a_x, a_w, a_rstd, a_dx, a_dw});
  const Arg a_res{"residual", *residual};
  check_float(op, a_res);
  check_same_rows(op, a_res, a_x);
  check_alias_ok(op, a_dx, a_res);
  check_no_overlap(op, a_dw, a_res);
  return check_devices(op, {a_dout, a_x, a_w, a_rstd, a_res, a_dx, a_dw});
}

}  // namespace

void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                      const Tensor& dweight) {
  if (check_rmsnorm_backward("rmsnorm_backward", dout, x, weight, rstd, nullptr, dx, dweight).is_cpu()) {
    profile::op(profile::Activity::Ops, "rmsnorm backward", 0,
                [&] { cpu::rmsnorm_backward(dout, x, weight, rstd, dx, dweight); });
  } else {
    st::cuda::rmsnorm_backward(dout, x, weight, rstd, dx, dweight);
  }
}

void add_rmsnorm_forward(const Tensor& x, const Tensor& delta, const Tensor& weight, float eps, const Tensor& h,
                         const Tensor& out, const Tensor& rstd) {
  const char* op = "add_rmsnorm_forward";
  const Arg a_x{"x", x}, a_delta{"delta", delta}, a_w{"weight", weight}, a_h{"h", h}, a_out{"out", out},
      a_rstd{"rstd", rstd};
  check_rmsnorm_common(op, a_x, a_w, a_rstd);
  for (const Arg& a : {a_delta, a_h, a_out}) {
    check_float(op, a);
    check_same_rows(op, a, a_x);
  }
  ST_CHECK(std::isfinite(eps) && eps >= 0.0f, "add_rmsnorm_forward: eps must be finite and >= 0, got {}", eps);
  check_alias_ok(op, a_h, a_x);
  check_alias_ok(op, a_h, a_delta);
  // out is written while h's row is still read: it must be its own buffer.
  for (const Arg& in : {a_x, a_delta, a_h, a_w}) check_no_overlap(op, a_out, in);
  check_no_overlap(op, a_h, a_w);
  for (const Arg& in : {a_x, a_delta, a_h, a_w, a_out}) check_no_overlap(op, a_rstd, in);
  if (check_devices(op, {a_x, a_delta, a_w, a_h, a_out, a_rstd}).is_cpu()) {
    profile::op(profile::Activity::Ops, "add+rmsnorm forward", 0,
                [&] { cpu::add_rmsnorm_forward(x, delta, weight, eps, h, out, rstd); });
  } else {
    // No fused CUDA kernel yet: the chain it stands for.
    st::cuda::add(x, delta, h);
    st::cuda::rmsnorm_forward(h, weight, eps, out, rstd);
  }
}

void rmsnorm_backward_add(const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& rstd,
                          const Tensor& residual, const Tensor& dx, const Tensor& dweight) {
  if (check_rmsnorm_backward("rmsnorm_backward_add", dout, x, weight, rstd, &residual, dx, dweight).is_cpu()) {
    profile::op(profile::Activity::Ops, "rmsnorm+add backward", 0,
                [&] { cpu::rmsnorm_backward_add(dout, x, weight, rstd, residual, dx, dweight); });
  } else {
    // No fused CUDA kernel yet: the chain it stands for. The residual is read
    // after dx is written, so a residual that is dx is copied first.
    const Tensor res = overlaps(residual, dx) ? residual.clone() : residual;
    st::cuda::rmsnorm_backward(dout, x, weight, rstd, dx, dweight);
    st::cuda::add(res, dx, dx);
  }
}

// ---------------------------------------------------------------- RoPE

void rope_tables(int64_t seq_len, int64_t head_dim, double theta, const Tensor& cos, const Tensor& sin) {
  const char* op = "rope_tables";
  const Arg a_cos{"cos", cos}, a_sin{"sin", sin};
  ST_CHECK(seq_len >= 0, "rope_tables: seq_len must be >= 0, got {}", seq_len);
  ST_CHECK(head_dim > 0 && head_dim % 2 == 0, "rope_tables: head_dim must be even and positive, got {}", head_dim);
  ST_CHECK(std::isfinite(theta) && theta > 0.0, "rope_tables: theta must be finite and > 0, got {}", theta);
  check_dtype(op, a_cos, DType::F32, "rotary table");
  check_dtype(op, a_sin, DType::F32, "rotary table");
  const Shape expected{seq_len, head_dim};
  ST_CHECK(cos.shape() == expected && sin.shape() == expected,
           "rope_tables: cos has shape {} and sin has shape {}; both must be [seq_len, head_dim] = {}",
           shape_str(cos.shape()), shape_str(sin.shape()), shape_str(expected));
  check_no_overlap(op, a_cos, a_sin);
  if (check_devices(op, {a_cos, a_sin}).is_cpu()) {
    profile::op(profile::Activity::Ops, "rope tables", 0,
                [&] { cpu::rope_tables(seq_len, head_dim, theta, cos, sin); });
  } else {
    st::cuda::rope_tables(seq_len, head_dim, theta, cos, sin);
  }
}

namespace {

// x [B, T, heads, hd] with hd even; cos, sin F32 [T', hd] with T' >= T (tables
// built for the longest sequence serve every shorter one: row t is position t).
// Returns the operands' device.
Device check_rope(const char* op, const Arg& x, const Arg& cos, const Arg& sin) {
  check_float(op, x);
  check_dtype(op, cos, DType::F32, "rotary table");
  check_dtype(op, sin, DType::F32, "rotary table");
  check_dim(op, x, 4, "[B, T, heads, head_dim]");
  const int64_t seq = x.t.size(1);
  const int64_t hd = x.t.size(3);
  ST_CHECK(hd % 2 == 0, "{}: {} has shape {}; head_dim {} must be even", op, x.name, shape_str(x.t.shape()), hd);
  ST_CHECK(cos.t.dim() == 2 && cos.t.size(0) >= seq && cos.t.size(1) == hd && sin.t.shape() == cos.t.shape(),
           "{}: cos has shape {} and sin has shape {} but {} has shape {}; both tables must be [T, {}] with T >= {}",
           op, shape_str(cos.t.shape()), shape_str(sin.t.shape()), x.name, shape_str(x.t.shape()), hd, seq);
  check_no_overlap(op, x, cos);
  check_no_overlap(op, x, sin);
  return check_devices(op, {x, cos, sin});
}

}  // namespace

void rope_forward(const Tensor& x, const Tensor& cos, const Tensor& sin) {
  if (check_rope("rope_forward", {"x", x}, {"cos", cos}, {"sin", sin}).is_cpu()) {
    profile::op(profile::Activity::Ops, "rope forward", 0, [&] { cpu::rope_forward(x, cos, sin); });
  } else {
    st::cuda::rope_forward(x, cos, sin);
  }
}

void rope_backward(const Tensor& dx, const Tensor& cos, const Tensor& sin) {
  if (check_rope("rope_backward", {"dx", dx}, {"cos", cos}, {"sin", sin}).is_cpu()) {
    profile::op(profile::Activity::Ops, "rope backward", 0, [&] { cpu::rope_backward(dx, cos, sin); });
  } else {
    st::cuda::rope_backward(dx, cos, sin);
  }
}

// ---------------------------------------------------------------- attention

namespace {

// Whether k and v may hold more positions than q (forward, for a KV cache) or
// exactly as many (backward).
enum class KeyPositions : uint8_t { SameAsQueries, AtLeastQueries };

// q [B, Tq, H, hd]; k, v [B, Tk, KV, hd] with KV dividing H; lse F32 [B, H, Tq].
void check_attention_inputs(const char* op, const Arg& q, const Arg& k, const Arg& v, const Arg& lse,
                            KeyPositions positions) {
  check_float(op, q);
  check_float(op, k);
  check_float(op, v);
  check_dtype(op, lse, DType::F32, "a saved statistic");
  check_dim(op, q, 4, "[B, T, H, head_dim]");
  check_dim(op, k, 4, "[B, T, KV, head_dim]");
  const Shape& qs = q.t.shape();
  const Shape& ks = k.t.shape();
  const bool same_t = positions == KeyPositions::SameAsQueries ? ks[1] == qs[1] : ks[1] >= qs[1];
  ST_CHECK(ks[0] == qs[0] && same_t && ks[3] == qs[3] && ks[2] > 0 && qs[2] % ks[2] == 0,
           "{}: q has shape {} but k has shape {}; k must be [B, T, KV, head_dim] with q's B and head_dim, {} "
           "and KV dividing H",
           op, shape_str(qs), shape_str(ks),
           positions == KeyPositions::SameAsQueries ? "q's T" : "at least q's T positions");
  ST_CHECK(qs[3] > 0, "{}: q has shape {}; head_dim must be positive", op, shape_str(qs));
  check_same_shape(op, v, k);
  const Shape lse_shape{qs[0], qs[2], qs[1]};
  ST_CHECK(lse.t.shape() == lse_shape, "{}: lse has shape {} but q has shape {}; lse must be [B, H, T] = {}", op,
           shape_str(lse.t.shape()), shape_str(qs), shape_str(lse_shape));
}

}  // namespace

void attention_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse) {
  const char* op = "attention_forward";
  const Arg a_q{"q", q}, a_k{"k", k}, a_v{"v", v}, a_out{"out", out}, a_lse{"lse", lse};
  check_attention_inputs(op, a_q, a_k, a_v, a_lse, KeyPositions::AtLeastQueries);
  check_float(op, a_out);
  check_same_shape(op, a_out, a_q);
  // Every output element depends on whole rows of q, k, v: no aliasing at all.
  for (const Arg& in : {a_q, a_k, a_v}) {
    check_no_overlap(op, a_out, in);
    check_no_overlap(op, a_lse, in);
  }
  check_no_overlap(op, a_lse, a_out);
  if (check_devices(op, {a_q, a_k, a_v, a_out, a_lse}).is_cpu()) {
    profile::op(profile::Activity::Ops, "attention forward", 0, [&] { cpu::attention_forward(q, k, v, out, lse); });
  } else {
    st::cuda::attention_forward(q, k, v, out, lse);
  }
}

void attention_backward(const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                        const Tensor& lse, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_backward";
  const Arg a_dout{"dout", dout}, a_q{"q", q}, a_k{"k", k}, a_v{"v", v}, a_out{"out", out}, a_lse{"lse", lse},
      a_dq{"dq", dq}, a_dk{"dk", dk}, a_dv{"dv", dv};
  check_attention_inputs(op, a_q, a_k, a_v, a_lse, KeyPositions::SameAsQueries);
  for (const Arg& a : {a_dout, a_out, a_dq, a_dk, a_dv}) check_float(op, a);
  check_same_shape(op, a_dout, a_q);
  check_same_shape(op, a_out, a_q);
  check_same_shape(op, a_dq, a_q);
  check_same_shape(op, a_dk, a_k);
  check_same_shape(op, a_dv, a_v);
  for (const Arg& grad : {a_dq, a_dk, a_dv}) {
    for (const Arg& in : {a_dout, a_q, a_k, a_v, a_out, a_lse}) check_no_overlap(op, grad, in);
  }
  check_no_overlap(op, a_dq, a_dk);
  check_no_overlap(op, a_dq, a_dv);
  check_no_overlap(op, a_dk, a_dv);
  if (check_devices(op, {a_dout, a_q, a_k, a_v, a_out, a_lse, a_dq, a_dk, a_dv}).is_cpu()) {
    profile::op(profile::Activity::Ops, "attention backward", 0,
                [&] { cpu::attention_backward(dout, q, k, v, out, lse, dq, dk, dv); });
  } else {
    st::cuda::attention_backward(dout, q, k, v, out, lse, dq, dk, dv);
  }
}

// ---------------------------------------------------------------- SwiGLU, ReLU

void swiglu_forward(const Tensor& gate, const Tensor& up, const Tensor& out) {
  const char* op = "swiglu_forward";
  const Arg a_gate{"gate", gate}, a_up{"up", up}, a_out{"out", out};
  for (const Arg& a : {a_gate, a_up, a_out}) check_float(op, a);
  check_same_numel(op, a_up, a_gate);
  check_same_numel(op, a_out, a_gate);
  check_alias_ok(op, a_out, a_gate);
  check_alias_ok(op, a_out, a_up);
  if (check_devices(op, {a_gate, a_up, a_out}).is_cpu()) {
    profile::op(profile::Activity::Ops, "swiglu forward", 0, [&] { cpu::swiglu_forward(gate, up, out); });
  } else {
    st::cuda::swiglu_forward(gate, up, out);
  }
}

void swiglu_backward(const Tensor& dout, const Tensor& gate, const Tensor& up, const Tensor& dgate, const Tensor& dup) {
  const char* op = "swiglu_backward";
  const Arg a_dout{"dout", dout}, a_gate{"gate", gate}, a_up{"up", up}, a_dgate{"dgate", dgate}, a_dup{"dup", dup};
  for (const Arg& a : {a_dout, a_gate, a_up, a_dgate, a_dup}) check_float(op, a);
  for (const Arg& a : {a_dout, a_up, a_dgate, a_dup}) check_same_numel(op, a, a_gate);
  for (const Arg& in : {a_dout, a_gate, a_up}) {
    check_alias_ok(op, a_dgate, in);
    check_alias_ok(op, a_dup, in);
  }
  check_no_overlap(op, a_dgate, a_dup);
  if (check_devices(op, {a_dout, a_gate, a_up, a_dgate, a_dup}).is_cpu()) {
    profile::op(profile::Activity::Ops, "swiglu backward", 0,
                [&] { cpu::swiglu_backward(dout, gate, up, dgate, dup); });
  } else {
    st::cuda::swiglu_backward(dout, gate, up, dgate, dup);
  }
}

void relu_forward(const Tensor& x, const Tensor& out) {
  const char* op = "relu_forward";
  const Arg a_x{"x", x}, a_out{"out", out};
  check_float(op, a_x);
  check_float(op, a_out);
  check_same_numel(op, a_out, a_x);
  check_alias_ok(op, a_out, a_x);
  if (check_devices(op, {a_x, a_out}).is_cpu()) {
    profile::op(profile::Activity::Ops, "relu forward", 0, [&] { cpu::relu_forward(x, out); });
  } else {
    st::cuda::relu_forward(x, out);
  }
}

void relu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx) {
  const char* op = "relu_backward";
  const Arg a_dout{"dout", dout}, a_x{"x", x}, a_dx{"dx", dx};
  for (const Arg& a : {a_dout, a_x, a_dx}) check_float(op, a);
  check_same_numel(op, a_dout, a_x);
  check_same_numel(op, a_dx, a_x);
  check_alias_ok(op, a_dx, a_dout);
  check_alias_ok(op, a_dx, a_x);
  if (check_devices(op, {a_dout, a_x, a_dx}).is_cpu()) {
    profile::op(profile::Activity::Ops, "relu backward", 0, [&] { cpu::relu_backward(dout, x, dx); });
  } else {
    st::cuda::relu_backward(dout, x, dx);
  }
}

// ---------------------------------------------------------------- losses

LossSum cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, float grad_scale,
                      const Tensor& dlogits) {
  const char* op = "cross_entropy";
  const Arg a_logits{"logits", logits}, a_tgt{"targets", targets}, a_dl{"dlogits", dlogits};
  check_float(op, a_logits);
  check_dtype(op, a_tgt, DType::I32, "class ids");
  check_float(op, a_dl);
  const int64_t vocab = row_width(op, a_logits);
  ST_CHECK(vocab > 0, "cross_entropy: logits has shape {}; the class dimension must be non-empty",
           shape_str(logits.shape()));
  ST_CHECK(targets.numel() * vocab == logits.numel(),
           "cross_entropy: targets has shape {} but logits has shape {}; targets needs one entry per row of logits "
           "({} rows)",
           shape_str(targets.shape()), shape_str(logits.shape()), logits.numel() / vocab);
  check_same_rows(op, a_dl, a_logits);
  ST_CHECK(std::isfinite(grad_scale), "cross_entropy: grad_scale must be finite, got {}", grad_scale);
  check_alias_ok(op, a_dl, a_logits);
  check_no_overlap(op, a_dl, a_tgt);
  if (check_devices(op, {a_logits, a_tgt, a_dl}).is_cpu()) {
    LossSum result{};
    profile::op(profile::Activity::Ops, "cross-entropy loss", 0,
                [&] { result = cpu::cross_entropy(logits, targets, ignore_index, grad_scale, dlogits); });
    return result;
  }
  return st::cuda::cross_entropy(logits, targets, ignore_index, grad_scale, dlogits);
}

LossSum mse(const Tensor& pred, const Tensor& target, float grad_scale, const Tensor& dpred) {
  const char* op = "mse";
  const Arg a_pred{"pred", pred}, a_tgt{"target", target}, a_dp{"dpred", dpred};
  for (const Arg& a : {a_pred, a_tgt, a_dp}) check_float(op, a);
  check_same_shape(op, a_tgt, a_pred);
  check_same_numel(op, a_dp, a_pred);
  ST_CHECK(std::isfinite(grad_scale), "mse: grad_scale must be finite, got {}", grad_scale);
  check_alias_ok(op, a_dp, a_pred);
  check_alias_ok(op, a_dp, a_tgt);
  if (check_devices(op, {a_pred, a_tgt, a_dp}).is_cpu()) {
    LossSum result{};
    profile::op(profile::Activity::Ops, "mse loss", 0, [&] { result = cpu::mse(pred, target, grad_scale, dpred); });
    return result;
  }
  return st::cuda::mse(pred, target, grad_scale, dpred);
}

}  // namespace st::ops
