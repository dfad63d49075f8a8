// The unified layout's plan and indexes (index.h describes the files).
#include <algorithm>

#include "checkpoint/save.h"
#include "core/error.h"

namespace st::checkpoint {
namespace {

constexpr std::string_view kFamilies[] = {"model", "master_weights", "optimizer"};

// The families a tensor is stored in: master weights as model weights and/or
// F32 master weights, every other kind as optimizer state.
std::vector<std::string_view> families_of(const TensorId& id, const SaveOptions& options) {
  if (id.second != kMasterKind) return {"optimizer"};
  std::vector<std::string_view> f;
  if (options.model_weights) f.push_back("model");
  if (options.master_weights) f.push_back("master_weights");
  return f;
}

DType stored_dtype(std::string_view family, const TensorMeta& meta, const SaveOptions& options) {
  return family == "model" ? options.model_dtype : meta.dtype;
}

// Bytes each FQN puts on disk, over every family it is stored in.
std::map<std::string, int64_t> bytes_by_fqn(const GlobalView& view, const SaveOptions& options) {
  std::map<std::string, int64_t> bytes;
  for (const auto& [id, meta] : view.tensors) {
    int64_t& b = bytes[id.first];
    for (std::string_view family : families_of(id, options))
      b += shape_numel(meta.shape) * static_cast<int64_t>(dtype_size(stored_dtype(family, meta, options)));
  }
  return bytes;
}

// The files of `family`: file k belongs to the k-th owning rank.
void plan_family(std::string_view family, const GlobalView& view, const SaveOptions& options,
                 const std::map<std::string, int>& owner, std::vector<FilePlan>& files) {
  std::vector<int> ranks;
  for (const auto& [id, meta] : view.tensors) {
    const std::vector<std::string_view> fams = families_of(id, options);
    if (std::find(fams.begin(), fams.end(), family) != fams.end()) ranks.push_back(owner.at(id.first));
  }
  std::sort(ranks.begin(), ranks.end());
  ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  const int n = static_cast<int>(ranks.size());
  for (int k = 0; k < n; ++k) {
    FilePlan file{std::string(family), unified_file_name(family, k + 1, n), ranks[k], {{"format", "pt"}}, {}, {}, 0};
    for (const auto& [id, meta] : view.tensors) {
      const std::vector<std::string_view> fams = families_of(id, options);
      if (owner.at(id.first) != ranks[k] || std::find(fams.begin(), fams.end(), family) == fams.end()) continue;
      const std::string key = family == "optimizer" ? id.first + "." + id.second : id.first;
      file.tensors.push_back({key, id, stored_dtype(family, meta, options), meta.shape, 0, shape_numel(meta.shape), 0});
    }
    files.push_back(std::move(file));
  }
}

}  // namespace

SavePlan plan_unified(const GlobalView& view, const SaveOptions& options, int rank, int world) {
  ST_CHECK(options.model_weights || options.master_weights,
           "unified save: model_weights and master_weights are both off, so the weights would not be saved");
  SavePlan plan;
  plan.layout = Layout::Unified;
  const std::map<std::string, int64_t> bytes = bytes_by_fqn(view, options);
  for (const auto& [fqn, b] : bytes) plan.total_bytes += b;
  const std::map<std::string, int> owner = balance_owners(bytes, world);
  for (std::string_view family : kFamilies) plan_family(family, view, options, owner, plan.files);

  // Where each (family, id) lives, then this rank's pieces into every file of their tensor.
  std::map<std::pair<std::string, TensorId>, std::pair<size_t, size_t>> where;
  for (size_t f = 0; f < plan.files.size(); ++f)
    for (size_t t = 0; t < plan.files[f].tensors.size(); ++t)
      where[{plan.files[f].family, plan.files[f].tensors[t].id}] = {f, t};
  for (const Piece& p : view.pieces) {
    if (p.rank != rank) continue;
    const TensorId id{p.fqn, p.kind};
    for (std::string_view family : families_of(id, options)) {
      const auto [f, t] = where.at({std::string(family), id});
      plan.writes.push_back({f, t, p.begin, p.numel, p.entry, 0});
      plan.bytes += p.numel * static_cast<int64_t>(dtype_size(plan.files[f].tensors[t].dtype));
    }
  }
  return plan;
}

std::vector<std::pair<std::string, std::string>> unified_indexes(const SavePlan& plan,
                                                                 const std::vector<std::vector<uint32_t>>& crcs,
                                                                 int world) {
  const std::pair<std::string_view, std::string_view> names[] = {
      {"model", kModelIndexName}, {"master_weights", kMasterIndexName}, {"optimizer", kOptimizerIndexName}};
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [family, index_name] : names) {
    std::vector<UnifiedIndexEntry> entries;
    for (size_t f = 0; f < plan.files.size(); ++f) {
      const FilePlan& file = plan.files[f];
      if (file.family != family) continue;
      for (size_t t = 0; t < file.tensors.size(); ++t) {
        const FileTensor& ft = file.tensors[t];
        entries.push_back({ft.key, file.name, crcs[f][t], ft.numel * static_cast<int64_t>(dtype_size(ft.dtype))});
      }
    }
    if (!entries.empty()) out.emplace_back(index_name, unified_index_text(family, world, entries));
  }
  return out;
}

}  // namespace st::checkpoint
