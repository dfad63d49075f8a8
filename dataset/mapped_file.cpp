#include "dataset/mapped_file.h"

#include <cerrno>
#include <string>
#include <system_error>
#include <utility>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/file.h"
#include "core/format.h"

namespace st::dataset {

MappedFile::MappedFile(const std::filesystem::path& path, std::string_view what) {
  // open_regular_file: a FIFO or a device in data.path never blocks the start-up.
  UniqueFd fd = open_regular_file(path, format("{} file", what));
  struct stat st {};
  ST_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat {} file '{}': {}", what, path.string(), errno_text());
  size_ = static_cast<size_t>(st.st_size);
  if (size_ == 0) return;
  void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd.get(), 0);  // the mapping outlives the descriptor
  ST_CHECK(p != MAP_FAILED, "cannot map {} file '{}' ({} bytes): {}", what, path.string(), size_, errno_text());
  data_ = static_cast<const unsigned char*>(p);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace st::dataset
