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
#include "render_budget.h"
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

// A macro, a built-in function or a method. A method's receiver (`s` in `s.split`) is held
// here and handed to `fn` at each call rather than captured by it, so that freeing a chain of
// them (a mapping's method whose mapping holds a method of another...) can take it out and
// need no recursion (Value::ReleaseChildren).
class Callable {
 public:
  using Fn = std::function<Value(Interpreter&, const Value& receiver, CallArgs&, Env& caller)>;
  Callable(std::string name, Fn fn, Value receiver = Value())
      : name_(std::move(name)), fn_(std::move(fn)), receiver_(std::move(receiver)) {}
  const std::string& name() const { return name_; }
  const Value& receiver() const { return receiver_; }
  Value Call(Interpreter& in, CallArgs& args, Env& caller) const { return fn_(in, receiver_, args, caller); }
  // For the last owner only, as it frees this.
  Value TakeReceiver() const { return std::move(receiver_); }

 private:
  std::string name_;
  Fn fn_;
  mutable Value receiver_;
};

// The text a block writes, counted against the render's bytes while it is held here.
class Output {
 public:
  explicit Output(RenderBudget& budget) : budget_(budget) {}
  ~Output() { budget_.Release(held_); }
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  void Append(std::string_view text) {
    budget_.CheckString(text_.size() + text.size());
    budget_.Hold(text.size());
    held_ += text.size();
    text_.append(text);
  }
  // The text, no longer counted here (a Value made of it counts it again).
  std::string Take() {
    budget_.Release(held_);
    held_ = 0;
    return std::move(text_);
  }

 private:
  RenderBudget& budget_;
  std::string text_;
  size_t held_ = 0;
};

class Interpreter {
 public:
  Interpreter(const RenderOptions& options, RenderBudget& budget) : options_(options), budget_(budget) {}

  // The rendered text; throws RenderError (naming the line) for any error.
  std::string Run(const Program& program, Env& global);

  Value Eval(const Node& node, Env& env);
  Value CallValue(const Value& fn, CallArgs& args, Env& env, int line);
  [[noreturn]] void Fail(const std::string& message) const;
  const RenderOptions& options() const { return options_; }
  RenderBudget& budget() { return budget_; }
  // Refuses a string past the size limit (exponential concatenation).
  void CheckSize(size_t bytes) const { budget_.CheckString(bytes); }
  // Each namespace() the render creates, emptied when it ends (see ClearNamespaces).
  void TrackNamespace(const Value& ns);

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  // Evaluation recurses once per node, and a macro's body nests inside its caller's: the depth
  // is bounded as a whole, and so are the stack bytes it spans (frames are several times larger
  // in sanitizer builds), well inside the 8 MiB a thread gets.
  static constexpr int kMaxEvalDepth = 1000;
  static constexpr size_t kMaxStackBytes = size_t{2} << 20;
  class Nested {
   public:
    explicit Nested(Interpreter* in);
    ~Nested() { --in_->depth_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Interpreter* in_;
  };

  void Step(const Node& node);
  Flow ExecBlock(const std::vector<std::unique_ptr<Node>>& body, Env& env, Output* out);
  Flow Exec(const Node& node, Env& env, Output* out);
  void ExecSet(const Node& node, Env& env);
  Flow ExecFor(const Node& node, Env& env, Output* out);
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
  RenderBudget& budget_;
  std::vector<Value> namespaces_;
  int call_depth_ = 0;
  int depth_ = 0;            // Eval and Exec calls in progress
  uintptr_t stack_top_ = 0;  // the stack's address where Run started
  int line_ = 0;             // the line being evaluated, for error messages
};

// The bytes a value's data spans, to weigh the work on it: a string's length, a list's or a
// mapping's entries times the size of one (what scanning, comparing or copying it touches).
size_t DataBytes(const Value& v);
size_t DataBytes(const CallArgs& args);

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
