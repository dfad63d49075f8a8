// One `--resume auto` decision for the whole job (resume.h): views, the pure
// decision, the agreement collective, and the load with fallback.
#include "checkpoint/resume.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <set>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>

#include "checkpoint/fs.h"
#include "core/error.h"

namespace st::checkpoint {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string join_strings(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (const std::string& p : parts) {
    if (!out.empty()) out += sep;
    out += p;
  }
  return out;
}

const StepView* find_step(const RootView& view, int64_t step) {
  for (const StepView& s : view.steps)
    if (s.step == step) return &s;
  return nullptr;
}

bool complete_in(const RootView& view, int64_t step) {
  const StepView* s = find_step(view, step);
  return s != nullptr && s->problem.empty();
}

// "step-000010 (complete), step-000020 (incomplete: why)", or why there is nothing to list.
std::string describe(const fs::path& root, const RootView& view) {
  if (!view.error.empty()) return view.error;
  if (view.steps.empty()) return format("no step directory in {}{}", root.string(), absolute_note(root));
  std::string out;
  for (const StepView& s : view.steps) {
    out += out.empty() ? "" : ", ";
    out += s.problem.empty() ? format("{} (complete)", step_dir_name(s.step))
                             : format("{} (incomplete: {})", step_dir_name(s.step), s.problem);
  }
  return out;
}

std::string rank_on_host(size_t rank, const RootView& view) { return format("rank {} on host {}", rank, view.host); }

// The refusal when ranks see different things: what rank 0 would do, then each rank that differs.
std::string disagreement_message(const fs::path& root, std::span<const RootView> views,
                                 const std::vector<size_t>& differing, const std::string& lead_intent) {
  std::string out = format(
      "--resume auto: the ranks do not see the same checkpoints in {}{}, so the job cannot agree on where to resume: "
      "{} {}",
      root.string(), absolute_note(root), rank_on_host(0, views[0]), lead_intent);
  for (size_t r : differing) out += format("\n  {} sees: {}", rank_on_host(r, views[r]), describe(root, views[r]));
  out +=
      "\nEvery rank must see the same step directories: put checkpoint.dir on a file system all hosts share (or copy "
      "the step directories to every host), then run the same command again; or name a checkpoint with --resume PATH; "
      "or start over with --overwrite.";
  return out;
}

// Ranks (other than 0) whose view differs from rank 0's in what the decision rests on.
std::vector<size_t> ranks_differing(std::span<const RootView> views,
                                    const std::function<bool(const RootView&)>& differs) {
  std::vector<size_t> out;
  for (size_t r = 0; r < views.size(); ++r)
    if (!views[r].error.empty() || (r > 0 && differs(views[r]))) out.push_back(r);
  return out;
}

// Each step rank 0 sees newer than `chosen`, with why it is skipped (`latest`'s own problem is in `note`).
std::vector<std::string> skip_warnings(const RootView& lead, const ResumeChoice& choice) {
  std::vector<std::string> out;
  if (!choice.note.empty()) out.push_back(choice.note);
  for (auto it = lead.steps.rbegin(); it != lead.steps.rend() && it->step > choice.step; ++it) {
    if (!choice.note.empty() && lead.latest == it->step) continue;  // the note named it already
    const std::string why =
        it->problem.empty() ? format("complete, but latest names {}", step_dir_name(choice.step)) : it->problem;
    out.push_back(
        format("skipping {} ({}); resuming from {}", step_dir_name(it->step), why, step_dir_name(choice.step)));
  }
  return out;
}

// The refusal when `latest` names a step but no step directory is there: a
// checkpoint was committed here and is gone (deleted, renamed), so starting
// from step 0 would silently throw it away.
std::string missing_latest_message(const fs::path& root, int64_t named) {
  return format(
      "--resume auto: {}/{} names {}, but {}{} holds no step directory (it was deleted, moved or renamed)\n"
      "Nothing was trained or deleted. To go on: restore {} and run the same command again; or resume from another "
      "checkpoint with --resume PATH; or start over with --overwrite (moves `latest` into {}/overwritten-<UTC time>/).",
      root.string(), kLatestFileName, step_dir_name(named), root.string(), absolute_note(root), step_dir_name(named),
      root.string());
}

}  // namespace

std::string view_to_json(const RootView& view) {
  json steps = json::array();
  for (const StepView& s : view.steps)
    steps.push_back({{"step", s.step}, {"problem", s.problem}, {"part", s.part}, {"held", s.held}, {"away", s.away}});
  json j = {{"host", view.host},
            {"error", view.error},
            {"steps", steps},
            {"latest", view.latest ? json(*view.latest) : json(nullptr)},
            {"latest_problem", view.latest_problem},
            {"latest_found", view.latest_found}};
  return j.dump();
}

RootView view_from_json(const std::string& text) {
  RootView view;
  try {
    const json j = json::parse(text);
    view.host = j.at("host").get<std::string>();
    view.error = j.at("error").get<std::string>();
    for (const json& s : j.at("steps"))
      view.steps.push_back({s.at("step").get<int64_t>(), s.at("problem").get<std::string>(), s.at("part").get<bool>(),
                            s.at("held").get<std::vector<std::string>>(),
                            s.at("away").get<std::vector<std::string>>()});
    if (!j.at("latest").is_null()) view.latest = j.at("latest").get<int64_t>();
    view.latest_problem = j.at("latest_problem").get<std::string>();
    view.latest_found = j.at("latest_found").get<bool>();
  } catch (const json::exception& e) {
    ST_FAIL("a rank's view of the checkpoint directory is malformed: {}", e.what());
  }
  return view;
}

std::string no_loadable_checkpoint_message(const fs::path& root, std::span<const StepView> steps,
                                           const std::map<int64_t, std::string>& load_errors) {
  std::string out =
      format("--resume auto: {}{} holds step directories, but none is a complete checkpoint that loads:", root.string(),
             absolute_note(root));
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    std::string why = it->problem;
    if (why.empty()) {
      const auto e = load_errors.find(it->step);
      why = e != load_errors.end() ? format("does not load: {}", e->second) : "complete, but not tried";
    }
    out += format("\n  {}: {}", step_dir_name(it->step), why);
  }
  out += format(
      "\nNothing was trained or deleted. To go on: restore the missing or damaged files and run the same command "
      "again; or resume from another checkpoint with --resume PATH; or start over with --overwrite (moves the step "
      "directories into {}/overwritten-<UTC time>/).",
      root.string());
  return out;
}

ResumePlan decide_resume(const fs::path& root, std::span<const RootView> views) {
  ST_CHECK(!views.empty(), "decide_resume needs rank 0's view");
  const RootView& lead = views[0];
  ResumePlan plan;
  plan.steps = lead.steps;
  auto refuse = [&](std::string message) {
    plan.action = ResumePlan::Action::Refuse;
    plan.error = std::move(message);
    return plan;
  };
  if (!lead.error.empty()) {
    return refuse(disagreement_message(root, views, ranks_differing(views, [](const RootView&) { return false; }),
                                       "cannot list it"));
  }
  if (lead.steps.empty()) {
    const auto differing = ranks_differing(views, [](const RootView& v) { return !v.steps.empty(); });
    if (differing.empty() && lead.latest) return refuse(missing_latest_message(root, *lead.latest));
    if (differing.empty()) return plan;  // Fresh: no step directory anywhere
    return refuse(disagreement_message(root, views, differing, "sees no step directory (it would start from step 0)"));
  }
  const std::optional<ResumeChoice> choice = choose_resume(root, lead);
  if (!choice) {
    std::string message = no_loadable_checkpoint_message(root, lead.steps, {});
    for (size_t r : ranks_differing(views, [&](const RootView& v) { return v.steps != lead.steps; }))
      message += format("\n(the ranks disagree: {} sees: {})", rank_on_host(r, views[r]), describe(root, views[r]));
    return refuse(std::move(message));
  }
  // Every rank must see the chosen step complete, and nothing newer that rank 0 judges otherwise.
  const auto differing = ranks_differing(views, [&](const RootView& v) {
    if (!complete_in(v, choice->step)) return true;
    for (const RootView* side : {&v, &lead})
      for (const StepView& s : side->steps)
        if (s.step > choice->step && complete_in(v, s.step) != complete_in(lead, s.step)) return true;
    return false;
  });
  if (!differing.empty())
    return refuse(disagreement_message(root, views, differing, format("would resume {}", step_dir_name(choice->step))));
  plan.action = ResumePlan::Action::Load;
  plan.candidates.push_back(choice->step);
  for (auto it = lead.steps.rbegin(); it != lead.steps.rend(); ++it) {
    if (it->step >= choice->step) continue;
    if (std::all_of(views.begin(), views.end(), [&](const RootView& v) { return complete_in(v, it->step); }))
      plan.candidates.push_back(it->step);
  }
  plan.warnings = skip_warnings(lead, *choice);
  return plan;
}

RootView merge_host_views(std::span<const RootView> views) {
  RootView out;
  std::vector<std::string> names;
  for (const RootView& v : views) names.push_back(v.host);
  out.host = format("the hosts {}", join_strings(names, ", "));
  std::map<int64_t, std::vector<std::pair<std::string, const StepView*>>> by_step;
  for (const RootView& v : views) {
    if (!v.error.empty()) out.error += format("{}on host {}: {}", out.error.empty() ? "" : "; ", v.host, v.error);
    for (const StepView& s : v.steps) by_step[s.step].emplace_back(v.host, &s);
    if (v.latest && (!out.latest || *v.latest > *out.latest)) out.latest = v.latest;
    out.latest_found = out.latest_found || v.latest_found;
  }
  if (!out.error.empty()) return out;
  if (!out.latest && !views.empty()) out.latest_problem = views[0].latest_problem;
  for (const auto& [step, seen] : by_step) {
    StepView merged{step, "", false, {}, {}};
    std::set<std::string> held, away;
    std::vector<std::string> problems;
    for (const auto& [host, s] : seen) {
      const bool sound = s->problem.empty() || s->part;
      if (!sound) problems.push_back(format("on host {}: {}", host, s->problem));
      if (sound) held.insert(s->held.begin(), s->held.end());
      away.insert(s->away.begin(), s->away.end());
    }
    std::vector<std::string> missing;
    for (const std::string& name : away)
      if (!held.contains(name)) missing.push_back(name);
    if (!missing.empty())
      problems.push_back(
          format("{} file(s) are on none of these hosts: {} (the hosts that saved them must take "
                 "part, or the files be copied to one that does)",
                 missing.size(), join_strings(missing, ", ")));
    merged.problem = join_strings(problems, "; ");
    out.steps.push_back(std::move(merged));
  }
  return out;
}

ResumePlan decide_resume(const fs::path& root, std::span<const RootView> views, const StorageTopology& topology) {
  if (topology.shared || topology.host_count() <= 1) return decide_resume(root, views);
  // Each host's ranks must see what its lowest rank sees; the hosts' views then count as one.
  std::vector<RootView> hosts;
  for (int h = 0; h < topology.host_count(); ++h) {
    const std::vector<int> ranks = topology.ranks_of_host(h);
    const RootView& lead = views[static_cast<size_t>(ranks.front())];
    std::vector<size_t> differing;
    for (int r : ranks)
      if (views[static_cast<size_t>(r)] != lead) differing.push_back(static_cast<size_t>(r));
    if (!differing.empty()) {
      ResumePlan plan;
      plan.action = ResumePlan::Action::Refuse;
      plan.error = disagreement_message(
          root, views, differing, format("(the lowest rank on host {}) sees: {}", lead.host, describe(root, lead)));
      return plan;
    }
    hosts.push_back(lead);
  }
  const RootView merged = merge_host_views(hosts);
  return decide_resume(root, std::span<const RootView>(&merged, 1));
}

namespace {

// The directory this rank lists: the root, or the test hook's path for the rank it names.
fs::path listed_root(const fs::path& root, int rank) {
  const char* hook = std::getenv(kResumeViewHookEnv);
  if (hook == nullptr) return root;
  const std::string_view text(hook);
  const size_t colon = text.find(':');
  int hook_rank = -1;
  if (colon == std::string_view::npos ||
      std::from_chars(text.data(), text.data() + colon, hook_rank).ec != std::errc() || hook_rank != rank)
    return root;
  return fs::path(std::string(text.substr(colon + 1)));
}

}  // namespace

ResumePlan agree_resume(const fs::path& root, ProcessGroup& group, const StorageTopology& topology) {
  // Nothing before the exchange may throw: a rank that left early would leave the others waiting in it.
  const std::string mine = view_to_json(view_root(listed_root(root, group.rank()), host_name()));
  const std::vector<std::string> texts =
      group.size() == 1 ? std::vector<std::string>{mine} : all_gather_strings(group, mine);
  std::vector<RootView> views;
  views.reserve(texts.size());
  for (const std::string& text : texts) views.push_back(view_from_json(text));
  return decide_resume(root, views, topology);
}

ResolvedDir agree_checkpoint_dir(const std::string& path, ProcessGroup& group) {
  ResolvedDir resolved;
  const std::string error =
      error_message_of([&] { resolved = resolve_checkpoint_dir(listed_root(path, group.rank()).string()); });
  const std::string mine =
      json{{"host", host_name()}, {"path", error.empty() ? resolved.path : ""}, {"error", error}}.dump();
  const std::vector<std::string> texts =
      group.size() == 1 ? std::vector<std::string>{mine} : all_gather_strings(group, mine);
  // What a rank resolved (or why it could not), without where it runs.
  auto outcome = [](const std::string& text) {
    const json j = json::parse(text);
    return std::pair{j.at("path").get<std::string>(), j.at("error").get<std::string>()};
  };
  const auto first = outcome(texts[0]);
  if (std::all_of(texts.begin(), texts.end(), [&](const std::string& t) { return outcome(t) == first; })) {
    if (!error.empty()) throw AgreedError(error, __FILE__, __LINE__);
    return resolved;
  }
  std::string message = format("--resume {}: the ranks do not resolve it to the same checkpoint:", path);
  for (size_t r = 0; r < texts.size(); ++r) {
    const json j = json::parse(texts[r]);
    const std::string what = j.at("error").get<std::string>().empty() ? j.at("path").get<std::string>()
                                                                      : "fails: " + j.at("error").get<std::string>();
    message += format("\n  rank {} on host {}: {}", r, j.at("host").get<std::string>(), what);
  }
  message +=
      "\nEvery rank must see the same checkpoint: put it on a file system all hosts share, or name a step "
      "directory that every host holds.";
  throw AgreedError(message, __FILE__, __LINE__);
}

AutoResumed resume_auto(const fs::path& root, const std::function<void(const std::string& path)>& load,
                        const std::function<void(const std::string& message)>& warn, ProcessGroup& group,
                        const StorageTopology& topology) {
  const ResumePlan plan = agree_resume(root, group, topology);
  if (plan.action == ResumePlan::Action::Refuse) throw AgreedError(plan.error, __FILE__, __LINE__);
  AutoResumed out;
  if (plan.action == ResumePlan::Action::Fresh) return out;
  for (const std::string& w : plan.warnings) warn(w);
  for (const StepView& s : plan.steps)
    if (!s.problem.empty()) out.damaged[s.step] = s.problem;
  std::map<int64_t, std::string> load_errors;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const std::string path = (root / step_dir_name(plan.candidates[i])).string();
    try {
      load(path);
      out.path = path;
      return out;
    } catch (const Misfit&) {
      throw;  // an older checkpoint would not fit either
    } catch (const Error& e) {
      load_errors[plan.candidates[i]] = e.message();
      out.damaged[plan.candidates[i]] = format("does not load: {}", e.message());
      if (i + 1 < plan.candidates.size())
        warn(format("{} does not load ({}); falling back to {}", path, e.message(),
                    (root / step_dir_name(plan.candidates[i + 1])).string()));
    }
  }
  throw AgreedError(no_loadable_checkpoint_message(root, plan.steps, load_errors), __FILE__, __LINE__);
}

}  // namespace st::checkpoint
