#include "checkpoint/state.h"

#include <fstream>
#include <sstream>
#include <system_error>
#include <type_traits>

#include <nlohmann/json.hpp>

#include "checkpoint/commit.h"
#include "checkpoint/fs.h"
#include "core/error.h"
#include "core/file.h"

namespace st::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// An integer `key` of the state: present, an integer, 0 <= value < 2^53 (JSON's exact range).
int64_t count_field(const json& state, const char* key, const std::string& where) {
  ST_CHECK(state.contains(key), "{} lacks '{}'", where, key);
  const json& v = state.at(key);
  ST_CHECK(v.is_number_integer() && (v.is_number_unsigned() || v.get<int64_t>() >= 0) &&
               v.get<uint64_t>() < (uint64_t{1} << 53),
           "{} is corrupt: '{}' is {}, expected a non-negative integer", where, key, v.dump());
  return v.get<int64_t>();
}

template <class T>
T optional_field(const json& object, const char* key, T fallback, const std::string& where) {
  if (!object.contains(key)) return fallback;
  // get<int64_t>() casts a float, undefined beyond int64_t's range (fuzzing
  // found "seed": 8e47), so an integer field must not hold a float.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    ST_CHECK(!object.at(key).is_number_float(), "{} is corrupt: '{}' is {}, expected an integer", where, key,
             object.at(key).dump());
  try {
    return object.at(key).get<T>();
  } catch (const json::exception&) {
    ST_FAIL("{} is corrupt: '{}' is {}, of the wrong type", where, key, object.at(key).dump());
  }
}

}  // namespace

std::string trainer_state_text(const TrainerState& s) {
  json j = {{"step", s.step},
            {"consumed_samples", s.consumed_samples},
            {"optimizer_steps", s.optimizer_steps},
            {"world_size", s.world_size},
            {"sharding_strategy", s.sharding_strategy},
            {"format", s.format},
            {"model_dtype", s.model_dtype},
            {"model_weights", s.model_weights},
            {"master_weights", s.master_weights},
            {"rng", {{"seed", s.seed}, {"sampler_position", s.consumed_samples}}},
            {"config", s.config_yaml}};
  if (s.schedule)
    j["schedule"] = {
        {"kind", s.schedule->kind}, {"total_steps", s.schedule->total_steps}, {"next_lr", s.schedule->next_lr}};
  return j.dump(2) + "\n";
}

TrainerState parse_trainer_state(const std::string& text, const std::string& where) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    ST_FAIL("{} is not valid JSON: {}", where, e.what());
  }
  ST_CHECK(j.is_object(), "{} is not a JSON object", where);
  TrainerState s;
  s.step = count_field(j, "step", where);
  s.consumed_samples = count_field(j, "consumed_samples", where);
  s.optimizer_steps = count_field(j, "optimizer_steps", where);
  s.world_size = optional_field<int64_t>(j, "world_size", 0, where);
  s.sharding_strategy = optional_field<std::string>(j, "sharding_strategy", "", where);
  s.format = optional_field<std::string>(j, "format", "", where);
  s.model_dtype = optional_field<std::string>(j, "model_dtype", "", where);
  s.model_weights = optional_field<bool>(j, "model_weights", false, where);
  s.master_weights = optional_field<bool>(j, "master_weights", true, where);
  s.config_yaml = optional_field<std::string>(j, "config", "", where);
  const json rng = optional_field<json>(j, "rng", json::object(), where);
  if (rng.is_object()) s.seed = optional_field<int64_t>(rng, "seed", 0, where);
  const json schedule = optional_field<json>(j, "schedule", json(), where);
  if (schedule.is_object() && schedule.contains("next_lr") && schedule["next_lr"].is_number()) {
    s.schedule =
        ScheduleState{optional_field<std::string>(schedule, "kind", "?", where),
                      optional_field<int64_t>(schedule, "total_steps", 0, where), schedule["next_lr"].get<double>()};
  }
  return s;
}

TrainerState read_trainer_state(const fs::path& dir) {
  const fs::path path = dir / kTrainerStateFileName;
  std::error_code ec;
  ST_CHECK(fs::is_regular_file(path, ec), "cannot read {} (is {} a checkpoint directory?)", path.string(),
           dir.string());
  return parse_trainer_state(read_file(path, "trainer state"), path.string());
}

std::optional<TrainerState> read_trainer_state_if_present(const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir / kTrainerStateFileName, ec)) return std::nullopt;
  return read_trainer_state(dir);
}

}  // namespace st::checkpoint
