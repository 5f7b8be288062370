// Evaluates a parsed template: statements append to the output, expressions give values.
// Scopes, loops, macros and call blocks follow the reference runtime (a for loop has one scope
// for all its iterations; a macro runs in a scope below its caller's).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ast.h"
#include "kvl/jinja.h"
#include "kvl/jinja_value.h"
#include "value_ops.h"

namespace kvl::jinja {

class Env {
 public:
  explicit Env(Env* parent = nullptr) : parent_(parent) {}
  Value Lookup(const std::string& name) const;
  void Set(const std::string& name, Value value) { vars_[name] = std::move(value); }

 private:
  std::unordered_map<std::string, Value> vars_;
  Env* parent_;
};

// A call's arguments: the positional ones, then the keyword ones (`has_keywords` also when the
// reference passes an empty keyword mapping, as a call block does).
struct CallArgs {
  std::vector<Value> positional;
  ValueMap keywords;
  bool has_keywords = false;
};

class Interpreter;

class Callable {
 public:
  using Fn = std::function<Value(Interpreter&, CallArgs&, Env& caller)>;
  Callable(std::string name, Fn fn) : name_(std::move(name)), fn_(std::move(fn)) {}
  const std::string& name() const { return name_; }
  Value Call(Interpreter& in, CallArgs& args, Env& caller) const { return fn_(in, args, caller); }

 private:
  std::string name_;
  Fn fn_;
};

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options) : options_(options) {}

  // The rendered text; throws RenderError (naming the line) for any error.
  std::string Run(const Program& program, Env& global);

  Value Eval(const Node& node, Env& env);
  Value CallValue(const Value& fn, CallArgs& args, Env& env, int line);
  [[noreturn]] void Fail(const std::string& message) const;
  const RenderOptions& options() const { return options_; }
  // Refuses a string past the size limit (exponential concatenation).
  void CheckSize(size_t bytes) const;
  // Each namespace() the render creates, emptied when it ends (see ClearNamespaces).
  void TrackNamespace(const Value& ns);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  void Step(const Node& node);
  Flow ExecBlock(const std::vector<std::unique_ptr<Node>>& body, Env& env, std::string* out);
  Flow Exec(const Node& node, Env& env, std::string* out);
  void ExecSet(const Node& node, Env& env);
  Flow ExecFor(const Node& node, Env& env, std::string* out);
  void ExecMacro(const Node& node, Env& env);
  Value ExecCallStatement(const Node& node, Env& env);
  void BindArguments(const std::string& display_name, const Node& owner,
                     const std::vector<std::unique_ptr<Node>>& parameters, CallArgs& args, Env& scope);
  CallArgs EvalArguments(const std::vector<std::unique_ptr<Node>>& args, Env& env);
  Value EvalBinary(const Node& node, Env& env);
  Value EvalUnary(const Node& node, Env& env);
  Value EvalMember(const Node& node, Env& env);
  Value EvalSlice(const Value& object, const Node& slice, Env& env);
  Value EvalCall(const Node& node, Env& env);
  Value EvalObjectLiteral(const Node& node, Env& env);
  Value ApplyFilter(const Value& operand, const Node& filter, Env& env);
  bool ApplyTest(const Node& node, const Value& operand, Env& env);

  void ClearNamespaces();

  const RenderOptions& options_;
  std::vector<Value> namespaces_;
  int64_t steps_ = 0;
  int call_depth_ = 0;
  int line_ = 0;  // the line being evaluated, for error messages
};

// Built-in behaviour, in builtins.cc and methods.cc.
Value ApplyNamedFilter(Interpreter& in, const Value& operand, const std::string& name);
Value ApplyCalledFilter(Interpreter& in, const Value& operand, const std::string& name,
                        const std::vector<std::unique_ptr<Node>>& arg_nodes, CallArgs& args, Env& env);
// The test `name` (defined, none, string, ...) on the operand; false in *known for an unknown one.
bool RunTest(const std::string& name, const Value& operand, const Value& argument, bool* known);
// A string's, a list's or a mapping's method or property (`s.strip`, `d.items`, `l.length`);
// undefined where the type has none.
Value BuiltinMember(const Value& object, const std::string& name);
// The globals every render starts with: namespace, range, raise_exception, strftime_now,
// true/false/none in both cases.
void AddGlobals(Env& env);

}  // namespace kvl::jinja
