#pragma once
// safetensors files: our own reader and writer for the published format.
//
//   [u64 little-endian N][N bytes of UTF-8 JSON header, space-padded][data]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end]} (offsets relative to the start of the data section) and may
// hold "__metadata__": {string: string}. Only F32, BF16 and I32 are supported.
// The reader treats every file as untrusted input and validates the header
// completely before any data is read; it never loads a whole file.
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checksum.h"
#include "checkpoint/fs.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace st::checkpoint {

/// Headers larger than this are rejected before any allocation (a corrupt
/// length must not make the reader allocate gigabytes).
inline constexpr uint64_t kMaxHeaderBytes = 100'000'000;

/// Where one tensor lives in a file.
struct TensorInfo {
  DType dtype = DType::F32;
  Shape shape;
  uint64_t data_begin = 0;  // absolute file offset of the first byte
  uint64_t nbytes = 0;
};

/// What SafetensorsWriter::write put where.
struct WrittenTensor {
  std::string name;
  uint64_t offset = 0;  // absolute file offset of the first byte
  uint64_t nbytes = 0;
  uint32_t crc32c = 0;  // of the tensor's bytes, as written
  NonFinite nonfinite;  // NaN/Inf elements, counted in the checksum's pass
};

/// A tensor as a header lists it.
struct HeaderTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t nbytes = 0;
};

/// The bytes of a file before its data section: the little-endian length,
/// the JSON header listing `tensors` contiguously in the given order (the
/// JSON's keys come out sorted by name, which readers ignore), and `metadata`
/// as "__metadata__" when not empty, space-padded so the data section starts
/// 8-byte aligned. The data of tensor i starts at header size + the bytes of
/// tensors 0..i-1.
std::string safetensors_header(const std::vector<HeaderTensor>& tensors,
                               const std::map<std::string, std::string>& metadata);

/// The bytes of safetensors file `path` before its data section: the 8-byte
/// length and the header it gives, unparsed (what the COMPLETE marker's
/// header checksum covers, index.h). Throws naming the file when it is not a
/// regular file, is shorter than its header, or gives a length above
/// kMaxHeaderBytes.
std::string read_header_bytes(const std::string& path);

/// Collects tensors and metadata, then writes one file. Tensors are laid out
/// contiguously in the order they were added (callers choose the order, e.g.
/// to keep a model's parameters in definition order); the header's JSON keys
/// come out sorted by name, which readers ignore.
class SafetensorsWriter {
 public:
  /// Adds a CPU tensor; the writer keeps the handle, so the data stays alive.
  void add(const std::string& name, const Tensor& tensor);
  /// Adds raw little-endian bytes; `bytes` must stay valid until write().
  void add(const std::string& name, DType dtype, const Shape& shape, std::span<const std::byte> bytes);
  /// Sets one "__metadata__" entry (replacing an earlier value for `key`).
  void set_metadata(const std::string& key, const std::string& value);

  /// Writes the file (replacing any existing one), fsyncs it and returns one
  /// entry per tensor in layout order. A failed write removes the partial file.
  std::vector<WrittenTensor> write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType dtype;
    Shape shape;
    std::span<const std::byte> bytes;
    Tensor keep_alive;  // undefined for span entries
  };
  void check_new_name(const std::string& name) const;

  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// An open, validated safetensors file. Reads are positional (pread), so one
/// SafetensorsFile may serve several threads reading different ranges.
class SafetensorsFile {
 public:
  /// Opens and validates `path`; throws st::Error naming the file (and the
  /// tensor) on any malformed header.
  explicit SafetensorsFile(std::string path);

  const std::string& path() const { return path_; }
  /// Tensor names in file order (ascending data offset).
  const std::vector<std::string>& names() const { return names_; }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  /// Throws if there is no tensor `name`.
  const TensorInfo& info(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Size of the whole file in bytes.
  uint64_t file_size() const { return file_size_; }

  /// Copies bytes [byte_begin, byte_begin + nbytes) of tensor `name` into `dst`.
  void read(const std::string& name, uint64_t byte_begin, uint64_t nbytes, void* dst) const;
  /// The whole tensor as a new CPU tensor.
  Tensor read_tensor(const std::string& name) const;

 private:
  void parse_header();

  std::string path_;
  UniqueFd fd_;
  uint64_t file_size_ = 0;
  std::vector<std::string> names_;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace st::checkpoint
