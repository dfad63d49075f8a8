// Tensor: construction, views, copies, typed access, allocator accounting,
// and what happens when a GPU is asked for.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/cuda/cuda_runtime.h"
#include "core/tensor.h"
#include "tests/harness/test_util.h"

namespace {

using st::BFloat16;
using st::Device;
using st::DType;
using st::Shape;
using st::Tensor;

using st::test::error_of;

std::vector<float> iota_floats(int64_t n, float start = 0.0f) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = start + static_cast<float>(i);
  return v;
}

TEST(TensorShape, NumelAndShapeStr) {
  EXPECT_EQ(st::shape_numel({}), 1);
  EXPECT_EQ(st::shape_numel({2, 3, 4}), 24);
  EXPECT_EQ(st::shape_numel({5, 0, 3}), 0);
  EXPECT_EQ(st::shape_str({2, 3}), "[2, 3]");
  EXPECT_EQ(st::shape_str({}), "[]");
  EXPECT_THROW(st::shape_numel({2, -3}), st::Error);
}

TEST(TensorBasics, UndefinedTensor) {
  Tensor t;
  EXPECT_FALSE(t.defined());
  EXPECT_EQ(t.str(), "Tensor(undefined)");
  EXPECT_THROW(t.raw_data(), st::Error);
  EXPECT_THROW(t.view({1}), st::Error);
}

TEST(TensorBasics, EmptyReportsShapeDtypeDeviceAndBytes) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::BF16);
  EXPECT_TRUE(t.defined());
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.dim(), 3);
  EXPECT_EQ(t.size(0), 2);
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 48u);
  EXPECT_EQ(t.dtype(), DType::BF16);
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(t.storage_offset(), 0);
  EXPECT_EQ(t.str(), "Tensor([2, 3, 4], BF16, cpu)");
  std::string msg = error_of([&] { (void)t.size(3); });
  EXPECT_NE(msg.find("[2, 3, 4]"), std::string::npos) << msg;

  Tensor scalar = Tensor::empty({}, DType::F32);
  EXPECT_EQ(scalar.numel(), 1);
  EXPECT_EQ(scalar.nbytes(), 4u);
  Tensor none = Tensor::empty({3, 0}, DType::I32);
  EXPECT_EQ(none.numel(), 0);
  EXPECT_EQ(none.nbytes(), 0u);
}

TEST(TensorBasics, ZerosAndFull) {
  Tensor z = Tensor::zeros({3, 5}, DType::F32);
  for (float v : z.span<float>()) EXPECT_EQ(v, 0.0f);
  Tensor zb = Tensor::zeros({7}, DType::BF16);
  for (BFloat16 v : zb.span<BFloat16>()) EXPECT_EQ(v.bits, 0);

  Tensor f = Tensor::full({4}, 2.5, DType::F32);
  for (float v : f.span<float>()) EXPECT_EQ(v, 2.5f);
  // 1 + 2^-8 is a BF16 tie: rounds to even, 1.0 (0x3f80).
  Tensor fb = Tensor::full({4}, 1.0 + 1.0 / 256.0, DType::BF16);
  for (BFloat16 v : fb.span<BFloat16>()) EXPECT_EQ(v.bits, 0x3f80);
  // 1 + 3 * 2^-8 ties to the even neighbour above, 1 + 2^-6 (0x3f82).
  Tensor fb2 = Tensor::full({2}, 1.0 + 3.0 / 256.0, DType::BF16);
  for (BFloat16 v : fb2.span<BFloat16>()) EXPECT_EQ(v.bits, 0x3f82);
  // I32 truncates towards zero.
  Tensor fi = Tensor::full({2}, 2.7, DType::I32);
  for (int32_t v : fi.span<int32_t>()) EXPECT_EQ(v, 2);
  Tensor fn = Tensor::full({2}, -2.7, DType::I32);
  for (int32_t v : fn.span<int32_t>()) EXPECT_EQ(v, -2);
}

TEST(TensorBasics, FromVectorKeepsValuesAndDtype) {
  Tensor f = Tensor::from_vector(std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f}, {2, 3});
  EXPECT_EQ(f.dtype(), DType::F32);
  EXPECT_EQ(f.to_floats(), (std::vector<float>{1.5f, -2.0f, 3.25f, 0.0f, 7.0f, 8.0f}));

  Tensor b = Tensor::from_vector(std::vector<BFloat16>{BFloat16::from_bits(0x3f80), BFloat16::from_bits(0xc040)}, {2});
  EXPECT_EQ(b.dtype(), DType::BF16);
  EXPECT_EQ(b.to_floats(), (std::vector<float>{1.0f, -3.0f}));

  Tensor i = Tensor::from_vector(std::vector<int32_t>{7, -9, 2147483647}, {3});
  EXPECT_EQ(i.dtype(), DType::I32);
  EXPECT_EQ(i.span<int32_t>()[2], 2147483647);

  std::string msg = error_of([] { Tensor::from_vector(std::vector<float>{1, 2, 3}, {2, 2}); });
  EXPECT_NE(msg.find("[2, 2]"), std::string::npos) << msg;
}

TEST(TensorBasics, FromFloatsRoundsToDtype) {
  std::vector<float> values = {1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -0.0f, 3.0f};
  Tensor b = Tensor::from_floats(values, {4}, DType::BF16);
  auto s = b.span<BFloat16>();
  EXPECT_EQ(s[0].bits, 0x3f80);
  EXPECT_EQ(s[1].bits, 0x3f82);
  EXPECT_EQ(s[2].bits, 0x8000);
  EXPECT_EQ(s[3].bits, 0x4040);
  Tensor f = Tensor::from_floats(values, {2, 2}, DType::F32);
  EXPECT_EQ(f.to_floats(), values);
  EXPECT_THROW(Tensor::from_floats(values, {3}, DType::F32), st::Error);
}

TEST(TensorViews, ViewInfersMinusOneAndSharesStorage) {
  Tensor t = Tensor::from_floats(iota_floats(24), {2, 3, 4}, DType::F32);
  Tensor v = t.view({-1, 4});
  EXPECT_EQ(v.shape(), (Shape{6, 4}));
  EXPECT_TRUE(v.shares_storage_with(t));
  EXPECT_EQ(t.view({2, -1}).shape(), (Shape{2, 12}));
  EXPECT_EQ(t.view({24}).shape(), (Shape{24}));
  EXPECT_EQ(t.view({-1}).shape(), (Shape{24}));
  v.data<float>()[5] = 100.0f;
  EXPECT_EQ(t.to_floats()[5], 100.0f);
}

TEST(TensorViews, ViewErrorsNameTheShapes) {
  Tensor t = Tensor::empty({2, 3, 4}, DType::F32);
  std::string msg = error_of([&] { t.view({5, -1}); });
  EXPECT_NE(msg.find("[2, 3, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[5, -1]"), std::string::npos) << msg;
  msg = error_of([&] { t.view({7, 3}); });
  EXPECT_NE(msg.find("[2, 3, 4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[7, 3]"), std::string::npos) << msg;
  msg = error_of([&] { t.view({-1, -1}); });
  EXPECT_NE(msg.find("[-1, -1]"), std::string::npos) << msg;
  msg = error_of([&] { t.view({-2, -12}); });
  EXPECT_NE(msg.find("[-2, -12]"), std::string::npos) << msg;
}

TEST(TensorViews, FlatSliceWritesThroughToBase) {
  Tensor base = Tensor::from_floats(iota_floats(10), {2, 5}, DType::F32);
  Tensor s = base.flat_slice(3, 4);
  EXPECT_EQ(s.shape(), (Shape{4}));
  EXPECT_EQ(s.storage_offset(), 3);
  EXPECT_TRUE(s.shares_storage_with(base));
  EXPECT_EQ(s.to_floats(), (std::vector<float>{3, 4, 5, 6}));
  s.data<float>()[0] = -1.0f;
  s.data<float>()[3] = -2.0f;
  // A slice of a slice adds the offsets.
  Tensor ss = s.flat_slice(1, 2);
  EXPECT_EQ(ss.storage_offset(), 4);
  ss.data<float>()[1] = -3.0f;
  EXPECT_EQ(base.to_floats(), (std::vector<float>{0, 1, 2, -1, 4, -3, -2, 7, 8, 9}));
  EXPECT_EQ(base.flat_slice(10, 0).numel(), 0);
}

TEST(TensorViews, FlatSliceBoundsAreChecked) {
  Tensor base = Tensor::empty({10}, DType::BF16);
  EXPECT_THROW(base.flat_slice(8, 3), st::Error);
  EXPECT_THROW(base.flat_slice(-1, 2), st::Error);
  EXPECT_THROW(base.flat_slice(0, -1), st::Error);
  EXPECT_THROW(base.flat_slice(11, 0), st::Error);
  std::string msg = error_of([&] { base.flat_slice(8, 3); });
  EXPECT_NE(msg.find("10"), std::string::npos) << msg;
}

TEST(TensorViews, Narrow0SelectsRows) {
  Tensor base = Tensor::from_floats(iota_floats(12), {4, 3}, DType::F32);
  Tensor rows = base.narrow0(1, 2);
  EXPECT_EQ(rows.shape(), (Shape{2, 3}));
  EXPECT_EQ(rows.storage_offset(), 3);
  EXPECT_EQ(rows.to_floats(), (std::vector<float>{3, 4, 5, 6, 7, 8}));
  rows.data<float>()[0] = 42.0f;
  EXPECT_EQ(base.to_floats()[3], 42.0f);
  EXPECT_EQ(base.narrow0(4, 0).numel(), 0);
  std::string msg = error_of([&] { base.narrow0(3, 2); });
  EXPECT_NE(msg.find("[4, 3]"), std::string::npos) << msg;
  EXPECT_THROW(Tensor::empty({}, DType::F32).narrow0(0, 1), st::Error);
}

TEST(TensorCopies, CopyFromSameDtype) {
  Tensor src = Tensor::from_floats(iota_floats(6, 1.0f), {2, 3}, DType::BF16);
  Tensor dst = Tensor::zeros({3, 2}, DType::BF16);  // same numel, other shape: fine
  dst.copy_from(src);
  EXPECT_EQ(dst.to_floats(), src.to_floats());
  EXPECT_FALSE(dst.shares_storage_with(src));
}

TEST(TensorCopies, CopyFromChecksDtypeAndNumel) {
  Tensor f = Tensor::zeros({4}, DType::F32);
  Tensor b = Tensor::zeros({4}, DType::BF16);
  std::string msg = error_of([&] { f.copy_from(b); });
  EXPECT_NE(msg.find("BF16"), std::string::npos) << msg;
  EXPECT_NE(msg.find("F32"), std::string::npos) << msg;
  Tensor f5 = Tensor::zeros({5}, DType::F32);
  msg = error_of([&] { f.copy_from(f5); });
  EXPECT_NE(msg.find("5"), std::string::npos) << msg;
  EXPECT_THROW(f.copy_from(Tensor()), st::Error);
}

TEST(TensorCopies, CloneAndToAreIndependent) {
  Tensor t = Tensor::from_floats(iota_floats(5), {5}, DType::F32);
  Tensor c = t.clone();
  Tensor h = t.to(Device::cpu());
  EXPECT_FALSE(c.shares_storage_with(t));
  EXPECT_FALSE(h.shares_storage_with(t));
  EXPECT_EQ(c.shape(), t.shape());
  EXPECT_EQ(h.device(), Device::cpu());
  c.data<float>()[0] = 99.0f;
  h.data<float>()[1] = 98.0f;
  EXPECT_EQ(t.to_floats(), iota_floats(5));
  EXPECT_EQ(c.to_floats()[0], 99.0f);
  EXPECT_EQ(h.to_floats()[1], 98.0f);
}

TEST(TensorCopies, CloneOfSliceCopiesOnlyTheSlice) {
  Tensor base = Tensor::from_floats(iota_floats(8), {8}, DType::F32);
  Tensor c = base.flat_slice(2, 3).clone();
  EXPECT_EQ(c.storage_offset(), 0);
  EXPECT_EQ(c.to_floats(), (std::vector<float>{2, 3, 4}));
}

TEST(TensorCopies, ZeroClearsOnlyTheView) {
  Tensor base = Tensor::from_floats(iota_floats(6, 1.0f), {6}, DType::F32);
  base.flat_slice(1, 3).zero_();
  EXPECT_EQ(base.to_floats(), (std::vector<float>{1, 0, 0, 0, 5, 6}));
}

TEST(TensorAccess, WrongDtypeThrows) {
  Tensor t = Tensor::zeros({3}, DType::F32);
  std::string msg = error_of([&] { (void)t.data<BFloat16>(); });
  EXPECT_NE(msg.find("F32"), std::string::npos) << msg;
  EXPECT_NE(msg.find("BF16"), std::string::npos) << msg;
  EXPECT_THROW((void)t.span<int32_t>(), st::Error);
  EXPECT_NO_THROW((void)t.data<float>());
  Tensor i = Tensor::zeros({3}, DType::I32);
  EXPECT_THROW((void)i.data<float>(), st::Error);
}

TEST(TensorAllocation, CpuMemoryIs64ByteAligned) {
  std::vector<Tensor> keep;
  for (int64_t n : {1, 3, 7, 16, 31, 33, 100, 1000}) {
    for (DType t : {DType::F32, DType::BF16, DType::I32}) {
      keep.push_back(Tensor::empty({n}, t));
      auto address = reinterpret_cast<uintptr_t>(keep.back().raw_data());
      EXPECT_EQ(address % st::kCpuAlignment, 0u) << n << " x " << t;
    }
  }
  EXPECT_EQ(st::kCpuAlignment, 64u);
}

TEST(TensorAllocation, AllocatorStatsTrackCurrentAndPeak) {
  st::Allocator& alloc = st::cpu_allocator();
  EXPECT_EQ(&st::allocator_for(Device::cpu()), &alloc);
  const st::AllocatorStats before = alloc.stats();
  {
    Tensor a = Tensor::empty({1000}, DType::F32);  // 4000 bytes
    st::AllocatorStats s = alloc.stats();
    EXPECT_EQ(s.current_bytes, before.current_bytes + 4000);
    EXPECT_EQ(s.num_allocs, before.num_allocs + 1);
    EXPECT_GE(s.peak_bytes, s.current_bytes);
    {
      Tensor b = Tensor::empty({500}, DType::BF16);  // 1000 bytes
      Tensor view = b.view({-1});                    // a view allocates nothing
      EXPECT_EQ(alloc.stats().current_bytes, before.current_bytes + 5000);
      EXPECT_EQ(alloc.stats().num_allocs, before.num_allocs + 2);
    }
    EXPECT_EQ(alloc.stats().current_bytes, before.current_bytes + 4000);
  }
  st::AllocatorStats after = alloc.stats();
  EXPECT_EQ(after.current_bytes, before.current_bytes);
  EXPECT_GE(after.peak_bytes, before.current_bytes + 5000);

  alloc.reset_peak();
  EXPECT_EQ(alloc.stats().peak_bytes, alloc.stats().current_bytes);
  {
    Tensor c = Tensor::empty({256}, DType::F32);  // 1024 bytes
  }
  EXPECT_EQ(alloc.stats().peak_bytes, after.current_bytes + 1024);
  EXPECT_EQ(alloc.stats().current_bytes, after.current_bytes);
}

TEST(TensorAllocation, ALargeBlockFreedIsReusedForTheSameSize) {
  // A training step repeats its allocations: the second one of a size gets
  // the block the first gave back (no fresh pages), and the counters still
  // describe tensors only.
  st::Allocator& alloc = st::cpu_allocator();
  const int64_t before = alloc.stats().current_bytes;
  const void* first = nullptr;
  {
    Tensor a = Tensor::empty({1 << 18}, DType::F32);  // 1 MiB
    first = a.raw_data();
  }
  EXPECT_EQ(alloc.stats().current_bytes, before);
  Tensor b = Tensor::empty({1 << 18}, DType::F32);
  EXPECT_EQ(b.raw_data(), first);
  EXPECT_EQ(alloc.stats().current_bytes, before + (1 << 20));
  // Another size never gets that block while it is in use, nor a smaller one.
  Tensor c = Tensor::empty({(1 << 18) + 16}, DType::F32);
  EXPECT_NE(c.raw_data(), first);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.raw_data()) % st::kCpuAlignment, 0u);
}

TEST(TensorAllocation, StorageOutlivesTheTensorThatMadeIt) {
  const int64_t before = st::cpu_allocator().stats().current_bytes;
  Tensor slice;
  {
    Tensor base = Tensor::from_floats(iota_floats(16), {16}, DType::F32);
    slice = base.flat_slice(4, 2);
  }
  EXPECT_EQ(st::cpu_allocator().stats().current_bytes, before + 64);
  EXPECT_EQ(slice.to_floats(), (std::vector<float>{4, 5}));
  slice = Tensor();
  EXPECT_EQ(st::cpu_allocator().stats().current_bytes, before);
}

TEST(TensorCuda, RequestingAGpuWithoutOneThrows) {
  if (st::cuda::device_count() > 0) GTEST_SKIP() << "a GPU is present; this checks the no-GPU behaviour";
  std::string msg = error_of([] { Tensor::empty({4}, DType::F32, Device::cuda(0)); });
  EXPECT_NE(msg.find("cuda:0"), std::string::npos) << msg;
  EXPECT_THROW(st::allocator_for(Device::cuda(1)), st::Error);
  EXPECT_THROW(Tensor::zeros({4}, DType::F32).to(Device::cuda(0)), st::Error);
}

TEST(TensorCuda, RoundTripThroughEachGpu) {
  const int count = st::cuda::device_count();
  if (count == 0) GTEST_SKIP() << "no GPU";
  EXPECT_TRUE(st::cuda::compiled_with_cuda());
  for (int index = 0; index < count; ++index) {
    st::Allocator& alloc = st::allocator_for(Device::cuda(index));
    EXPECT_EQ(alloc.device(), Device::cuda(index));
    const st::AllocatorStats before = alloc.stats();
    Tensor host = Tensor::from_floats(iota_floats(1000, -500.0f), {10, 100}, DType::F32);
    Tensor dev = host.to(Device::cuda(index));
    EXPECT_EQ(dev.device(), Device::cuda(index));
    EXPECT_EQ(alloc.stats().current_bytes, before.current_bytes + 4000);
    Tensor dev2 = dev.clone();  // device to device
    dev.zero_();
    EXPECT_EQ(dev2.to_floats(), host.to_floats());
    EXPECT_EQ(dev.to_floats(), std::vector<float>(1000, 0.0f));
    // A slice on the device copies from the right offset.
    EXPECT_EQ(dev2.flat_slice(500, 2).to_floats(), (std::vector<float>{0.0f, 1.0f}));
    Tensor full = Tensor::full({3}, 1.0 + 1.0 / 256.0, DType::BF16, Device::cuda(index));
    EXPECT_EQ(full.to_floats(), std::vector<float>(3, 1.0f));
  }
  if (count >= 2) {
    Tensor a = Tensor::from_floats(iota_floats(64), {64}, DType::F32).to(Device::cuda(0));
    Tensor b = a.to(Device::cuda(1));
    EXPECT_EQ(b.to_floats(), iota_floats(64));
  }
  EXPECT_THROW(st::allocator_for(Device::cuda(count)), st::Error);
}

}  // namespace
