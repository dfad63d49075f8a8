#pragma once
// Which ranks see one file system at checkpoint.dir
// (docs/DESIGN.md, "Node-local disks"). On one machine, or on a cluster file
// system (NFS, Lustre), all ranks share it; on machines with node-local disks
// each host has a checkpoint root of its own, and a checkpoint exists only as
// the union of what the hosts hold (the PaddleNLP Unified Checkpoint workflow).
//
// Detection, at start-up: the lowest rank of each host writes a token file
// named for the job and the host into checkpoint.dir; after a barrier every
// rank lists which hosts' tokens it sees; the gathered lists say shared (all
// see all), node-local (each host sees only its own) or mixed (an error).
// checkpoint.shared: true | false states it instead (a file system that
// shows new files late, such as NFS with long attribute caching, can make
// detection say node-local for a shared directory).
#include <cstdint>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "core/comm.h"
#include "core/config.h"

namespace st::checkpoint {

/// checkpoint.shared: detect, or stated by the user.
enum class SharedStorage : uint8_t { Auto, Yes, No };
/// "auto", "true", "false".
std::span<const Named<SharedStorage>> names_of(SharedStorage);

/// Which ranks share a checkpoint root.
struct StorageTopology {
  bool shared = true;              // one file system for every rank
  bool stated = false;             // from checkpoint.shared rather than detected
  std::vector<std::string> hosts;  // distinct host names, in the order of each one's lowest rank
  std::vector<int> host_of_rank;   // index into `hosts`, per rank

  int host_count() const { return static_cast<int>(hosts.size()); }
  /// The ranks on host `host`, ascending; the first leads it (writes its files, holds its lock).
  std::vector<int> ranks_of_host(int host) const;
  /// Whether `rank` is the lowest rank of its host.
  bool leads_host(int rank) const;
  /// One log line, e.g. "checkpoint.dir /local/ckpt: node-local, each of the 2 hosts h1, h2 has its own (detected)".
  std::string describe(const std::string& dir) const;
  bool operator==(const StorageTopology&) const = default;
};

/// The hosts of the ranks (`rank_hosts[r]` is rank r's host name), in the order of each one's lowest rank.
StorageTopology group_hosts(std::span<const std::string> rank_hosts);

/// Pure: the topology from every rank's host name and the indices of the
/// hosts whose token each rank saw (`seen[r]`, into group_hosts' order).
/// Shared when every rank saw every host's token, node-local when each saw
/// exactly its own host's; otherwise throws st::Error naming the directory
/// and, per host, which hosts' files its ranks see.
StorageTopology classify_storage(const std::string& dir, std::span<const std::string> rank_hosts,
                                 std::span<const std::set<int>> seen);

/// Collective over `world`: gathers the host names and, with Auto and more
/// than one host, detects as described above (token files are removed
/// before it returns). One host is always shared. `dir` must exist on every
/// rank. Throws the same st::AgreedError on every rank.
StorageTopology detect_storage(const std::string& dir, SharedStorage setting, ProcessGroup& world);

}  // namespace st::checkpoint
