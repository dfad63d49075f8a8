#pragma once
// Module: a layer with an explicit forward and backward, named parameters and
// named children. There is no autograd tape: forward keeps what backward
// needs; backward(dy) accumulates (+=) parameter gradients and returns dx.
//
// Callers always go through forward()/backward(), never the *_impl methods,
// so that hooks (FSDP's gather/free/reduce-scatter) and wrappers (activation
// recomputation, fsdp/recompute.h) see every module call. A parameter's
// `value` and `grad` are handles the owner may re-point (FSDP points them at
// views of a gathered flat buffer); modules read them on every call and never
// cache them.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace st::models {

/// How a parameter is initialised (docs/training.md, "Models": normal(0, 0.02) for LLaMA linears
/// and embeddings, ones for norms; the toy model uses PyTorch's Linear init
/// bounds so its scale matches the tutorial).
struct Init {
  enum class Kind : uint8_t { Normal, Uniform, Ones, Zeros };
  Kind kind = Kind::Zeros;
  double a = 0;  // Normal: std; Uniform: bound (values in [-a, a))
  static Init normal(double std) { return {Kind::Normal, std}; }
  static Init uniform(double bound) { return {Kind::Uniform, bound}; }
  static Init ones() { return {Kind::Ones, 0}; }
  static Init zeros() { return {Kind::Zeros, 0}; }
};

struct Parameter {
  std::string name;  // local name ("weight"); the FQN comes from the tree
  Shape shape;       // full (unsharded) shape, PyTorch layout
  Init init;
  bool weight_decay = false;  // true for parameters with two or more dimensions
  Tensor value;               // the weights used by forward/backward (any float dtype)
  Tensor grad;                // same shape as value; backward accumulates into it
  std::string fqn;            // full name once known (set by the model's constructor and by
                              // allocate/bind/init below); error messages name it
};

class Module;

/// Calls around a module's forward and backward. FSDP installs these on the
/// modules that root a shard unit.
class ModuleHooks {
 public:
  virtual ~ModuleHooks() = default;
  virtual void pre_forward(Module&) {}
  virtual void post_forward(Module&) {}
  virtual void pre_backward(Module&) {}
  virtual void post_backward(Module&) {}
};

/// What a ModuleWrapper may do with the module it wraps: run the module's own
/// forward and backward (its *_impl: no hooks, no wrapper) and drop the state
/// that forward saved. Only Module makes one, for the length of one call.
class ModuleBody {
 public:
  Tensor forward(const Tensor& x);
  Tensor backward(const Tensor& dy);
  /// Drops the state forward saved for backward, in the module and below
  /// (Module::release_saved_recursive).
  void release_saved();
  std::string_view type_name() const;

 private:
  friend class Module;
  explicit ModuleBody(Module& module) : module_(module) {}
  Module& module_;
};

/// Runs in place of a module's own forward and backward, inside its hooks
/// (pre_forward, wrapper's forward, post_forward; the same for backward).
/// forward() returns what body.forward(x) would and backward() what
/// body.backward(dy) would; when and how often it runs them is the wrapper's
/// business. The module owns its wrapper (Module::set_wrapper).
class ModuleWrapper {
 public:
  virtual ~ModuleWrapper() = default;
  virtual Tensor forward(ModuleBody& body, const Tensor& x) = 0;
  virtual Tensor backward(ModuleBody& body, const Tensor& dy) = 0;
  /// Drops what the wrapper keeps between forward and backward; the module's
  /// release_saved_recursive() calls it.
  virtual void release_saved() {}
};

class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  /// The class name used by type-based wrapping ("DecoderLayer", "Linear", ...).
  virtual std::string_view type_name() const = 0;

  /// Runs the forward: hooks around the wrapper, if any, else forward_impl.
  Tensor forward(const Tensor& x);
  /// Runs the backward (hooks, then the wrapper or backward_impl): parameter
  /// grads +=, returns dx (an undefined tensor when the input was not
  /// differentiable, e.g. tokens).
  Tensor backward(const Tensor& dy);

  /// Direct children in registration order, with their local names.
  const std::vector<std::pair<std::string, Module*>>& children() const { return children_; }
  /// This module's own parameters in registration order (not the children's).
  const std::vector<Parameter*>& own_parameters() const { return own_params_; }
  /// Parameters this module uses but does not own (tied weights, see
  /// share_parameter); they have no FQN under this module. A shard unit that
  /// holds this module must also hold (or see gathered) their owner.
  const std::vector<Parameter*>& shared_parameters() const { return shared_params_; }
  /// Every parameter of the subtree as (FQN, parameter), depth first in
  /// registration order: own parameters, then each child's. `prefix` is this
  /// module's FQN ("" for the root).
  std::vector<std::pair<std::string, Parameter*>> named_parameters(const std::string& prefix = "");
  /// Every module of the subtree as (FQN, module), this one first.
  std::vector<std::pair<std::string, Module*>> named_modules(const std::string& prefix = "");
  /// Total elements of the subtree's parameters (a shared parameter counts once).
  int64_t num_parameters();

  void set_hooks(ModuleHooks* hooks) { hooks_ = hooks; }
  ModuleHooks* hooks() const { return hooks_; }
  /// Puts `wrapper` between this module's hooks and its own forward/backward,
  /// which the module then owns. A module has at most one wrapper: setting a
  /// second is an error naming the module's type; nullptr removes it.
  void set_wrapper(std::unique_ptr<ModuleWrapper> wrapper);
  const ModuleWrapper* wrapper() const { return wrapper_.get(); }

  /// Drops the state forward saved for backward (the wrappers' too), in this
  /// module and below.
  void release_saved_recursive();

 protected:
  virtual Tensor forward_impl(const Tensor& x) = 0;
  virtual Tensor backward_impl(const Tensor& dy) = 0;
  /// Drops what forward_impl saved (activations, statistics) in this module only.
  virtual void release_saved() {}

  /// Declares a parameter; storage is bound later (allocate_parameters or FSDP).
  Parameter& register_parameter(std::string name, Shape shape, Init init);
  /// Adopts a child; returns a reference to it.
  template <class M>
  M& register_module(std::string name, std::unique_ptr<M> child) {
    M& ref = *child;
    children_.emplace_back(std::move(name), child.get());
    owned_.push_back(std::move(child));
    return ref;
  }
  /// Uses a parameter owned elsewhere (tied weights), without a second FQN.
  void share_parameter(Parameter& p) { shared_params_.push_back(&p); }

 private:
  friend class ModuleBody;  // runs forward_impl/backward_impl for the wrapper

  std::vector<std::unique_ptr<Parameter>> param_storage_;
  std::vector<Parameter*> own_params_;
  std::vector<Parameter*> shared_params_;
  std::vector<std::pair<std::string, Module*>> children_;
  std::vector<std::unique_ptr<Module>> owned_;
  ModuleHooks* hooks_ = nullptr;
  std::unique_ptr<ModuleWrapper> wrapper_;
};

/// Gives every parameter of the subtree its own zeroed `grad` and a `value` of
/// `dtype` (uninitialised). Convenient for tests and single-process use.
void allocate_parameters(Module& root, DType dtype);
/// Points every parameter's value/grad at consecutive views of two flat 1-D
/// buffers, in named_parameters() order; returns each FQN's (begin, numel).
std::vector<std::pair<std::string, std::pair<int64_t, int64_t>>> bind_parameters_flat(Module& root,
                                                                                      const Tensor& flat_value,
                                                                                      const Tensor& flat_grad);

/// Sets every parameter's `fqn` from named_parameters() (shared parameters keep
/// their owner's name). The models call it in their constructors.
void assign_fqns(Module& root);

/// Fills out[0 .. n) with elements [begin, begin + n) of the initial value of
/// parameter `fqn` (full shape p.shape) for `seed`. Each element depends only
/// on (seed, fqn, flat index): any rank can initialise any slice, and a
/// sharded run starts from exactly the weights of an unsharded one.
///
/// The generator is counter based (splitmix64 over a key made from the seed
/// and the FNV-1a hash of the FQN, then over the element index), with one
/// Box-Muller normal per element. The weights therefore follow PyTorch's
/// initialisers *in distribution* (normal(0, std), uniform(-a, a)), never in
/// values: torch.manual_seed(s) gives other numbers. Values are computed in
/// double and written in out's dtype (rounded to nearest even for BF16).
void init_parameter_slice(const Parameter& p, std::string_view fqn, uint64_t seed, int64_t begin, const Tensor& out);
/// init_parameter_slice over every parameter's whole value.
void init_parameters(Module& root, uint64_t seed);

}  // namespace st::models
