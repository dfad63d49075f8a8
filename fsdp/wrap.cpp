// Wrap policies (which modules root a shard unit). They only read the module
// tree; nothing here allocates parameter storage or touches names.
//
// One rule for shared parameters, whatever the policy: a module is *eligible*
// to root a unit only if no module in its subtree owns or uses a parameter
// that more than one module uses (tied embeddings: model.embed_tokens owns
// the weight that lm_head uses). Such a parameter, its owner and every user
// therefore all land in the root unit, which is gathered for the whole
// forward and backward, so every user sees the gathered weight and its
// gradient is reduced once. Checking the whole subtree, not just the module,
// matters: wrapping `model` would move the embedding weight out of the root
// unit while lm_head, outside `model`, still reads it.
#include <algorithm>
#include <functional>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/error.h"
#include "fsdp/fsdp.h"

namespace st::fsdp {

namespace {

using models::Module;
using models::Parameter;

/// Parameters used by more than one module: anything some module lists in
/// shared_parameters() is also owned by another.
std::unordered_set<const Parameter*> multiply_used_parameters(Module& root) {
  std::unordered_set<const Parameter*> out;
  for (const auto& entry : root.named_modules()) {
    for (const Parameter* p : entry.second->shared_parameters()) out.insert(p);
  }
  return out;
}

/// Modules whose subtree owns or uses a multiply used parameter (see the rule
/// at the top of the file); these never root a unit.
std::unordered_set<const Module*> pinned_modules(Module& root) {
  const auto shared = multiply_used_parameters(root);
  std::unordered_set<const Module*> pinned;
  if (shared.empty()) return pinned;
  std::function<bool(const Module&)> visit = [&](const Module& m) {
    bool uses = false;
    for (const Parameter* p : m.own_parameters()) uses = uses || shared.count(p) > 0;
    for (const Parameter* p : m.shared_parameters()) uses = uses || shared.count(p) > 0;
    // Visit every child even after a hit, so that each pinned one is recorded.
    for (const auto& child : m.children()) uses = visit(*child.second) || uses;
    if (uses) pinned.insert(&m);
    return uses;
  };
  visit(root);
  return pinned;
}

int64_t numel_of(const Parameter& p) { return shape_numel(p.shape); }

/// transformer: every eligible non-root module of a listed type.
std::unordered_set<const Module*> transformer_roots(Module& root, const AutoWrapConfig& config,
                                                    const std::unordered_set<const Module*>& pinned) {
  std::unordered_set<const Module*> roots;
  for (const auto& entry : modules_of_types(root, config.module_types, "fsdp.auto_wrap.module_types")) {
    const Module* m = entry.second;
    if (m != &root && pinned.count(m) == 0) roots.insert(m);
  }
  return roots;
}

/// size_based, as PyTorch's size_based_auto_wrap_policy with recurse on:
/// modules are decided bottom-up (post-order, children in registration
/// order). When a module is decided, its *remaining* count is the elements of
/// the parameters its subtree owns minus those already taken by units rooted
/// strictly below it (parameters it merely uses, via shared_parameters, are
/// not counted). A non-root, eligible module whose remaining count is at
/// least min_num_params becomes a unit and takes exactly those parameters;
/// otherwise they stay unassigned and count toward its parent. The root
/// takes whatever is left at the top. So a layer made of children that each
/// fall below the threshold can still qualify as a whole, and once a child
/// qualifies, its parent is judged only on what the child left over.
/// ModuleList may become a unit here (unlike PyTorch, which excludes it): our
/// ModuleList runs its children in sequence, so it has a forward to hook.
std::unordered_set<const Module*> size_based_roots(Module& root, const AutoWrapConfig& config,
                                                   const std::unordered_set<const Module*>& pinned) {
  std::unordered_set<const Module*> roots;
  // Returns the remaining (not yet wrapped) parameter elements of m's subtree.
  std::function<int64_t(const Module&)> visit = [&](const Module& m) -> int64_t {
    int64_t remaining = 0;
    for (const Parameter* p : m.own_parameters()) remaining += numel_of(*p);
    for (const auto& child : m.children()) remaining += visit(*child.second);
    if (&m != &root && pinned.count(&m) == 0 && remaining >= config.min_num_params) {
      roots.insert(&m);
      return 0;
    }
    return remaining;
  };
  visit(root);
  return roots;
}

}  // namespace

std::vector<std::pair<std::string, models::Module*>> modules_of_types(models::Module& root,
                                                                      const std::vector<std::string>& types,
                                                                      std::string_view key) {
  auto modules = root.named_modules();
  std::set<std::string, std::less<>> present;
  for (const auto& entry : modules) present.emplace(entry.second->type_name());
  for (const std::string& wanted : types) {
    if (present.count(wanted) > 0) continue;
    std::string known;
    for (const std::string& t : present) known += (known.empty() ? "" : ", ") + t;
    ST_FAIL("{}: no module of type '{}' in this model; its module types are: {}", key, wanted, known);
  }
  const std::set<std::string, std::less<>> wanted(types.begin(), types.end());
  std::erase_if(modules, [&](const auto& entry) { return wanted.count(entry.second->type_name()) == 0; });
  return modules;
}

std::vector<UnitPlan> plan_units(models::Module& root, const AutoWrapConfig& config) {
  const auto pinned = pinned_modules(root);
  std::unordered_set<const Module*> roots;
  switch (config.policy) {
    case WrapPolicy::None: break;
    case WrapPolicy::Transformer: roots = transformer_roots(root, config, pinned); break;
    case WrapPolicy::SizeBased: roots = size_based_roots(root, config, pinned); break;
  }
  roots.insert(&root);

  // Units in pre-order of their roots; each parameter goes to its nearest
  // enclosing unit root. Walking parameters in named_parameters() order keeps
  // each unit's list in registration order with the ordinary FQNs.
  std::vector<UnitPlan> units;
  std::unordered_map<const Module*, size_t> unit_of;
  std::function<void(Module&, const std::string&, size_t)> visit = [&](Module& m, const std::string& fqn,
                                                                       size_t enclosing) {
    if (roots.count(&m) > 0) {
      enclosing = units.size();
      units.push_back(UnitPlan{fqn, &m, {}, 0});
    }
    unit_of[&m] = enclosing;
    for (const auto& [name, child] : m.children()) visit(*child, fqn.empty() ? name : fqn + "." + name, enclosing);
  };
  visit(root, "", 0);

  // named_parameters() names each parameter once, under its owner; find the
  // owner to find the unit.
  std::unordered_map<const Parameter*, const Module*> owner;
  for (const auto& entry : root.named_modules()) {
    for (const Parameter* p : entry.second->own_parameters()) owner[p] = entry.second;
  }
  for (const auto& [fqn, p] : root.named_parameters()) {
    UnitPlan& unit = units[unit_of.at(owner.at(p))];
    unit.params.emplace_back(fqn, p);
    unit.numel += numel_of(*p);
  }

  // A unit without parameters would be an empty flat buffer to gather for
  // nothing (a listed type without weights, a module that falls back to its
  // parent); its module simply runs inside its enclosing unit.
  std::erase_if(units, [](const UnitPlan& u) { return u.params.empty(); });
  return units;
}

}  // namespace st::fsdp
