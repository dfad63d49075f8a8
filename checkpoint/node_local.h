#pragma once
// Loading a checkpoint saved to node-local disks (topology.h): each host
// holds its part of root/step-N (the indexes, trainer_state.json and
// config.json, and the data files its ranks wrote), and a new host may hold
// nothing at all. To load, every host builds a view of the whole step in a
// temporary directory of its root: its own files hard-linked, the other
// hosts' small files copied in, and each of their data files as a sparse
// stand-in that holds only its header (so indexes, headers and sizes read
// as for a whole checkpoint). The data of those stand-ins is never read
// locally: load_entries reads it through a rank on a host that holds the
// file (LoadOptions::file_readers) and sends it over the process group.
#include <map>
#include <string>
#include <vector>

#include "checkpoint/topology.h"
#include "core/comm.h"

namespace st::checkpoint {

/// The whole of one node-local step, as this host sees it for a load.
class NodeLocalStep {
 public:
  /// Collective over `group`: the lowest rank of each host lists `dir`
  /// (root/step-N on its own disk; missing is fine), the lists travel to
  /// every rank, and each host's lowest rank builds the view in
  /// root/.tmp-load-step-N-<pid>. Throws the same error on every rank when a
  /// file of the step is on no host or a host's files cannot be read.
  NodeLocalStep(const std::string& dir, const StorageTopology& topology, ProcessGroup& group);
  /// Removes the temporary directory (on the ranks that made it).
  ~NodeLocalStep();
  NodeLocalStep(const NodeLocalStep&) = delete;
  NodeLocalStep& operator=(const NodeLocalStep&) = delete;

  /// The directory to load from on this rank.
  const std::string& dir() const { return view_; }
  /// For LoadOptions::file_readers: each data file's readers (the ranks on hosts that hold it).
  const std::map<std::string, std::vector<int>>& readers() const { return readers_; }

 private:
  std::string view_;
  bool made_ = false;
  std::map<std::string, std::vector<int>> readers_;
};

}  // namespace st::checkpoint
