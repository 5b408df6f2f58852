// Suggestions for a misspelt name by optimal string alignment distance.
#include "runtime/core/did_you_mean.h"

#include <algorithm>
#include <cctype>
#include <fmt/format.h>

namespace runner::core {
namespace {

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Optimal string alignment distance: insertions, deletions, substitutions and swaps of neighbours.
std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::vector<std::size_t>> d(a.size() + 1, std::vector<std::size_t>(b.size() + 1));
  for (std::size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
  for (std::size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  }
  return d[a.size()][b.size()];
}

}  // namespace

std::string did_you_mean(std::string_view key, const std::vector<std::string>& names) {
  const std::string wanted = lower(key);
  const std::string* best = nullptr;
  std::size_t best_distance = 3;
  for (const std::string& name : names) {
    const std::size_t distance = edit_distance(wanted, lower(name));
    if (distance < best_distance && (distance == 0 || distance * 2 < wanted.size())) {
      best = &name;
      best_distance = distance;
    }
  }
  return best ? fmt::format("; did you mean '{}'?", *best) : std::string();
}

}  // namespace runner::core
