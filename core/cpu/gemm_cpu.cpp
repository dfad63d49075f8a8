// CPU GEMM: oneDNN's matmul when built with it (ST_WITH_DNNL), which picks
// AVX2, AVX-512, AVX512_BF16 or AMX at run time (capped by cpu_isa(), isa.h);
// Eigen otherwise, and as the reference.
//
// BF16 operands: on a CPU with BF16 dot products (avx512_bf16 and up) oneDNN
// multiplies them directly with F32 accumulation. Below that level they are
// widened to F32 (exact) and multiplied by oneDNN's threaded F32 kernel, so a
// BF16 run costs an F32 GEMM plus a pass over the operands, never more: the
// alternatives there (Eigen, oneDNN's emulation) are single-threaded or slower
// than F32. Mixed F32/BF16 operands take the same widened path.
//
// Both paths keep the contract of ops::gemm: F32 accumulation, c rounded once,
// beta == 0 ignores c's old contents. oneDNN's result for a shape is fixed for
// a given thread count (no atomics in its reductions), so a recomputed forward
// matches the original bit for bit.
#include <algorithm>
#include <bit>
#include <cstring>
#include <memory>
#include <mutex>
#include <unordered_map>

#include <Eigen/Core>

#include "core/cpu/isa.h"
#include "core/cpu/ops_cpu.h"
#include "core/cpu/parallel.h"
#include "core/cpu/scratch.h"
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
  // (The bytes a GEMM of given shapes takes here: gemm_scratch_bytes().)
  thread_local Scratch<float> buffer;
  return buffer.get(static_cast<int64_t>(n));
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

// oneDNN's own ISA cap, set from cpu_isa() before its first kernel when
// ST_MAX_CPU_ISA lowers the level (oneDNN accepts it only before then; its
// ONEDNN_MAX_CPU_ISA variable keeps working when ours is not set).
void cap_dnnl_isa() {
  if (cpu_isa() == machine_cpu_isa()) return;
  dnnl::cpu_isa cap = dnnl::cpu_isa::avx2;
  switch (cpu_isa()) {
    case CpuIsa::Avx2: cap = dnnl::cpu_isa::avx2; break;
    case CpuIsa::Avx512: cap = dnnl::cpu_isa::avx512_core; break;
    case CpuIsa::Avx512Bf16: cap = dnnl::cpu_isa::avx512_core_bf16; break;
    case CpuIsa::Amx: cap = dnnl::cpu_isa::avx512_core_amx; break;
  }
  try {
    dnnl::set_max_cpu_isa(cap);
  } catch (const dnnl::error& e) {
    ST_FAIL("oneDNN refused the instruction-set cap {}={}: {}", kMaxCpuIsaVariable, isa_name(cpu_isa()), e.what());
  }
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine = [] {
    cap_dnnl_isa();
    return dnnl::engine(dnnl::engine::kind::cpu, 0);
  }();
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

// Runs a cached primitive on raw pointers laid out as its descriptors say.
void execute(const Matmul& matmul, const void* a, const void* b, void* c) {
  thread_local dnnl::stream stream(cpu_engine());
  dnnl::memory ma(matmul.pd.src_desc(), cpu_engine(), const_cast<void*>(a));
  dnnl::memory mb(matmul.pd.weights_desc(), cpu_engine(), const_cast<void*>(b));
  dnnl::memory mc(matmul.pd.dst_desc(), cpu_engine(), c);
  matmul.primitive.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
  stream.wait();
}

// Whether BF16 operands are multiplied as such (BF16 dot products) or widened.
bool native_bf16() { return cpu_isa() >= CpuIsa::Avx512Bf16; }

// The widened path works block by block so that its scratch stays near
// kScratchTarget floats whatever the step's size (a BF16 logits tensor of a
// large micro-batch would otherwise need an F32 copy as large as itself):
// blocks of op(a)'s rows (and c's) when K is the short side, blocks of K
// (c accumulating with beta = 1 after the first) when K is the long side, as
// in a weight gradient dW = dy^T x over many tokens. op(b) is widened whole
// when rows are blocked: it is a weight there. A block that is strided in
// memory is copied even from F32, so that every primitive sees contiguous
// operands. The blocks depend on the shapes only, never on the threads.
constexpr int64_t kScratchTarget = int64_t{1} << 21;  // floats: 8 MiB
constexpr int64_t kMinBlock = 64;

// One widened GEMM's blocking and the floats of scratch each operand takes.
struct WidenedPlan {
  bool block_k = false;  // blocks of K, else blocks of op(a)'s rows
  int64_t block = 0;     // rows or K per block
  int64_t a = 0, b = 0, c = 0;
  int64_t total() const { return a + b + c; }
};

WidenedPlan widened_plan(const GemmKey& key) {
  const auto [m, n, k, a_t, b_t, ad, bd, cd, alpha, beta] = key;
  const bool wa = ad == DType::BF16, wb = bd == DType::BF16, wc = cd == DType::BF16;
  WidenedPlan plan;
  plan.block_k = k > m && (wa || wb);
  if (plan.block_k) {
    plan.block = std::clamp(kScratchTarget / (m + n), kMinBlock, k);
    const bool whole = plan.block == k;
    // A block of K is strided in op(a) when a is stored (M, K), in op(b) when b is stored (N, K).
    plan.a = wa || (!whole && !a_t) ? m * plan.block : 0;
    plan.b = wb || (!whole && b_t) ? plan.block * n : 0;
    plan.c = wc ? m * n : 0;  // c accumulates across the blocks in F32
  } else {
    plan.b = wb ? k * n : 0;
    const bool a_copied = wa || a_t;  // rows of op(a) are strided when a is stored (K, M)
    const int64_t per_row = (a_copied ? k : 0) + (wc ? n : 0);
    plan.block = per_row > 0 ? std::clamp(kScratchTarget / per_row, kMinBlock, m) : m;
    if (plan.block == m && !wa)
      plan.a = 0;
    else
      plan.a = a_copied ? plan.block * k : 0;
    plan.c = wc ? plan.block * n : 0;
  }
  return plan;
}

// A (rows, cols) block at (r0, c0) of a row-major matrix with `ld` columns,
// as contiguous F32: the tensor's own memory when it is F32 and the block is
// whole rows (`copy` null), else copied (BF16 widened exactly) into `copy`.
const float* f32_block(const Tensor& x, int64_t ld, int64_t r0, int64_t rows, int64_t c0, int64_t cols, float* copy) {
  if (x.dtype() == DType::F32 && c0 == 0 && cols == ld) return x.data<float>() + r0 * ld;
  ST_CHECK(copy != nullptr, "gemm: a strided or BF16 block of {} has no scratch", shape_str(x.shape()));
  parallel_for(rows, std::max<int64_t>(1, 16384 / std::max<int64_t>(cols, 1)), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      float* dst = copy + r * cols;
      if (x.dtype() == DType::BF16) {
        widen_bf16(x.data<BFloat16>() + (r0 + r) * ld + c0, dst, cols);
      } else {
        std::memcpy(dst, x.data<float>() + (r0 + r) * ld + c0, static_cast<size_t>(cols) * sizeof(float));
      }
    }
  });
  return copy;
}

void narrow_rows(const float* src, BFloat16* dst, int64_t n) {
  parallel_for(n, 65536, [&](int64_t begin, int64_t end) { narrow_to_bf16(src + begin, dst + begin, end - begin); });
}

// One primitive call of the widened path: op(a) (m, k) @ op(b) (k, n) into c (m, n), all contiguous F32.
void run_f32(int64_t m, int64_t n, int64_t k, bool a_t, const float* a, bool b_t, const float* b, float* c, float alpha,
             float beta) {
  const GemmKey key{m, n, k, a_t, b_t, DType::F32, DType::F32, DType::F32, alpha, beta};
  const std::shared_ptr<const Matmul> matmul = cached_matmul(key);
  ST_CHECK(matmul != nullptr, "oneDNN has no F32 matmul for {}x{}x{}", m, n, k);
  execute(*matmul, a, b, c);
}

// Blocks of op(a)'s rows: op(b) widened once, a and c one block at a time.
void widened_by_rows(const GemmKey& key, const WidenedPlan& plan, const Tensor& a, const Tensor& b, const Tensor& c,
                     float* scratch) {
  const auto [m, n, k, a_t, b_t, ad, bd, cd, alpha, beta] = key;
  float* sa = plan.a > 0 ? scratch : nullptr;
  float* sb = plan.b > 0 ? scratch + plan.a : nullptr;
  float* sc = plan.c > 0 ? scratch + plan.a + plan.b : nullptr;
  const float* pb = f32_block(b, b_t ? k : n, 0, b_t ? n : k, 0, b_t ? k : n, sb);
  for (int64_t i0 = 0; i0 < m; i0 += plan.block) {
    const int64_t rows = std::min(plan.block, m - i0);
    // op(a)'s rows [i0, i0 + rows): stored rows of a (M, K), or columns of a (K, M).
    const float* pa = a_t ? f32_block(a, m, 0, k, i0, rows, sa) : f32_block(a, k, i0, rows, 0, k, sa);
    float* pc = nullptr;
    if (sc != nullptr) {
      if (beta != 0.0f) f32_block(c, n, i0, rows, 0, n, sc);
      pc = sc;
    } else {
      pc = c.data<float>() + i0 * n;
    }
    run_f32(rows, n, k, a_t, pa, b_t, pb, pc, alpha, beta);
    if (sc != nullptr) narrow_rows(sc, c.data<BFloat16>() + i0 * n, rows * n);
  }
}

// Blocks of K: c (in F32) takes each block's product, beta applying to the first.
void widened_by_k(const GemmKey& key, const WidenedPlan& plan, const Tensor& a, const Tensor& b, const Tensor& c,
                  float* scratch) {
  const auto [m, n, k, a_t, b_t, ad, bd, cd, alpha, beta] = key;
  float* sa = plan.a > 0 ? scratch : nullptr;
  float* sb = plan.b > 0 ? scratch + plan.a : nullptr;
  float* pc = plan.c > 0 ? scratch + plan.a + plan.b : c.data<float>();
  if (plan.c > 0 && beta != 0.0f) f32_block(c, n, 0, m, 0, n, pc);
  for (int64_t k0 = 0; k0 < k; k0 += plan.block) {
    const int64_t depth = std::min(plan.block, k - k0);
    // op(a)'s columns [k0, k0 + depth): stored rows of a (K, M), or columns of a (M, K); op(b)'s rows likewise.
    const float* pa = a_t ? f32_block(a, m, k0, depth, 0, m, sa) : f32_block(a, k, 0, m, k0, depth, sa);
    const float* pb = b_t ? f32_block(b, k, 0, n, k0, depth, sb) : f32_block(b, n, k0, depth, 0, n, sb);
    run_f32(m, n, depth, a_t, pa, b_t, pb, pc, alpha, k0 == 0 ? beta : 1.0f);
  }
  if (plan.c > 0) narrow_rows(pc, c.data<BFloat16>(), m * n);
}

// Widened GEMMs below this many multiply-adds go to Eigen on the calling
// thread (operands widened whole): decided by the shape alone, so results stay
// fixed for a shape.
constexpr int64_t kSmallGemm = int64_t{1} << 23;
bool small_gemm(int64_t m, int64_t n, int64_t k) {
  return static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) < static_cast<double>(kSmallGemm);
}

// The F32 GEMM of operands any of which may be BF16, in blocks (above).
void gemm_widened(const Tensor& a, bool a_t, const Tensor& b, bool b_t, const Tensor& c, int64_t m, int64_t n,
                  int64_t k, float alpha, float beta) {
  const GemmKey key{m, n, k, a_t, b_t, a.dtype(), b.dtype(), c.dtype(), alpha, beta};
  const WidenedPlan plan = widened_plan(key);
  float* scratch = plan.total() > 0 ? gemm_scratch(static_cast<size_t>(plan.total())) : nullptr;
  if (plan.block_k) {
    widened_by_k(key, plan, a, b, c, scratch);
  } else {
    widened_by_rows(key, plan, a, b, c, scratch);
  }
}

}  // namespace

void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& c, int64_t m, int64_t n,
          int64_t k, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    gemm_eigen(a, ta, b, tb, c, m, n, k, alpha, beta);
    return;
  }
  const bool a_t = ta == Transpose::Yes, b_t = tb == Transpose::Yes;
  const bool direct = a.dtype() == b.dtype() && (a.dtype() == DType::F32 || native_bf16());
  if (!direct && small_gemm(m, n, k)) {
    // Too small to pay for the widening passes' and the primitive's thread
    // wake-ups (llama-tiny's GEMMs ran at half speed through them).
    gemm_eigen(a, ta, b, tb, c, m, n, k, alpha, beta);
    return;
  }
  if (!direct) {
    gemm_widened(a, a_t, b, b_t, c, m, n, k, alpha, beta);
    return;
  }
  const GemmKey key{m, n, k, a_t, b_t, a.dtype(), b.dtype(), c.dtype(), alpha, beta};
  const std::shared_ptr<const Matmul> matmul = cached_matmul(key);
  if (!matmul) {
    // oneDNN declined these dtypes (say F32 operands into a BF16 c): widened.
    gemm_widened(a, a_t, b, b_t, c, m, n, k, alpha, beta);
    return;
  }
  execute(*matmul, a.raw_data(), b.raw_data(), c.raw_data());
}

int64_t gemm_scratch_bytes(int64_t m, int64_t n, int64_t k, DType a, DType b, DType c) {
  const bool direct = a == b && (a == DType::F32 || native_bf16());
  if (direct && c == DType::F32) return 0;
  if (!direct && small_gemm(m, n, k)) {
    const int64_t whole =
        (a == DType::BF16 ? m * k : 0) + (b == DType::BF16 ? k * n : 0) + (c == DType::BF16 ? m * n : 0);
    return whole * static_cast<int64_t>(sizeof(float));
  }
  // Transposes change which blocks are copied; the larger of the two layouts bounds both.
  int64_t floats = 0;
  for (const bool a_t : {false, true}) {
    for (const bool b_t : {false, true})
      floats = std::max(floats, widened_plan(GemmKey{m, n, k, a_t, b_t, a, b, c, 1.0f, 0.0f}).total());
  }
  return floats * static_cast<int64_t>(sizeof(float));
}

std::string gemm_backend() {
  const dnnl_version_t* v = dnnl::version();
  auto impl = [](DType dtype) {
    const GemmKey key{256, 256, 256, false, true, dtype, dtype, DType::F32, 1.0f, 0.0f};
    const std::shared_ptr<const Matmul> matmul = cached_matmul(key);
    return matmul ? std::string(matmul->pd.impl_info_str()) : std::string("Eigen");
  };
  const std::string bf16 = native_bf16() ? impl(DType::BF16) : "widened to F32";
  return format("oneDNN {}.{}.{} (F32 {}, BF16 {}; ISA {})", v->major, v->minor, v->patch, impl(DType::F32), bf16,
                isa_description());
}

#else

void gemm(const Tensor& a, Transpose ta, const Tensor& b, Transpose tb, const Tensor& c, int64_t m, int64_t n,
          int64_t k, float alpha, float beta) {
  gemm_eigen(a, ta, b, tb, c, m, n, k, alpha, beta);
}

int64_t gemm_scratch_bytes(int64_t m, int64_t n, int64_t k, DType a, DType b, DType c) {
  const int64_t elems =
      (a == DType::BF16 ? m * k : 0) + (b == DType::BF16 ? k * n : 0) + (c == DType::BF16 ? m * n : 0);
  return elems * static_cast<int64_t>(sizeof(float));
}

std::string gemm_backend() {
  return format("Eigen {}.{}.{} (ISA {})", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION,
                isa_description());
}

#endif

}  // namespace st::cpu
