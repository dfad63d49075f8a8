// generate: continue a prompt with a trained model, in one process (issue 15).
//
//   generate --checkpoint DIR|auto (--prompt TEXT | --prompt-file PATH) [--max-new-tokens N]
//            [--temperature T] [--top-k K] [--top-p P] [--seed S] [--num-samples N]
//            [--root DIR | --config FILE] [--tokenizer FILE] [--no-bos] [--threads N]
//            [--json] [--logits FILE]
//
// DIR is any checkpoint of the trainer (unified or sharded, saved at any world
// size), a checkpoint root (its newest complete checkpoint), or a Hugging Face
// llama directory (config.json + model*.safetensors). The weights load in F32
// from the master weights when the checkpoint has them, else from model-*;
// the model config comes from trainer_state.json's copy of the run's YAML,
// else from config.json. Tokens stream to stdout; a tokens/s line goes to
// stderr. Errors reach run_main (core/cli.h): one line, exit 1 (2 for a
// mistake on the command line).
#include "models/generate.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/commit.h"
#include "checkpoint/index.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/state.h"
#include "core/cli.h"
#include "core/cpu/parallel.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "core/text.h"
#include "dataset/tokenizer.h"
#include "launch/config.h"
#include "models/hf_config.h"
#include "models/llama.h"

namespace {

namespace fs = std::filesystem;
using st::format;
using st::dataset::Tokenizer;

// ---- threads -----------------------------------------------------------------------

/// Below this hidden size one token's matrix products are too small to share:
/// waking and joining the threads costs more than the work they split. On the
/// 2-core AMD EPYC kind (docs/generation.md, "Threads"), 1 thread ran 2.2x as
/// fast as 2 at hidden size 128 (the tutorial's model) and as fast at 256;
/// from 384 on, 2 threads were 1.5-1.6x faster when the other core was free
/// and 1.2-1.4x slower when another job kept it busy; 512 keeps 1 thread for
/// the sizes where sharing gains least.
constexpr int64_t kThreadedHiddenSize = 512;

constexpr const char* kThreadsHelp =
    "CPU threads (default 0: 1 thread for a model of hidden_size below 512, where\n"
    "one token's work is too small to share; else the cores this process may use)";

/// --threads 0: one thread for small models, else every core this process may use.
int default_threads(const st::ModelConfig& config) {
  return config.hidden_size < kThreadedHiddenSize ? 1 : st::cpu::auto_cpu_threads(1);
}

// ---- command line ----------------------------------------------------------------

/// Command line of `generate`.
struct GenerateArgs {
  bool help = false;
  std::string checkpoint;             // --checkpoint DIR|auto
  std::string root;                   // --root DIR: where `auto` looks
  std::string config;                 // --config FILE: `auto` looks in its checkpoint.dir
  std::optional<std::string> prompt;  // --prompt TEXT (this or --prompt-file)
  std::string prompt_file;            // --prompt-file PATH: the prompt is the file's text, as it is
  std::string tokenizer;              // --tokenizer FILE: a SentencePiece model instead of the checkpoint's
  bool no_bos = false;                // --no-bos: encode the prompt without BOS whatever the tokenizer says
  int64_t num_samples = 1;            // --num-samples N: continuations of the prompt, seeds S, S+1, ...
  int threads = 0;                    // --threads N: CPU threads; 0 = default_threads()'s rule
  bool json = false;                  // --json: one JSON object at the end instead of streaming
  std::string logits;                 // --logits FILE: the prompt's logits (safetensors) for comparisons
  st::models::SampleOptions sample;   // --max-new-tokens, --temperature, --top-k, --top-p, --seed
};

/// The flags, writing into `args`.
st::cli::Parser generate_parser(GenerateArgs& args) {
  st::models::SampleOptions& s = args.sample;
  st::cli::Parser p("generate", "generate --checkpoint DIR|auto (--prompt TEXT | --prompt-file PATH) [options]");
  p.option("--checkpoint", "DIR", &args.checkpoint,
           "a checkpoint (unified or sharded, any world size), a checkpoint root (its newest\n"
           "complete checkpoint) or a Hugging Face llama directory; `auto`: the newest\n"
           "complete checkpoint under --root DIR, or under checkpoint.dir of --config FILE")
      .option("--root", "DIR", &args.root, "where --checkpoint auto looks")
      .option("--config", "FILE", &args.config, "--checkpoint auto looks in its checkpoint.dir")
      .option("--prompt", "TEXT", &args.prompt,
              "the text to continue (at most model.max_position_embeddings tokens, BOS included)")
      .option("--prompt-file", "PATH", &args.prompt_file,
              "the text to continue is this file's, byte for byte (a final newline included);\n"
              "it must be UTF-8")
      .option("--max-new-tokens", "N", &s.max_new_tokens,
              "tokens to generate (default 64); generation stops early at the model's\n"
              "max_position_embeddings tokens in all (a note says so) or at the tokenizer's EOS",
              0)
      .option("--temperature", "T", &s.temperature, "0: greedy; else sample from softmax(logits / T) (default 1.0)")
      .option("--top-k", "K", &s.top_k, "sample among the K most likely tokens; 0: all (default 0)", 0)
      .option("--top-p", "P", &s.top_p,
              "sample among the fewest most likely tokens whose probability reaches P (default 0.9)")
      .option(
          "--seed", "S",
          [&s](const std::string& v) { s.seed = static_cast<uint64_t>(st::cli::to_int("--seed", v, 0)); },
          "the sampler's seed: the same seed gives the same text (default 1234)")
      .option("--num-samples", "N", &args.num_samples,
              "continue the prompt N times, with seeds S, S+1, ..., S+N-1 (default 1); with N > 1\n"
              "each continuation follows a line `--- sample K of N (seed S+K-1) ---`",
              1, 100000)
      .option("--tokenizer", "FILE", &args.tokenizer,
              "a SentencePiece model to use instead of the checkpoint's tokenizer.model\n"
              "(without either, ids are bytes: model.vocab_size must be 256)")
      .flag("--no-bos", &args.no_bos,
            "encode the prompt without BOS. By default it starts with the tokenizer's BOS, as a\n"
            "Hugging Face tokenizer encodes it: when the tokenizer's tokenizer_config.json (beside\n"
            "it) says add_bos_token true, or, without that file, whenever the tokenizer has a BOS\n"
            "(training framed every document with one); bytes have none")
      .option("--threads", "N", &args.threads, kThreadsHelp, 0, std::numeric_limits<int>::max())
      .flag("--json", &args.json,
            "print one JSON object per sample at its end (prompt_ids, ids, text, stop, seed,\n"
            "seconds, tokens_per_s) instead of streaming the text")
      .option("--logits", "FILE", &args.logits,
              "also write the prompt's logits, one forward over all its positions, to FILE\n"
              "(safetensors: logits F32 [T, vocab], input_ids I32 [T]) before generating")
      .usage_without_arguments();
  return p;
}

/// Parses argv (without the program name); throws st::cli::UsageError naming the bad argument.
GenerateArgs parse_generate_args(const std::vector<std::string>& argv) {
  GenerateArgs args;
  args.sample.top_p = 0.9;
  args.help = generate_parser(args).parse(argv);
  if (args.help) return args;
  if (args.checkpoint.empty() && (!args.root.empty() || !args.config.empty())) args.checkpoint = "auto";
  ST_USAGE_CHECK(!args.checkpoint.empty(), "--checkpoint DIR|auto is required (see --help)");
  ST_USAGE_CHECK(args.prompt.has_value() || !args.prompt_file.empty(),
                 "--prompt TEXT or --prompt-file PATH is required (see --help)");
  ST_USAGE_CHECK(!(args.prompt.has_value() && !args.prompt_file.empty()),
                 "--prompt and --prompt-file {} both given: give one", args.prompt_file);
  try {
    args.sample.validate();
  } catch (const st::Error& e) {
    // The message starts with the field's name: "top_p 0: ..." -> "--top-p 0: ...".
    std::string message = e.message();
    std::replace(message.begin(), message.begin() + static_cast<std::ptrdiff_t>(message.find(' ')), '_', '-');
    st::cli::usage_error("--" + message);
  }
  return args;
}

// ---- the checkpoint ----------------------------------------------------------------

// `--checkpoint auto`: the newest complete checkpoint under --root, or under
// checkpoint.dir of --config.
std::string auto_checkpoint(const GenerateArgs& args) {
  std::string root = args.root, from = "--root";
  if (root.empty()) {
    ST_CHECK(!args.config.empty(), "--checkpoint auto needs --root DIR or --config FILE (with checkpoint.dir)");
    root = st::load_config(args.config).checkpoint.dir;
    from = format("checkpoint.dir of {}", args.config);
    ST_CHECK(!root.empty(), "--checkpoint auto: checkpoint.dir is empty in {}; pass --root DIR", args.config);
  }
  const std::optional<st::checkpoint::ResumeChoice> choice = st::checkpoint::choose_resume(root);
  ST_CHECK(choice.has_value(), "--checkpoint auto: no complete checkpoint under {} ({})", root, from);
  if (!choice->note.empty()) std::fprintf(stderr, "generate: %s\n", choice->note.c_str());
  return choice->path;
}

/// The directory `--checkpoint` names (a root stands for its newest complete step).
fs::path named_checkpoint(const GenerateArgs& args) {
  if (args.checkpoint == "auto") return auto_checkpoint(args);
  std::error_code ec;
  ST_CHECK(fs::exists(args.checkpoint, ec), "checkpoint {} does not exist", args.checkpoint);
  const st::checkpoint::ResolvedDir resolved = st::checkpoint::resolve_checkpoint_dir(args.checkpoint);
  if (!resolved.note.empty()) std::fprintf(stderr, "generate: %s\n", resolved.note.c_str());
  return resolved.path;
}

/// The directory to load: a checkpoint that passes the trainer's own check
/// (check_checkpoint: COMPLETE marker, sizes, checksums), or a Hugging Face model directory.
std::string checkpoint_dir(const GenerateArgs& args) {
  const fs::path dir = named_checkpoint(args);
  std::error_code ec;
  const st::checkpoint::CheckedCheckpoint checked = st::checkpoint::require_checkpoint(dir);
  if (const std::string note = checked.unchecked_note(dir.string()); !note.empty())
    std::fprintf(stderr, "generate: note: %s\n", note.c_str());
  ST_CHECK(!checked.model_dir || fs::is_regular_file(dir / st::models::kHfConfigName, ec),
           "{} is not a checkpoint: it has neither trainer_state.json nor config.json", dir.string());
  return dir.string();
}

/// model.* of the run that saved `dir` (trainer_state.json's YAML), else of its config.json.
st::ModelConfig model_config_of(const std::string& dir) {
  const auto state = st::checkpoint::read_trainer_state_if_present(dir);
  const fs::path hf = fs::path(dir) / st::models::kHfConfigName;
  std::error_code ec;
  if (state && !state->config_yaml.empty()) {
    try {
      return st::load_config_from_string(state->config_yaml, (fs::path(dir) / "trainer_state.json").string()).model;
    } catch (const st::Error& e) {
      // A run of another version may have keys this one lacks: config.json still describes the model.
      if (!fs::is_regular_file(hf, ec)) throw;
      std::fprintf(stderr, "generate: note: %s; reading %s instead\n", e.message().c_str(), hf.string().c_str());
    }
  }
  ST_CHECK(fs::is_regular_file(hf, ec), "{} has no model config: no config in trainer_state.json and no {}", dir,
           hf.string());
  return st::models::hf_llama_model_config(st::read_file(hf, "Hugging Face config"), hf.string());
}

/// The tensors of `dir` that hold the weights: its master weights when it has
/// them, else its model-* weights. The optimizer state is left out, so that
/// the load neither reads nor checksums it.
st::checkpoint::Catalog weights_catalog(const std::string& dir) {
  st::checkpoint::Catalog catalog = st::checkpoint::read_catalog(dir);
  const std::string_view kind =
      catalog.has_kind(st::checkpoint::kMasterKind) ? st::checkpoint::kMasterKind : st::checkpoint::kModelKind;
  std::erase_if(catalog.tensors, [&](const auto& tensor) { return tensor.first.second != kind; });
  ST_CHECK(!catalog.tensors.empty(), "{} holds no model weights (no tensors of kind master or model)", dir);
  return catalog;
}

/// Refuses a model that has no text to generate, before a tokenizer is
/// looked for: the toy model maps features to features.
void check_generates_text(const st::ModelConfig& config, const std::string& dir) {
  ST_CHECK(config.name != "toy",
           "{} holds the toy model (model.name toy: it maps numbers to numbers and has no tokens), which cannot "
           "generate text; "
           "generate needs a llama checkpoint",
           dir);
  ST_CHECK(config.name == "llama", "{}: model.name is '{}'; generate needs a llama model", dir, config.name);
}

/// The model with F32 weights read from `dir` (weights_catalog; BF16 model-*
/// weights are widened).
std::unique_ptr<st::models::Llama> load_llama(const std::string& dir, const st::ModelConfig& config) {
  check_generates_text(config, dir);
  auto model = std::make_unique<st::models::Llama>(config);
  st::models::allocate_parameters(*model, st::DType::F32);
  std::vector<st::StateEntry> entries;
  for (auto& [fqn, p] : model->named_parameters()) {
    entries.push_back({fqn, std::string(st::checkpoint::kMasterKind), p->shape, st::DType::F32, 0,
                       p->value.view({p->value.numel()})});
  }
  st::checkpoint::LoadOptions options;
  options.master_from_model = true;  // no master weights: the model-* weights
  options.refuse_nonfinite = true;
  st::checkpoint::load_entries(weights_catalog(dir), entries, options);
  return model;
}

// ---- text <-> ids ------------------------------------------------------------------
// Generation sees a tokenizer only through these function objects, built
// from dataset/tokenizer.h's Tokenizer (SentencePiece or bytes).

/// What generate needs of a tokenizer.
struct TextCodec {
  std::string name;                                                // "bytes" or the model file
  int64_t vocab_size = 0;                                          // ids are in [0, vocab_size)
  int32_t eos_id = -1;                                             // generation ends after it; -1: none
  int32_t bos_id = -1;                                             // the prompt starts with it; -1: no BOS
  std::string bos_rule;                                            // why the prompt does or does not start with BOS
  std::function<std::vector<int32_t>(const std::string&)> encode;  // no BOS/EOS added
  std::function<std::string(int32_t)> decode_piece;                // the text one id adds, for streaming

  /// The prompt's ids: BOS (when bos_id >= 0), then encode(text).
  std::vector<int32_t> prompt_ids(const std::string& text) const {
    std::vector<int32_t> ids;
    if (bos_id >= 0) ids.push_back(bos_id);
    const std::vector<int32_t> body = encode(text);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }
};

/// Whether the prompt starts with BOS, and why, as a Hugging Face user's
/// tokenizer would encode it: tokenizer_config.json's add_bos_token (true when
/// the file leaves it out, LlamaTokenizer's default); without that file,
/// whenever the tokenizer has a BOS, since training framed every document
/// with one (dataset/tokenizer.h: encode_document).
std::pair<bool, std::string> bos_rule(const Tokenizer& tokenizer, const fs::path& config_dir, bool no_bos) {
  if (no_bos) return {false, "no BOS (--no-bos)"};
  if (tokenizer.bos_id() < 0) return {false, "no BOS (the tokenizer has none)"};
  const fs::path config = config_dir / st::dataset::kTokenizerConfigName;
  std::error_code ec;
  if (!fs::is_regular_file(config, ec)) return {true, "BOS first (training's framing; no tokenizer_config.json)"};
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(st::read_file(config, "tokenizer config"));
  } catch (const nlohmann::json::exception& e) {
    ST_CHECK(false, "{} is not valid JSON: {}", config.string(), e.what());
  }
  ST_CHECK(j.is_object(), "{} is not a JSON object", config.string());
  if (!j.contains("add_bos_token")) return {true, format("BOS first ({} has no add_bos_token: true)", config.string())};
  ST_CHECK(j["add_bos_token"].is_boolean(), "{}: add_bos_token is {}, expected true or false", config.string(),
           j["add_bos_token"].dump());
  const bool add = j["add_bos_token"].get<bool>();
  return {add,
          format("{} ({}: add_bos_token {})", add ? "BOS first" : "no BOS", config.string(), add ? "true" : "false")};
}

/// The codec of `tokenizer`, whose tokenizer_config.json (if any) is in `config_dir`.
TextCodec codec_of(const Tokenizer& tokenizer, const fs::path& config_dir, bool no_bos) {
  TextCodec c;
  c.name = tokenizer.is_bytes() ? std::string("bytes") : tokenizer.path();
  c.vocab_size = tokenizer.vocab_size();
  c.eos_id = tokenizer.eos_id();
  bool bos = false;
  std::tie(bos, c.bos_rule) = bos_rule(tokenizer, config_dir, no_bos);
  c.bos_id = bos ? tokenizer.bos_id() : -1;
  c.encode = [tokenizer](const std::string& text) { return tokenizer.encode(text); };
  c.decode_piece = [tokenizer](int32_t id) { return tokenizer.decode_piece(id); };
  return c;
}

/// --tokenizer, else the checkpoint's tokenizer.model, else bytes; its
/// vocabulary must be the model's. The tokenizer_config.json looked at is the
/// one beside the tokenizer's file.
TextCodec text_codec(const GenerateArgs& args, const std::string& dir, int64_t model_vocab) {
  const fs::path beside = fs::path(dir) / "tokenizer.model";
  std::error_code ec;
  const bool own = args.tokenizer.empty() && fs::is_regular_file(beside, ec);
  const fs::path config_dir = !args.tokenizer.empty() ? fs::path(args.tokenizer).parent_path() : fs::path(dir);
  TextCodec codec = codec_of(!args.tokenizer.empty() ? Tokenizer::load(args.tokenizer)
                             : own                   ? Tokenizer::load(beside.string())
                                                     : Tokenizer::bytes(),
                             config_dir, args.no_bos);
  ST_CHECK(codec.vocab_size == model_vocab, "the tokenizer ({}) has {} tokens but the model has model.vocab_size {}{}",
           codec.name, codec.vocab_size, model_vocab,
           args.tokenizer.empty() ? "; pass the run's tokenizer with --tokenizer FILE" : "");
  return codec;
}

// ---- the run -----------------------------------------------------------------------

const char* stop_name(st::models::StopReason r) {
  switch (r) {
    case st::models::StopReason::MaxNewTokens: return "max_new_tokens";
    case st::models::StopReason::StopToken: return "eos";
    case st::models::StopReason::Context: return "max_position_embeddings";
    case st::models::StopReason::Caller: return "caller";
  }
  return "?";
}

/// The prompt's text (--prompt, or --prompt-file's bytes, which must be UTF-8)
/// and what to call it in messages.
struct Prompt {
  std::string text;
  std::string what;  // "the prompt" or "the prompt (file 'PATH')"
};

Prompt read_prompt(const GenerateArgs& args) {
  if (args.prompt) return Prompt{*args.prompt, "the prompt"};
  Prompt p{st::read_file(args.prompt_file, "prompt file"), format("the prompt (file '{}')", args.prompt_file)};
  const int64_t bad = st::find_invalid_utf8(p.text);
  ST_CHECK(bad < 0, "prompt file '{}' is not UTF-8 text: an invalid byte at offset {}", args.prompt_file, bad);
  return p;
}

/// The prompt's ids: 1 to model.max_position_embeddings of them, BOS included.
std::vector<int32_t> encode_prompt(const Prompt& prompt, const TextCodec& codec, const st::ModelConfig& config) {
  std::vector<int32_t> ids = codec.prompt_ids(prompt.text);
  const auto n = static_cast<int64_t>(ids.size());
  ST_CHECK(n >= 1, "{} is empty, and with {} there is nothing to continue: give some text", prompt.what,
           codec.bos_rule);
  ST_CHECK(n <= config.max_position_embeddings,
           "{} is {} tokens long, more than the model's model.max_position_embeddings ({})", prompt.what, n,
           config.max_position_embeddings);
  return ids;
}

struct Result {
  st::models::Generation generation;
  uint64_t seed = 0;
  std::string text;  // the new tokens' text
  double seconds = 0;
};

/// One continuation of `ids` with a KV cache, seeded `seed`, streamed (unless
/// --json) piece by piece after the prompt's text.
Result run_generation(st::models::Llama& model, st::models::KVCache& cache, const TextCodec& codec,
                      const GenerateArgs& args, const Prompt& prompt, const std::vector<int32_t>& ids, uint64_t seed) {
  const st::ModelConfig& config = model.config();
  Result r;
  r.seed = seed;
  st::models::SampleOptions options = args.sample;
  options.stop_token = codec.eos_id;
  options.seed = seed;
  if (!args.json) {
    std::fputs(prompt.text.c_str(), stdout);
    std::fflush(stdout);
  }
  const auto start = std::chrono::steady_clock::now();
  r.generation = st::models::generate(st::models::next_logits_cached(model, cache), ids, config.max_position_embeddings,
                                      options, [&](int32_t id) {
                                        const std::string piece = codec.decode_piece(id);
                                        r.text += piece;
                                        if (!args.json) {
                                          std::fputs(piece.c_str(), stdout);
                                          std::fflush(stdout);
                                        }
                                        return true;
                                      });
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

/// --logits: the plain forward over the whole prompt (no KV cache), every
/// position's F32 logits written with the prompt's ids, for comparing this
/// forward with another implementation's (bench/hf_check.py).
void write_prompt_logits(st::models::Llama& model, const std::vector<int32_t>& ids, const std::string& path) {
  const auto n = static_cast<int64_t>(ids.size());
  const st::Tensor input = st::Tensor::from_vector(ids, {1, n});  // (1,T)
  const st::Tensor logits = model.forward(input);                 // (1,T,V)
  model.release_saved_recursive();
  st::checkpoint::SafetensorsWriter writer;
  writer.add("logits", logits.view({n, logits.size(-1)}));
  writer.add("input_ids", input.view({n}));
  writer.write(path);
  std::fprintf(stderr, "generate: wrote the logits of %lld prompt tokens to %s\n", static_cast<long long>(n),
               path.c_str());
}

/// The end of one continuation: its JSON line (--json) or a newline; its
/// numbers on stderr, which name the sample when there are several.
void report(const Result& r, const std::vector<int32_t>& prompt_ids, const GenerateArgs& args,
            const st::ModelConfig& config, int64_t k) {
  const auto generated = static_cast<double>(r.generation.tokens.size());
  const double rate = r.seconds > 0 ? generated / r.seconds : 0.0;
  if (args.json) {
    const nlohmann::json j{{"prompt_ids", prompt_ids}, {"ids", r.generation.tokens},
                           {"text", r.text},           {"stop", stop_name(r.generation.reason)},
                           {"seed", r.seed},           {"seconds", r.seconds},
                           {"tokens_per_s", rate}};
    std::printf("%s\n", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  } else {
    std::fputs("\n", stdout);
  }
  std::fflush(stdout);
  if (r.generation.reason == st::models::StopReason::Context) {
    std::fprintf(stderr,
                 "generate: note: stopped after %zu of %lld new tokens: prompt + new tokens reached "
                 "model.max_position_embeddings (%lld)\n",
                 r.generation.tokens.size(), static_cast<long long>(args.sample.max_new_tokens),
                 static_cast<long long>(config.max_position_embeddings));
  }
  const std::string which =
      args.num_samples > 1 ? format("sample {} of {} (seed {}): ", k + 1, args.num_samples, r.seed) : "";
  std::fprintf(stderr, "generate: %s%zu tokens in %.3f s (%.1f tokens/s), prompt %zu tokens\n", which.c_str(),
               r.generation.tokens.size(), r.seconds, rate, prompt_ids.size());
}

/// --num-samples N: continuations seeded S, S+1, ..., each after a separator
/// line when there are several (none in --json, whose lines carry "seed").
void run_samples(st::models::Llama& model, const TextCodec& codec, const GenerateArgs& args, const Prompt& prompt,
                 const std::vector<int32_t>& ids) {
  const st::ModelConfig& config = model.config();
  if (args.num_samples > 1 && args.sample.temperature == 0)
    std::fprintf(stderr, "generate: note: --temperature 0 is greedy: all %lld samples will be the same\n",
                 static_cast<long long>(args.num_samples));
  st::models::KVCache cache(config, config.max_position_embeddings, st::DType::F32);
  for (int64_t k = 0; k < args.num_samples; ++k) {
    const uint64_t seed = args.sample.seed + static_cast<uint64_t>(k);
    if (args.num_samples > 1 && !args.json)
      std::printf("--- sample %lld of %lld (seed %llu) ---\n", static_cast<long long>(k + 1),
                  static_cast<long long>(args.num_samples), static_cast<unsigned long long>(seed));
    report(run_generation(model, cache, codec, args, prompt, ids, seed), ids, args, config, k);
  }
}

int run(const std::vector<std::string>& argv) {
  const GenerateArgs args = parse_generate_args(argv);
  if (args.help) {
    GenerateArgs unused;
    std::fputs(generate_parser(unused).help().c_str(), stdout);
    return 0;
  }
  // Checked before the model loads: opening a FIFO to write would wait for a reader.
  if (!args.logits.empty()) st::check_output_path(args.logits, "--logits file");
  const Prompt prompt = read_prompt(args);
  const std::string dir = checkpoint_dir(args);
  const st::ModelConfig config = model_config_of(dir);
  check_generates_text(config, dir);
  const int threads = args.threads > 0 ? args.threads : default_threads(config);
  st::cpu::set_cpu_threads(threads);
  const TextCodec codec = text_codec(args, dir, config.vocab_size);
  const std::vector<int32_t> ids = encode_prompt(prompt, codec, config);
  const auto model = load_llama(dir, config);
  std::fprintf(stderr, "generate: %s (%lld parameters, tokenizer %s, %d thread(s)); prompt: %s\n", dir.c_str(),
               static_cast<long long>(model->num_parameters()), codec.name.c_str(), threads, codec.bos_rule.c_str());
  if (!args.logits.empty()) write_prompt_logits(*model, ids, args.logits);
  run_samples(*model, codec, args, prompt, ids);
  return 0;
}

}  // namespace

// OpenMP threads spin only briefly while they wait (core/cpu/parallel.h).
ST_SHORT_OPENMP_SPIN();

int main(int argc, char** argv) {
  return st::run_main("generate", [&] { return run(std::vector<std::string>(argv + 1, argv + argc)); });
}
