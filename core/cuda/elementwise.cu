// CUDA element-wise ops of core/ops.h: add, scale, axpy, cast, fill and
// sum_of_squares. The rule of core/cpu/ops_cpu.cpp holds here too: BF16 is
// widened to F32 (exact), the arithmetic is F32 with one rounding per
// operation as written there (no contraction into FMAs), and a BF16 result is
// rounded once, to nearest even, bit for bit like core/dtype.h, so the GPU
// and CPU results of these ops are identical.
#include <cstdint>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/cuda/cuda_runtime.h"
#include "core/cuda/device_util.cuh"
#include "core/cuda/ops_cuda.h"
#include "core/cuda/stream.h"

namespace st::cuda {

namespace {

using detail::bf16;
using detail::device_ptr;
using detail::from_f32;
using detail::round_bf16;
using detail::to_f32;
using detail::visit_float;

constexpr int kThreads = 256;
// Enough resident threads to saturate the memory system of any current GPU
// (an H100 holds 132 SMs x 2048 threads = 1056 such blocks); grid-stride loops
// cover the rest, so large tensors do not pay for launching idle blocks.
constexpr int64_t kMaxBlocks = 1024;

int blocks_for(int64_t work_items) { return detail::grid_blocks(work_items, kThreads, kMaxBlocks); }

// --- conversions (the rest are in core/cuda/device_util.cuh) ----------------------

// I32 -> BF16 rounded once, as core/cpu/ops_cpu.cpp's i32_to_bf16_bits: the
// F32 value is nudged one F32 ulp towards v when it landed on a BF16 midpoint
// that v itself is not on, so the tie cannot break the wrong way.
__device__ __forceinline__ bf16 i32_to_bf16(int32_t v) {
  float f = __int2float_rn(v);
  if ((__float_as_uint(f) & 0xffffu) == 0x8000u) {
    const long long diff = static_cast<long long>(v) - static_cast<long long>(f);
    if (diff != 0)
      f = nextafterf(f, diff > 0 ? __int_as_float(0x7f800000) : __int_as_float(static_cast<int>(0xff800000u)));
  }
  return round_bf16(f);
}

// --- the element-wise operations ----------------------------------------------------

template <class Out>
struct Convert {
  template <class In>
  __device__ __forceinline__ Out operator()(In v) const {
    if constexpr (std::is_same_v<In, int32_t>) {
      if constexpr (std::is_same_v<Out, float>) {
        return __int2float_rn(v);
      } else {
        return i32_to_bf16(v);
      }
    } else {
      return from_f32<Out>(to_f32(v));
    }
  }
};

template <class Out>
struct Add {
  template <class A, class B>
  __device__ __forceinline__ Out operator()(A a, B b) const {
    return from_f32<Out>(__fadd_rn(to_f32(a), to_f32(b)));
  }
};

template <class T>
struct Scale {
  float s;
  __device__ __forceinline__ T operator()(T x) const { return from_f32<T>(__fmul_rn(to_f32(x), s)); }
};

// y + alpha * x as one fused multiply-add, as the CPU loop computes it: GCC
// contracts a * b + c in C++ by default, and the CPU build targets this
// machine's ISA (ST_NATIVE), which has FMA on every x86-64 server we run on.
template <class Y>
struct Axpy {
  float alpha;
  template <class X>
  __device__ __forceinline__ Y operator()(X x, Y y) const {
    return from_f32<Y>(__fmaf_rn(alpha, to_f32(x), to_f32(y)));
  }
};

// --- map kernels: grid-stride, four elements per access when aligned ----------------

// Four elements loaded or stored as one access (16 bytes for F32/I32, 8 for BF16).
template <class T>
struct alignas(4 * sizeof(T)) Pack4 {
  T v[4];
};

template <class T>
bool pack_aligned(const T* p) {
  return reinterpret_cast<uintptr_t>(p) % sizeof(Pack4<T>) == 0;
}

// out[i] = f(in[i]). `packed` says every pointer is Pack4-aligned; out may be in.
template <class In, class Out, class F>
__global__ void map1_kernel(const In* in, Out* out, int64_t n, F f, bool packed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (packed) {
    const int64_t packs = n / 4;
    const auto* pin = reinterpret_cast<const Pack4<In>*>(in);
    auto* pout = reinterpret_cast<Pack4<Out>*>(out);
    for (int64_t p = start; p < packs; p += stride) {
      const Pack4<In> x = pin[p];
      Pack4<Out> y;
#pragma unroll
      for (int j = 0; j < 4; ++j) y.v[j] = f(x.v[j]);
      pout[p] = y;
    }
    tail = packs * 4;
  }
  for (int64_t i = tail + start; i < n; i += stride) out[i] = f(in[i]);
}

// out[i] = f(a[i], b[i]). out may be a or b exactly (each element is read before it is written).
template <class A, class B, class Out, class F>
__global__ void map2_kernel(const A* a, const B* b, Out* out, int64_t n, F f, bool packed) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t tail = 0;
  if (packed) {
    const int64_t packs = n / 4;
    const auto* pa = reinterpret_cast<const Pack4<A>*>(a);
    const auto* pb = reinterpret_cast<const Pack4<B>*>(b);
    auto* pout = reinterpret_cast<Pack4<Out>*>(out);
    for (int64_t p = start; p < packs; p += stride) {
      const Pack4<A> x = pa[p];
      const Pack4<B> y = pb[p];
      Pack4<Out> z;
#pragma unroll
      for (int j = 0; j < 4; ++j) z.v[j] = f(x.v[j], y.v[j]);
      pout[p] = z;
    }
    tail = packs * 4;
  }
  for (int64_t i = tail + start; i < n; i += stride) out[i] = f(a[i], b[i]);
}

template <class In, class Out, class F>
void launch_map1(const In* in, Out* out, int64_t n, F f, cudaStream_t stream) {
  if (n == 0) return;
  const bool packed = pack_aligned(in) && pack_aligned(out);
  map1_kernel<<<blocks_for(packed ? (n + 3) / 4 : n), kThreads, 0, stream>>>(in, out, n, f, packed);
  CUDA_CHECK_LAUNCH();
}

template <class A, class B, class Out, class F>
void launch_map2(const A* a, const B* b, Out* out, int64_t n, F f, cudaStream_t stream) {
  if (n == 0) return;
  const bool packed = pack_aligned(a) && pack_aligned(b) && pack_aligned(out);
  map2_kernel<<<blocks_for(packed ? (n + 3) / 4 : n), kThreads, 0, stream>>>(a, b, out, n, f, packed);
  CUDA_CHECK_LAUNCH();
}

template <class T>
__global__ void fill_kernel(T* x, int64_t n, T value) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = value;
}

// --- sum of squares: per-block double partials, then one block adds them ------------

template <class T>
__global__ void __launch_bounds__(kThreads) sum_of_squares_partial_kernel(const T* x, int64_t n, double* partial) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  double acc = 0.0;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    // An F32 square is exact in double (48 significant bits), as on the CPU.
    const double v = to_f32(x[i]);
    acc += v * v;
  }
  acc = detail::block_sum_to_thread0<kThreads>(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

}  // namespace

void add(const Tensor& a, const Tensor& b, const Tensor& out) {
  const int device = out.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  visit_float(a.dtype(), [&](auto a_type) {
    visit_float(b.dtype(), [&](auto b_type) {
      visit_float(out.dtype(), [&](auto out_type) {
        using A = typename decltype(a_type)::type;
        using B = typename decltype(b_type)::type;
        using O = typename decltype(out_type)::type;
        launch_map2(device_ptr<A>(a), device_ptr<B>(b), device_ptr<O>(out), out.numel(), Add<O>{}, stream);
      });
    });
  });
}

void scale(const Tensor& x, float s) {
  const int device = x.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  visit_float(x.dtype(), [&](auto x_type) {
    using T = typename decltype(x_type)::type;
    T* p = device_ptr<T>(x);
    launch_map1(p, p, x.numel(), Scale<T>{s}, stream);
  });
}

void axpy(float alpha, const Tensor& x, const Tensor& y) {
  const int device = y.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  visit_float(x.dtype(), [&](auto x_type) {
    visit_float(y.dtype(), [&](auto y_type) {
      using X = typename decltype(x_type)::type;
      using Y = typename decltype(y_type)::type;
      Y* py = device_ptr<Y>(y);
      launch_map2(device_ptr<X>(x), py, py, y.numel(), Axpy<Y>{alpha}, stream);
    });
  });
}

void cast(const Tensor& src, const Tensor& dst) {
  const int device = dst.device().index;
  if (src.dtype() == dst.dtype()) {
    copy_bytes(dst.raw_data(), dst.device(), src.raw_data(), src.device(), dst.nbytes());
    return;
  }
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  visit_float(dst.dtype(), [&](auto dst_type) {
    using D = typename decltype(dst_type)::type;
    switch (src.dtype()) {
      case DType::F32: launch_map1(src.data<float>(), device_ptr<D>(dst), dst.numel(), Convert<D>{}, stream); return;
      case DType::BF16:
        launch_map1(device_ptr<bf16>(src), device_ptr<D>(dst), dst.numel(), Convert<D>{}, stream);
        return;
      case DType::I32: launch_map1(src.data<int32_t>(), device_ptr<D>(dst), dst.numel(), Convert<D>{}, stream); return;
    }
  });
}

double sum_of_squares(const Tensor& x) {
  const int64_t n = x.numel();
  if (n == 0) return 0.0;
  const int device = x.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  const int blocks = blocks_for(n);
  return detail::two_stage_sum<kThreads>(x.device(), blocks, stream, [&](double* partial) {
    visit_float(x.dtype(), [&](auto x_type) {
      using T = typename decltype(x_type)::type;
      sum_of_squares_partial_kernel<<<blocks, kThreads, 0, stream>>>(device_ptr<T>(x), n, partial);
      CUDA_CHECK_LAUNCH();
    });
  });
}

void fill(const Tensor& x, double value) {
  const int64_t n = x.numel();
  if (n == 0) return;
  const int device = x.device().index;
  DeviceGuard guard(device);
  cudaStream_t stream = compute_stream(device);
  // The value is rounded on the host exactly as the CPU fill rounds it (BF16
  // through float), so the kernel only stores a bit pattern.
  switch (x.dtype()) {
    case DType::F32:
      fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x.data<float>(), n, static_cast<float>(value));
      break;
    case DType::BF16: {
      const uint16_t bits = f32_to_bf16_bits(static_cast<float>(value));
      fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(reinterpret_cast<uint16_t*>(x.data<BFloat16>()), n, bits);
      break;
    }
    case DType::I32:
      fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(x.data<int32_t>(), n, static_cast<int32_t>(value));
      break;
  }
  CUDA_CHECK_LAUNCH();
}

}  // namespace st::cuda
