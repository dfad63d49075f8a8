#pragma once
// `--resume auto` for a whole job: one decision, taken from what every rank sees.
//
// Every rank lists the checkpoint root (view_root: never throws, so a rank
// whose listing fails still joins the exchange); the views are gathered;
// decide_resume, a pure function led by rank 0's view, turns them into one
// plan: start fresh (no step directory anywhere), load a step (then every
// rank sees it complete), or refuse with one message. Every rank computes the
// same plan from the same gathered views, so no combination of views can
// leave one rank in a collective the others never join.
//
// Starting from step 0 is reserved for a root that holds no step directory
// at all: step directories of which none is complete and loadable are an
// error naming each one and why, never a silent restart.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/commit.h"
#include "checkpoint/topology.h"
#include "core/comm.h"

namespace st::checkpoint {

/// Test hook (environment): "RANK:PATH" makes rank RANK's view list PATH
/// instead of the root, e.g. to give one rank a different set of step
/// directories, as node-local disks would. Production runs never set it.
inline constexpr const char* kResumeViewHookEnv = "ST_TEST_RESUME_VIEW_OF";

/// A RootView as one line of JSON, and back (throws naming the field on a malformed text).
std::string view_to_json(const RootView& view);
RootView view_from_json(const std::string& text);

/// What the job does about `--resume auto`.
struct ResumePlan {
  enum class Action { Fresh, Load, Refuse };
  Action action = Action::Fresh;
  /// Load: the steps to try, newest first; the first is the choice, the
  /// others are tried only when those before fail to load for a data reason.
  std::vector<int64_t> candidates;
  std::vector<std::string> warnings;  // Load: each step directory skipped (and `latest`'s problem), with why
  std::string error;                  // Refuse: the whole message
  std::vector<StepView> steps;        // rank 0's view of the step directories (for a later refusal)
};

/// The decision for `root` from every rank's view (`views[r]` is rank r's;
/// pure, deterministic). Rank 0's view chooses as choose_resume() does; the
/// plan refuses when rank 0 sees step directories but no complete
/// checkpoint, when any rank could not list the root, or when a rank does not
/// see what rank 0 chose (the chosen step not complete there, or a complete
/// step newer than it, or step directories where rank 0 sees none): the
/// message names each such rank, its host and what it sees. Fallback
/// candidates are the older steps complete in every view.
ResumePlan decide_resume(const std::filesystem::path& root, std::span<const RootView> views);

/// Node-local roots (topology.h): the hosts' views as one, as if their step
/// directories were copied together. A step is complete when no host's part
/// of it is damaged and every file some part names as "elsewhere" is held by
/// one of these hosts; otherwise its problem names the host or the files on
/// none of them. `latest` is the newest any host names. `views`: one per host.
RootView merge_host_views(std::span<const RootView> views);

/// decide_resume for `topology`: shared, as above; node-local, every rank
/// must see what the lowest rank of its host sees, and the decision is taken
/// on merge_host_views of the hosts' views (a new host with an empty disk
/// simply adds nothing).
ResumePlan decide_resume(const std::filesystem::path& root, std::span<const RootView> views,
                         const StorageTopology& topology);

/// The refusal when no step directory of `root` loads: each step with why
/// (`steps`' problems, `load_errors` for complete ones that failed to load),
/// and how to go on (restore the files, --resume PATH, --overwrite).
std::string no_loadable_checkpoint_message(const std::filesystem::path& root, std::span<const StepView> steps,
                                           const std::map<int64_t, std::string>& load_errors);

/// Collective over `group`: every rank's view of `root` (with its host
/// name), gathered, and decide_resume on them; the same plan on every rank.
ResumePlan agree_resume(const std::filesystem::path& root, ProcessGroup& group, const StorageTopology& topology = {});

/// --resume PATH, collective: resolve_checkpoint_dir(path) on every rank
/// (the test hook of kResumeViewHookEnv applies here too); the ranks must
/// resolve it to the same directory. Throws an AgreedError with the common
/// error when every rank failed alike, or naming each rank, its host and what
/// it resolved (or why it could not) when they differ.
ResolvedDir agree_checkpoint_dir(const std::string& path, ProcessGroup& group);

/// What resume_auto did.
struct AutoResumed {
  std::optional<std::string> path;         // the checkpoint loaded; nullopt: a fresh start
  std::map<int64_t, std::string> damaged;  // steps skipped because they are incomplete or did not load, with why
};

/// --resume auto, collective: agree_resume, then `load` (collective, errors
/// agreed) with each candidate in turn until one loads; a data error (a
/// checksum, a damaged file) is reported through `warn` and the next
/// candidate tried; a Misfit propagates at once. Throws an AgreedError with
/// the plan's message when it refuses, or no_loadable_checkpoint_message when
/// every candidate failed. Skipped steps are reported through `warn`.
AutoResumed resume_auto(const std::filesystem::path& root, const std::function<void(const std::string& path)>& load,
                        const std::function<void(const std::string& message)>& warn, ProcessGroup& group,
                        const StorageTopology& topology = {});

}  // namespace st::checkpoint
