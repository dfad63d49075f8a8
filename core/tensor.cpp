#include "core/tensor.h"

#include <cmath>
#include <cstring>
#include <sstream>

#include "core/cuda/cuda_runtime.h"

namespace st {

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    ST_CHECK(d >= 0, "negative dimension in shape {}", shape_str(shape));
    n *= d;
  }
  return n;
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  Tensor t;
  t.numel_ = shape_numel(shape);
  t.shape_ = shape;
  t.dtype_ = dtype;
  t.storage_ = std::make_shared<Storage>(t.nbytes(), allocator_for(device));
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

namespace {
template <class T>
void fill_cpu(void* data, int64_t n, T value) {
  T* p = static_cast<T*>(data);
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}
}  // namespace

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  if (!device.is_cpu()) return full(shape, value, dtype, Device::cpu()).to(device);
  Tensor t = empty(shape, dtype, device);
  switch (dtype) {
    case DType::F32: fill_cpu(t.raw_data(), t.numel_, static_cast<float>(value)); break;
    case DType::BF16: fill_cpu(t.raw_data(), t.numel_, BFloat16(static_cast<float>(value))); break;
    case DType::I32: fill_cpu(t.raw_data(), t.numel_, static_cast<int32_t>(value)); break;
  }
  return t;
}

template <class T>
Tensor Tensor::from_vector(std::span<const T> values, const Shape& shape) {
  ST_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_vector: {} values for shape {}",
           values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype_of_v<T>);
  if (!values.empty()) std::memcpy(t.raw_data(), values.data(), values.size_bytes());
  return t;
}
template Tensor Tensor::from_vector<float>(std::span<const float>, const Shape&);
template Tensor Tensor::from_vector<BFloat16>(std::span<const BFloat16>, const Shape&);
template Tensor Tensor::from_vector<int32_t>(std::span<const int32_t>, const Shape&);

Tensor Tensor::from_floats(std::span<const float> values, const Shape& shape, DType dtype) {
  ST_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape), "from_floats: {} values for shape {}",
           values.size(), shape_str(shape));
  Tensor t = empty(shape, dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (dtype) {
      case DType::F32: t.data<float>()[i] = values[i]; break;
      case DType::BF16: t.data<BFloat16>()[i] = BFloat16(values[i]); break;
      case DType::I32: t.data<int32_t>()[i] = static_cast<int32_t>(values[i]); break;
    }
  }
  return t;
}

int64_t Tensor::size(int64_t i) const {
  int64_t d = dim();
  int64_t j = i < 0 ? i + d : i;
  ST_CHECK(j >= 0 && j < d, "dimension {} out of range for a tensor of shape {}", i, shape_str(shape_));
  return shape_[static_cast<size_t>(j)];
}

Device Tensor::device() const { return storage_ ? storage_->device() : Device::cpu(); }

void* Tensor::raw_data() const {
  ST_CHECK(defined(), "raw_data() on an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * static_cast<int64_t>(dtype_size(dtype_));
}

Tensor Tensor::view(const Shape& shape) const {
  ST_CHECK(defined(), "view() on an undefined tensor");
  Shape resolved = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < resolved.size(); ++i) {
    if (resolved[i] == -1) {
      ST_CHECK(infer < 0, "view {}: only one dimension may be -1", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      ST_CHECK(resolved[i] >= 0, "view {}: negative dimension", shape_str(shape));
      known *= resolved[i];
    }
  }
  if (infer >= 0) {
    ST_CHECK(known > 0 && numel_ % known == 0, "cannot view a tensor of shape {} as {}", shape_str(shape_),
             shape_str(shape));
    resolved[static_cast<size_t>(infer)] = numel_ / known;
  }
  ST_CHECK(shape_numel(resolved) == numel_, "cannot view a tensor of shape {} ({} elements) as {}", shape_str(shape_),
           numel_, shape_str(shape));
  Tensor t = *this;
  t.shape_ = std::move(resolved);
  return t;
}

Tensor Tensor::flat_slice(int64_t begin, int64_t n) const {
  ST_CHECK(defined(), "flat_slice() on an undefined tensor");
  ST_CHECK(begin >= 0 && n >= 0 && begin + n <= numel_, "flat_slice({}, {}) out of range for {} elements", begin, n,
           numel_);
  Tensor t = *this;
  t.offset_ = offset_ + begin;
  t.numel_ = n;
  t.shape_ = {n};
  return t;
}

Tensor Tensor::narrow0(int64_t begin, int64_t n) const {
  ST_CHECK(dim() >= 1, "narrow0() needs at least one dimension");
  ST_CHECK(begin >= 0 && n >= 0 && begin + n <= shape_[0], "narrow0({}, {}) out of range for shape {}", begin, n,
           shape_str(shape_));
  int64_t row = shape_[0] == 0 ? 0 : numel_ / shape_[0];
  Tensor t = *this;
  t.offset_ = offset_ + begin * row;
  t.numel_ = n * row;
  t.shape_[0] = n;
  return t;
}

void Tensor::copy_from(const Tensor& src) const {
  ST_CHECK(defined() && src.defined(), "copy_from() with an undefined tensor");
  ST_CHECK(src.numel_ == numel_, "copy_from: {} elements into {}", src.numel_, numel_);
  ST_CHECK(src.dtype_ == dtype_, "copy_from: {} into {} (use ops::cast to convert)", src.dtype_, dtype_);
  if (nbytes() == 0) return;
  Device d = device();
  Device s = src.device();
  if (d.is_cpu() && s.is_cpu()) {
    std::memmove(raw_data(), src.raw_data(), nbytes());
  } else {
    cuda::copy_bytes(raw_data(), d, src.raw_data(), s, nbytes());
  }
}

Tensor Tensor::to(Device device) const {
  Tensor t = empty(shape_, dtype_, device);
  t.copy_from(*this);
  return t;
}

Tensor Tensor::clone() const { return to(device()); }

void Tensor::zero_() const {
  if (nbytes() == 0) return;
  if (device().is_cpu()) {
    std::memset(raw_data(), 0, nbytes());
  } else {
    cuda::zero_bytes(raw_data(), device(), nbytes());
  }
}

std::vector<float> Tensor::to_floats() const {
  Tensor host = device().is_cpu() ? *this : to(Device::cpu());
  std::vector<float> out(static_cast<size_t>(numel_));
  for (int64_t i = 0; i < numel_; ++i) {
    switch (dtype_) {
      case DType::F32: out[i] = host.data<float>()[i]; break;
      case DType::BF16: out[i] = host.data<BFloat16>()[i]; break;
      case DType::I32: out[i] = static_cast<float>(host.data<int32_t>()[i]); break;
    }
  }
  return out;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return format("Tensor({}, {}, {})", shape_str(shape_), dtype_, device());
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

bool memory_overlaps(const Tensor& a, const Tensor& b) {
  if (a.nbytes() == 0 || b.nbytes() == 0) return false;
  const auto pa = reinterpret_cast<uintptr_t>(a.raw_data());
  const auto pb = reinterpret_cast<uintptr_t>(b.raw_data());
  return pa < pb + b.nbytes() && pb < pa + a.nbytes();
}

}  // namespace st
