// CPU GEMM: oneDNN's matmul when built with it (ST_WITH_DNNL), which picks
// AVX-512, AVX512_BF16 or AMX at run time and multiplies BF16 operands
// directly with F32 accumulation; Eigen otherwise, and as the reference.
//
// Both paths keep the contract of ops::gemm: F32 accumulation, c rounded once,
// beta == 0 ignores c's old contents. oneDNN's result for a shape is fixed for
// a given thread count (no atomics in its reductions), so a recomputed forward
// matches the original bit for bit.
#include <bit>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <Eigen/Core>

#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"
#include "core/format.h"

#ifdef ST_WITH_DNNL
#include <oneapi/dnnl/dnnl.hpp>
#endif

namespace st::cpu {

namespace {

using ops::Transpose;

// F32 scratch for GEMMs with BF16 operands on the Eigen path (and for the
// rare mixed-dtype operands on the oneDNN path), owned by the calling thread
// and grow-only: a training step repeats the same shapes, so after the first
// step nothing is allocated. Not counted by cpu_allocator(), whose stats
// describe tensors.
float* gemm_scratch(size_t n) {
  struct Buffer {
    std::unique_ptr<float[]> data;
    size_t size = 0;
  };
  thread_local Buffer buffer;
  if (buffer.size < n) {
    buffer.data.reset();  // release the old block before taking the larger one
    buffer.data = std::make_unique_for_overwrite<float[]>(n);
    buffer.size = n;
  }
  return buffer.data.get();
}

using RowMajorF32 = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMajorF32>;
using MatrixMap = Eigen::Map<RowMajorF32>;

// c = alpha * lhs @ rhs + beta * c. Zeroing first (rather than scaling by 0)
// is what makes beta == 0 ignore NaN or Inf left in c.
template <class Lhs, class Rhs>
void multiply_into(MatrixMap& c, const Lhs& lhs, const Rhs& rhs, float alpha, float beta) {
  if (beta == 0.0f) {
    c.setZero();
  } else if (beta != 1.0f) {
    c *= beta;
  }
  // Eigen folds the scalar into its GEMM kernel and reads the transposes in
  // place, so no operand is copied here.
  c.noalias() += alpha * lhs * rhs;
}

// The F32 GEMM on raw pointers; a, b as stored, c (M, N) row-major.
void eigen_f32(const float* pa, bool a_t, const float* pb, bool b_t, float* pc, int64_t m, int64_t n, int64_t k,
               float alpha, float beta) {
  MatrixMap cm(pc, m, n);
  if (k == 0) {
    // op(a) @ op(b) is all zeros; only the beta term is left.
    if (beta == 0.0f) {
      cm.setZero();
    } else if (beta != 1.0f) {
      cm *= beta;
    }
    return;
  }
  ConstMatrixMap as(pa, a_t ? k : m, a_t ? m : k);  // (M, K) or (K, M)
  ConstMatrixMap bs(pb, b_t ? n : k, b_t ? k : n);  // (K, N) or (N, K)
  if (!a_t && !b_t) {
    multiply_into(cm, as, bs, alpha, beta);
  } else if (!a_t && b_t) {
    multiply_into(cm, as, bs.transpose(), alpha, beta);
  } else if (a_t && !b_t) {
    multiply_into(cm, as.transpose(), bs, alpha, beta);
  } else {
    multiply_into(cm, as.transpose(), bs.transpose(), alpha, beta);
  }
}

}  // namespace

void gemm_eigen(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& c, int64_t m, int64_t n,
                int64_t k, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  const int64_t a_scratch = a.dtype() == DType::BF16 ? m * k : 0;
  const int64_t b_scratch = b.dtype() == DType::BF16 ? k * n : 0;
  const int64_t c_scratch = c.dtype() == DType::BF16 ? m * n : 0;
  float* scratch = nullptr;
  if (a_scratch + b_scratch + c_scratch > 0)
    scratch = gemm_scratch(static_cast<size_t>(a_scratch + b_scratch + c_scratch));
  // F32 views of the operands: the tensors themselves, or widened copies.
  const float* pa = a.dtype() == DType::F32 ? a.data<float>() : scratch;
  if (a_scratch > 0) widen_bf16(a.data<BFloat16>(), scratch, a_scratch);
  const float* pb = b.dtype() == DType::F32 ? b.data<float>() : scratch + a_scratch;
  if (b_scratch > 0) widen_bf16(b.data<BFloat16>(), scratch + a_scratch, b_scratch);
  float* pc = c.dtype() == DType::F32 ? c.data<float>() : scratch + a_scratch + b_scratch;
  if (c_scratch > 0 && beta != 0.0f) widen_bf16(c.data<BFloat16>(), pc, c_scratch);
  eigen_f32(pa, ta == Transpose::Yes, pb, tb == Transpose::Yes, pc, m, n, k, alpha, beta);
  if (c_scratch > 0) narrow_to_bf16(pc, c.data<BFloat16>(), c_scratch);
}

#ifdef ST_WITH_DNNL

namespace {

// One matmul primitive per shape, transposes, dtypes and scalars. A training
// step repeats a handful of shapes, so after the first step every GEMM is a
// lookup and an execute. A shape oneDNN declines is remembered as such and
// goes to Eigen.
struct GemmKey {
  int64_t m, n, k;
  bool a_t, b_t;
  DType a_dtype, b_dtype, c_dtype;
  float alpha, beta;
  bool operator==(const GemmKey&) const = default;
};

struct GemmKeyHash {
  size_t operator()(const GemmKey& key) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) { h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(static_cast<uint64_t>(key.m));
    mix(static_cast<uint64_t>(key.n));
    mix(static_cast<uint64_t>(key.k));
    mix((key.a_t ? 1u : 0u) | (key.b_t ? 2u : 0u) | static_cast<uint64_t>(key.a_dtype) << 2 |
        static_cast<uint64_t>(key.b_dtype) << 6 | static_cast<uint64_t>(key.c_dtype) << 10);
    mix(std::bit_cast<uint32_t>(key.alpha) | static_cast<uint64_t>(std::bit_cast<uint32_t>(key.beta)) << 32);
    return h;
  }
};

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::memory::data_type dnnl_type(DType dtype) {
  return dtype == DType::BF16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

// A row-major (rows, cols) matrix as stored, seen as op(x) of shape (r, c):
// the transpose is a choice of strides, never a copy.
dnnl::memory::desc operand_desc(int64_t r, int64_t c, bool transposed, DType dtype) {
  const dnnl::memory::dims strides = transposed ? dnnl::memory::dims{1, r} : dnnl::memory::dims{c, 1};
  return dnnl::memory::desc({r, c}, dnnl_type(dtype), strides);
}

struct Matmul {
  dnnl::matmul::primitive_desc pd;
  dnnl::matmul primitive;
};

std::shared_ptr<const Matmul> make_matmul(const GemmKey& key) {
  try {
    dnnl::primitive_attr attr;
    if (key.alpha != 1.0f) attr.set_output_scales(0, {key.alpha});
    if (key.beta != 0.0f) {
      dnnl::post_ops post;
      post.append_sum(key.beta);
      attr.set_post_ops(post);
    }
    const dnnl::matmul::desc desc(operand_desc(key.m, key.k, key.a_t, key.a_dtype),
                                  operand_desc(key.k, key.n, key.b_t, key.b_dtype),
                                  operand_desc(key.m, key.n, false, key.c_dtype));
    dnnl::matmul::primitive_desc pd(desc, attr, cpu_engine());
    return std::make_shared<const Matmul>(Matmul{pd, dnnl::matmul(pd)});
  } catch (const dnnl::error&) {
    return nullptr;  // not supported for this combination: the Eigen path takes it
  }
}

std::shared_ptr<const Matmul> cached_matmul(const GemmKey& key) {
  static std::mutex mutex;
  static std::unordered_map<GemmKey, std::shared_ptr<const Matmul>, GemmKeyHash> cache;
  std::lock_guard lock(mutex);
  auto it = cache.find(key);
  if (it == cache.end()) it = cache.emplace(key, make_matmul(key)).first;
  return it->second;
}

}  // namespace

void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& c, int64_t m, int64_t n,
          int64_t k, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  // Operands of different dtypes (F32 with BF16) are multiplied in F32: the
  // BF16 one is widened, which is exact.
  if (k == 0 || a.dtype() != b.dtype()) {
    gemm_eigen(a, ta, b, tb, c, m, n, k, alpha, beta);
    return;
  }
  const GemmKey key{m, n, k, ta == Transpose::Yes, tb == Transpose::Yes, a.dtype(), b.dtype(), c.dtype(), alpha, beta};
  const std::shared_ptr<const Matmul> matmul = cached_matmul(key);
  if (!matmul) {
    gemm_eigen(a, ta, b, tb, c, m, n, k, alpha, beta);
    return;
  }
  thread_local dnnl::stream stream(cpu_engine());
  dnnl::memory ma(matmul->pd.src_desc(), cpu_engine(), a.raw_data());
  dnnl::memory mb(matmul->pd.weights_desc(), cpu_engine(), b.raw_data());
  dnnl::memory mc(matmul->pd.dst_desc(), cpu_engine(), c.raw_data());
  matmul->primitive.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  stream.wait();
}

std::string gemm_backend() {
  const dnnl_version_t* v = dnnl::version();
  auto impl = [](DType dtype) {
    const GemmKey key{256, 256, 256, false, true, dtype, dtype, DType::F32, 1.0f, 0.0f};
    const std::shared_ptr<const Matmul> matmul = cached_matmul(key);
    return matmul ? std::string(matmul->pd.impl_info_str()) : std::string("Eigen");
  };
  return format("oneDNN {}.{}.{} (F32 {}, BF16 {})", v->major, v->minor, v->patch, impl(DType::F32), impl(DType::BF16));
}

#else

void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& c, int64_t m, int64_t n,
          int64_t k, float alpha, float beta) {
  gemm_eigen(a, ta, b, tb, c, m, n, k, alpha, beta);
}

std::string gemm_backend() {
  return format("Eigen {}.{}.{}", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
}

#endif

}  // namespace st::cpu
