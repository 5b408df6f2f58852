// Tests of the `runner runs --where` language (runtime/report/run_where): what it matches and its errors' text.
#include <catch2/catch.hpp>

#include <map>
#include <string>
#include <vector>

#include "runtime/report/run_where.h"

using runner::report::RunWhere;
using runner::report::WhereError;
using runner::report::WhereRun;
using runner::report::WhereValue;

namespace {

WhereRun run(const std::string& name, const std::string& status, std::vector<std::string> tags,
             std::map<std::string, WhereValue> values) {
  return {name, status, std::move(tags), [values](const std::string& key) {
            const auto found = values.find(key);
            return found == values.end() ? WhereValue{} : found->second;
          }};
}

const WhereRun kBaseline = run("quickstart-1", "finished", {"baseline", "cifar"},
                               {{"lr", 2e-4}, {"schedule", std::string("cosine")}, {"loss", 0.25}});
const WhereRun kFast = run("quickstart-2", "failed", {}, {{"lr", 3e-3}, {"loss", 0.5}, {"time/step_ms", 12.0}});

bool matches(const std::string& text, const WhereRun& which) { return RunWhere(text).matches(which); }

std::string usage_error(const std::string& text, const std::set<std::string>& known = {"lr", "loss"}) {
  try {
    RunWhere(text).check_keys(known);
  } catch (const WhereError& error) {
    return error.what();
  }
  FAIL("expected a WhereError for " << text);
  return {};
}

}  // namespace

TEST_CASE("runs --where compares config values and metrics with numbers and texts", "[cli]") {
  CHECK(matches("lr < 1e-3", kBaseline));
  CHECK_FALSE(matches("lr < 1e-3", kFast));
  CHECK(matches("lr >= 0.003", kFast));
  CHECK(matches("lr<=3e-3 and loss>0.4", kFast));
  CHECK(matches("loss = 0.25", kBaseline));
  CHECK(matches("loss != 0.25", kFast));
  CHECK(matches("schedule = 'cosine'", kBaseline));
  CHECK(matches("schedule = \"cosine\"", kBaseline));
  CHECK(matches("schedule < 'd'", kBaseline));
  CHECK(matches("time/step_ms > 10", kFast));
  // A run without the key, or with a value of another kind, does not match; `not` turns that around.
  CHECK_FALSE(matches("schedule = 'cosine'", kFast));
  CHECK_FALSE(matches("schedule != 'cosine'", kFast));
  CHECK(matches("not schedule = 'cosine'", kFast));
  CHECK_FALSE(matches("schedule = 1", kBaseline));
  CHECK_FALSE(matches("lr = 'x'", kBaseline));
}

TEST_CASE("runs --where matches tags, status and name, joined by and, or, not and parentheses", "[cli]") {
  CHECK(matches("tag = 'baseline'", kBaseline));
  CHECK_FALSE(matches("tag = 'baseline'", kFast));
  CHECK(matches("tag != 'baseline'", kFast));
  CHECK_FALSE(matches("tag != 'cifar'", kBaseline));
  CHECK(matches("lr < 1e-3 and tag = 'baseline'", kBaseline));
  CHECK_FALSE(matches("lr < 1e-3 and tag = 'baseline'", kFast));
  CHECK(matches("status = 'failed' or tag = 'baseline'", kFast));
  CHECK(matches("status = 'failed' or tag = 'baseline'", kBaseline));
  CHECK(matches("name = 'quickstart-2'", kFast));
  CHECK(matches("name > 'quickstart-1'", kFast));
  // and binds tighter than or; parentheses and not change that.
  CHECK(matches("tag = 'cifar' or status = 'failed' and loss > 1", kBaseline));
  CHECK_FALSE(matches("(tag = 'cifar' or status = 'failed') and loss > 1", kBaseline));
  CHECK(matches("not (status = 'failed') AND NOT tag = 'x'", kBaseline));
  CHECK(matches("not not tag = 'cifar'", kBaseline));
  CHECK(matches("tag = 'cifar' and lr = 2e-4 or lr = -1", kBaseline));
}

TEST_CASE("runs --where's keys are those compared, without tag, status and name", "[cli]") {
  CHECK(RunWhere("lr < 1 and (tag = 'x' or loss > 2) and not status = 'failed' and name = 'a'").keys() ==
        std::set<std::string>{"loss", "lr"});
}

TEST_CASE("runs --where's syntax errors and unknown keys point at the column", "[cli]") {
  CHECK(usage_error("") == "--where '': the expression is empty at column 1");
  CHECK(usage_error("lr <") ==
        "--where 'lr <': expected a number or a quoted text after 'lr <', found the end at column 5");
  CHECK(usage_error("lr << 1") ==
        "--where 'lr << 1': expected a number or a quoted text after 'lr <', found < at column 5");
  CHECK(usage_error("lr 1") ==
        "--where 'lr 1': expected a comparison (<, <=, >, >=, =, !=) after 'lr', found 1 at column 4");
  CHECK(
      usage_error("lr < 1 and") ==
      "--where 'lr < 1 and': expected a key (a config key, a metric, tag, status or name), found the end at column 11");
  CHECK(usage_error("(lr < 1") == "--where '(lr < 1': expected ')', found the end at column 8");
  CHECK(usage_error("lr < 1)") == "--where 'lr < 1)': unexpected ')' at column 7");
  CHECK(usage_error("lr < 'x") == "--where 'lr < 'x': a text without its closing ' at column 6");
  CHECK(usage_error("lr < 1e-3x") == "--where 'lr < 1e-3x': '1e-3x' is not a number at column 6");
  CHECK(usage_error("lr ! 1") == "--where 'lr ! 1': '!' is not a comparison (!= is) at column 4");
  CHECK(usage_error("lr ; 1") == "--where 'lr ; 1': unexpected ';' at column 4");
  CHECK(usage_error("tag < 'b'") ==
        "--where 'tag < 'b'': tag is compared with = or != (a run has the tag or not), not < at column 5");
  CHECK(usage_error("tag = baseline") ==
        "--where 'tag = baseline': expected a number or a quoted text after 'tag =', found baseline at column 7");
  CHECK(usage_error("status = 1") == "--where 'status = 1': status is compared with a quoted text, not 1 at column 10");
  CHECK(usage_error("status = 'finishd'") ==
        "--where 'status = 'finishd'': 'finishd' is not a run status (one of running, finished, failed, interrupted, "
        "paused, pruned) at column 10");
  CHECK(usage_error("loss < 1 or lrr < 1e-3") ==
        "--where 'loss < 1 or lrr < 1e-3': unknown key 'lrr' at column 13 (not a config key or metric of any run, nor "
        "tag, status or name); did you mean 'lr'?");
  CHECK(usage_error("tags = 'x'") ==
        "--where 'tags = 'x'': unknown key 'tags' at column 1 (not a config key or metric of any run, nor tag, status "
        "or name); did you mean 'tag'?");
}

TEST_CASE("runs --where bounds the nesting, and long chains of and / or are flat", "[cli]") {
  // 100 levels of parentheses or 'not' parse; one more is a usage error at the column where it starts.
  const auto nested = [](int depth, const std::string& open, const std::string& close) {
    std::string text;
    for (int i = 0; i < depth; ++i) text += open;
    text += "lr < 1";
    for (int i = 0; i < depth; ++i) text += close;
    return text;
  };
  CHECK(matches(nested(100, "(", ")"), kBaseline));
  CHECK(matches(nested(100, "not ", ""), kBaseline));
  CHECK_FALSE(matches(nested(99, "not ", ""), kBaseline));
  const std::string too_deep = nested(12000, "(", ")");
  CHECK(usage_error(too_deep) ==
        "--where '" + too_deep.substr(0, 200) + "...': parentheses and 'not' nest more than 100 deep at column 101");
  CHECK(usage_error(nested(20000, "not ", "")).find("parentheses and 'not' nest more than 100 deep at column 401") !=
        std::string::npos);
  // A 'not' (or a parenthesis) that has ended no longer counts: 150 of them one after another nest 1 deep.
  std::string nots = "not lr > 1";
  for (int i = 0; i < 150; ++i) nots += " and not (lr > 1)";
  CHECK(matches(nots, kBaseline));
  // Chains of 100,000 comparisons neither nest nor recurse.
  std::string all = "lr < 1", any = "lr > 1";
  for (int i = 0; i < 100000; ++i) all += " and loss < 1", any += " or lr > 1";
  CHECK(matches(all, kBaseline));
  CHECK_FALSE(matches(all + " and lr > 1", kBaseline));
  CHECK_FALSE(matches(any, kBaseline));
  CHECK(matches(any + " or loss < 1", kBaseline));
}
