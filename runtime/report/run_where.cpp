// The `runner runs --where` language: a tokenizer, a recursive-descent parser, the evaluation over one run, and
// the filter over the index's runs.
#include "runtime/report/run_where.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/core/json_text.h"
#include "runtime/core/did_you_mean.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_store.h"

namespace runner::report {

enum class Comparison { less, less_equal, greater, greater_equal, equal, not_equal };

struct RunWhere::Node {
  enum class Kind { all_of, any_of, negation, comparison } kind = Kind::comparison;
  std::vector<std::unique_ptr<Node>> children;  // all_of, any_of: two or more; negation: one
  std::string key;
  size_t key_column = 0;
  Comparison comparison = Comparison::equal;
  WhereValue value;
};

namespace {

using Node = RunWhere::Node;

struct Token {
  enum class Kind { word, number, text, comparison, open, close, end } kind = Kind::end;
  std::string text;  // a word, a text's contents, a comparison's symbol
  double number = 0;
  size_t column = 0;  // from 1
};

bool word_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool word_part(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '/' || c == '-';
}
bool number_start(const std::string& text, size_t i) {
  const auto digit = [&](size_t at) { return at < text.size() && std::isdigit(static_cast<unsigned char>(text[at])); };
  if (digit(i)) return true;
  if (text[i] == '.') return digit(i + 1);
  if (text[i] == '-' || text[i] == '+')
    return digit(i + 1) || (i + 1 < text.size() && text[i + 1] == '.' && digit(i + 2));
  return false;
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

class Parser {
 public:
  explicit Parser(const std::string& text) : text_(text) { tokenize(); }

  std::unique_ptr<Node> parse() {
    if (tokens_.front().kind == Token::Kind::end) fail("the expression is empty", 1);
    std::unique_ptr<Node> root = any_of();
    if (peek().kind != Token::Kind::end) fail(fmt::format("unexpected '{}'", shown(peek())), peek().column);
    return root;
  }

  [[noreturn]] void fail(const std::string& what, size_t column) const {
    constexpr size_t kShown = 200;
    const std::string shown = text_.size() > kShown ? text_.substr(0, kShown) + "..." : text_;
    throw WhereError(fmt::format("--where '{}': {} at column {}", shown, what, column));
  }

 private:
  void tokenize() {
    size_t i = 0;
    while (i < text_.size()) {
      const char c = text_[i];
      const size_t column = i + 1;
      if (std::isspace(static_cast<unsigned char>(c))) {
        ++i;
      } else if (c == '(' || c == ')') {
        tokens_.push_back({c == '(' ? Token::Kind::open : Token::Kind::close, std::string(1, c), 0, column});
        ++i;
      } else if (c == '\'' || c == '"') {
        const size_t end = text_.find(c, i + 1);
        if (end == std::string::npos) fail(fmt::format("a text without its closing {}", c), column);
        tokens_.push_back({Token::Kind::text, text_.substr(i + 1, end - i - 1), 0, column});
        i = end + 1;
      } else if (c == '<' || c == '>' || c == '=' || c == '!') {
        std::string symbol(1, c);
        if (i + 1 < text_.size() && text_[i + 1] == '=' && c != '=') symbol += '=';
        if (symbol == "!") fail("'!' is not a comparison (!= is)", column);
        tokens_.push_back({Token::Kind::comparison, symbol, 0, column});
        i += symbol.size();
      } else if (number_start(text_, i)) {
        const char* start = text_.c_str() + i;
        char* end = nullptr;
        const double number = std::strtod(start, &end);
        size_t length = static_cast<size_t>(end - start);
        if (i + length < text_.size() && word_part(text_[i + length]))
          fail(fmt::format("'{}' is not a number", text_.substr(i, word_end(i) - i)), column);
        tokens_.push_back({Token::Kind::number, text_.substr(i, length), number, column});
        i += length;
      } else if (word_start(c)) {
        const size_t end = word_end(i);
        tokens_.push_back({Token::Kind::word, text_.substr(i, end - i), 0, column});
        i = end;
      } else {
        fail(fmt::format("unexpected '{}'", c), column);
      }
    }
    tokens_.push_back({Token::Kind::end, "", 0, text_.size() + 1});
  }

  size_t word_end(size_t i) const {
    while (i < text_.size() && word_part(text_[i])) ++i;
    return i;
  }

  static std::string shown(const Token& token) {
    if (token.kind == Token::Kind::text) return "'" + token.text + "'";
    return token.kind == Token::Kind::end ? "the end" : token.text;
  }

  const Token& peek() const { return tokens_[position_]; }
  const Token& next() { return tokens_[position_++]; }
  bool next_is_word(const char* word) const { return peek().kind == Token::Kind::word && lower(peek().text) == word; }

  // `left` joined with `right` by and / or: a chain of the same joint is one node with many children, so that a
  // long chain neither nests deeply nor recurses deeply.
  static std::unique_ptr<Node> joined(Node::Kind kind, std::unique_ptr<Node> left, std::unique_ptr<Node> right) {
    if (left->kind == kind) {
      left->children.push_back(std::move(right));
      return left;
    }
    auto node = std::make_unique<Node>();
    node->kind = kind;
    node->children.push_back(std::move(left));
    node->children.push_back(std::move(right));
    return node;
  }

  std::unique_ptr<Node> any_of() {
    std::unique_ptr<Node> node = all_of();
    while (next_is_word("or")) {
      next();
      node = joined(Node::Kind::any_of, std::move(node), all_of());
    }
    return node;
  }

  std::unique_ptr<Node> all_of() {
    std::unique_ptr<Node> node = unary();
    while (next_is_word("and")) {
      next();
      node = joined(Node::Kind::all_of, std::move(node), unary());
    }
    return node;
  }

  // Parentheses and `not` nest: at most kMaxNesting deep, so that the parse's recursion stays bounded.
  std::unique_ptr<Node> unary() {
    if (next_is_word("not") || peek().kind == Token::Kind::open) {
      if (++nesting_ > kMaxNesting)
        fail(fmt::format("parentheses and 'not' nest more than {} deep", kMaxNesting), peek().column);
    }
    std::unique_ptr<Node> node;
    if (next_is_word("not")) {
      next();
      node = std::make_unique<Node>();
      node->kind = Node::Kind::negation;
      node->children.push_back(unary());
      --nesting_;
      return node;
    }
    if (peek().kind == Token::Kind::open) {
      next();
      node = any_of();
      if (peek().kind != Token::Kind::close) fail(fmt::format("expected ')', found {}", shown(peek())), peek().column);
      next();
      --nesting_;
      return node;
    }
    return comparison();
  }

  std::unique_ptr<Node> comparison() {
    const Token key = next();
    if (key.kind != Token::Kind::word || reserved_word(key))
      fail(fmt::format("expected a key (a config key, a metric, tag, status or name), found {}", shown(key)),
           key.column);
    const Token op = next();
    if (op.kind != Token::Kind::comparison)
      fail(fmt::format("expected a comparison (<, <=, >, >=, =, !=) after '{}', found {}", key.text, shown(op)),
           op.column);
    const Token value = next();
    auto node = std::make_unique<Node>();
    node->key = key.text;
    node->key_column = key.column;
    node->comparison = op.text == "<"    ? Comparison::less
                       : op.text == "<=" ? Comparison::less_equal
                       : op.text == ">"  ? Comparison::greater
                       : op.text == ">=" ? Comparison::greater_equal
                       : op.text == "="  ? Comparison::equal
                                         : Comparison::not_equal;
    if (value.kind == Token::Kind::number)
      node->value = value.number;
    else if (value.kind == Token::Kind::text)
      node->value = value.text;
    else if (value.kind == Token::Kind::word && (lower(value.text) == "true" || lower(value.text) == "false"))
      node->value = lower(value.text) == "true" ? 1.0 : 0.0;
    else
      fail(fmt::format("expected a number or a quoted text after '{} {}', found {}", key.text, op.text, shown(value)),
           value.column);
    check_builtin(*node, op, value);
    return node;
  }

  static bool reserved_word(const Token& token) {
    const std::string word = lower(token.text);
    return word == "and" || word == "or" || word == "not";
  }

  // tag, status and name take texts; tags are only had or not, and a status must be one.
  void check_builtin(const Node& node, const Token& op, const Token& value) const {
    if (node.key != "tag" && node.key != "status" && node.key != "name") return;
    if (!std::holds_alternative<std::string>(node.value))
      fail(fmt::format("{} is compared with a quoted text, not {}", node.key, value.text), value.column);
    if (node.key == "tag" && node.comparison != Comparison::equal && node.comparison != Comparison::not_equal)
      fail(fmt::format("tag is compared with = or != (a run has the tag or not), not {}", op.text), op.column);
    if (node.key == "status" && !index::is_run_status(std::get<std::string>(node.value)))
      fail(fmt::format("'{}' is not a run status (one of {})", std::get<std::string>(node.value),
                       fmt::join(index::kRunStatuses, ", ")),
           value.column);
  }

  static constexpr int kMaxNesting = 100;
  const std::string& text_;
  std::vector<Token> tokens_;
  size_t position_ = 0;
  int nesting_ = 0;
};

bool builtin(const std::string& key) { return key == "tag" || key == "status" || key == "name"; }

void collect_keys(const Node& node, std::vector<const Node*>& comparisons) {
  if (node.kind == Node::Kind::comparison) {
    if (!builtin(node.key)) comparisons.push_back(&node);
    return;
  }
  for (const auto& child : node.children) collect_keys(*child, comparisons);
}

template <typename T>
bool compare(const T& left, Comparison comparison, const T& right) {
  switch (comparison) {
    case Comparison::less:
      return left < right;
    case Comparison::less_equal:
      return left <= right;
    case Comparison::greater:
      return left > right;
    case Comparison::greater_equal:
      return left >= right;
    case Comparison::equal:
      return left == right;
    case Comparison::not_equal:
      return left != right;
  }
  return false;
}

bool holds(const WhereValue& value, Comparison comparison, const WhereValue& literal) {
  if (const double* number = std::get_if<double>(&value)) {
    const double* wanted = std::get_if<double>(&literal);
    return wanted && !std::isnan(*number) && compare(*number, comparison, *wanted);
  }
  if (const std::string* text = std::get_if<std::string>(&value)) {
    const std::string* wanted = std::get_if<std::string>(&literal);
    return wanted && compare(*text, comparison, *wanted);
  }
  return false;
}

bool evaluate(const Node& node, const WhereRun& run) {
  switch (node.kind) {
    case Node::Kind::all_of:
      return std::all_of(node.children.begin(), node.children.end(),
                         [&](const std::unique_ptr<Node>& child) { return evaluate(*child, run); });
    case Node::Kind::any_of:
      return std::any_of(node.children.begin(), node.children.end(),
                         [&](const std::unique_ptr<Node>& child) { return evaluate(*child, run); });
    case Node::Kind::negation:
      return !evaluate(*node.children[0], run);
    case Node::Kind::comparison:
      break;
  }
  if (node.key == "tag") {
    const bool has = std::find(run.tags.begin(), run.tags.end(), std::get<std::string>(node.value)) != run.tags.end();
    return node.comparison == Comparison::equal ? has : !has;
  }
  if (node.key == "status") return holds(run.status, node.comparison, node.value);
  if (node.key == "name") return holds(run.name, node.comparison, node.value);
  return holds(run.value(node.key), node.comparison, node.value);
}

}  // namespace

RunWhere::RunWhere(std::string text) : text_(std::move(text)) { root_ = Parser(text_).parse(); }
RunWhere::~RunWhere() = default;
RunWhere::RunWhere(RunWhere&&) noexcept = default;
RunWhere& RunWhere::operator=(RunWhere&&) noexcept = default;

std::set<std::string> RunWhere::keys() const {
  std::vector<const Node*> comparisons;
  collect_keys(*root_, comparisons);
  std::set<std::string> keys;
  for (const Node* node : comparisons) keys.insert(node->key);
  return keys;
}

void RunWhere::check_keys(const std::set<std::string>& known) const {
  std::vector<const Node*> comparisons;
  collect_keys(*root_, comparisons);
  for (const Node* node : comparisons) {
    if (known.count(node->key)) continue;
    std::vector<std::string> names(known.begin(), known.end());
    names.insert(names.end(), {"name", "status", "tag"});
    throw WhereError(fmt::format(
        "--where '{}': unknown key '{}' at column {} (not a config key or metric of any run, nor tag, status or "
        "name){}",
        text_, node->key, node->key_column, core::did_you_mean(node->key, names)));
  }
}

bool RunWhere::matches(const WhereRun& run) const { return evaluate(*root_, run); }

namespace {

// What an expression compares for a config key or metric: the config value (as runner attach last changed it),
// else the summary's, else the latest logged.
WhereValue where_value(index::Database& db, const index::RunRecord& run, const std::string& key) {
  const auto from_json = [](const nlohmann::json& value) -> WhereValue {
    if (value.is_boolean()) return value.get<bool>() ? 1.0 : 0.0;
    if (value.is_number()) return value.get<double>();
    if (value.is_string()) return value.get<std::string>();
    return value.is_null() ? WhereValue{} : WhereValue{core::json_text(value)};
  };
  if (run.config.is_object() && run.config.contains(key)) {
    const std::map<std::string, index::ConfigChange> changed = index::config_changes(index::interventions(db, run.run));
    const auto found = changed.find(key);
    return from_json(found == changed.end() ? run.config[key] : found->second.value);
  }
  if (run.summary.is_object() && run.summary.contains(key)) return from_json(run.summary[key]);
  if (const auto latest = index::latest_metric(db, run.run, key)) return *latest;
  return {};
}

}  // namespace

std::vector<index::RunRecord> runs_where(index::Database& db, std::vector<index::RunRecord> runs, const RunWhere& where,
                                         double now) {
  if (runs.empty()) return runs;
  std::set<std::string> known;
  for (const auto& run : runs) {
    if (run.config.is_object())
      for (const auto& [key, value] : run.config.items()) known.insert(key);
    if (run.summary.is_object())
      for (const auto& [key, value] : run.summary.items()) known.insert(key);
  }
  const std::set<std::string> keys = where.keys();
  if (!std::includes(known.begin(), known.end(), keys.begin(), keys.end()))
    for (const auto& run : runs)
      for (const auto& latest : index::latest_metrics(db, run.run)) known.insert(latest.key);
  where.check_keys(known);
  std::vector<index::RunRecord> kept;
  for (auto& run : runs) {
    const WhereRun facts{run.name, index::effective_status(run, now), run.tags,
                         [&](const std::string& key) { return where_value(db, run, key); }};
    if (where.matches(facts)) kept.push_back(std::move(run));
  }
  return kept;
}

}  // namespace runner::report
