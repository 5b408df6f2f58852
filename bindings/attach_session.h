// The training process's side of `runner attach`: an attached client's chunks run in the training script's scope
// between two steps, and what they print and their errors go back to it (the socket: runtime/attach).
#pragma once

#include <string>

#include "runtime/attach/attach_socket.h"

struct lua_State;

namespace runner::run {
class RunContext;
}

namespace runner::bindings {

// Answers `first` and every later request that has arrived, without waiting for more, so that the training goes
// on as soon as they are answered: eval runs the chunk (run_attached_chunk) and sends its output, then done,
// error (with the traceback), incomplete or syntax_error; complete sends completions, one per line. The scope of
// a chunk: the fields of the table at stack index `values` (train, model, loader, batch, loss, out, run), then
// the active locals of the script's main chunk, then those of the innermost script function on the stack (later
// ones win); assigning one of those locals writes it back into the script's frame, other names are globals.
// os.exit is refused there. An interrupt (Ctrl-C of the training) or an os.exit reached through a script function
// is answered, then continued in the script.
// A running chunk is stopped (an error naming why, at its next Lua instruction, however it loops) by the client's
// `interrupt` or hang-up (the run goes on), by a stop signal to the run (which then stops after this step with a
// checkpoint, as it would have), and in a job of several ranks once this call has run attached_chunks_time_limit()
// (the ranks then take their next step); after the last two nothing more is answered until the next step.
// A chunk that changes the run (note_attached_change) is recorded in `run` (RunContext::record_intervention)
// before it is answered.
void serve_attached_client(lua_State* L, attach::AttachServer& server, run::RunContext& run, attach::Message first,
                           int values);

// While an attached chunk runs: notes `what` as a change it made to the run ("train:set_lr(0.01)", "run:stop()").
// The session notes assigned locals and globals and changed config values itself. Else nothing.
void note_attached_change(const std::string& what);

// While an attached chunk runs in a data-parallel job: throws std::logic_error saying that `what` (train:set_lr,
// run:checkpoint) is refused, because it would change rank 0 alone and the ranks would disagree. Else nothing.
void refuse_on_one_rank(const char* what);

// How long one serve_attached_client may answer chunks: half of the job's collective timeout (RUNNER_DIST_TIMEOUT)
// in a job of several ranks, which wait for rank 0 at the next step meanwhile; infinity with one rank.
double attached_chunks_time_limit();

// Whether an attached client's chunk is running now (os.exit is refused then, by every path to it).
bool attached_chunk_is_running();

}  // namespace runner::bindings
