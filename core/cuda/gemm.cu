// CUDA GEMM through cuBLASLt: c = alpha * op(a) @ op(b) + beta * c with
// row-major operands, F32 accumulation (CUBLAS_COMPUTE_32F, never TF32, so
// F32 results stay within rounding of the CPU's).
//
// cuBLASLt is column-major. A row-major [R, C] buffer read column-major is
// its transpose, so the row-major product C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T: b is cuBLASLt's first operand, a its
// second, and the transpose flags pass through unchanged.
//
// Types cuBLASLt takes with F32 compute: A and B both F32 with an F32 C, or
// both BF16 with an F32 or BF16 C. Other mixes are brought to one of these
// without changing the result: a BF16 operand next to an F32 one is widened
// to F32 (exact), and an F32 product bound for a BF16 c, or any product
// added to a BF16 c (beta != 0), goes through an F32 temporary that is
// rounded once at the end, as the CPU does.
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cublasLt.h>
#include <cuda_runtime.h>

#include "core/cuda/cublas_check.h"
#include "core/cuda/cuda_runtime.h"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/stream.h"

namespace st::cuda {

namespace {

using ops::Transpose;

// What cuBLASLt may use for split-K and similar; allocated once per GPU.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::I32: break;
  }
  ST_FAIL("gemm: operands must be F32 or BF16, got {}", dtype);
}

// Largest power of two (up to 256) dividing the address: cuBLASLt assumes
// 256-byte aligned operands unless told otherwise, and views (narrow0,
// flat_slice) are often less aligned than that.
uint32_t alignment_of(const void* p) {
  auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// --- move-only owners of cuBLASLt objects; destructors never throw -------------------

class LtHandle {
 public:
  LtHandle() { CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasLtCreate)(&handle_)); }
  ~LtHandle() {
    // At process exit the library may already be shutting down; nothing useful to report.
    if (handle_ != nullptr) (void)ST_CUDA_LIB_CALL(cublasLtDestroy)(handle_);
  }
  LtHandle(const LtHandle&) = delete;
  LtHandle& operator=(const LtHandle&) = delete;
  cublasLtHandle_t get() const { return handle_; }

 private:
  cublasLtHandle_t handle_ = nullptr;
};

class MatmulDesc {
 public:
  MatmulDesc(Transpose first, Transpose second) {
    CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasLtMatmulDescCreate)(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t op_first = first == Transpose::Yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_second = second == Transpose::Yes ? CUBLAS_OP_T : CUBLAS_OP_N;
    CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasLtMatmulDescSetAttribute)(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                                                  sizeof(op_first)));
    CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasLtMatmulDescSetAttribute)(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                                                  sizeof(op_second)));
  }
  ~MatmulDesc() {
    if (desc_ != nullptr) (void)ST_CUDA_LIB_CALL(cublasLtMatmulDescDestroy)(desc_);
  }
  MatmulDesc(const MatmulDesc&) = delete;
  MatmulDesc& operator=(const MatmulDesc&) = delete;
  cublasLtMatmulDesc_t get() const { return desc_; }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
};

// A column-major rows x cols matrix with leading dimension ld.
class MatrixLayout {
 public:
  MatrixLayout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasLtMatrixLayoutCreate)(&layout_, type, static_cast<uint64_t>(rows),
                                                              static_cast<uint64_t>(cols), ld));
  }
  ~MatrixLayout() {
    if (layout_ != nullptr) (void)ST_CUDA_LIB_CALL(cublasLtMatrixLayoutDestroy)(layout_);
  }
  MatrixLayout(const MatrixLayout&) = delete;
  MatrixLayout& operator=(const MatrixLayout&) = delete;
  cublasLtMatrixLayout_t get() const { return layout_; }

 private:
  cublasLtMatrixLayout_t layout_ = nullptr;
};

class Preference {
 public:
  Preference() { CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasLtMatmulPreferenceCreate)(&pref_)); }
  ~Preference() {
    if (pref_ != nullptr) (void)ST_CUDA_LIB_CALL(cublasLtMatmulPreferenceDestroy)(pref_);
  }
  Preference(const Preference&) = delete;
  Preference& operator=(const Preference&) = delete;
  cublasLtMatmulPreference_t get() const { return pref_; }

  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, T value) {
    CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasLtMatmulPreferenceSetAttribute)(pref_, attribute, &value, sizeof(value)));
  }

 private:
  cublasLtMatmulPreference_t pref_ = nullptr;
};

// --- plans: descriptors and the chosen algorithm, cached per problem -----------------

// Everything the heuristic's choice depends on. alpha and beta are not part
// of it: they are passed at launch.
struct PlanKey {
  int64_t m, n, k;
  Transpose ta, tb;
  cudaDataType_t ab_type, c_type;
  uint32_t align_a, align_b, align_c;
  bool operator==(const PlanKey&) const = default;
};

struct PlanKeyHash {
  size_t operator()(const PlanKey& key) const {
    size_t h = 0;
    auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>{}(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2); };
    mix(static_cast<uint64_t>(key.m));
    mix(static_cast<uint64_t>(key.n));
    mix(static_cast<uint64_t>(key.k));
    mix((static_cast<uint64_t>(key.ta) << 8) | static_cast<uint64_t>(key.tb));
    mix((static_cast<uint64_t>(key.ab_type) << 16) | static_cast<uint64_t>(key.c_type));
    mix((static_cast<uint64_t>(key.align_a) << 32) | (static_cast<uint64_t>(key.align_b) << 16) | key.align_c);
    return h;
  }
};

// cuBLASLt's view of one row-major problem (see the top of the file):
// first operand = b, second = a, output = c^T.
struct Plan {
  MatmulDesc desc;
  MatrixLayout first;   // b as stored: tb No -> [N x K] col-major, ld N; Yes -> [K x N], ld K
  MatrixLayout second;  // a as stored: ta No -> [K x M] col-major, ld K; Yes -> [M x K], ld M
  MatrixLayout out;     // c: [N x M] col-major, ld N
  cublasLtMatmulAlgo_t algo{};

  explicit Plan(const PlanKey& key)
      : desc(key.tb, key.ta),
        first(key.ab_type, key.tb == Transpose::No ? key.n : key.k, key.tb == Transpose::No ? key.k : key.n,
              key.tb == Transpose::No ? key.n : key.k),
        second(key.ab_type, key.ta == Transpose::No ? key.k : key.m, key.ta == Transpose::No ? key.m : key.k,
               key.ta == Transpose::No ? key.k : key.m),
        out(key.c_type, key.n, key.m, key.n) {}
};

// One GPU's cuBLASLt state: handle, workspace and plan cache, created on the
// first GEMM there and kept for the process.
class GemmContext {
 public:
  explicit GemmContext(int device)
      : device_(device),
        workspace_(
            Tensor::empty({static_cast<int64_t>(kWorkspaceBytes / sizeof(float))}, DType::F32, Device::cuda(device))) {}

  // d = alpha * op(a) @ op(b) + beta * c with a, b of one type; c is both C
  // and D. The caller holds a DeviceGuard for this GPU.
  void matmul(const PlanKey& key, const void* a, const void* b, void* c, float alpha, float beta, cudaStream_t stream) {
    const Plan& plan = plan_for(key);
    // Every GEMM on this GPU runs on its one compute stream, so the shared
    // workspace is never used by two at once.
    CUBLAS_CHECK(ST_CUDA_LIB_CALL(cublasLtMatmul)(handle_.get(), plan.desc.get(), &alpha, b, plan.first.get(), a,
                                                  plan.second.get(), &beta, c, plan.out.get(), c, plan.out.get(),
                                                  &plan.algo, workspace_.raw_data(), kWorkspaceBytes, stream));
  }

 private:
  const Plan& plan_for(const PlanKey& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = plans_.find(key);
    if (it != plans_.end()) return *it->second;
    auto plan = std::make_unique<Plan>(key);
    Preference pref;
    pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, static_cast<uint64_t>(kWorkspaceBytes));
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b);  // cuBLASLt's A is b
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_c);
    pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_c);
    // Split-K partial sums only in F32 (the compute type) or not at all: the
    // in-place and output-type schemes would add BF16 partials, rounding many
    // times (seen on an H100: a 64x96x80 BF16 product off by 6 BF16 ulps).
    pref.set(CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
             static_cast<uint32_t>(CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    // cuBLASLt answers "no algorithm" either with found == 0 or with
    // CUBLAS_STATUS_NOT_SUPPORTED; both reach the check below, whose message
    // names the problem (CUBLAS_CHECK would only name the status).
    const cublasStatus_t status = ST_CUDA_LIB_CALL(cublasLtMatmulAlgoGetHeuristic)(
        handle_.get(), plan->desc.get(), plan->first.get(), plan->second.get(), plan->out.get(), plan->out.get(),
        pref.get(), 1, &result, &found);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) {
      found = 0;
    } else {
      CUBLAS_CHECK(status);
    }
    ST_CHECK(found > 0 && result.state == CUBLAS_STATUS_SUCCESS,
             "gemm on cuda:{}: cuBLASLt has no algorithm for [{}, {}] x [{}, {}] (ta {}, tb {}, operand type {}, "
             "output type {}, alignments a {} b {} c {} bytes)",
             device_, key.m, key.k, key.k, key.n, key.ta == Transpose::Yes ? "Yes" : "No",
             key.tb == Transpose::Yes ? "Yes" : "No", static_cast<int>(key.ab_type), static_cast<int>(key.c_type),
             key.align_a, key.align_b, key.align_c);
    plan->algo = result.algo;
    // Plans are never removed, so the reference stays valid after the lock
    // is released. A training run has a handful of distinct shapes.
    return *plans_.emplace(key, std::move(plan)).first->second;
  }

  int device_;
  LtHandle handle_;
  Tensor workspace_;  // kWorkspaceBytes on this GPU
  std::mutex mutex_;
  std::unordered_map<PlanKey, std::unique_ptr<Plan>, PlanKeyHash> plans_;
};

GemmContext& context(int device) {
  // Sized once for every visible GPU; entries are made on first use. The
  // caching allocator the workspaces come from was created before (the
  // operands live in it), so it outlives them at exit.
  static std::mutex mutex;
  static std::vector<std::unique_ptr<GemmContext>> contexts(static_cast<size_t>(device_count()));
  std::lock_guard<std::mutex> lock(mutex);
  ST_CHECK(device >= 0 && static_cast<size_t>(device) < contexts.size(), "gemm: cuda:{} is not a visible GPU ({})",
           device, contexts.size());
  auto& slot = contexts[static_cast<size_t>(device)];
  if (!slot) slot = std::make_unique<GemmContext>(device);
  return *slot;
}

// A float operand as `dtype`: the tensor itself, or a converted copy in `storage`.
const void* operand_as(const Tensor& t, DType dtype, Tensor& storage) {
  if (t.dtype() == dtype) return t.raw_data();
  storage = Tensor::empty(t.shape(), dtype, t.device());
  cast(t, storage);
  return storage.raw_data();
}

}  // namespace

void gemm(const Tensor& a, ops::Transpose ta, const Tensor& b, ops::Transpose tb, const Tensor& c, int64_t m, int64_t n,
          int64_t k, float alpha, float beta) {
  if (m == 0 || n == 0) return;
  const int device = c.device().index;
  DeviceGuard guard(device);
  if (k == 0) {
    // op(a) @ op(b) is all zeros; only the beta term is left.
    if (beta == 0.0f) {
      zero_bytes(c.raw_data(), c.device(), c.nbytes());
    } else if (beta != 1.0f) {
      scale(c, beta);
    }
    return;
  }

  // Operands of one type: BF16 only when both are, otherwise F32.
  const DType ab_dtype = a.dtype() == DType::BF16 && b.dtype() == DType::BF16 ? DType::BF16 : DType::F32;
  Tensor a_storage;
  Tensor b_storage;
  const void* pa = operand_as(a, ab_dtype, a_storage);
  const void* pb = operand_as(b, ab_dtype, b_storage);

  // An F32 product for a BF16 c, or any product added to a BF16 c (beta != 0):
  // accumulate into F32, round once at the end, as the CPU does. cuBLASLt
  // with a BF16 C and beta != 0 may round alpha * op(a) op(b) before adding
  // beta * c (seen on an H100).
  Tensor c_f32;
  void* pc = c.raw_data();
  if (c.dtype() == DType::BF16 && (ab_dtype == DType::F32 || beta != 0.0f)) {
    c_f32 = Tensor::empty(c.shape(), DType::F32, c.device());
    if (beta != 0.0f) cast(c, c_f32);
    pc = c_f32.raw_data();
  }
  const DType c_dtype = c_f32.defined() ? DType::F32 : c.dtype();

  const PlanKey key{
      m, n, k, ta, tb, cuda_type(ab_dtype), cuda_type(c_dtype), alignment_of(pa), alignment_of(pb), alignment_of(pc)};
  // cuBLASLt does not read C when beta is 0, so NaN left in c cannot leak in.
  context(device).matmul(key, pa, pb, pc, alpha, beta, compute_stream(device));

  if (c_f32.defined()) cast(c_f32, c);
  // Temporaries go back to the cache here, before the GPU has used them: the
  // cache hands a block out again only to work on this same stream, which
  // runs after the GEMM.
}

}  // namespace st::cuda
