// fsdp/wrap.cpp: the exact units each wrap policy chooses for a tiny LLaMA
// and the toy model (counts worked out by hand from the dimensions), that
// wrapping never renames or duplicates a parameter, that tied embeddings stay
// in the root unit, and which modules recompute (fsdp/recompute.h).
#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "fsdp/fsdp.h"
#include "launch/config.h"
#include "models/model.h"
#include "test_util.h"

namespace st::fsdp {
namespace {

// Dimensions of the tiny LLaMA: D = 32, F = 48, V = 64, 4 heads of 8, 2 KV heads.
constexpr int64_t kD = 32, kF = 48, kV = 64, kKv = 2 * (32 / 4);
constexpr int64_t kAttn = kD * kD + 2 * kKv * kD + kD * kD;  // q, k, v, o
constexpr int64_t kMlp = 3 * kD * kF;                        // gate, up, down
constexpr int64_t kLayer = kAttn + kMlp + 2 * kD;            // + two RMSNorms
constexpr int64_t kEmbed = kV * kD;
constexpr int64_t kHead = kD * kV;
static_assert(kAttn == 3072 && kMlp == 4608 && kLayer == 7744 && kEmbed == 2048);

std::unique_ptr<models::Model> tiny_llama(bool tied = false) {
  ModelConfig c;
  c.name = "llama";
  c.vocab_size = kV;
  c.hidden_size = kD;
  c.intermediate_size = kF;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  return models::build_model(c);
}

std::unique_ptr<models::Model> toy() {
  ModelConfig c;
  c.name = "toy";
  return models::build_model(c);
}

AutoWrapConfig none() { return {WrapPolicy::None, 0, {}}; }
AutoWrapConfig by_type(std::vector<std::string> types) { return {WrapPolicy::Transformer, 0, std::move(types)}; }
AutoWrapConfig by_size(int64_t min_num_params) { return {WrapPolicy::SizeBased, min_num_params, {}}; }

using Summary = std::vector<std::pair<std::string, int64_t>>;  // (unit name, numel)

/// The plan as (name, numel), after checking what must hold for every plan:
/// every (FQN, parameter) of named_parameters() is in exactly one unit, with
/// its usual FQN, and nothing else is; each unit lists its parameters in
/// named_parameters() order; numel is the sum of the parameters; the unit's
/// module is the module at its name.
Summary plan(models::Module& root, const AutoWrapConfig& config) {
  const auto units = plan_units(root, config);
  Summary out;
  std::set<std::string> module_names;
  for (const auto& [name, m] : root.named_modules()) module_names.insert(name);
  for (const UnitPlan& u : units) {
    int64_t numel = 0;
    for (const auto& entry : u.params) numel += shape_numel(entry.second->shape);
    EXPECT_EQ(u.numel, numel) << u.name;
    EXPECT_FALSE(u.params.empty()) << u.name;
    EXPECT_TRUE(module_names.count(u.name) > 0) << u.name;
    for (const auto& [name, m] : root.named_modules()) {
      if (name == u.name) {
        EXPECT_EQ(u.module, m) << u.name;
      }
    }
    for (const auto& entry : u.params) {
      // A unit holds its own subtree: every FQN sits under the unit's name.
      EXPECT_TRUE(u.name.empty() || entry.first.rfind(u.name + ".", 0) == 0) << entry.first << " in " << u.name;
    }
    out.emplace_back(u.name, u.numel);
  }
  const auto named = root.named_parameters();
  std::vector<int> seen(named.size(), 0);
  for (const UnitPlan& u : units) {
    size_t next = 0;  // position in `named` after the unit's previous parameter
    for (const auto& entry : u.params) {
      size_t i = next;
      while (i < named.size() && named[i] != entry) ++i;
      EXPECT_LT(i, named.size()) << entry.first << " of unit '" << u.name << "' is not named so, or out of order";
      if (i < named.size()) ++seen[i];
      next = i + 1;
    }
  }
  for (size_t i = 0; i < named.size(); ++i) EXPECT_EQ(seen[i], 1) << named[i].first;
  return out;
}

std::vector<std::string> unit_params(models::Module& root, const AutoWrapConfig& config, const std::string& unit) {
  std::vector<std::string> out;
  for (const UnitPlan& u : plan_units(root, config)) {
    if (u.name != unit) continue;
    for (const auto& entry : u.params) out.push_back(entry.first);
  }
  return out;
}

// --- policies on the untied tiny LLaMA -------------------------------------------

TEST(Wrap, NoneIsOneUnitWithEveryParameter) {
  auto m = tiny_llama();
  EXPECT_EQ(plan(*m, none()), (Summary{{"", kEmbed + 3 * kLayer + kD + kHead}}));
  EXPECT_EQ(plan_units(*m, none())[0].module, m.get());
}

TEST(Wrap, TransformerWrapsEachDecoderLayer) {
  auto m = tiny_llama();
  EXPECT_EQ(plan(*m, by_type({"DecoderLayer"})), (Summary{{"", kEmbed + kD + kHead},
                                                          {"model.layers.0", kLayer},
                                                          {"model.layers.1", kLayer},
                                                          {"model.layers.2", kLayer}}));
  EXPECT_EQ(unit_params(*m, by_type({"DecoderLayer"}), ""),
            (std::vector<std::string>{"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}));
  EXPECT_EQ(
      unit_params(*m, by_type({"DecoderLayer"}), "model.layers.1"),
      (std::vector<std::string>{"model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight",
                                "model.layers.1.self_attn.v_proj.weight", "model.layers.1.self_attn.o_proj.weight",
                                "model.layers.1.mlp.gate_proj.weight", "model.layers.1.mlp.up_proj.weight",
                                "model.layers.1.mlp.down_proj.weight", "model.layers.1.input_layernorm.weight",
                                "model.layers.1.post_attention_layernorm.weight"}));
}

TEST(Wrap, TransformerNestsUnitsAndDropsParameterlessOnes) {
  auto m = tiny_llama();
  // MLP inside DecoderLayer: the layer keeps attention and norms.
  EXPECT_EQ(plan(*m, by_type({"DecoderLayer", "MLP"})), (Summary{{"", kEmbed + kD + kHead},
                                                                 {"model.layers.0", kAttn + 2 * kD},
                                                                 {"model.layers.0.mlp", kMlp},
                                                                 {"model.layers.1", kAttn + 2 * kD},
                                                                 {"model.layers.1.mlp", kMlp},
                                                                 {"model.layers.2", kAttn + 2 * kD},
                                                                 {"model.layers.2.mlp", kMlp}}));
  // The toy model's ReLU has no parameters: no unit for it.
  auto t = toy();
  EXPECT_EQ(plan(*t, by_type({"ReLU"})), (Summary{{"", 16 * 16 + 16 + 16 * 8 + 8}}));
}

TEST(Wrap, TransformerRejectsUnknownAndEmptyTypes) {
  auto m = tiny_llama();
  EXPECT_EQ(test::error_of([&] {
              plan_units(*m, by_type({"DecoderLayer", "Block"}));
            }),
            "fsdp.auto_wrap.module_types: no module of type 'Block' in this model; its module types are: Attention, "
            "DecoderLayer, Embedding, Linear, LlamaForCausalLM, LlamaModel, MLP, ModuleList, RMSNorm");
  // An empty list is refused by the config's one check of it, before any plan.
  FsdpConfig empty;
  empty.auto_wrap = by_type({});
  EXPECT_NE(test::error_of([&] { empty.validate(); }).find("fsdp.auto_wrap.module_types"), std::string::npos);
}

TEST(Wrap, SizeBasedJustBelowALayerWrapsTheLayers) {
  // 7000: no child of a layer reaches it (attention 3072, MLP 4608), the layer
  // (7744) does; what is left of `layers` (0) and `model` (2080) does not.
  auto m = tiny_llama();
  EXPECT_EQ(plan(*m, by_size(7000)), (Summary{{"", kEmbed + kD + kHead},
                                              {"model.layers.0", kLayer},
                                              {"model.layers.1", kLayer},
                                              {"model.layers.2", kLayer}}));
  EXPECT_EQ(plan(*m, by_size(kLayer)), plan(*m, by_size(7000)));  // the threshold is inclusive
}

TEST(Wrap, SizeBasedSmallerThresholdWrapsChildrenFirst) {
  auto m = tiny_llama();
  // 3000: attention (3072) and MLP (4608) qualify; each layer keeps only its
  // two norms (64 < 3000), so the layers, `layers` and `model` do not.
  EXPECT_EQ(plan(*m, by_size(3000)), (Summary{{"", kEmbed + 3 * 2 * kD + kD + kHead},
                                              {"model.layers.0.self_attn", kAttn},
                                              {"model.layers.0.mlp", kMlp},
                                              {"model.layers.1.self_attn", kAttn},
                                              {"model.layers.1.mlp", kMlp},
                                              {"model.layers.2.self_attn", kAttn},
                                              {"model.layers.2.mlp", kMlp}}));
  // 2000: the embedding and lm_head (2048 each) qualify as well.
  EXPECT_EQ(plan(*m, by_size(2000)), (Summary{{"", 3 * 2 * kD + kD},
                                              {"model.embed_tokens", kEmbed},
                                              {"model.layers.0.self_attn", kAttn},
                                              {"model.layers.0.mlp", kMlp},
                                              {"model.layers.1.self_attn", kAttn},
                                              {"model.layers.1.mlp", kMlp},
                                              {"model.layers.2.self_attn", kAttn},
                                              {"model.layers.2.mlp", kMlp},
                                              {"lm_head", kHead}}));
  // 1000: q and o (1024) are units; k and v (512 each) are not, so attention
  // is judged on their 1024 and qualifies too; each MLP linear (1536) is a
  // unit, leaving its MLP nothing.
  Summary expected{{"", 3 * 2 * kD + kD}, {"model.embed_tokens", kEmbed}};
  for (int i = 0; i < 3; ++i) {
    const std::string l = "model.layers." + std::to_string(i);
    expected.insert(expected.end(), {{l + ".self_attn", 2 * kKv * kD},
                                     {l + ".self_attn.q_proj", kD * kD},
                                     {l + ".self_attn.o_proj", kD * kD},
                                     {l + ".mlp.gate_proj", kD * kF},
                                     {l + ".mlp.up_proj", kD * kF},
                                     {l + ".mlp.down_proj", kD * kF}});
  }
  expected.emplace_back("lm_head", kHead);
  EXPECT_EQ(plan(*m, by_size(1000)), expected);
  EXPECT_EQ(
      unit_params(*m, by_size(1000), "model.layers.2.self_attn"),
      (std::vector<std::string>{"model.layers.2.self_attn.k_proj.weight", "model.layers.2.self_attn.v_proj.weight"}));
}

TEST(Wrap, SizeBasedLargeThresholdsWrapWholeSubtrees) {
  auto m = tiny_llama();
  const int64_t model_numel = kEmbed + 3 * kLayer + kD;  // 25312
  // 20000: the layers one by one do not qualify, the ModuleList (23232) does.
  EXPECT_EQ(plan(*m, by_size(20000)), (Summary{{"", kEmbed + kD + kHead}, {"model.layers", 3 * kLayer}}));
  // 25000: only the whole LlamaModel does; the root keeps lm_head.
  EXPECT_EQ(plan(*m, by_size(25000)), (Summary{{"", kHead}, {"model", model_numel}}));
  // Above the model's size: the root alone.
  EXPECT_EQ(plan(*m, by_size(30000)), (Summary{{"", model_numel + kHead}}));
}

// --- tied embeddings -------------------------------------------------------------

TEST(Wrap, TiedEmbeddingStaysInTheRootUnit) {
  auto m = tiny_llama(/*tied=*/true);
  // lm_head owns nothing; the embedding weight is named once, in the root unit.
  EXPECT_EQ(
      plan(*m, by_type({"DecoderLayer"})),
      (Summary{{"", kEmbed + kD}, {"model.layers.0", kLayer}, {"model.layers.1", kLayer}, {"model.layers.2", kLayer}}));
  // Asking for the embedding (or lm_head's Linear) by type does not move it.
  EXPECT_EQ(plan(*m, by_type({"DecoderLayer", "Embedding"})), plan(*m, by_type({"DecoderLayer"})));
  EXPECT_EQ(unit_params(*m, by_type({"Linear"}), ""),
            (std::vector<std::string>{
                "model.embed_tokens.weight", "model.layers.0.input_layernorm.weight",
                "model.layers.0.post_attention_layernorm.weight", "model.layers.1.input_layernorm.weight",
                "model.layers.1.post_attention_layernorm.weight", "model.layers.2.input_layernorm.weight",
                "model.layers.2.post_attention_layernorm.weight", "model.norm.weight"}));
  // 2000: the embedding would qualify (2048) but is shared with lm_head.
  EXPECT_EQ(plan(*m, by_size(2000)), (Summary{{"", kEmbed + 3 * 2 * kD + kD},
                                              {"model.layers.0.self_attn", kAttn},
                                              {"model.layers.0.mlp", kMlp},
                                              {"model.layers.1.self_attn", kAttn},
                                              {"model.layers.1.mlp", kMlp},
                                              {"model.layers.2.self_attn", kAttn},
                                              {"model.layers.2.mlp", kMlp}}));
  // 25000: `model` would qualify but holds the shared weight; the layers'
  // ModuleList (23232) falls short, so everything stays in the root.
  EXPECT_EQ(plan(*m, by_size(25000)), (Summary{{"", kEmbed + 3 * kLayer + kD}}));
  // 20000: the ModuleList holds no shared weight and may be a unit.
  EXPECT_EQ(plan(*m, by_size(20000)), (Summary{{"", kEmbed + kD}, {"model.layers", 3 * kLayer}}));
}

// --- toy model -------------------------------------------------------------------

TEST(Wrap, ToySizeBased) {
  auto t = toy();
  const int64_t net1 = 16 * 16 + 16, net2 = 16 * 8 + 8;  // 272, 136
  EXPECT_EQ(plan(*t, by_size(200)), (Summary{{"", net2}, {"net1", net1}}));
  EXPECT_EQ(unit_params(*t, by_size(200), ""), (std::vector<std::string>{"net2.weight", "net2.bias"}));
  // Both linears qualify and the root is left with nothing, so it is no unit.
  EXPECT_EQ(plan(*t, by_size(100)), (Summary{{"net1", net1}, {"net2", net2}}));
  EXPECT_EQ(plan(*t, by_size(1000)), (Summary{{"", net1 + net2}}));
}

// --- activation checkpointing ---------------------------------------------------

std::vector<bool> recomputing_layers(models::Module& root) {
  std::vector<bool> out;
  for (const auto& [name, m] : root.named_modules()) {
    if (m->type_name() == "DecoderLayer") {
      out.push_back(is_recomputed(*m));
    } else {
      EXPECT_FALSE(is_recomputed(*m)) << name;  // nothing else is ever touched
    }
  }
  return out;
}

/// FQNs of the recomputed modules, in pre-order.
std::vector<std::string> recomputed_modules(models::Module& root) {
  std::vector<std::string> out;
  for (const auto& [name, m] : root.named_modules()) {
    if (is_recomputed(*m)) out.push_back(name);
  }
  return out;
}

TEST(Wrap, ActivationCheckpointing) {
  {
    auto m = tiny_llama();
    EXPECT_EQ(apply_activation_checkpointing(*m, {RecomputeMode::None, 2}), 0);
    EXPECT_EQ(recomputing_layers(*m), (std::vector<bool>{false, false, false}));
  }
  {
    auto m = tiny_llama();
    EXPECT_EQ(apply_activation_checkpointing(*m, {RecomputeMode::Full, 2}), 3);
    EXPECT_EQ(recomputing_layers(*m), (std::vector<bool>{true, true, true}));
  }
  {
    auto m = tiny_llama();
    EXPECT_EQ(apply_activation_checkpointing(*m, {RecomputeMode::EveryN, 2}), 2);
    EXPECT_EQ(recomputing_layers(*m), (std::vector<bool>{true, false, true}));
  }
  {
    auto m = tiny_llama();
    EXPECT_EQ(apply_activation_checkpointing(*m, {RecomputeMode::EveryN, 1}), 3);
    // n = 0 is refused by the config's one check of it (FsdpConfig::validate).
    FsdpConfig zero;
    zero.activation_checkpointing = {RecomputeMode::EveryN, 0};
    EXPECT_NE(test::error_of([&] { zero.validate(); }).find("fsdp.activation_checkpointing.n"), std::string::npos);
  }
  // The toy model has no decoder layers: with the default module_types
  // ([DecoderLayer]) that is an error naming the key and the model's types,
  // as for fsdp.auto_wrap.module_types; mode none checks nothing.
  auto t = toy();
  EXPECT_EQ(apply_activation_checkpointing(*t, {RecomputeMode::None, 2}), 0);
  EXPECT_EQ(test::error_of([&] {
              apply_activation_checkpointing(*t, {RecomputeMode::Full, 2});
            }),
            "fsdp.activation_checkpointing.module_types: no module of type 'DecoderLayer' in this model; its module "
            "types are: Linear, ReLU, ToyModel");
  EXPECT_TRUE(recomputed_modules(*t).empty());
}

TEST(Wrap, ActivationCheckpointingOfConfiguredTypes) {
  {
    auto m = tiny_llama();
    EXPECT_EQ(apply_activation_checkpointing(*m, {RecomputeMode::Full, 2, {"MLP"}}), 3);
    EXPECT_EQ(recomputed_modules(*m),
              (std::vector<std::string>{"model.layers.0.mlp", "model.layers.1.mlp", "model.layers.2.mlp"}));
  }
  {
    // every_n counts the modules of every listed type together, in pre-order:
    // attention 0, MLP 0, attention 1, MLP 1, ... of which 0 and 3 here.
    auto m = tiny_llama();
    EXPECT_EQ(apply_activation_checkpointing(*m, {RecomputeMode::EveryN, 3, {"MLP", "Attention"}}), 2);
    EXPECT_EQ(recomputed_modules(*m), (std::vector<std::string>{"model.layers.0.self_attn", "model.layers.1.mlp"}));
  }
  {
    auto t = toy();
    EXPECT_EQ(apply_activation_checkpointing(*t, {RecomputeMode::Full, 2, {"Linear"}}), 2);
    EXPECT_EQ(recomputed_modules(*t), (std::vector<std::string>{"net1", "net2"}));
    EXPECT_NE(test::error_of([&] {
                apply_activation_checkpointing(*t, {RecomputeMode::Full, 2, {"Linear"}});
              }).find("fsdp.activation_checkpointing.module_types: module 'net1' (Linear) already has a wrapper"),
              std::string::npos);
  }
  auto m = tiny_llama();
  // An empty list is the config's to refuse (FsdpConfig::validate, the one check of it).
  FsdpConfig empty;
  empty.activation_checkpointing = {RecomputeMode::Full, 2, {}};
  EXPECT_EQ(test::error_of([&] { empty.validate(); }),
            "invalid value [] for 'fsdp.activation_checkpointing.module_types': expected at least one module type "
            "name when fsdp.activation_checkpointing.mode is not none, e.g. [DecoderLayer]");
  EXPECT_EQ(test::error_of([&] {
              apply_activation_checkpointing(*m, {RecomputeMode::EveryN, 2, {"MLP", "Block"}});
            }),
            "fsdp.activation_checkpointing.module_types: no module of type 'Block' in this model; its module types "
            "are: Attention, DecoderLayer, Embedding, Linear, LlamaForCausalLM, LlamaModel, MLP, ModuleList, RMSNorm");
  EXPECT_TRUE(recomputed_modules(*m).empty());  // nothing wrapped when the config is refused
}

}  // namespace
}  // namespace st::fsdp
