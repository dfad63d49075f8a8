// models/generate.h and the KV cache (Llama::forward_step): cached logits
// against the full forward, cached generation against recomputing the whole
// prefix at every step, the sampler's rules, the loop's stops and errors, and
// config.json read back into a model config.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "models/generate.h"
#include "models/hf_config.h"
#include "models/llama.h"
#include "test_util.h"

namespace st::models {
namespace {

using test::error_of;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Two layers with GQA; init_std large enough that the logits are spread out
// (greedy picks are not near-ties) and attention is far from uniform.
ModelConfig tiny_llama(bool tied = false) {
  ModelConfig c;
  c.name = "llama";
  c.vocab_size = 96;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 80;  // two key tiles of the CPU attention (64 positions each)
  c.tie_word_embeddings = tied;
  c.init_std = 0.3;
  return c;
}

std::unique_ptr<Llama> random_llama(const ModelConfig& c, DType dtype = DType::F32, uint64_t seed = 7) {
  auto model = std::make_unique<Llama>(c);
  allocate_parameters(*model, dtype);
  init_parameters(*model, seed);
  return model;
}

std::vector<int32_t> token_ids(int64_t n, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& x : v) x = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  return v;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}

// Logits of every position by forward_step: a prefill of `prefill` tokens,
// then one token per step; each step's rows against the full forward's.
TEST(KvCache, StepLogitsMatchTheFullForward) {
  for (bool tied : {false, true}) {
    const ModelConfig c = tiny_llama(tied);
    auto model = random_llama(c);
    const int64_t t = 75, prefill = 9;  // positions past the first 64-key tile
    const std::vector<int32_t> ids = token_ids(t, c.vocab_size, 3);
    const std::vector<float> full = model->forward(Tensor::from_vector(ids, {1, t})).to_floats();  // (T*V)
    model->release_saved_recursive();
    KVCache cache(c, c.max_position_embeddings, DType::F32);
    int64_t pos = 0;
    double worst = 0;
    while (pos < t) {
      const int64_t n = pos == 0 ? prefill : 1;
      const std::vector<int32_t> part(ids.begin() + pos, ids.begin() + pos + n);
      const std::vector<float> got = model->forward_step(Tensor::from_vector(part, {1, n}), cache, pos).to_floats();
      const std::vector<float> want(full.begin() + pos * c.vocab_size, full.begin() + (pos + n) * c.vocab_size);
      worst = std::max(worst, max_abs_diff(got, want));
      pos += n;
      EXPECT_EQ(cache.length(), pos);
    }
    // Not bit for bit: for one query row the CPU attention's tile products
    // are matrix-vector products, for a tile of rows matrix products, which
    // sum in another order. F32 rounding of sums of a few dozen terms: a
    // relative 1e-6 of the largest logit, asserted with room to 1e-5.
    double largest = 0;
    for (float x : full) largest = std::max(largest, std::fabs(double(x)));
    EXPECT_LT(worst, 1e-5 * largest) << "tied " << tied << ", largest logit " << largest;
    RecordProperty(tied ? "max_abs_diff_tied" : "max_abs_diff", std::to_string(worst));
    RecordProperty(tied ? "largest_logit_tied" : "largest_logit", std::to_string(largest));
  }
}

TEST(KvCache, LastLogitsAreTheLastRow) {
  const ModelConfig c = tiny_llama();
  auto model = random_llama(c);
  const std::vector<int32_t> ids = token_ids(12, c.vocab_size, 4);
  KVCache all(c, 20, DType::F32), last(c, 20, DType::F32);
  const Tensor x = Tensor::from_vector(ids, {1, 12});
  const std::vector<float> rows = model->forward_step(x, all, 0, StepLogits::All).to_floats();
  const Tensor one = model->forward_step(x, last, 0, StepLogits::Last);
  EXPECT_EQ(one.shape(), (Shape{1, 1, c.vocab_size}));
  const std::vector<float> want(rows.end() - c.vocab_size, rows.end());
  EXPECT_LT(max_abs_diff(one.to_floats(), want), 1e-4);
}

// The tentpole: generation with the cache picks the same tokens as
// recomputing the whole prefix with the plain forward at every step, greedy
// and sampled, in F32 and BF16.
TEST(Generate, CachedEqualsFullRecompute) {
  for (DType dtype : {DType::F32, DType::BF16}) {
    const ModelConfig c = tiny_llama();
    auto model = random_llama(c, dtype);
    const std::vector<int32_t> prompt = token_ids(5, c.vocab_size, 5);
    for (double temperature : {0.0, 0.9}) {
      SampleOptions o;
      o.max_new_tokens = 70;  // runs into the context (80) after 75 tokens in all
      o.temperature = temperature;
      o.top_k = temperature > 0 ? 20 : 0;
      o.top_p = temperature > 0 ? 0.95 : 1.0;
      o.seed = 11;
      KVCache cache(c, c.max_position_embeddings, dtype);
      const Generation cached = generate(next_logits_cached(*model, cache), prompt, c.max_position_embeddings, o);
      const Generation full = generate(*model, prompt, c.max_position_embeddings, o);
      EXPECT_EQ(cached.tokens, full.tokens) << dtype_name(dtype) << " temperature " << temperature;
      EXPECT_EQ(cached.tokens.size(), 70u);
      EXPECT_EQ(cached.reason, StopReason::MaxNewTokens);
      // Not a constant stream: the comparison means something.
      std::map<int32_t, int> distinct;
      for (int32_t id : cached.tokens) ++distinct[id];
      EXPECT_GT(distinct.size(), 3u) << dtype_name(dtype) << " temperature " << temperature;
    }
  }
}

TEST(Generate, StopsAtContextStopTokenAndCaller) {
  const ModelConfig c = tiny_llama();
  auto model = random_llama(c);
  const std::vector<int32_t> prompt = token_ids(70, c.vocab_size, 6);
  SampleOptions o;
  o.temperature = 0;
  o.max_new_tokens = 100;
  KVCache cache(c, c.max_position_embeddings, DType::F32);
  Generation g = generate(next_logits_cached(*model, cache), prompt, c.max_position_embeddings, o);
  EXPECT_EQ(g.reason, StopReason::Context);
  EXPECT_EQ(g.tokens.size(), 10u);  // 70 + 10 = 80 positions
  // The third greedy token as the stop token: generation ends right after it.
  o.stop_token = g.tokens[2];
  g = generate(next_logits_cached(*model, cache), prompt, c.max_position_embeddings, o);
  EXPECT_EQ(g.reason, StopReason::StopToken);
  EXPECT_EQ(g.tokens.back(), o.stop_token);
  EXPECT_LE(g.tokens.size(), 3u);
  o.stop_token = -1;
  int seen = 0;
  g = generate(next_logits_cached(*model, cache), prompt, c.max_position_embeddings, o,
               [&](int32_t) { return ++seen < 4; });
  EXPECT_EQ(g.reason, StopReason::Caller);
  EXPECT_EQ(g.tokens.size(), 4u);
}

TEST(Generate, BadPromptsNameTheNumbers) {
  const ModelConfig c = tiny_llama();
  auto model = random_llama(c);
  SampleOptions o;
  const std::vector<int32_t> long_prompt = token_ids(81, c.vocab_size, 8);
  std::string msg = error_of([&] { generate(*model, long_prompt, c.max_position_embeddings, o); });
  EXPECT_TRUE(contains(msg, "81") && contains(msg, "80") && contains(msg, "max_position_embeddings")) << msg;
  msg = error_of([&] { generate(*model, std::vector<int32_t>{}, c.max_position_embeddings, o); });
  EXPECT_TRUE(contains(msg, "empty")) << msg;
  o.top_p = 0;
  msg = error_of([&] { generate(*model, long_prompt, c.max_position_embeddings, o); });
  EXPECT_TRUE(contains(msg, "top_p 0")) << msg;
  KVCache bf16(c, 10, DType::BF16);
  msg = error_of([&] { model->forward_step(Tensor::from_vector(std::vector<int32_t>{1, 2}, {1, 2}), bf16, 0); });
  EXPECT_TRUE(contains(msg, "BF16") && contains(msg, "F32")) << msg;
  KVCache small(c, 10, DType::F32);
  msg = error_of([&] { model->forward_step(Tensor::from_vector(token_ids(11, 96, 1), {1, 11}), small, 0); });
  EXPECT_TRUE(contains(msg, "[0, 11)") && contains(msg, "10")) << msg;
  msg = error_of([&] { KVCache too_big(c, 81, DType::F32); });
  EXPECT_TRUE(contains(msg, "81") && contains(msg, "80")) << msg;
}

// --- the sampler ----------------------------------------------------------------

std::vector<float> log_probs(const std::vector<double>& p) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)));
  return out;
}

std::vector<double> frequencies(SampleOptions o, const std::vector<float>& logits, int draws) {
  TokenSampler sampler(o);
  std::vector<double> f(logits.size(), 0.0);
  for (int i = 0; i < draws; ++i) f[static_cast<size_t>(sampler.sample(logits))] += 1.0;
  for (double& x : f) x /= draws;
  return f;
}

TEST(TokenSampler, GreedyTakesTheFirstLargest) {
  SampleOptions o;
  o.temperature = 0;
  TokenSampler s(o);
  EXPECT_EQ(s.sample(std::vector<float>{0.5f, 2.0f, -1.0f, 2.0f}), 1);
  const std::string msg = error_of([&] { s.sample(std::vector<float>{0.5f, NAN}); });
  EXPECT_TRUE(contains(msg, "token 1")) << msg;
}

TEST(TokenSampler, FrequenciesFollowTheRules) {
  const std::vector<float> logits = log_probs({0.5, 0.3, 0.15, 0.05});
  const int draws = 20000;  // standard error of a frequency <= 0.0036
  SampleOptions o;
  o.temperature = 1.0;
  std::vector<double> f = frequencies(o, logits, draws);
  const std::vector<double> want = {0.5, 0.3, 0.15, 0.05};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(f[i], want[i], 0.02) << "token " << i;
  o.top_k = 2;  // renormalised over the two most likely: 0.625, 0.375
  f = frequencies(o, logits, draws);
  EXPECT_NEAR(f[0], 0.625, 0.02);
  EXPECT_EQ(f[2] + f[3], 0.0);
  o.top_k = 0;
  o.top_p = 0.9;  // 0.5 + 0.3 + 0.15 = 0.95 reaches 0.9: the last token is cut
  f = frequencies(o, logits, draws);
  EXPECT_EQ(f[3], 0.0);
  EXPECT_NEAR(f[2], 0.15 / 0.95, 0.02);
  o.top_p = 0.4;  // the most likely alone reaches it
  EXPECT_EQ(frequencies(o, logits, 200)[0], 1.0);
  o.top_p = 1.0;
  o.temperature = 0.25;  // sharper: p ~ p^4, 0.5^4 / sum = 0.87
  f = frequencies(o, logits, draws);
  EXPECT_NEAR(f[0], 0.0625 / (0.0625 + 0.0081 + 0.00050625 + 0.00000625), 0.02);
}

TEST(TokenSampler, SameSeedSameTokens) {
  const std::vector<float> logits = log_probs({0.2, 0.2, 0.2, 0.2, 0.2});
  SampleOptions o;
  o.seed = 99;
  auto draw = [&](SampleOptions opts) {
    TokenSampler s(opts);
    std::vector<int32_t> v;
    for (int i = 0; i < 50; ++i) v.push_back(s.sample(logits));
    return v;
  };
  EXPECT_EQ(draw(o), draw(o));
  SampleOptions other = o;
  other.seed = 100;
  EXPECT_NE(draw(o), draw(other));
}

// --- config.json ---------------------------------------------------------------------

TEST(HfConfig, LlamaConfigReadsBack) {
  ModelConfig c = tiny_llama(true);
  c.rope_theta = 500000.0;
  c.rms_norm_eps = 1e-6;
  EXPECT_EQ(hf_llama_model_config(hf_llama_config_json(c, "float32"), "config.json"), c);
  std::string msg = error_of([] { hf_llama_model_config(R"({"model_type": "llama", "hidden_size": 8})", "x.json"); });
  EXPECT_TRUE(contains(msg, "x.json") && contains(msg, "vocab_size")) << msg;
  msg = error_of([] { hf_llama_model_config(R"({"model_type": "gpt2"})", "x.json"); });
  EXPECT_TRUE(contains(msg, "gpt2")) << msg;
}

}  // namespace
}  // namespace st::models
