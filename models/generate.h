#pragma once
// Text generation from a causal language model: the sampling rules (greedy,
// temperature, top-k, top-p) and the loop that feeds each chosen token back.
// The loop sees the model only through a NextTokenLogits function, so the
// same loop runs with a KV cache (a plain Llama, build/generate) or with the
// plain forward over the whole sequence at every step (any Model, e.g. the
// sharded one during training, where every rank runs the forward).
//
//   models::SampleOptions options;  // temperature 0: greedy
//   auto tokens = models::generate(models::next_logits_cached(llama, cache), prompt,
//                                  llama.config().max_position_embeddings, options,
//                                  [](int32_t id) { print(id); return true; });
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

#include "models/llama.h"
#include "models/model.h"

namespace st::models {

/// How the next token is chosen and when generation ends.
struct SampleOptions {
  int64_t max_new_tokens = 64;  // tokens to generate at most (>= 0)
  double temperature = 1.0;     // 0: greedy (argmax, lowest id on ties); else softmax(logits / temperature)
  int64_t top_k = 0;            // sample among the k most likely tokens; 0: all
  double top_p = 1.0;           // nucleus: the fewest most likely tokens whose probability reaches top_p; 1: all
  uint64_t seed = 1234;         // the sampler's generator: the same seed and logits give the same tokens
  int32_t stop_token = -1;      // generation ends after this id (a tokenizer's EOS); -1: none

  /// Throws st::Error naming the option (e.g. "temperature -1: expected >= 0").
  void validate() const;
};

/// Chooses tokens from logits by SampleOptions' rules. Deterministic: the
/// generator is a std::mt19937_64 seeded with `seed` (its sequence is fixed
/// by the C++ standard) and one draw is taken per sampled token (none when
/// greedy); ties in probability are ordered by id.
class TokenSampler {
 public:
  explicit TokenSampler(const SampleOptions& options);
  /// The chosen id in [0, logits.size()); non-finite logits are an error
  /// naming the id.
  int32_t sample(std::span<const float> logits);

 private:
  SampleOptions options_;
  std::mt19937_64 rng_;
};

/// The F32 logits of the token that follows `tokens` (the whole sequence so
/// far: the prompt, then every token chosen). Called once per new token with
/// a sequence one longer than the time before.
using NextTokenLogits = std::function<std::vector<float>(std::span<const int32_t> tokens)>;
/// Called with each new token as soon as it is chosen; false ends generation.
using OnToken = std::function<bool(int32_t token)>;

/// Why generate() returned.
enum class StopReason : uint8_t { MaxNewTokens, StopToken, Context, Caller };

struct Generation {
  std::vector<int32_t> tokens;  // the new tokens (the stop token included when it ended generation)
  StopReason reason = StopReason::MaxNewTokens;
};

/// The loop: up to max_new_tokens tokens, each sampled from next(sequence)
/// and passed to on_token, until the stop token, on_token returning false,
/// or the sequence reaching `context` tokens (model.max_position_embeddings).
/// The prompt must hold between 1 and `context` tokens (an error naming both
/// numbers otherwise).
Generation generate(const NextTokenLogits& next, std::span<const int32_t> prompt, int64_t context,
                    const SampleOptions& options, const OnToken& on_token = {});

/// Logits by the model's own forward over the whole sequence at every step
/// (no cache: O(T^2) work, but any Model and any hooks, e.g. FSDP's; every
/// rank of a sharded model must call it with the same tokens). Tokens go in
/// as I32 [1, T] on `device`; the last position's logits come back.
NextTokenLogits next_logits_full(Model& model, Device device = Device::cpu());

/// Logits by Llama::forward_step with `cache` (emptied first): the prompt in
/// one step, then one token per step. The model and the cache must outlive
/// the returned function.
NextTokenLogits next_logits_cached(Llama& model, KVCache& cache);

/// generate() with next_logits_full(model): what training's eval.sample_tokens calls.
Generation generate(Model& model, std::span<const int32_t> prompt, int64_t context, const SampleOptions& options,
                    const OnToken& on_token = {}, Device device = Device::cpu());

}  // namespace st::models
