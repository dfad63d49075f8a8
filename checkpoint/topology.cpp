// Shared or node-local checkpoint.dir: the detection of topology.h.
#include "checkpoint/topology.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <random>

#include <fcntl.h>
#include <unistd.h>

#include "checkpoint/fs.h"
#include "core/error.h"
#include "core/format.h"

namespace st::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr std::array<Named<SharedStorage>, 3> kSharedNames{{
    {SharedStorage::Auto, "auto"},
    {SharedStorage::Yes, "true"},
    {SharedStorage::No, "false"},
}};

constexpr std::string_view kTokenPrefix = ".host-probe-";

std::string join_hosts(const StorageTopology& t, const std::vector<int>& hosts) {
  std::string out;
  for (int h : hosts) {
    if (!out.empty()) out += ", ";
    out += t.hosts[static_cast<size_t>(h)];
  }
  return out;
}

// Writes and fsyncs this host's token (and the directory entry naming it).
void write_token(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ST_CHECK(fd >= 0, "checkpoint.dir: cannot create '{}': {}", path.string(), errno_text(errno));
  const bool synced = ::fsync(fd) == 0;
  const int e = errno;
  ::close(fd);
  ST_CHECK(synced, "checkpoint.dir: cannot fsync '{}': {}", path.string(), errno_text(e));
  fsync_path(path.parent_path(), PathKind::Directory);
}

// The host indices of the tokens of job `nonce` in `dir`, as "0,2,3".
std::string tokens_seen(const fs::path& dir, const std::string& nonce) {
  const std::string prefix = std::string(kTokenPrefix) + nonce + "-";
  std::set<int> seen;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!name.starts_with(prefix)) continue;
    int host = -1;
    const char* first = name.data() + prefix.size();
    const char* last = name.data() + name.size();
    if (auto [p, err] = std::from_chars(first, last, host); err == std::errc() && p == last && host >= 0)
      seen.insert(host);
  }
  std::string out;
  for (int h : seen) {
    if (!out.empty()) out += ',';
    out += std::to_string(h);
  }
  return out;
}

std::set<int> parse_seen(const std::string& text) {
  std::set<int> out;
  size_t at = 0;
  while (at < text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    int h = 0;
    std::from_chars(text.data() + at, text.data() + comma, h);
    out.insert(h);
    at = comma + 1;
  }
  return out;
}

}  // namespace

std::span<const Named<SharedStorage>> names_of(SharedStorage) { return kSharedNames; }

std::vector<int> StorageTopology::ranks_of_host(int host) const {
  std::vector<int> out;
  for (size_t r = 0; r < host_of_rank.size(); ++r)
    if (host_of_rank[r] == host) out.push_back(static_cast<int>(r));
  return out;
}

bool StorageTopology::leads_host(int rank) const {
  const int host = host_of_rank.at(static_cast<size_t>(rank));
  return ranks_of_host(host).front() == rank;
}

std::string StorageTopology::describe(const std::string& dir) const {
  std::vector<int> all(hosts.size());
  for (size_t h = 0; h < hosts.size(); ++h) all[h] = static_cast<int>(h);
  const std::string how = stated ? "checkpoint.shared" : "detected";
  if (hosts.size() <= 1)
    return format("checkpoint.dir {}: one host ({}), one file system", dir, join_hosts(*this, all));
  if (shared)
    return format("checkpoint.dir {}: one file system shared by the {} hosts {} ({})", dir, hosts.size(),
                  join_hosts(*this, all), how);
  return format("checkpoint.dir {}: node-local, each of the {} hosts {} has its own ({})", dir, hosts.size(),
                join_hosts(*this, all), how);
}

StorageTopology group_hosts(std::span<const std::string> rank_hosts) {
  StorageTopology t;
  for (const std::string& host : rank_hosts) {
    const auto it = std::find(t.hosts.begin(), t.hosts.end(), host);
    t.host_of_rank.push_back(static_cast<int>(it - t.hosts.begin()));
    if (it == t.hosts.end()) t.hosts.push_back(host);
  }
  return t;
}

StorageTopology classify_storage(const std::string& dir, std::span<const std::string> rank_hosts,
                                 std::span<const std::set<int>> seen) {
  StorageTopology t = group_hosts(rank_hosts);
  std::set<int> all;
  for (int h = 0; h < t.host_count(); ++h) all.insert(h);
  bool shared = true;
  bool local = true;
  for (size_t r = 0; r < seen.size(); ++r) {
    shared = shared && seen[r] == all;
    local = local && seen[r] == std::set<int>{t.host_of_rank[r]};
  }
  if (shared || local) {
    t.shared = shared;
    return t;
  }
  std::string views;
  for (size_t r = 0; r < seen.size(); ++r) {
    const std::vector<int> hosts(seen[r].begin(), seen[r].end());
    views += format("{}rank {} on {} sees the files of {}", views.empty() ? "" : "; ", r,
                    t.hosts[static_cast<size_t>(t.host_of_rank[r])], hosts.empty() ? "no host" : join_hosts(t, hosts));
  }
  ST_FAIL(
      "checkpoint.dir '{}' is neither shared by all hosts nor separate on each: {}. Use a directory that every host "
      "shares, or one on each host's own disk, or state it with checkpoint.shared: true | false",
      dir, views);
}

StorageTopology detect_storage(const std::string& dir, SharedStorage setting, ProcessGroup& world) {
  const std::vector<std::string> rank_hosts = all_gather_strings(world, host_name());
  StorageTopology t = group_hosts(rank_hosts);
  if (setting != SharedStorage::Auto || t.host_count() == 1) {
    t.shared = setting != SharedStorage::No || t.host_count() == 1;
    t.stated = setting != SharedStorage::Auto;
    return t;
  }
  // One name for this job's tokens: rank 0's random number.
  const std::string nonce = all_gather_strings(world, std::to_string(std::random_device{}()))[0];
  const int host = t.host_of_rank[static_cast<size_t>(world.rank())];
  const fs::path token = fs::path(dir) / format("{}{}-{}", kTokenPrefix, nonce, host);
  run_on_every_rank(world, [&] {
    if (t.leads_host(world.rank())) write_token(token);
  });
  world.barrier().wait();
  // The gather returns only once every rank has listed the directory.
  const std::vector<std::string> texts = all_gather_strings(world, tokens_seen(dir, nonce));
  if (t.leads_host(world.rank())) ::unlink(token.c_str());
  std::vector<std::set<int>> seen;
  for (const std::string& text : texts) seen.push_back(parse_seen(text));
  StorageTopology out;
  run_on_every_rank(world, [&] { out = classify_storage(dir, rank_hosts, seen); });
  return out;
}

}  // namespace st::checkpoint
