// The whole of a node-local step for a load (node_local.h).
#include "checkpoint/node_local.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint/fs.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"

namespace st::checkpoint {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Small files (indexes, trainer_state.json, config.json, the tokenizer) travel
// whole; larger ones that are not tensor data are not needed to load.
constexpr uintmax_t kMaxSmallFile = uintmax_t{16} << 20;

std::string to_hex(std::string_view bytes) {
  static constexpr char kHexDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) {
    out += kHexDigits[c >> 4];
    out += kHexDigits[c & 15];
  }
  return out;
}

std::string from_hex(const std::string& hex) {
  std::string out(hex.size() / 2, '\0');
  auto value = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<char>(value(hex[2 * i]) << 4 | value(hex[2 * i + 1]));
  return out;
}

// What this host holds of the step: each regular file with its size, and the
// header (data files) or the whole text (small files).
json list_step(const fs::path& dir) {
  json files = json::array();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    std::error_code type_ec;
    if (!e.is_regular_file(type_ec)) continue;
    const std::string name = e.path().filename().string();
    const uintmax_t size = e.file_size();
    if (name.ends_with(".safetensors")) {
      files.push_back(
          {{"name", name}, {"size", size}, {"data", true}, {"bytes", to_hex(read_header_bytes(e.path().string()))}});
    } else if (size <= kMaxSmallFile) {
      files.push_back(
          {{"name", name}, {"size", size}, {"data", false}, {"bytes", to_hex(read_file(e.path(), "checkpoint file"))}});
    }
  }
  return files;
}

// A stand-in for another host's data file: its header, then a hole as long as its data.
void write_stand_in(const fs::path& path, const std::string& header, uintmax_t size) {
  const UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ST_CHECK(fd.valid(), "cannot create '{}': {}", path.string(), errno_text());
  pwrite_all(fd.get(), header.data(), header.size(), 0, path.string());
  ST_CHECK(::ftruncate(fd.get(), static_cast<off_t>(size)) == 0, "cannot size '{}': {}", path.string(), errno_text());
}

}  // namespace

NodeLocalStep::NodeLocalStep(const std::string& dir, const StorageTopology& topology, ProcessGroup& group) {
  const int me = group.rank();
  const bool lead = topology.leads_host(me);
  json mine = json::array();
  run_on_every_rank(group, [&] {
    if (lead) mine = list_step(dir);
  });
  const std::vector<std::string> lists = all_gather_strings(group, mine.dump());
  // name -> (hosts holding it, the first host's listing)
  std::map<std::string, std::pair<std::vector<int>, json>> files;
  for (int h = 0; h < topology.host_count(); ++h) {
    const int leader = topology.ranks_of_host(h).front();
    for (const json& f : json::parse(lists[static_cast<size_t>(leader)])) {
      auto& [hosts, first] = files[f.at("name").get<std::string>()];
      if (hosts.empty()) first = f;
      hosts.push_back(h);
    }
  }
  for (const auto& [name, held] : files) {
    if (!held.second.at("data").get<bool>()) continue;
    std::vector<int>& ranks = readers_[name];
    for (int h : held.first)
      for (int r : topology.ranks_of_host(h)) ranks.push_back(r);
    std::sort(ranks.begin(), ranks.end());
  }
  const int my_host = topology.host_of_rank[static_cast<size_t>(me)];
  const fs::path src(dir);
  const fs::path view = src.parent_path() / format(".tmp-load-{}-{}", src.filename().string(), ::getpid());
  std::string made;
  run_on_every_rank(group, [&] {
    if (!lead) return;
    std::error_code ec;
    fs::remove_all(view, ec);
    fs::create_directories(view, ec);
    ST_CHECK(!ec, "cannot create '{}': {}", view.string(), ec.message());
    made_ = true;
    made = view.string();
    for (const auto& [name, held] : files) {
      const json& f = held.second;
      const bool here = std::find(held.first.begin(), held.first.end(), my_host) != held.first.end();
      if (here && f.at("data").get<bool>()) {
        fs::create_hard_link(src / name, view / name, ec);
        if (!ec) continue;
        ec.clear();
      }
      const std::string bytes = from_hex(f.at("bytes").get<std::string>());
      if (f.at("data").get<bool>()) {
        write_stand_in(view / name, bytes, f.at("size").get<uintmax_t>());
      } else {
        write_file_synced(view / name, bytes);
      }
    }
  });
  view_ = all_gather_strings(group, made)[static_cast<size_t>(topology.ranks_of_host(my_host).front())];
}

NodeLocalStep::~NodeLocalStep() {
  if (!made_) return;
  std::error_code ec;  // a leftover is debris that retention removes (".tmp-" with another pid)
  fs::remove_all(view_, ec);
}

}  // namespace st::checkpoint
