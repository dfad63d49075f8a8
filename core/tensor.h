#pragma once
// Tensor: a contiguous, row-major view (shape, dtype, element offset) of a
// shared Storage. Copying a Tensor copies the handle, not the data; `const`
// applies to the handle, so ops write outputs through `const Tensor&`.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace st {

using Shape = std::vector<int64_t>;

/// Product of the dimensions (1 for a scalar shape {}).
int64_t shape_numel(const Shape& shape);
/// "[2, 3]".
std::string shape_str(const Shape& shape);

class Tensor {
 public:
  /// An undefined tensor (no storage); defined() is false.
  Tensor() = default;

  /// Uninitialised memory.
  static Tensor empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype, Device device = Device::cpu());
  /// Every element `value`, rounded to `dtype` (BF16 round-to-nearest-even, I32 truncation).
  static Tensor full(const Shape& shape, double value, DType dtype, Device device = Device::cpu());
  /// A CPU tensor holding `values` (float -> F32, BFloat16 -> BF16, int32_t -> I32).
  template <class T>
  static Tensor from_vector(std::span<const T> values, const Shape& shape);
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, const Shape& shape) {
    return from_vector(std::span<const T>(values), shape);
  }
  /// A CPU tensor of `dtype` holding `values` converted (rounded for BF16).
  static Tensor from_floats(std::span<const float> values, const Shape& shape, DType dtype);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t dim() const { return static_cast<int64_t>(shape_.size()); }
  /// Size of dimension `i`; negative counts from the end.
  int64_t size(int64_t i) const;
  DType dtype() const { return dtype_; }
  Device device() const;
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  /// Element offset of this view into its storage.
  int64_t storage_offset() const { return offset_; }
  /// True when both handles view the same storage.
  bool shares_storage_with(const Tensor& other) const { return storage_ == other.storage_; }

  /// Same data, new shape with the same numel; one dimension may be -1.
  Tensor view(const Shape& shape) const;
  /// 1-D view of elements [begin, begin + n) of the flattened tensor.
  Tensor flat_slice(int64_t begin, int64_t n) const;
  /// Rows [begin, begin + n) along dimension 0 (a view).
  Tensor narrow0(int64_t begin, int64_t n) const;

  /// Copies `src` into this tensor: same numel and dtype; devices may differ.
  void copy_from(const Tensor& src) const;
  /// A copy on `device` (a new tensor even when the device is the same).
  Tensor to(Device device) const;
  /// A copy on the same device.
  Tensor clone() const;
  /// Sets every byte to zero.
  void zero_() const;

  void* raw_data() const;
  /// Typed pointer; throws unless T matches dtype(). Device memory for CUDA tensors.
  template <class T>
  T* data() const {
    ST_CHECK(defined(), "data() on an undefined tensor");
    ST_CHECK(dtype_of_v<T> == dtype_, "tensor holds {} but was accessed as {}", dtype_, dtype_of_v<T>);
    return static_cast<T*>(raw_data());
  }
  /// Typed view of a CPU tensor's elements.
  template <class T>
  std::span<T> span() const {
    ST_CHECK(device().is_cpu(), "span() needs a CPU tensor, this one is on {}", device());
    return {data<T>(), static_cast<size_t>(numel_)};
  }
  /// Every element converted to float (copies from the device if needed).
  std::vector<float> to_floats() const;
  /// One-line description: "Tensor([2, 3], F32, cpu)".
  std::string str() const;

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  int64_t numel_ = 0;
  Shape shape_;
  DType dtype_ = DType::F32;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

/// Whether the bytes of `a` and `b` intersect (collectives copy an input that
/// aliases its output: MPI and NCCL forbid overlapping send/receive buffers).
bool memory_overlaps(const Tensor& a, const Tensor& b);

}  // namespace st
