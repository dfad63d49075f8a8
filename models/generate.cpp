// Sampling and the generation loop (models/generate.h). Probabilities are
// formed in double from the F32 logits, so the choice depends on the logits
// and the seed only.
#include "models/generate.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/error.h"

namespace st::models {

void SampleOptions::validate() const {
  ST_CHECK(max_new_tokens >= 0, "max_new_tokens {}: expected a number >= 0", max_new_tokens);
  ST_CHECK(std::isfinite(temperature) && temperature >= 0, "temperature {}: expected a number >= 0 (0: greedy)",
           temperature);
  ST_CHECK(top_k >= 0, "top_k {}: expected a number >= 0 (0: every token)", top_k);
  ST_CHECK(top_p > 0 && top_p <= 1, "top_p {}: expected a number in (0, 1] (1: every token)", top_p);
}

namespace {

// The first index of the largest value.
int32_t argmax(std::span<const float> logits) {
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

// Ids of the `keep` largest logits (all when keep is 0 or too large), most
// likely first, equal logits by ascending id: a total order, so the result
// does not depend on the sort's implementation.
std::vector<int32_t> most_likely(std::span<const float> logits, int64_t keep) {
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  auto before = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
  const auto n = static_cast<int64_t>(ids.size());
  if (keep > 0 && keep < n) {
    std::partial_sort(ids.begin(), ids.begin() + keep, ids.end(), before);
    ids.resize(static_cast<size_t>(keep));
  } else {
    std::sort(ids.begin(), ids.end(), before);
  }
  return ids;
}

// softmax(logits[ids] / temperature), in the order of ids (ids[0] has the largest logit).
std::vector<double> probabilities(std::span<const float> logits, const std::vector<int32_t>& ids, double temperature) {
  std::vector<double> p(ids.size());
  const double top = logits[ids.front()];
  double sum = 0;
  for (size_t j = 0; j < ids.size(); ++j) {
    p[j] = std::exp((static_cast<double>(logits[ids[j]]) - top) / temperature);
    sum += p[j];
  }
  for (double& x : p) x /= sum;
  return p;
}

// How many of the most likely tokens (p sorted descending) the nucleus keeps:
// the fewest whose probabilities add up to top_p, at least one.
size_t nucleus_size(const std::vector<double>& p, double top_p) {
  if (top_p >= 1) return p.size();
  double cumulative = 0;
  for (size_t j = 0; j < p.size(); ++j) {
    cumulative += p[j];
    if (cumulative >= top_p) return j + 1;
  }
  return p.size();
}

}  // namespace

TokenSampler::TokenSampler(const SampleOptions& options) : options_(options), rng_(options.seed) {
  options_.validate();
}

int32_t TokenSampler::sample(std::span<const float> logits) {
  ST_CHECK(!logits.empty(), "sampling: no logits (vocabulary of size 0)");
  for (size_t i = 0; i < logits.size(); ++i) {
    ST_CHECK(std::isfinite(logits[i]), "sampling: the logit of token {} is {}", i, logits[i]);
  }
  if (options_.temperature == 0) return argmax(logits);
  const std::vector<int32_t> ids = most_likely(logits, options_.top_k);
  const std::vector<double> p = probabilities(logits, ids, options_.temperature);
  const size_t kept = nucleus_size(p, options_.top_p);
  const double total = std::accumulate(p.begin(), p.begin() + static_cast<std::ptrdiff_t>(kept), 0.0);
  // A uniform double in [0, total) from the top 53 bits of one draw.
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  for (size_t j = 0; j < kept; ++j) {
    cumulative += p[j];
    if (u < cumulative) return ids[j];
  }
  return ids[kept - 1];  // u within rounding of total
}

Generation generate(const NextTokenLogits& next, std::span<const int32_t> prompt, int64_t context,
                    const SampleOptions& options, const OnToken& on_token) {
  TokenSampler sampler(options);
  const auto prompt_tokens = static_cast<int64_t>(prompt.size());
  ST_CHECK(prompt_tokens > 0, "the prompt is empty: generation needs at least one token to continue");
  ST_CHECK(prompt_tokens <= context,
           "the prompt has {} tokens, more than the model's {} positions (model.max_position_embeddings)",
           prompt_tokens, context);
  std::vector<int32_t> sequence(prompt.begin(), prompt.end());
  Generation out;
  while (true) {
    if (static_cast<int64_t>(out.tokens.size()) >= options.max_new_tokens) {
      out.reason = StopReason::MaxNewTokens;
      break;
    }
    if (static_cast<int64_t>(sequence.size()) >= context) {
      out.reason = StopReason::Context;
      break;
    }
    const int32_t id = sampler.sample(next(sequence));
    sequence.push_back(id);
    out.tokens.push_back(id);
    if (on_token && !on_token(id)) {
      out.reason = StopReason::Caller;
      break;
    }
    if (id == options.stop_token) {
      out.reason = StopReason::StopToken;
      break;
    }
  }
  return out;
}

NextTokenLogits next_logits_full(Model& model, Device device) {
  return [&model, device](std::span<const int32_t> tokens) {
    const auto n = static_cast<int64_t>(tokens.size());
    const Tensor ids = Tensor::from_vector(tokens, {1, n}).to(device);  // (1,T)
    const Tensor logits = model.forward(ids);                           // (1,T,V)
    model.release_saved_recursive();
    const int64_t vocab = logits.size(-1);
    return logits.view({n, vocab}).narrow0(n - 1, 1).to_floats();
  };
}

NextTokenLogits next_logits_cached(Llama& model, KVCache& cache) {
  cache.truncate(0);
  return [&model, &cache](std::span<const int32_t> tokens) {
    // The cache holds tokens [0, start) from the previous calls; the rest is new.
    const int64_t start = cache.length();
    const auto n = static_cast<int64_t>(tokens.size()) - start;
    ST_CHECK(n > 0, "next_logits_cached: {} token(s) given, the KV cache already holds {}", tokens.size(), start);
    const Device device = model.model().embed_tokens().weight().value.device();
    const Tensor ids = Tensor::from_vector(tokens.subspan(static_cast<size_t>(start)), {1, n}).to(device);  // (1,n)
    return model.forward_step(ids, cache, start, StepLogits::Last).to_floats();                             // (1,1,V)
  };
}

Generation generate(Model& model, std::span<const int32_t> prompt, int64_t context, const SampleOptions& options,
                    const OnToken& on_token, Device device) {
  return generate(next_logits_full(model, device), prompt, context, options, on_token);
}

}  // namespace st::models
