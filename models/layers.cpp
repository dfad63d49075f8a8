// Forward/backward of the LLaMA layers. Parameter gradients use +=,
// activations and input gradients use = (see layers.h for the other rules).
#include "models/layers.h"

#include "core/ops.h"

namespace st::models {

using ops::Transpose;

namespace {

// Parameters are re-pointed by their owner (FSDP) between calls, so every
// call checks what it is about to read.
const Tensor& value_of(const Parameter& p, std::string_view module) {
  const std::string& name = p.fqn.empty() ? p.name : p.fqn;
  ST_CHECK(p.value.defined(), "{}: parameter {} has no value bound (allocate_parameters or bind it first)", module,
           name);
  ST_CHECK(p.value.shape() == p.shape, "{}: parameter {} is bound to shape {} but is declared {}", module, name,
           shape_str(p.value.shape()), shape_str(p.shape));
  return p.value;
}

const Tensor& grad_of(const Parameter& p, std::string_view module) {
  const std::string& name = p.fqn.empty() ? p.name : p.fqn;
  ST_CHECK(p.grad.defined(), "{}: parameter {} has no grad bound; backward accumulates into it", module, name);
  ST_CHECK(p.grad.numel() == shape_numel(p.shape), "{}: grad of {} has {} elements but the parameter has shape {}",
           module, name, p.grad.numel(), shape_str(p.shape));
  return p.grad;
}

void check_saved(const Tensor& t, std::string_view module) {
  ST_CHECK(t.defined(), "{}: backward without a saved forward (forward not run, or its state already released)",
           module);
}

Shape with_last_dim(Shape s, int64_t last) {
  s.back() = last;
  return s;
}

// x [..., D] -> rows N = numel / D.
int64_t rows_of(const Tensor& x) { return x.size(-1) == 0 ? 0 : x.numel() / x.size(-1); }

// Whether a fused entry point (RMSNorm::forward_add, Linear::backward_add) may
// do the module's work itself: nothing else (FSDP hooks, a recomputation
// wrapper) needs to see the call.
bool runs_plain(const Module& m) { return m.hooks() == nullptr && m.wrapper() == nullptr; }

}  // namespace

namespace {

const ModelConfig& checked(const ModelConfig& c) {
  c.validate();
  return c;
}

}  // namespace

// --- Linear -------------------------------------------------------------------

Linear::Linear(int64_t in_features, int64_t out_features, Bias bias, Init weight_init, Init bias_init)
    : in_(in_features), out_(out_features) {
  ST_CHECK(in_features > 0 && out_features > 0, "Linear: features must be positive, got in {} out {}", in_features,
           out_features);
  weight_ = &register_parameter("weight", {out_features, in_features}, weight_init);
  if (bias == Bias::Yes) bias_ = &register_parameter("bias", {out_features}, bias_init);
}

Linear::Linear(Parameter& shared_weight) : weight_(&shared_weight) {
  ST_CHECK(shared_weight.shape.size() == 2, "Linear: shared weight {} must be 2-D [out, in], got {}",
           shared_weight.name, shape_str(shared_weight.shape));
  out_ = shared_weight.shape[0];
  in_ = shared_weight.shape[1];
  share_parameter(shared_weight);
}

const Tensor& Linear::ones(int64_t rows, Device device) {
  if (!ones_.defined() || ones_.size(0) != rows || ones_.device() != device) {
    ones_ = Tensor::full({rows, 1}, 1.0, DType::F32, device);
  }
  return ones_;
}

Tensor Linear::forward_impl(const Tensor& x) {
  const Tensor& w = value_of(*weight_, "Linear");  // (out,in)
  ST_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == in_,
           "Linear [{} -> {}]: input has shape {}, expected [..., {}]", in_, out_,
           x.defined() ? shape_str(x.shape()) : std::string("undefined"), in_);
  Tensor y = Tensor::empty(with_last_dim(x.shape(), out_), w.dtype(), w.device());  // (...,out)
  float beta = 0.0f;
  if (bias_ != nullptr) {
    // y = b first, then y += x W^T: the sum is rounded once, as a fused addmm.
    const Tensor& b = value_of(*bias_, "Linear");  // (out)
    ops::gemm(ones(rows_of(x), x.device()), Transpose::No, b.view({1, out_}), Transpose::No, y);
    beta = 1.0f;
  }
  ops::gemm(x, Transpose::No, w, Transpose::Yes, y, 1.0f, beta);
  x_ = x;
  return y;
}

Tensor Linear::backward_impl(const Tensor& dy) {
  check_saved(x_, "Linear");
  Tensor dx = Tensor::empty(x_.shape(), x_.dtype(), x_.device());  // (...,in)
  backward_into(dy, dx, 0.0f);
  return dx;
}

void Linear::backward_add(const Tensor& dy, const Tensor& dx) {
  if (!runs_plain(*this)) {
    ops::add(dx, backward(dy), dx);
    return;
  }
  check_saved(x_, "Linear");
  ST_CHECK(dx.numel() == x_.numel() && dx.size(-1) == in_,
           "Linear [{} -> {}]: dx to accumulate into has shape {} but the input was {}", in_, out_,
           shape_str(dx.shape()), shape_str(x_.shape()));
  backward_into(dy, dx, 1.0f);
}

void Linear::backward_into(const Tensor& dy, const Tensor& dx, float beta) {
  const Tensor& w = value_of(*weight_, "Linear");
  ST_CHECK(dy.numel() == rows_of(x_) * out_ && dy.size(-1) == out_,
           "Linear [{} -> {}]: dy has shape {} but the output was {}", in_, out_, shape_str(dy.shape()),
           shape_str(with_last_dim(x_.shape(), out_)));
  ops::gemm(dy, Transpose::Yes, x_, Transpose::No, grad_of(*weight_, "Linear"), 1.0f, 1.0f);  // dW += dy^T x
  if (bias_ != nullptr) {
    const Tensor& db = grad_of(*bias_, "Linear").view({out_, 1});  // (out,1)
    ops::gemm(dy, Transpose::Yes, ones(rows_of(x_), dy.device()), Transpose::No, db, 1.0f, 1.0f);
  }
  ops::gemm(dy, Transpose::No, w, Transpose::No, dx, 1.0f, beta);  // dx = dy W + beta dx
  release_saved();
}

// --- Embedding ------------------------------------------------------------------

Embedding::Embedding(int64_t num_embeddings, int64_t embedding_dim, Init init)
    : num_(num_embeddings), dim_(embedding_dim) {
  ST_CHECK(num_embeddings > 0 && embedding_dim > 0, "Embedding: sizes must be positive, got {} x {}", num_embeddings,
           embedding_dim);
  weight_ = &register_parameter("weight", {num_embeddings, embedding_dim}, init);
}

Tensor Embedding::forward_impl(const Tensor& tokens) {
  const Tensor& w = value_of(*weight_, "Embedding");  // (V,D)
  ST_CHECK(tokens.defined() && tokens.dtype() == DType::I32, "Embedding: tokens must be I32, got {}",
           tokens.defined() ? tokens.str() : std::string("undefined"));
  Shape out_shape = tokens.shape();
  out_shape.push_back(dim_);
  Tensor out = Tensor::empty(out_shape, w.dtype(), w.device());  // (B,T,D)
  ops::embedding_forward(tokens.view({tokens.numel()}), w, out.view({tokens.numel(), dim_}));
  tokens_ = tokens;
  return out;
}

Tensor Embedding::backward_impl(const Tensor& dy) {
  check_saved(tokens_, "Embedding");
  const int64_t n = tokens_.numel();
  ST_CHECK(dy.numel() == n * dim_, "Embedding: dy has shape {}, expected {} rows of {}", shape_str(dy.shape()), n,
           dim_);
  ops::embedding_backward(tokens_.view({n}), dy.view({n, dim_}), grad_of(*weight_, "Embedding"));
  release_saved();
  return Tensor();
}

// --- RMSNorm ---------------------------------------------------------------------

RMSNorm::RMSNorm(int64_t dim, double eps) : dim_(dim), eps_(static_cast<float>(eps)) {
  ST_CHECK(dim > 0, "RMSNorm: dim must be positive, got {}", dim);
  ST_CHECK(eps > 0, "RMSNorm: eps (model.rms_norm_eps) must be positive, got {}", eps);
  weight_ = &register_parameter("weight", {dim}, Init::ones());
}

Tensor RMSNorm::forward_impl(const Tensor& x) {
  const Tensor& w = value_of(*weight_, "RMSNorm");  // (D)
  ST_CHECK(x.defined() && x.dim() >= 1 && x.size(-1) == dim_, "RMSNorm({}): input has shape {}", dim_,
           x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  const int64_t n = rows_of(x);
  Tensor out = Tensor::empty(x.shape(), w.dtype(), w.device());  // (N,D)
  Tensor rstd = Tensor::empty({n}, DType::F32, w.device());      // (N)
  ops::rmsnorm_forward(x.view({n, dim_}), w, eps_, out.view({n, dim_}), rstd);
  x_ = x;
  rstd_ = rstd;
  return out;
}

Tensor RMSNorm::backward_impl(const Tensor& dy) {
  check_saved(x_, "RMSNorm");
  const int64_t n = rows_of(x_);
  ST_CHECK(dy.numel() == x_.numel(), "RMSNorm({}): dy has shape {} but the input was {}", dim_, shape_str(dy.shape()),
           shape_str(x_.shape()));
  Tensor dx = Tensor::empty(x_.shape(), x_.dtype(), x_.device());  // (N,D)
  ops::rmsnorm_backward(dy.view({n, dim_}), x_.view({n, dim_}), value_of(*weight_, "RMSNorm"), rstd_,
                        dx.view({n, dim_}), grad_of(*weight_, "RMSNorm"));
  release_saved();
  return dx;
}

Tensor RMSNorm::forward_add(const Tensor& x, const Tensor& delta) {
  if (!runs_plain(*this)) {
    ops::add(x, delta, delta);
    return forward(delta);
  }
  const Tensor& w = value_of(*weight_, "RMSNorm");  // (D)
  ST_CHECK(x.defined() && delta.defined() && x.dim() >= 1 && x.size(-1) == dim_ && delta.shape() == x.shape(),
           "RMSNorm({}): residual input has shape {} and branch output {}; both must be [..., {}] and match", dim_,
           x.defined() ? shape_str(x.shape()) : std::string("undefined"),
           delta.defined() ? shape_str(delta.shape()) : std::string("undefined"), dim_);
  const int64_t n = rows_of(x);
  Tensor out = Tensor::empty(x.shape(), w.dtype(), w.device());  // (N,D)
  Tensor rstd = Tensor::empty({n}, DType::F32, w.device());      // (N)
  ops::add_rmsnorm_forward(x.view({n, dim_}), delta.view({n, dim_}), w, eps_, delta.view({n, dim_}),
                           out.view({n, dim_}), rstd);
  x_ = delta;  // now h = x + delta, the norm's input
  rstd_ = rstd;
  return out;
}

Tensor RMSNorm::backward_add(const Tensor& dy, const Tensor& residual) {
  if (!runs_plain(*this)) {
    Tensor dx = backward(dy);
    ops::add(residual, dx, dx);
    return dx;
  }
  check_saved(x_, "RMSNorm");
  const int64_t n = rows_of(x_);
  ST_CHECK(dy.numel() == x_.numel() && residual.numel() == x_.numel(),
           "RMSNorm({}): dy has shape {} and residual {} but the input was {}", dim_, shape_str(dy.shape()),
           shape_str(residual.shape()), shape_str(x_.shape()));
  Tensor dx = Tensor::empty(x_.shape(), x_.dtype(), x_.device());  // (N,D)
  ops::rmsnorm_backward_add(dy.view({n, dim_}), x_.view({n, dim_}), value_of(*weight_, "RMSNorm"), rstd_,
                            residual.view({n, dim_}), dx.view({n, dim_}), grad_of(*weight_, "RMSNorm"));
  release_saved();
  return dx;
}

// --- RopeCache -------------------------------------------------------------------

RopeCache::RopeCache(int64_t head_dim, double theta, int64_t max_positions)
    : head_dim_(head_dim), theta_(theta), max_positions_(max_positions) {
  ST_CHECK(head_dim > 0 && head_dim % 2 == 0, "rotary head dim must be even and positive, got {}", head_dim);
  ST_CHECK(theta > 0, "model.rope_theta must be positive, got {}", theta);
}

std::pair<const Tensor&, const Tensor&> RopeCache::get(int64_t seq_len, Device device) {
  ST_CHECK(seq_len <= max_positions_,
           "sequence length {} exceeds model.max_position_embeddings ({}); shorten train.seq_len or raise it", seq_len,
           max_positions_);
  if (!cos_.defined() || cos_.size(0) != seq_len || cos_.device() != device) {
    cos_ = Tensor::empty({seq_len, head_dim_}, DType::F32, device);
    sin_ = Tensor::empty({seq_len, head_dim_}, DType::F32, device);
    ops::rope_tables(seq_len, head_dim_, theta_, cos_, sin_);
  }
  return {cos_, sin_};
}

// --- Attention -------------------------------------------------------------------

Attention::Attention(const ModelConfig& config, std::shared_ptr<RopeCache> rope)
    : hidden_(checked(config).hidden_size),
      heads_(config.num_attention_heads),
      kv_heads_(config.num_key_value_heads),
      head_dim_(config.hidden_size / config.num_attention_heads),
      rope_(rope ? std::move(rope)
                 : std::make_shared<RopeCache>(head_dim_, config.rope_theta, config.max_position_embeddings)),
      q_proj_(register_module("q_proj", std::make_unique<Linear>(hidden_, heads_ * head_dim_, Linear::Bias::No,
                                                                 Init::normal(config.init_std)))),
      k_proj_(register_module("k_proj", std::make_unique<Linear>(hidden_, kv_heads_ * head_dim_, Linear::Bias::No,
                                                                 Init::normal(config.init_std)))),
      v_proj_(register_module("v_proj", std::make_unique<Linear>(hidden_, kv_heads_ * head_dim_, Linear::Bias::No,
                                                                 Init::normal(config.init_std)))),
      o_proj_(register_module("o_proj", std::make_unique<Linear>(heads_ * head_dim_, hidden_, Linear::Bias::No,
                                                                 Init::normal(config.init_std)))) {}

Tensor Attention::forward_impl(const Tensor& x) {
  ST_CHECK(x.defined() && x.dim() == 3 && x.size(2) == hidden_, "Attention: input must be [B, T, {}], got {}", hidden_,
           x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  const int64_t b = x.size(0), t = x.size(1);
  auto [cos, sin] = rope_->get(t, x.device());
  // The projections' outputs belong to nobody else (a Linear saves its input),
  // so rotary can work on them in place.
  Tensor q = q_proj_.forward(x).view({b, t, heads_, head_dim_});     // (B,T,H,hd)
  Tensor k = k_proj_.forward(x).view({b, t, kv_heads_, head_dim_});  // (B,T,KV,hd)
  Tensor v = v_proj_.forward(x).view({b, t, kv_heads_, head_dim_});  // (B,T,KV,hd)
  ops::rope_forward(q, cos, sin);
  ops::rope_forward(k, cos, sin);
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());        // (B,T,H,hd)
  Tensor lse = Tensor::empty({b, heads_, t}, DType::F32, q.device());  // (B,H,T)
  ops::attention_forward(q, k, v, out, lse);
  q_ = q;
  k_ = k;
  v_ = v;
  out_ = out;
  lse_ = lse;
  return o_proj_.forward(out.view({b, t, heads_ * head_dim_}));  // (B,T,D)
}

Tensor Attention::backward_impl(const Tensor& dy) {
  check_saved(q_, "Attention");
  const int64_t b = q_.size(0), t = q_.size(1);
  auto [cos, sin] = rope_->get(t, q_.device());
  Tensor dout = o_proj_.backward(dy).view(q_.shape());             // (B,T,H,hd)
  Tensor dq = Tensor::empty(q_.shape(), q_.dtype(), q_.device());  // (B,T,H,hd)
  Tensor dk = Tensor::empty(k_.shape(), k_.dtype(), k_.device());  // (B,T,KV,hd)
  Tensor dv = Tensor::empty(v_.shape(), v_.dtype(), v_.device());  // (B,T,KV,hd)
  ops::attention_backward(dout, q_, k_, v_, out_, lse_, dq, dk, dv);
  release_saved();
  ops::rope_backward(dq, cos, sin);
  ops::rope_backward(dk, cos, sin);
  // The three input gradients are summed by the GEMMs themselves (beta = 1).
  Tensor dx = q_proj_.backward(dq.view({b, t, heads_ * head_dim_}));  // (B,T,D)
  k_proj_.backward_add(dk.view({b, t, kv_heads_ * head_dim_}), dx);
  v_proj_.backward_add(dv.view({b, t, kv_heads_ * head_dim_}), dx);
  return dx;
}

Tensor Attention::forward_cached(const Tensor& x, const AttentionCache& cache, int64_t start) {
  ST_CHECK(x.defined() && x.dim() == 3 && x.size(0) == 1 && x.size(2) == hidden_,
           "Attention: a cached step takes one sequence [1, n, {}], got {}", hidden_,
           x.defined() ? shape_str(x.shape()) : std::string("undefined"));
  const int64_t n = x.size(1), capacity = cache.k.size(1), end = start + n;
  ST_CHECK(start >= 0 && end <= capacity, "Attention: positions [{}, {}) do not fit a KV cache of {} positions", start,
           end, capacity);
  // Tables for the cache's whole length, computed once; rows [start, end) are
  // the positions of x (a table's rows do not depend on its length).
  auto [cos_all, sin_all] = rope_->get(capacity, x.device());
  const Tensor cos = cos_all.narrow0(start, n), sin = sin_all.narrow0(start, n);  // (n,hd)
  Tensor q = q_proj_.forward(x).view({1, n, heads_, head_dim_});                  // (1,n,H,hd)
  Tensor k = k_proj_.forward(x).view({1, n, kv_heads_, head_dim_});               // (1,n,KV,hd)
  Tensor v = v_proj_.forward(x).view({1, n, kv_heads_, head_dim_});               // (1,n,KV,hd)
  ops::rope_forward(q, cos, sin);
  ops::rope_forward(k, cos, sin);
  const int64_t row = kv_heads_ * head_dim_;
  cache.k.view({capacity, row}).narrow0(start, n).copy_from(k.view({n, row}));
  cache.v.view({capacity, row}).narrow0(start, n).copy_from(v.view({n, row}));
  const Tensor keys =
      cache.k.view({capacity, row}).narrow0(0, end).view({1, end, kv_heads_, head_dim_});  // (1,end,KV,hd)
  const Tensor values =
      cache.v.view({capacity, row}).narrow0(0, end).view({1, end, kv_heads_, head_dim_});  // (1,end,KV,hd)
  Tensor out = Tensor::empty(q.shape(), q.dtype(), q.device());                            // (1,n,H,hd)
  Tensor lse = Tensor::empty({1, heads_, n}, DType::F32, q.device());                      // (1,H,n)
  ops::attention_forward(q, keys, values, out, lse);
  return o_proj_.forward(out.view({1, n, heads_ * head_dim_}));  // (1,n,D)
}

void Attention::release_saved() {
  q_ = Tensor();
  k_ = Tensor();
  v_ = Tensor();
  out_ = Tensor();
  lse_ = Tensor();
}

// --- MLP ---------------------------------------------------------------------------

MLP::MLP(const ModelConfig& config)
    : gate_proj_(
          register_module("gate_proj", std::make_unique<Linear>(checked(config).hidden_size, config.intermediate_size,
                                                                Linear::Bias::No, Init::normal(config.init_std)))),
      up_proj_(register_module("up_proj", std::make_unique<Linear>(config.hidden_size, config.intermediate_size,
                                                                   Linear::Bias::No, Init::normal(config.init_std)))),
      down_proj_(
          register_module("down_proj", std::make_unique<Linear>(config.intermediate_size, config.hidden_size,
                                                                Linear::Bias::No, Init::normal(config.init_std)))) {}

Tensor MLP::forward_impl(const Tensor& x) {
  Tensor gate = gate_proj_.forward(x);                                  // (B,T,F)
  Tensor up = up_proj_.forward(x);                                      // (B,T,F)
  Tensor h = Tensor::empty(gate.shape(), gate.dtype(), gate.device());  // (B,T,F)
  ops::swiglu_forward(gate, up, h);
  gate_ = gate;
  up_ = up;
  return down_proj_.forward(h);  // (B,T,D)
}

Tensor MLP::backward_impl(const Tensor& dy) {
  check_saved(gate_, "MLP");
  Tensor dh = down_proj_.backward(dy);                                         // (B,T,F)
  Tensor dgate = Tensor::empty(gate_.shape(), gate_.dtype(), gate_.device());  // (B,T,F)
  Tensor dup = Tensor::empty(up_.shape(), up_.dtype(), up_.device());          // (B,T,F)
  ops::swiglu_backward(dh, gate_, up_, dgate, dup);
  release_saved();
  dh = Tensor();
  Tensor dx = gate_proj_.backward(dgate);  // (B,T,D)
  up_proj_.backward_add(dup, dx);          // summed by the GEMM (beta = 1)
  return dx;
}

// --- DecoderLayer ------------------------------------------------------------------

DecoderLayer::DecoderLayer(const ModelConfig& config, std::shared_ptr<RopeCache> rope)
    : self_attn_(register_module("self_attn", std::make_unique<Attention>(config, std::move(rope)))),
      mlp_(register_module("mlp", std::make_unique<MLP>(config))),
      input_layernorm_(
          register_module("input_layernorm", std::make_unique<RMSNorm>(config.hidden_size, config.rms_norm_eps))),
      post_attention_layernorm_(register_module("post_attention_layernorm",
                                                std::make_unique<RMSNorm>(config.hidden_size, config.rms_norm_eps))) {}

Tensor DecoderLayer::forward_impl(const Tensor& x) {
  // The branch outputs are fresh tensors nobody saved, so the residual sums
  // are written into them in place. x itself is never written: the caller
  // (or recomputation) may still hold it.
  Tensor h = self_attn_.forward(input_layernorm_.forward(x));            // (B,T,D)
  Tensor y = mlp_.forward(post_attention_layernorm_.forward_add(x, h));  // (B,T,D); h = x + h
  ops::add(h, y, y);
  return y;
}

Tensor DecoderLayer::forward_cached(const Tensor& x, const AttentionCache& cache, int64_t start) {
  // forward_impl's residual sums, with the cached attention.
  Tensor h = self_attn_.forward_cached(input_layernorm_.forward(x), cache, start);  // (1,n,D)
  Tensor y = mlp_.forward(post_attention_layernorm_.forward_add(x, h));             // (1,n,D); h = x + h
  ops::add(h, y, y);
  return y;
}

Tensor DecoderLayer::backward_impl(const Tensor& dy) {
  // Residual: the gradient reaching a block's input is dy + d(branch), added
  // by the norm's backward in the same pass.
  Tensor dh = post_attention_layernorm_.backward_add(mlp_.backward(dy), dy);  // (B,T,D)
  return input_layernorm_.backward_add(self_attn_.backward(dh), dh);          // (B,T,D)
}

// --- ReLU ------------------------------------------------------------------------------

Tensor ReLU::forward_impl(const Tensor& x) {
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  ops::relu_forward(x, out);
  x_ = x;
  return out;
}

Tensor ReLU::backward_impl(const Tensor& dy) {
  check_saved(x_, "ReLU");
  Tensor dx = Tensor::empty(x_.shape(), dy.dtype(), dy.device());
  ops::relu_backward(dy, x_, dx);
  release_saved();
  return dx;
}

// --- ModuleList ---------------------------------------------------------------------

Tensor ModuleList::forward_impl(const Tensor& x) {
  Tensor h = x;
  for (const auto& entry : children()) h = entry.second->forward(h);
  return h;
}

Tensor ModuleList::backward_impl(const Tensor& dy) {
  Tensor d = dy;
  for (auto it = children().rbegin(); it != children().rend(); ++it) d = it->second->backward(d);
  return d;
}

}  // namespace st::models
