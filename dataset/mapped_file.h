#pragma once
// A read-only memory map of a whole file: token files can be far larger than
// memory, and only the pages a reader touches are ever read (the datasets'
// sampled windows, prepare's pieces of text).
#include <cstddef>
#include <filesystem>
#include <string_view>

namespace st::dataset {

class MappedFile {
 public:
  /// Maps `path`, which must be a regular file (open_regular_file: a FIFO or
  /// a device is refused without blocking); errors name it as "<what> file
  /// '<path>'". An empty file maps to size() 0.
  MappedFile(const std::filesystem::path& path, std::string_view what);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&&) = delete;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  std::string_view text() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace st::dataset
