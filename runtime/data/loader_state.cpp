// The loader state as JSON: how checkpoints store it and scripts see it.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "runtime/data/loader.h"

namespace runner::data {

nlohmann::json loader_state_json(const LoaderState& state) {
  return {{"seed", state.seed},       {"position", state.position},  {"dataset_size", state.dataset_size},
          {"batch", state.batch},     {"rank", state.rank},          {"world_size", state.world_size},
          {"shuffle", state.shuffle}, {"drop_last", state.drop_last}};
}

LoaderState loader_state_from_json(const nlohmann::json& json, const std::string& where) {
  if (!json.is_object()) throw std::invalid_argument(where + ": the loader state is not an object");
  for (const char* key : {"seed", "position", "dataset_size", "batch"})
    if (!json.contains(key)) throw std::invalid_argument(fmt::format("{}: the loader state lacks '{}'", where, key));
  LoaderState state;
  const nlohmann::json& seed = json["seed"];
  try {
    if (seed.is_string()) {
      const std::string text = seed.get<std::string>();
      std::size_t used = 0;
      state.seed = std::stoull(text, &used);
      if (used != text.size()) throw std::invalid_argument(text);
    } else {
      state.seed = seed.get<std::uint64_t>();
    }
    state.position = json["position"].get<std::int64_t>();
    state.dataset_size = json["dataset_size"].get<std::int64_t>();
    state.batch = json["batch"].get<std::int64_t>();
    state.rank = json.value("rank", 0);
    state.world_size = json.value("world_size", 1);
    state.shuffle = json.value("shuffle", true);
    state.drop_last = json.value("drop_last", false);
  } catch (const std::exception& error) {
    throw std::invalid_argument(fmt::format("{}: the loader state is malformed: {}", where, error.what()));
  }
  if (state.position < 0) throw std::invalid_argument(where + ": the loader state's position is negative");
  return state;
}

}  // namespace runner::data
