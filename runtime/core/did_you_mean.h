// Suggestions for a misspelt name: "; did you mean 'lr'?" in errors about unknown keys.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace runner::core {

// "; did you mean 'name'?" when one of `names` is a likely misspelling of `key` (at most two edits, a swap of
// neighbours counting as one, and fewer than half its length; case ignored), else "".
std::string did_you_mean(std::string_view key, const std::vector<std::string>& names);

}  // namespace runner::core
