// The run-index binding's hooks for the Lua host: end the active run with the script's final status, or take
// it back after a usage error.
#pragma once

#include <lua.hpp>

#include <nlohmann/json.hpp>

#include <functional>
#include <optional>
#include <string>

namespace runner::run {
class RunContext;
}
namespace runner::train {
class Trainer;
}

namespace runner::bindings {

// The run runner.start made in this state while it is active (not finished), or nullptr.
run::RunContext* active_run(lua_State* L);

// The active run's part of every trainer step, in the script's Lua state (trainer:step and trainer:step_batch call it
// once the step has returned): Lua's generator reseeded from the run's seed and the step when `trainer` is the one
// given to run:restore, then the chunks a client of runner attach sent, run in the scope of train (the Lua trainer
// at `trainer_table`), model, loader, batch (at `batch`; 0: none), out (the result at `out`), loss and run. Nothing
// without an active run.
void after_trainer_step(lua_State* L, const train::Trainer& trainer, int trainer_table, int batch, int out);

// Finishes the run started by runner.start in this state, if one is still active: flushes its metrics
// and records `status` (finished, failed, interrupted) and the error text. Never throws: returns what could
// not be recorded (lost metric values, a failed final checkpoint, the status row), naming the run.
std::optional<std::string> end_active_run(lua_State* L, const std::string& status,
                                          const std::optional<std::string>& error);

// Records in the run runner.start made (when one is active) an input the script read: kind "data" or "vae",
// the path as the script gave it, and what identifies it (run::RunContext::record_input), which `detail`
// computes only when there is a run to record it in.
void record_run_input(
    lua_State* L, const std::string& kind, const std::string& path,
    const std::function<nlohmann::json()>& detail = [] { return nlohmann::json::object(); });

// After a script stopped on a usage error: takes back the active run when its attempt ran no step and
// recorded nothing (run::RunContext::withdraw). Returns what became of the run, for the user; nothing when
// there is no such run, which end_active_run then ends as failed.
std::optional<std::string> withdraw_active_run(lua_State* L);

}  // namespace runner::bindings
