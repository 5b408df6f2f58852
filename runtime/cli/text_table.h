// Tables printed by the index commands: aligned text for people, CSV and JSON for programs.
#pragma once

#include <string>
#include <vector>

#include "runtime/index/read_query.h"

namespace runner::cli {

using Cell = index::SqlValue;  // empty (NULL), integer, real or text

struct Table {
  std::vector<std::string> columns;
  std::vector<std::vector<Cell>> rows;
};

enum class TableFormat { aligned, csv, json };

// aligned: a header, a rule, numbers right-aligned, reals with 6 significant digits, NULL as "-".
// csv: RFC 4180 quoting, reals in shortest round-trip form, NULL as an empty field.
// json: an array of objects keyed by column, NULL as null, non-finite reals as strings.
std::string format_table(const Table& table, TableFormat format);

// As core::number_text for reals, "-" for NULL.
std::string format_cell(const Cell& cell);

}  // namespace runner::cli
