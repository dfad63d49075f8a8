#include "checkpoint/safetensors.h"

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <optional>
#include <system_error>
#include <tuple>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checksum.h"
#include "core/error.h"
#include "core/text.h"

namespace st::checkpoint {
namespace {

using nlohmann::json;

// Linux transfers at most ~2 GiB per read/write call; staying below that keeps
// one code path for every size and lets a short transfer be retried cleanly.
constexpr size_t kMaxChunk = size_t{1} << 30;

void pread_all(int fd, std::byte* p, size_t n, uint64_t offset, const std::string& path) {
  while (n > 0) {
    ssize_t got = ::pread(fd, p, std::min(n, kMaxChunk), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    ST_CHECK(got >= 0, "reading safetensors file '{}' at offset {} failed: {}", path, offset, errno_text(errno));
    // The header was validated against fstat's size, so EOF here means the
    // file shrank after it was opened.
    ST_CHECK(got > 0, "safetensors file '{}': unexpected end of file at offset {} (was it truncated while open?)", path,
             offset);
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
}

void store_le64(uint64_t v, std::byte* out) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<std::byte>((v >> (8 * i)) & 0xffu);
}

uint64_t load_le64(const std::byte* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(in[i]) << (8 * i);
  return v;
}

// Element count with overflow detection; nullopt when a product overflows
// int64 (a hostile header could otherwise wrap around to a plausible size).
std::optional<uint64_t> checked_numel(const Shape& shape) {
  uint64_t n = 1;
  for (int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) || n > static_cast<uint64_t>(INT64_MAX))
      return std::nullopt;
  return n;
}

}  // namespace

// --- SafetensorsWriter -----------------------------------------------------------

void SafetensorsWriter::check_new_name(const std::string& name) const {
  ST_CHECK(!name.empty(), "SafetensorsWriter: empty tensor name");
  ST_CHECK(name != "__metadata__", "SafetensorsWriter: '__metadata__' is reserved and cannot name a tensor");
  ST_CHECK(find_invalid_utf8(name) < 0, "SafetensorsWriter: tensor name '{}' is not valid UTF-8", name);
  bool duplicate = std::any_of(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.name == name; });
  ST_CHECK(!duplicate, "SafetensorsWriter: duplicate tensor name '{}'", name);
}

void SafetensorsWriter::add(const std::string& name, const Tensor& tensor) {
  ST_CHECK(tensor.defined(), "SafetensorsWriter: tensor '{}' is undefined", name);
  ST_CHECK(tensor.device().is_cpu(), "SafetensorsWriter: tensor '{}' is on {}; copy it to the CPU first", name,
           tensor.device());
  check_new_name(name);
  // Tensor views are always contiguous, so the bytes are one range.
  std::span<const std::byte> bytes(static_cast<const std::byte*>(tensor.raw_data()), tensor.nbytes());
  entries_.push_back({name, tensor.dtype(), tensor.shape(), bytes, tensor});
}

void SafetensorsWriter::add(const std::string& name, DType dtype, const Shape& shape,
                            std::span<const std::byte> bytes) {
  check_new_name(name);
  for (int64_t d : shape)
    ST_CHECK(d >= 0, "SafetensorsWriter: tensor '{}' has negative shape {}", name, shape_str(shape));
  auto numel = checked_numel(shape);
  ST_CHECK(numel && *numel * dtype_size(dtype) == bytes.size(),
           "SafetensorsWriter: tensor '{}' of shape {} and dtype {} needs {} bytes but {} were given", name,
           shape_str(shape), dtype, numel ? *numel * dtype_size(dtype) : 0, bytes.size());
  ST_CHECK(bytes.data() != nullptr || bytes.empty(), "SafetensorsWriter: tensor '{}' has no data", name);
  entries_.push_back({name, dtype, shape, bytes, Tensor()});
}

void SafetensorsWriter::set_metadata(const std::string& key, const std::string& value) {
  ST_CHECK(find_invalid_utf8(key) < 0 && find_invalid_utf8(value) < 0,
           "SafetensorsWriter: metadata key '{}' or its value is not valid UTF-8", key);
  metadata_[key] = value;
}

std::string safetensors_header(const std::vector<HeaderTensor>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t cursor = 0;
  for (const HeaderTensor& t : tensors) {
    header[t.name] = {
        {"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {cursor, cursor + t.nbytes}}};
    cursor += t.nbytes;
  }
  std::string text = header.dump();
  // Spaces (valid JSON whitespace) pad the header so the data section starts
  // 8-byte aligned, which lets readers mmap it and view elements in place.
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  std::string out(8, '\0');
  store_le64(text.size(), reinterpret_cast<std::byte*>(out.data()));
  return out + text;
}

std::vector<WrittenTensor> SafetensorsWriter::write(const std::string& path) const {
  std::vector<HeaderTensor> listed;
  for (const Entry& e : entries_) listed.push_back({e.name, e.dtype, e.shape, e.bytes.size()});
  const std::string head = safetensors_header(listed, metadata_);
  const uint64_t data_start = head.size();

  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ST_CHECK(fd.valid(), "cannot create safetensors file '{}': {}", path, errno_text(errno));
  std::vector<WrittenTensor> written;
  written.reserve(entries_.size());
  try {
    const std::string what = format("safetensors file '{}'", path);
    write_all(fd.get(), head.data(), head.size(), what);
    uint64_t offset = data_start;
    for (const Entry& e : entries_) {
      const TensorScan scan = crc32c_and_scan(e.bytes, e.dtype);
      written.push_back({e.name, offset, e.bytes.size(), scan.crc32c, scan.nonfinite});
      write_all(fd.get(), e.bytes.data(), e.bytes.size(), what);
      offset += e.bytes.size();
    }
    fsync_fd(fd.get(), what);
    // close() can report a deferred write error (e.g. NFS); do not drop it.
    fd.close_checked(path);
  } catch (...) {
    ::unlink(path.c_str());  // a partial file must never look like a checkpoint
    throw;
  }
  return written;
}

// --- SafetensorsFile -------------------------------------------------------------

SafetensorsFile::SafetensorsFile(std::string path) : path_(std::move(path)) {
  fd_ = open_regular_file(path_, "safetensors file");
  struct stat st {};
  ST_CHECK(::fstat(fd_.get(), &st) == 0, "cannot stat safetensors file '{}': {}", path_, errno_text(errno));
  file_size_ = static_cast<uint64_t>(st.st_size);
  parse_header();
}

namespace {

// The header's JSON object, after the length and encoding checks.
json read_header_json(int fd, uint64_t file_size, const std::string& path, uint64_t& header_len) {
  ST_CHECK(file_size >= 8, "safetensors file '{}' is truncated: {} bytes, too short for the 8-byte header length", path,
           file_size);
  std::byte len_bytes[8];
  pread_all(fd, len_bytes, 8, 0, path);
  header_len = load_le64(len_bytes);
  ST_CHECK(header_len <= kMaxHeaderBytes, "safetensors file '{}': header length {} exceeds the limit of {} bytes", path,
           header_len, kMaxHeaderBytes);
  ST_CHECK(header_len <= file_size - 8,
           "safetensors file '{}': header length {} runs past the end of the file ({} bytes)", path, header_len,
           file_size);
  std::string text(header_len, '\0');
  pread_all(fd, reinterpret_cast<std::byte*>(text.data()), text.size(), 8, path);
  // Checked here rather than left to the JSON parser so the message can say
  // where the bad byte is, whatever the parser's own policy on encodings.
  const int64_t bad = find_invalid_utf8(text);
  ST_CHECK(
      bad < 0, "safetensors file '{}': header is not valid UTF-8 (byte 0x{} at header offset {})", path,
      [&] {
        const char* hex = "0123456789ABCDEF";
        auto c = static_cast<unsigned char>(text[static_cast<size_t>(bad < 0 ? 0 : bad)]);
        return std::string{hex[c >> 4], hex[c & 15]};
      }(),
      bad);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    ST_FAIL("safetensors file '{}': header is not valid JSON: {}", path, e.what());
  }
  ST_CHECK(header.is_object(), "safetensors file '{}': header is a JSON {}, not an object", path, header.type_name());
  return header;
}

std::map<std::string, std::string> parse_metadata(const json& entry, const std::string& path) {
  ST_CHECK(entry.is_object(), "safetensors file '{}': __metadata__ is a JSON {}, not an object", path,
           entry.type_name());
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : entry.items()) {
    ST_CHECK(value.is_string(), "safetensors file '{}': __metadata__ value for key '{}' is a JSON {}, not a string",
             path, key, value.type_name());
    out[key] = value.get<std::string>();
  }
  return out;
}

Shape parse_shape(const json& shape_json, const std::string& where) {
  ST_CHECK(shape_json.is_array(), "{}: 'shape' is a JSON {}, not an array", where, shape_json.type_name());
  Shape shape;
  for (const json& d : shape_json) {
    // nlohmann parses non-negative integer literals as unsigned, negative
    // ones as signed and anything with '.' or 'e' as float.
    ST_CHECK(!d.is_number_integer() || d.is_number_unsigned(), "{}: shape {} has a negative dimension", where,
             shape_json.dump());
    ST_CHECK(d.is_number_unsigned() && d.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX),
             "{}: shape {} must hold non-negative integers", where, shape_json.dump());
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

// One tensor's bytes within the data section.
struct Span {
  uint64_t begin, end;
  std::string name;
};

// Checks one tensor entry of the header; `info.data_begin` is relative to the data section.
TensorInfo parse_tensor(const std::string& name, const json& entry, const std::string& path, Span& span) {
  const std::string where = format("tensor '{}' in file '{}'", name, path);
  ST_CHECK(entry.is_object(), "{}: entry is a JSON {}, not an object", where, entry.type_name());
  for (const auto& [field, unused] : entry.items())
    ST_CHECK(field == "dtype" || field == "shape" || field == "data_offsets", "{}: unexpected field '{}'", where,
             field);
  for (const char* field : {"dtype", "shape", "data_offsets"})
    ST_CHECK(entry.contains(field), "{}: missing field '{}'", where, field);

  const json& dtype_json = entry["dtype"];
  ST_CHECK(dtype_json.is_string(), "{}: 'dtype' is a JSON {}, not a string", where, dtype_json.type_name());
  const auto dtype_text = dtype_json.get<std::string>();
  const std::optional<DType> dtype = dtype_from_name(dtype_text);
  ST_CHECK(dtype.has_value(), "unknown dtype '{}' for tensor '{}' in file '{}' (supported: F32, BF16, I32)", dtype_text,
           name, path);
  Shape shape = parse_shape(entry["shape"], where);

  const json& offsets_json = entry["data_offsets"];
  ST_CHECK(offsets_json.is_array() && offsets_json.size() == 2 && offsets_json[0].is_number_unsigned() &&
               offsets_json[1].is_number_unsigned(),
           "{}: 'data_offsets' must be two non-negative integers, got {}", where, offsets_json.dump());
  const auto begin = offsets_json[0].get<uint64_t>();
  const auto end = offsets_json[1].get<uint64_t>();
  ST_CHECK(begin <= end, "{}: data_offsets [{}, {}] end before they begin", where, begin, end);

  const std::optional<uint64_t> numel = checked_numel(shape);
  uint64_t nbytes = 0;
  ST_CHECK(numel && !__builtin_mul_overflow(*numel, dtype_size(*dtype), &nbytes), "{}: shape {} has too many elements",
           where, shape_str(shape));
  ST_CHECK(nbytes == end - begin, "{}: shape {} of {} needs {} bytes but data_offsets span {}", where, shape_str(shape),
           *dtype, nbytes, end - begin);
  span = Span{begin, end, name};
  return TensorInfo{*dtype, std::move(shape), begin, nbytes};
}

// The data section must be tiled exactly: an overlap would let one write
// clobber another tensor, a gap or trailing bytes mean a damaged file.
// Returns the names in file order.
std::vector<std::string> check_tiling(std::vector<Span> spans, uint64_t data_size, const std::string& path) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::vector<std::string> names;
  uint64_t cursor = 0;
  const std::string* previous = nullptr;
  for (const Span& s : spans) {
    const std::string where = format("tensor '{}' in file '{}'", s.name, path);
    ST_CHECK(s.end <= data_size, "{}: data_offsets [{}, {}] run past the end of the {}-byte data section", where,
             s.begin, s.end, data_size);
    ST_CHECK(s.begin >= cursor, "{}: data_offsets [{}, {}] overlap tensor '{}', which ends at {}", where, s.begin,
             s.end, *previous, cursor);
    ST_CHECK(s.begin == cursor, "{}: data_offsets [{}, {}] leave a gap of {} bytes after {}", where, s.begin, s.end,
             s.begin - cursor, previous ? format("tensor '{}'", *previous) : std::string("the header"));
    cursor = s.end;
    previous = &s.name;
    names.push_back(s.name);
  }
  ST_CHECK(cursor == data_size, "safetensors file '{}': {} unused bytes after {} at the end of the data section", path,
           data_size - cursor, previous ? format("tensor '{}'", *previous) : std::string("the header"));
  return names;
}

}  // namespace

void SafetensorsFile::parse_header() {
  uint64_t header_len = 0;
  const json header = read_header_json(fd_.get(), file_size_, path_, header_len);
  const uint64_t data_start = 8 + header_len;
  std::vector<Span> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      metadata_ = parse_metadata(entry, path_);
      continue;
    }
    Span span;
    TensorInfo info = parse_tensor(name, entry, path_, span);
    info.data_begin += data_start;
    tensors_[name] = std::move(info);
    spans.push_back(std::move(span));
  }
  names_ = check_tiling(std::move(spans), file_size_ - data_start, path_);
}

std::string read_header_bytes(const std::string& path) {
  const UniqueFd fd = open_regular_file(path, "safetensors file");
  struct stat st {};
  ST_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat safetensors file '{}': {}", path, errno_text(errno));
  const auto file_size = static_cast<uint64_t>(st.st_size);
  ST_CHECK(file_size >= 8, "safetensors file '{}' is truncated: {} bytes, too short for the 8-byte header length", path,
           file_size);
  std::string out(8, '\0');
  pread_all(fd.get(), reinterpret_cast<std::byte*>(out.data()), 8, 0, path);
  const uint64_t header_len = load_le64(reinterpret_cast<const std::byte*>(out.data()));
  ST_CHECK(header_len <= kMaxHeaderBytes, "safetensors file '{}': header length {} exceeds the limit of {} bytes", path,
           header_len, kMaxHeaderBytes);
  ST_CHECK(header_len <= file_size - 8,
           "safetensors file '{}': header length {} runs past the end of the file ({} bytes)", path, header_len,
           file_size);
  out.resize(8 + header_len);
  pread_all(fd.get(), reinterpret_cast<std::byte*>(out.data()) + 8, header_len, 8, path);
  return out;
}

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = tensors_.find(name);
  ST_CHECK(it != tensors_.end(), "no tensor '{}' in file '{}'", name, path_);
  return it->second;
}

void SafetensorsFile::read(const std::string& name, uint64_t byte_begin, uint64_t nbytes, void* dst) const {
  const TensorInfo& ti = info(name);
  ST_CHECK(byte_begin <= ti.nbytes && nbytes <= ti.nbytes - byte_begin,
           "tensor '{}' in file '{}': read of bytes [{}, {}+{}) is outside its {} bytes", name, path_, byte_begin,
           byte_begin, nbytes, ti.nbytes);
  if (nbytes == 0) return;
  ST_CHECK(dst != nullptr, "tensor '{}' in file '{}': read into a null buffer", name, path_);
  pread_all(fd_.get(), static_cast<std::byte*>(dst), nbytes, ti.data_begin + byte_begin, path_);
}

Tensor SafetensorsFile::read_tensor(const std::string& name) const {
  const TensorInfo& ti = info(name);
  Tensor t = Tensor::empty(ti.shape, ti.dtype);
  read(name, 0, ti.nbytes, t.raw_data());
  return t;
}

}  // namespace st::checkpoint
