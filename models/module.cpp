// Module plumbing: hooks and wrappers, the parameter tree, flat binding and
// the counter-based initialiser.
#include "models/module.h"

#include <cmath>
#include <numbers>
#include <unordered_set>

#include "core/hash.h"
#include "core/ops.h"

namespace st::models {

namespace {

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

void collect_parameters(Module& m, const std::string& prefix, std::vector<std::pair<std::string, Parameter*>>& out) {
  for (Parameter* p : m.own_parameters()) out.emplace_back(join_name(prefix, p->name), p);
  for (const auto& [name, child] : m.children()) collect_parameters(*child, join_name(prefix, name), out);
}

void collect_modules(Module& m, const std::string& prefix, std::vector<std::pair<std::string, Module*>>& out) {
  out.emplace_back(prefix, &m);
  for (const auto& [name, child] : m.children()) collect_modules(*child, join_name(prefix, name), out);
}

void collect_unique(Module& m, std::unordered_set<const Parameter*>& seen, int64_t& total) {
  auto count = [&](const Parameter* p) {
    if (seen.insert(p).second) total += shape_numel(p->shape);
  };
  for (const Parameter* p : m.own_parameters()) count(p);
  for (const Parameter* p : m.shared_parameters()) count(p);
  for (const auto& entry : m.children()) collect_unique(*entry.second, seen, total);
}

bool is_float(DType t) { return t == DType::F32 || t == DType::BF16; }

// --- counter-based RNG ------------------------------------------------------
// Hashing (key, index) with splitmix64 (core/hash.h) gives independent-looking bits for every index.

constexpr uint64_t fnv1a64(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<uint8_t>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// Mixing the counter before combining keeps nearby indices of nearby keys apart.
constexpr uint64_t hash_at(uint64_t key, uint64_t counter) { return splitmix64(key ^ splitmix64(counter)); }

// 53 random bits as a double in [0, 1).
constexpr double unit_interval(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1p-53; }

double normal_at(uint64_t key, uint64_t i) {
  // u1 in (0, 1] so the log is finite; one Box-Muller output per element so
  // the value at i needs nothing but i.
  const double u1 = static_cast<double>((hash_at(key, 2 * i) >> 11) + 1) * 0x1p-53;
  const double u2 = unit_interval(hash_at(key, 2 * i + 1));
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

double uniform_at(uint64_t key, uint64_t i, double bound) {
  return bound * (2.0 * unit_interval(hash_at(key, i)) - 1.0);
}

}  // namespace

// --- Module -------------------------------------------------------------------

Tensor Module::forward(const Tensor& x) {
  if (hooks_ != nullptr) hooks_->pre_forward(*this);
  ModuleBody body(*this);
  Tensor y = wrapper_ != nullptr ? wrapper_->forward(body, x) : forward_impl(x);
  if (hooks_ != nullptr) hooks_->post_forward(*this);
  return y;
}

Tensor Module::backward(const Tensor& dy) {
  if (hooks_ != nullptr) hooks_->pre_backward(*this);
  ModuleBody body(*this);
  Tensor dx = wrapper_ != nullptr ? wrapper_->backward(body, dy) : backward_impl(dy);
  if (hooks_ != nullptr) hooks_->post_backward(*this);
  return dx;
}

void Module::set_wrapper(std::unique_ptr<ModuleWrapper> wrapper) {
  ST_CHECK(wrapper == nullptr || wrapper_ == nullptr, "{}: the module already has a wrapper", type_name());
  wrapper_ = std::move(wrapper);
}

Tensor ModuleBody::forward(const Tensor& x) { return module_.forward_impl(x); }
Tensor ModuleBody::backward(const Tensor& dy) { return module_.backward_impl(dy); }
void ModuleBody::release_saved() { module_.release_saved_recursive(); }
std::string_view ModuleBody::type_name() const { return module_.type_name(); }

std::vector<std::pair<std::string, Parameter*>> Module::named_parameters(const std::string& prefix) {
  std::vector<std::pair<std::string, Parameter*>> out;
  collect_parameters(*this, prefix, out);
  return out;
}

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out;
  collect_modules(*this, prefix, out);
  return out;
}

int64_t Module::num_parameters() {
  std::unordered_set<const Parameter*> seen;
  int64_t total = 0;
  collect_unique(*this, seen, total);
  return total;
}

void Module::release_saved_recursive() {
  release_saved();
  if (wrapper_ != nullptr) wrapper_->release_saved();
  for (const auto& entry : children_) entry.second->release_saved_recursive();
}

Parameter& Module::register_parameter(std::string name, Shape shape, Init init) {
  for (const Parameter* p : own_params_) {
    ST_CHECK(p->name != name, "{}: parameter '{}' registered twice", type_name(), name);
  }
  for (const auto& entry : children_) {
    ST_CHECK(entry.first != name, "{}: parameter '{}' has the name of a child module", type_name(), name);
  }
  auto p = std::make_unique<Parameter>();
  p->name = std::move(name);
  p->weight_decay = shape.size() >= 2;
  p->shape = std::move(shape);
  p->init = init;
  own_params_.push_back(p.get());
  param_storage_.push_back(std::move(p));
  return *own_params_.back();
}

// --- free functions ---------------------------------------------------------

void assign_fqns(Module& root) {
  for (auto& [fqn, p] : root.named_parameters()) p->fqn = fqn;
}

void allocate_parameters(Module& root, DType dtype) {
  ST_CHECK(is_float(dtype), "allocate_parameters: parameters must be F32 or BF16, got {}", dtype);
  for (auto& [fqn, p] : root.named_parameters()) {
    p->fqn = fqn;
    p->value = Tensor::empty(p->shape, dtype);
    p->grad = Tensor::zeros(p->shape, dtype);
  }
}

std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> bind_parameters_flat(Module& root,
                                                                                      const Tensor& flat_value,
                                                                                      const Tensor& flat_grad) {
  auto named = root.named_parameters();
  int64_t total = 0;
  for (const auto& entry : named) total += shape_numel(entry.second->shape);
  ST_CHECK(flat_value.defined() && is_float(flat_value.dtype()),
           "bind_parameters_flat: flat_value must be a defined F32/BF16 tensor, got {}",
           flat_value.defined() ? flat_value.str() : std::string("undefined"));
  ST_CHECK(flat_value.numel() >= total, "bind_parameters_flat: flat_value has {} elements but the parameters need {}",
           flat_value.numel(), total);
  if (flat_grad.defined()) {
    ST_CHECK(is_float(flat_grad.dtype()), "bind_parameters_flat: flat_grad must be F32/BF16, got {}",
             flat_grad.dtype());
    ST_CHECK(flat_grad.numel() >= total, "bind_parameters_flat: flat_grad has {} elements but the parameters need {}",
             flat_grad.numel(), total);
  }
  std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> layout;
  layout.reserve(named.size());
  int64_t offset = 0;
  for (auto& [fqn, p] : named) {
    const int64_t n = shape_numel(p->shape);
    p->fqn = fqn;
    p->value = flat_value.flat_slice(offset, n).view(p->shape);
    if (flat_grad.defined()) p->grad = flat_grad.flat_slice(offset, n).view(p->shape);
    layout.emplace_back(fqn, std::make_pair(offset, n));
    offset += n;
  }
  return layout;
}

void init_parameter_slice(const Parameter& p, std::string_view fqn, uint64_t seed, int64_t begin, const Tensor& out) {
  ST_CHECK(out.defined() && is_float(out.dtype()), "init of {}: out must be a defined F32/BF16 tensor", fqn);
  const int64_t n = out.numel();
  const int64_t full = shape_numel(p.shape);
  ST_CHECK(begin >= 0 && begin + n <= full, "init of {}: elements [{}, {}) are outside its {} elements (shape {})", fqn,
           begin, begin + n, full, shape_str(p.shape));

  const uint64_t key = splitmix64(seed ^ splitmix64(fnv1a64(fqn)));
  const Init init = p.init;
  auto value_at = [&](int64_t i) -> float {
    const auto index = static_cast<uint64_t>(begin + i);
    switch (init.kind) {
      case Init::Kind::Normal: return static_cast<float>(init.a * normal_at(key, index));
      case Init::Kind::Uniform: return static_cast<float>(uniform_at(key, index, init.a));
      case Init::Kind::Ones: return 1.0f;
      case Init::Kind::Zeros: return 0.0f;
    }
    return 0.0f;
  };
  // CPU outputs are written in place; device outputs go through one host copy.
  Tensor host = out.device().is_cpu() ? out.view({n}) : Tensor::empty({n}, out.dtype());
  if (host.dtype() == DType::F32) {
    float* d = host.data<float>();
    for (int64_t i = 0; i < n; ++i) d[i] = value_at(i);
  } else {
    BFloat16* d = host.data<BFloat16>();
    for (int64_t i = 0; i < n; ++i) d[i] = BFloat16(value_at(i));
  }
  if (!out.device().is_cpu()) out.view({n}).copy_from(host);
}

void init_parameters(Module& root, uint64_t seed) {
  for (auto& [fqn, p] : root.named_parameters()) {
    ST_CHECK(p->value.defined(), "init_parameters: parameter {} has no value bound (allocate or bind it first)", fqn);
    p->fqn = fqn;
    init_parameter_slice(*p, fqn, seed, 0, p->value);
  }
}

}  // namespace st::models
