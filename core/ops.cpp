// Dispatcher for core/ops.h: every argument check lives here, once, so the
// backends can assume well-formed operands; then the op goes to the backend
// of the tensors' device.
#include "core/ops.h"

#include "core/cpu/ops_cpu.h"
#include "core/cuda/ops_cuda.h"
#include "core/profile.h"

namespace st::ops {

namespace {

const char* transpose_name(Transpose t) { return t == Transpose::Yes ? "Transpose::Yes" : "Transpose::No"; }

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16; }

void check_defined(const char* op, const char* name, const Tensor& t) {
  ST_CHECK(t.defined(), "{}: {} is an undefined tensor", op, name);
}

void check_float(const char* op, const char* name, const Tensor& t) {
  check_defined(op, name, t);
  ST_CHECK(is_float(t.dtype()), "{}: {} must be F32 or BF16, got {} (shape {})", op, name, t.dtype(),
           shape_str(t.shape()));
}

void check_same_device(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b) {
  ST_CHECK(a.device() == b.device(), "{}: {} is on {} but {} is on {}; move one with Tensor::to()", op, name_a,
           a.device(), name_b, b.device());
}

void check_same_numel(const char* op, const char* name_a, const Tensor& a, const char* name_b, const Tensor& b) {
  ST_CHECK(a.numel() == b.numel(), "{}: {} has shape {} ({} elements) but {} has shape {} ({} elements)", op, name_a,
           shape_str(a.shape()), a.numel(), name_b, shape_str(b.shape()), b.numel());
}

// True when the two tensors' bytes intersect (views of one storage).
bool overlaps(const Tensor& x, const Tensor& y) { return x.shares_storage_with(y) && memory_overlaps(x, y); }

// Elementwise ops read element i before writing element i, so an output that
// is exactly an input is fine; a shifted or reinterpreted overlap is not.
void check_alias_ok(const char* op, const char* out_name, const Tensor& out, const char* in_name, const Tensor& in) {
  bool identical = out.raw_data() == in.raw_data() && out.dtype() == in.dtype() && out.numel() == in.numel();
  ST_CHECK(identical || !overlaps(out, in),
           "{}: {} ({}) partly overlaps {} ({}); an output may only alias an input exactly", op, out_name, out.str(),
           in_name, in.str());
}

// A tensor of shape [..., X] as a row-major matrix [product of leading dims, X].
struct MatrixShape {
  int64_t rows;
  int64_t cols;
};

MatrixShape as_matrix(const char* name, const Tensor& t) {
  ST_CHECK(t.dim() >= 1, "gemm: {} must have at least one dimension, got shape {}", name, shape_str(t.shape()));
  int64_t rows = 1;
  for (int64_t i = 0; i + 1 < t.dim(); ++i) rows *= t.shape()[static_cast<size_t>(i)];
  return {rows, t.size(-1)};
}

}  // namespace

void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& c, float alpha, float beta) {
  check_float("gemm", "a", a);
  check_float("gemm", "b", b);
  check_float("gemm", "c", c);
  check_same_device("gemm", "a", a, "b", b);
  check_same_device("gemm", "a", a, "c", c);

  MatrixShape am = as_matrix("a", a);
  MatrixShape bm = as_matrix("b", b);
  const int64_t m = ta == Transpose::No ? am.rows : am.cols;
  const int64_t k = ta == Transpose::No ? am.cols : am.rows;
  const int64_t kb = tb == Transpose::No ? bm.rows : bm.cols;
  const int64_t n = tb == Transpose::No ? bm.cols : bm.rows;
  ST_CHECK(k == kb,
           "gemm: inner dimensions differ: op(a) is [{}, {}] (a has shape {}, {}) but op(b) is [{}, {}] (b has shape "
           "{}, {})",
           m, k, shape_str(a.shape()), transpose_name(ta), kb, n, shape_str(b.shape()), transpose_name(tb));
  ST_CHECK(c.dim() >= 1 && c.numel() == m * n && c.size(-1) == n,
           "gemm: c has shape {} but op(a) @ op(b) is [{}, {}] (a has shape {}, {}; b has shape {}, {})",
           shape_str(c.shape()), m, n, shape_str(a.shape()), transpose_name(ta), shape_str(b.shape()),
           transpose_name(tb));
  // c is written while a and b are still being read.
  ST_CHECK(!overlaps(c, a) && !overlaps(c, b), "gemm: c ({}) overlaps an input (a {}, b {})", c.str(), a.str(),
           b.str());

  if (c.device().is_cuda()) {
    cuda::gemm(a, ta, b, tb, c, m, n, k, alpha, beta);
    return;
  }
  // The profile counts 2*m*n*k FLOPs per product (a multiply and an add).
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  profile::op(profile::Activity::Gemm, "gemm", flops, [&] { cpu::gemm(a, ta, b, tb, c, m, n, k, alpha, beta); });
}

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_float("add", "a", a);
  check_float("add", "b", b);
  check_float("add", "out", out);
  check_same_device("add", "a", a, "b", b);
  check_same_device("add", "a", a, "out", out);
  check_same_numel("add", "a", a, "b", b);
  check_same_numel("add", "a", a, "out", out);
  check_alias_ok("add", "out", out, "a", a);
  check_alias_ok("add", "out", out, "b", b);
  if (out.device().is_cuda()) {
    cuda::add(a, b, out);
    return;
  }
  profile::op(profile::Activity::Ops, "add", 0, [&] { cpu::add(a, b, out); });
}

void scale(const Tensor& x, float s) {
  check_float("scale", "x", x);
  if (x.device().is_cuda()) {
    cuda::scale(x, s);
    return;
  }
  profile::op(profile::Activity::Ops, "scale", 0, [&] { cpu::scale(x, s); });
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  check_float("axpy", "x", x);
  check_float("axpy", "y", y);
  check_same_device("axpy", "x", x, "y", y);
  check_same_numel("axpy", "x", x, "y", y);
  check_alias_ok("axpy", "y", y, "x", x);
  if (y.device().is_cuda()) {
    cuda::axpy(alpha, x, y);
    return;
  }
  profile::op(profile::Activity::Ops, "axpy", 0, [&] { cpu::axpy(alpha, x, y); });
}

void cast(const Tensor& src, const Tensor& dst) {
  check_defined("cast", "src", src);
  check_defined("cast", "dst", dst);
  check_same_device("cast", "src", src, "dst", dst);
  check_same_numel("cast", "src", src, "dst", dst);
  if (src.dtype() == dst.dtype()) {
    // A plain copy; copy_from works on every device.
    dst.copy_from(src);
    return;
  }
  ST_CHECK(is_float(dst.dtype()), "cast: cannot convert {} to {} (dst must be F32 or BF16 unless dtypes match)",
           src.dtype(), dst.dtype());
  ST_CHECK(!overlaps(src, dst), "cast: dst ({}) overlaps src ({})", dst.str(), src.str());
  if (dst.device().is_cuda()) {
    cuda::cast(src, dst);
    return;
  }
  profile::op(profile::Activity::Ops, "cast", 0, [&] { cpu::cast(src, dst); });
}

Tensor cast(const Tensor& src, DType dtype) {
  check_defined("cast", "src", src);
  Tensor out = Tensor::empty(src.shape(), dtype, src.device());
  cast(src, out);
  return out;
}

double sum_of_squares(const Tensor& x) {
  check_float("sum_of_squares", "x", x);
  if (x.device().is_cuda()) return cuda::sum_of_squares(x);
  double result{};
  profile::op(profile::Activity::Ops, "sum of squares", 0, [&] { result = cpu::sum_of_squares(x); });
  return result;
}

void fill(const Tensor& x, double value) {
  check_defined("fill", "x", x);
  if (x.dtype() == DType::I32) {
    // Converting an out-of-range double to int32_t is undefined behaviour.
    ST_CHECK(value > -2147483649.0 && value < 2147483648.0, "fill: value {} does not fit {} (tensor {})", value,
             x.dtype(), x.str());
  }
  if (x.device().is_cuda()) {
    cuda::fill(x, value);
    return;
  }
  profile::op(profile::Activity::Ops, "fill", 0, [&] { cpu::fill(x, value); });
}

}  // namespace st::ops
