// Aligned, CSV and JSON renderings of a table of SQL values.
#include "runtime/cli/text_table.h"

#include <cmath>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "runtime/core/json_text.h"
#include "runtime/core/terminal_text.h"
#include "runtime/core/number_text.h"

namespace runner::cli {
namespace {

bool is_number(const Cell& cell) {
  return std::holds_alternative<int64_t>(cell) || std::holds_alternative<double>(cell);
}

// Display width in terminal columns: counts UTF-8 code points, not bytes.
size_t display_width(const std::string& text) {
  size_t width = 0;
  for (unsigned char c : text) width += (c & 0xC0) != 0x80;
  return width;
}

// One line for an aligned cell: line breaks and tabs as spaces, other control characters escaped.
std::string table_text(std::string text) {
  for (char& ch : text)
    if (ch == '\n' || ch == '\t') ch = ' ';
  return core::terminal_text(text, core::TextLines::escaped);
}

std::string csv_field(const Cell& cell) {
  if (std::holds_alternative<std::monostate>(cell)) return "";
  if (auto* integer = std::get_if<int64_t>(&cell)) return std::to_string(*integer);
  if (auto* real = std::get_if<double>(&cell))
    return std::isfinite(*real) ? fmt::format("{}", *real) : core::number_text(*real);
  const auto& text = std::get<std::string>(cell);
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
  return quoted + "\"";
}

nlohmann::json json_value(const Cell& cell) {
  if (std::holds_alternative<std::monostate>(cell)) return nullptr;
  if (auto* integer = std::get_if<int64_t>(&cell)) return *integer;
  if (auto* real = std::get_if<double>(&cell))
    return std::isfinite(*real) ? nlohmann::json(*real) : nlohmann::json(core::number_text(*real));
  return nlohmann::json(std::get<std::string>(cell));
}

}  // namespace

std::string format_cell(const Cell& cell) {
  if (std::holds_alternative<std::monostate>(cell)) return "-";
  if (auto* integer = std::get_if<int64_t>(&cell)) return std::to_string(*integer);
  if (auto* real = std::get_if<double>(&cell)) return core::number_text(*real);
  return std::get<std::string>(cell);
}

std::string format_table(const Table& table, TableFormat format) {
  std::string out;
  if (format == TableFormat::json) {
    nlohmann::json rows = nlohmann::json::array();
    for (const auto& row : table.rows) {
      nlohmann::json object = nlohmann::json::object();
      for (size_t c = 0; c < table.columns.size(); ++c) object[table.columns[c]] = json_value(row[c]);
      rows.push_back(std::move(object));
    }
    return core::json_text(rows, 2) + "\n";
  }
  if (format == TableFormat::csv) {
    for (size_t c = 0; c < table.columns.size(); ++c) out += (c ? "," : "") + csv_field(table.columns[c]);
    out += "\n";
    for (const auto& row : table.rows) {
      for (size_t c = 0; c < row.size(); ++c) out += (c ? "," : "") + csv_field(row[c]);
      out += "\n";
    }
    return out;
  }
  std::vector<size_t> widths(table.columns.size());
  std::vector<bool> numeric(table.columns.size(), true);
  std::vector<std::vector<std::string>> texts;
  std::vector<std::string> heads;
  for (size_t c = 0; c < table.columns.size(); ++c) {
    heads.push_back(table_text(table.columns[c]));
    widths[c] = display_width(heads[c]);
  }
  for (const auto& row : table.rows) {
    std::vector<std::string> line;
    for (size_t c = 0; c < row.size(); ++c) {
      std::string text = table_text(format_cell(row[c]));
      widths[c] = std::max(widths[c], display_width(text));
      if (!is_number(row[c]) && !std::holds_alternative<std::monostate>(row[c])) numeric[c] = false;
      line.push_back(std::move(text));
    }
    texts.push_back(std::move(line));
  }
  auto emit = [&](const std::vector<std::string>& cells) {
    std::string line;
    for (size_t c = 0; c < cells.size(); ++c) {
      const size_t pad = widths[c] - display_width(cells[c]);
      const bool last = c + 1 == cells.size();
      if (numeric[c])
        line += std::string(pad, ' ') + cells[c];
      else
        line += cells[c] + (last ? "" : std::string(pad, ' '));
      if (!last) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  };
  emit(heads);
  std::vector<std::string> rule;
  for (size_t width : widths) rule.emplace_back(width, '-');
  emit(rule);
  for (const auto& line : texts) emit(line);
  return out;
}

}  // namespace runner::cli
