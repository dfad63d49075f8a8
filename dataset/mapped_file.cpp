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

namespace st::dataset {

namespace {

std::string errno_text() { return std::error_code(errno, std::generic_category()).message(); }

}  // namespace

MappedFile::MappedFile(const std::filesystem::path& path, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ST_CHECK(fd >= 0, "cannot open {} file '{}': {}", what, path.string(), errno_text());
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const std::string reason = errno_text();
    ::close(fd);
    ST_FAIL("cannot stat {} file '{}': {}", what, path.string(), reason);
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const std::string reason = p == MAP_FAILED ? errno_text() : std::string();
    ::close(fd);  // the mapping keeps the file alive
    ST_CHECK(p != MAP_FAILED, "cannot map {} file '{}' ({} bytes): {}", what, path.string(), size_, reason);
    data_ = static_cast<const unsigned char*>(p);
  } else {
    ::close(fd);
  }
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<unsigned char*>(data_), size_);
}

}  // namespace st::dataset
