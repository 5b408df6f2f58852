// One table per enum that a user names in text (an option's value): its names, from which its parse, its name and
// the error for an unknown name all derive.
#pragma once

#include <fmt/format.h>

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace runner::core {

template <class E>
struct EnumName {
  E value;
  std::string_view name;
  std::string_view note = {};  // shown after the name in the error's list: "(ZeRO-1)"
};

// How the error's list writes each name: eps, 'eps' or "eps".
enum class NameQuotes { none, single, double_ };

template <class E, std::size_t N>
struct EnumTable {
  std::array<EnumName<E>, N> names;
  NameQuotes quotes;
  // The error for an unknown name: fmt text with {list} (the names, "a, b or c"), {got} (the name given) and
  // {what} (parse's `what`: the option that named it).
  std::string_view error;

  E parse(std::string_view given, std::string_view what = {}) const {
    for (const EnumName<E>& entry : names)
      if (entry.name == given) return entry.value;
    throw std::invalid_argument(
        fmt::format(fmt::runtime(error), fmt::arg("list", list()), fmt::arg("got", given), fmt::arg("what", what)));
  }

  std::string name(E value) const {
    for (const EnumName<E>& entry : names)
      if (entry.value == value) return std::string(entry.name);
    return "?";
  }

  std::string_view note(E value) const {
    for (const EnumName<E>& entry : names)
      if (entry.value == value) return entry.note;
    return {};
  }

  std::string list() const {
    const std::string_view quote = quotes == NameQuotes::single ? "'" : quotes == NameQuotes::double_ ? "\"" : "";
    std::string text;
    for (std::size_t i = 0; i < N; ++i) {
      if (i > 0) text += i + 1 == N ? " or " : ", ";
      text += fmt::format("{}{}{}", quote, names[i].name, quote);
      if (!names[i].note.empty()) text += fmt::format(" ({})", names[i].note);
    }
    return text;
  }
};

}  // namespace runner::core
