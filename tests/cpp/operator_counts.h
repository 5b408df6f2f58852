// Test helper: the dispatcher operators a piece of work calls, by name, with how many times each ran.
#pragma once

#include <ATen/record_function.h>

#include <functional>
#include <map>
#include <string>
#include <vector>

namespace runner::testing {

// The operators `work` calls on this thread (the dispatcher's record-function callbacks, FUNCTION scope: ops
// called from inside other ops count too; autograd's own nodes do not). CPU backward passes run on the calling
// thread, so they are counted.
inline std::map<std::string, int> operators_called(const std::function<void()>& work) {
  static thread_local std::map<std::string, int>* counts = nullptr;
  std::map<std::string, int> seen;
  counts = &seen;
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (counts != nullptr) ++(*counts)[fn.name()];
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  work();
  at::removeCallback(handle);
  counts = nullptr;
  return seen;
}

// The operators `work` calls itself, and those autograd's backward nodes call, but not the ops these call inside
// (an ATen op's own ATen ops, a runner op's CPU reference): the granularity of a model's code and of autograd's
// formulas, where each op is a kernel or a view on a GPU. Counted on this thread, as operators_called.
inline std::map<std::string, int> outer_operators_called(const std::function<void()>& work) {
  static thread_local std::vector<bool>* inside_op = nullptr;  // per open frame: whether it is an operator
  static thread_local std::map<std::string, int>* counts = nullptr;
  std::vector<bool> frames;
  std::map<std::string, int> seen;
  inside_op = &frames;
  counts = &seen;
  const at::CallbackHandle handle =
      at::addThreadLocalCallback(at::RecordFunctionCallback(
                                     [](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
                                       if (inside_op == nullptr) return nullptr;
                                       const std::string name = fn.name();
                                       const bool op = name.rfind("aten::", 0) == 0 || name.rfind("runner::", 0) == 0;
                                       const bool nested = !inside_op->empty() && inside_op->back();
                                       if (op && !nested) ++(*counts)[name];
                                       inside_op->push_back(op || nested);
                                       return nullptr;
                                     },
                                     [](const at::RecordFunction&, at::ObserverContext*) {
                                       if (inside_op != nullptr && !inside_op->empty()) inside_op->pop_back();
                                     })
                                     .scopes({at::RecordScope::FUNCTION}));
  work();
  at::removeCallback(handle);
  inside_op = nullptr;
  counts = nullptr;
  return seen;
}

// The number of calls of every operator in `counts`.
inline int total_calls(const std::map<std::string, int>& counts) {
  int total = 0;
  for (const auto& [name, calls] : counts) total += calls;
  return total;
}

}  // namespace runner::testing
