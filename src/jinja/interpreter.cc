#include "interpreter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "js_text.h"

namespace kvl::jinja {
namespace {

bool IsIdentifierNode(const Node* node) { return node != nullptr && node->kind == NodeKind::kIdentifier; }

// Python-style slicing, as the reference's slice() computes its bounds: `visit` is called with
// each index the slice takes, in order.
template <typename Visit>
void ForEachSliceIndex(int64_t length, const Value& start_v, const Value& stop_v, const Value& step_v, Visit visit) {
  const double step = step_v.is_undefined() ? 1 : step_v.number();
  const int direction = step > 0 ? 1 : step < 0 ? -1 : 0;
  double start = 0, stop = 0;
  const double n = static_cast<double>(length);
  if (direction >= 0) {
    start = start_v.is_undefined() ? 0 : start_v.number();
    stop = stop_v.is_undefined() ? n : stop_v.number();
    start = start < 0 ? std::max(n + start, 0.0) : std::min(start, n);
    stop = stop < 0 ? std::max(n + stop, 0.0) : std::min(stop, n);
  } else {
    start = start_v.is_undefined() ? n - 1 : start_v.number();
    stop = stop_v.is_undefined() ? -1 : stop_v.number();
    start = start < 0 ? std::max(n + start, -1.0) : std::min(start, n - 1);
    stop = stop < -1 ? std::max(n + stop, -1.0) : std::min(stop, n - 1);
  }
  if (direction == 0) return;
  for (double i = start; direction * i < direction * stop; i += step) {
    if (i >= 0 && i < n) visit(static_cast<size_t>(i));
  }
}

// The code point at `index` (negative: from the end), as .at() on Array.from(s) gives it.
Value CodePointAt(const std::string& s, int64_t index) {
  if (index < 0) {
    int64_t count = 0;
    for (size_t pos = 0; pos < s.size(); NextCodePoint(s, &pos)) ++count;
    index += count;
    if (index < 0) return Value();
  }
  size_t pos = 0;
  for (int64_t i = 0; i < index && pos < s.size(); ++i) NextCodePoint(s, &pos);
  if (pos >= s.size()) return Value();
  const size_t start = pos;
  NextCodePoint(s, &pos);
  return Value::String(s.substr(start, pos - start));
}

}  // namespace

Value Env::Lookup(const std::string& name) const {
  for (const Env* env = this; env != nullptr; env = env->parent_) {
    auto it = env->vars_.find(name);
    if (it != env->vars_.end()) return it->second;
  }
  return Value();
}

size_t DataBytes(const Value& v) {
  if (v.is_string()) return v.str().size();
  if (v.is_array()) return v.items().size() * sizeof(Value);
  if (v.is_object() || v.is_namespace()) return v.map().entries.size() * sizeof(v.map().entries[0]);
  return 0;
}

size_t DataBytes(const CallArgs& args) {
  size_t bytes = 0;
  for (const Value& v : args.positional) bytes += DataBytes(v);
  for (const auto& [key, v] : args.keywords.entries) bytes += DataBytes(v);
  return bytes;
}

void Interpreter::Fail(const std::string& message) const { throw RenderError(message); }

Interpreter::Nested::Nested(Interpreter* in) : in_(in) {
  const int depth = ++in_->depth_;
  const uintptr_t here = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  if (depth > kMaxEvalDepth || in_->stack_top_ - here > kMaxStackBytes) {
    --in_->depth_;
    in_->Fail(fmt::format("evaluation nested {} levels deep, past the limit of {} levels or {} KiB of "
                          "stack (runaway recursion, or blocks, expressions and macro calls nested too "
                          "deeply)",
                          depth, kMaxEvalDepth, kMaxStackBytes >> 10));
  }
}

void Interpreter::Step(const Node& node) {
  line_ = node.line;
  budget_.Step();
}

std::string Interpreter::Run(const Program& program, Env& global) {
  stack_top_ = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  Output out(budget_);
  try {
    if (ExecBlock(program.body, global, &out) != Flow::kNormal) Fail("'break' or 'continue' outside a loop");
  } catch (const RenderError& e) {
    ClearNamespaces();
    throw RenderError(fmt::format("template line {}: {}", line_, e.what()));
  }
  ClearNamespaces();
  return out.Take();
}

void Interpreter::TrackNamespace(const Value& ns) { namespaces_.push_back(ns); }

void Interpreter::ClearNamespaces() {
  // A namespace may hold itself (`{% set ns.me = ns %}`): emptied here, the reference cycle
  // goes and the memory with it. Nothing of a render outlives it but its text.
  for (Value& ns : namespaces_) ns.map().entries.clear();
  namespaces_.clear();
}

Interpreter::Flow Interpreter::ExecBlock(const std::vector<std::unique_ptr<Node>>& body, Env& env,
                                         Output* out) {
  for (const auto& statement : body) {
    const Flow flow = Exec(*statement, env, out);
    if (flow != Flow::kNormal) return flow;
  }
  return Flow::kNormal;
}

Interpreter::Flow Interpreter::Exec(const Node& node, Env& env, Output* out) {
  Nested nested(this);
  Step(node);
  switch (node.kind) {
    case NodeKind::kText:
      out->Append(node.text);
      return Flow::kNormal;
    case NodeKind::kComment:
      return Flow::kNormal;
    case NodeKind::kIf:
      return ExecBlock(Eval(*node.a, env).Truthy() ? node.body : node.alternate, env, out);
    case NodeKind::kFor:
      return ExecFor(node, env, out);
    case NodeKind::kBreak:
      return Flow::kBreak;
    case NodeKind::kContinue:
      return Flow::kContinue;
    case NodeKind::kSet:
      ExecSet(node, env);
      return Flow::kNormal;
    case NodeKind::kMacro:
      ExecMacro(node, env);
      return Flow::kNormal;
    case NodeKind::kFilterStatement: {
      Output body(budget_);
      const Flow flow = ExecBlock(node.body, env, &body);
      if (flow != Flow::kNormal) return flow;
      line_ = node.line;
      out->Append(Display(ApplyFilter(Value::String(body.Take()), *node.a, env)));
      return Flow::kNormal;
    }
    default: {
      const Value v = node.kind == NodeKind::kCallStatement ? ExecCallStatement(node, env) : Eval(node, env);
      if (!v.is_null() && !v.is_undefined()) out->Append(Display(v));
      return Flow::kNormal;
    }
  }
}

void Interpreter::ExecSet(const Node& node, Env& env) {
  Value rhs;
  if (node.b) {
    rhs = Eval(*node.b, env);
  } else {
    Output body(budget_);
    ExecBlock(node.body, env, &body);
    rhs = Value::String(body.Take());
  }
  line_ = node.line;
  const Node& target = *node.a;
  if (target.kind == NodeKind::kIdentifier) {
    env.Set(target.text, std::move(rhs));
  } else if (target.kind == NodeKind::kTupleLiteral) {
    if (!rhs.is_array()) Fail(fmt::format("cannot unpack non-iterable type in set: {}", rhs.TypeName()));
    if (rhs.items().size() != target.args.size()) {
      Fail(fmt::format("too {} items to unpack in set", target.args.size() > rhs.items().size() ? "few" : "many"));
    }
    for (size_t i = 0; i < target.args.size(); ++i) {
      if (!IsIdentifierNode(target.args[i].get())) Fail("cannot unpack into something that is not a name");
      env.Set(target.args[i]->text, rhs.items()[i]);
    }
  } else if (target.kind == NodeKind::kMember) {
    const Value object = Eval(*target.a, env);
    if (!object.is_namespace()) Fail("cannot assign an attribute of something that is not a namespace");
    if (!IsIdentifierNode(target.b.get())) Fail("cannot assign a member named by an expression");
    object.map().Set(target.b->text, std::move(rhs));
  } else {
    Fail("invalid target on the left of '=' in set");
  }
}

Interpreter::Flow Interpreter::ExecFor(const Node& node, Env& env, Output* out) {
  Env scope(&env);
  Value iterable = Eval(*node.b, scope);
  line_ = node.line;
  if (iterable.is_object()) {
    std::vector<Value> keys;
    for (const auto& [key, value] : iterable.map().entries) keys.push_back(Value::String(key));
    iterable = Value::Array(std::move(keys));
  }
  if (!iterable.is_array()) Fail(fmt::format("expected a list or a mapping in a for loop, got {}", iterable.TypeName()));
  const Node& target = *node.a;
  auto assign = [&](Env& into, const Value& item) {
    if (target.kind == NodeKind::kIdentifier) {
      into.Set(target.text, item);
      return;
    }
    for (size_t j = 0; j < target.args.size(); ++j) {
      if (!IsIdentifierNode(target.args[j].get())) Fail("cannot unpack into something that is not a name");
      into.Set(target.args[j]->text, item.items()[j]);
    }
  };
  std::vector<Value> items;
  for (const Value& item : iterable.items()) {
    if (target.kind == NodeKind::kTupleLiteral) {
      // A tuple item is refused, as the reference checks the type name ArrayValue.
      if (!item.is_array() || item.is_tuple()) Fail(fmt::format("cannot unpack non-iterable type {}", item.TypeName()));
      if (target.args.size() != item.items().size()) {
        Fail(fmt::format("too {} items to unpack", target.args.size() > item.items().size() ? "few" : "many"));
      }
    }
    if (node.c) {
      Env test_scope(&scope);
      assign(test_scope, item);
      if (!Eval(*node.c, test_scope).Truthy()) continue;
    }
    items.push_back(item);
  }
  // An iteration that ends in break or continue loses what it printed, and counts as no
  // iteration for the else block: both as the reference does.
  bool no_iteration = true;
  const int64_t length = static_cast<int64_t>(items.size());
  for (int64_t i = 0; i < length; ++i) {
    Step(node);
    ValueMap loop;
    loop.entries = {{"index", Value::Int(i + 1)},
                    {"index0", Value::Int(i)},
                    {"revindex", Value::Int(length - i)},
                    {"revindex0", Value::Int(length - i - 1)},
                    {"first", Value::Bool(i == 0)},
                    {"last", Value::Bool(i == length - 1)},
                    {"length", Value::Int(length)},
                    {"previtem", i > 0 ? items[i - 1] : Value()},
                    {"nextitem", i < length - 1 ? items[i + 1] : Value()}};
    scope.Set("loop", Value::Object(std::move(loop)));
    assign(scope, items[i]);
    Output body(budget_);
    const Flow flow = ExecBlock(node.body, scope, &body);
    if (flow == Flow::kContinue) continue;
    if (flow == Flow::kBreak) break;
    out->Append(body.Take());
    no_iteration = false;
  }
  if (no_iteration) return ExecBlock(node.alternate, scope, out);
  return Flow::kNormal;
}

void Interpreter::BindArguments(const std::string& display_name, const Node& owner,
                                const std::vector<std::unique_ptr<Node>>& parameters, CallArgs& args,
                                Env& scope) {
  std::vector<Value>& positional = args.positional;
  ValueMap keywords = args.keywords;
  std::vector<const Node*> pending_defaults;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const Node& p = *parameters[i];
    const std::string& name = p.text;
    std::optional<Value> value;
    if (i < positional.size()) value = positional[i];
    if (!value) {
      for (auto it = keywords.entries.begin(); it != keywords.entries.end(); ++it) {
        if (it->first == name) {
          value = it->second;
          keywords.entries.erase(it);
          break;
        }
      }
    }
    if (!value && p.kind == NodeKind::kKeywordArg) pending_defaults.push_back(&p);
    scope.Set(name, value ? *value : Value());
  }
  if (owner.uses_kwargs) {
    scope.Set("kwargs", Value::Object(std::move(keywords)));
  } else if (!keywords.entries.empty()) {
    Fail(fmt::format("macro {} takes no keyword argument '{}'", display_name, keywords.entries[0].first));
  }
  if (owner.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = parameters.size(); i < positional.size(); ++i) rest.push_back(positional[i]);
    scope.Set("varargs", Value::Array(std::move(rest)));
  } else if (positional.size() > parameters.size()) {
    Fail(fmt::format("macro {} takes not more than {} argument(s)", display_name, parameters.size()));
  }
  for (const Node* p : pending_defaults) scope.Set(p->text, Eval(*p->a, scope));
}

void Interpreter::ExecMacro(const Node& node, Env& env) {
  const Node* macro = &node;
  auto fn = [macro](Interpreter& in, const Value&, CallArgs& args, Env& caller) -> Value {
    if (++in.call_depth_ > in.options_.max_call_depth) {
      in.Fail(fmt::format("macro '{}' nested more than {} calls deep (runaway recursion?)", macro->text,
                          in.options_.max_call_depth));
    }
    Env scope(&caller);
    in.BindArguments("'" + macro->text + "'", *macro, macro->args, args, scope);
    Output out(in.budget_);
    if (in.ExecBlock(macro->body, scope, &out) != Flow::kNormal) in.Fail("'break' or 'continue' outside a loop");
    --in.call_depth_;
    return Value::String(out.Take());
  };
  env.Set(node.text, Value::Function(std::make_shared<Callable>(node.text, fn)));
}

Value Interpreter::ExecCallStatement(const Node& node, Env& env) {
  const Node* call_block = &node;
  Env* defining_env = &env;
  // `caller` reads the scope it was defined in, which ends with this statement: a caller kept
  // past it (stored in a namespace) must fail, not read a scope that is gone.
  auto alive = std::make_shared<bool>(true);
  auto caller_fn = [call_block, defining_env, alive](Interpreter& in, const Value&, CallArgs& args, Env&) -> Value {
    if (!*alive) in.Fail("caller() called after its call block ended");
    Env scope(defining_env);
    in.BindArguments("None", *call_block, call_block->args, args, scope);
    Output out(in.budget_);
    if (in.ExecBlock(call_block->body, scope, &out) != Flow::kNormal) in.Fail("'break' or 'continue' outside a loop");
    return Value::String(out.Take());
  };
  const Node& call = *node.a;
  CallArgs args = EvalArguments(call.args, env);
  args.has_keywords = true;
  const Value fn = Eval(*call.a, env);
  line_ = node.line;
  Env call_env(&env);
  call_env.Set("caller", Value::Function(std::make_shared<Callable>("caller", caller_fn)));
  Value result = CallValue(fn, args, call_env, node.line);
  *alive = false;
  return result;
}

CallArgs Interpreter::EvalArguments(const std::vector<std::unique_ptr<Node>>& nodes, Env& env) {
  CallArgs args;
  for (const auto& node : nodes) {
    if (node->kind == NodeKind::kSpread) {
      const Value v = Eval(*node->a, env);
      if (!v.is_array()) Fail(fmt::format("cannot unpack non-iterable type {}", v.TypeName()));
      for (const Value& item : v.items()) args.positional.push_back(item);
    } else if (node->kind != NodeKind::kKeywordArg && node->kind != NodeKind::kKeywordSpread) {
      args.positional.push_back(Eval(*node, env));
    }
  }
  auto add_keyword = [&](const std::string& key, Value value) {
    if (args.keywords.Find(key) != nullptr) Fail(fmt::format("got multiple values for keyword argument '{}'", key));
    args.keywords.entries.emplace_back(key, std::move(value));
  };
  for (const auto& node : nodes) {
    if (node->kind == NodeKind::kKeywordArg) {
      add_keyword(node->text, Eval(*node->a, env));
    } else if (node->kind == NodeKind::kKeywordSpread) {
      const Value v = Eval(*node->a, env);
      if (!v.is_object()) Fail(fmt::format("argument after ** must be a mapping, not {}", v.TypeName()));
      for (const auto& [key, value] : v.map().entries) add_keyword(key, value);
    }
  }
  args.has_keywords = !args.keywords.entries.empty();
  return args;
}

Value Interpreter::CallValue(const Value& fn, CallArgs& args, Env& env, int line) {
  if (!fn.is_function()) Fail(fmt::format("cannot call something that is not a function: got {}", fn.TypeName()));
  // A built-in's work is at most about the size of its receiver and arguments (or of what it
  // makes, which counts as it is made).
  budget_.Work(DataBytes(fn.function().receiver()) + DataBytes(args));
  Value result = fn.function().Call(*this, args, env);
  line_ = line;
  return result;
}

Value Interpreter::Eval(const Node& node, Env& env) {
  Nested nested(this);
  Step(node);
  switch (node.kind) {
    case NodeKind::kIntLiteral: return Value::Int(node.number);
    case NodeKind::kFloatLiteral: return Value::Float(node.number);
    case NodeKind::kStringLiteral:
    case NodeKind::kText: return Value::String(node.text);
    case NodeKind::kArrayLiteral:
    case NodeKind::kTupleLiteral: {
      std::vector<Value> items;
      for (const auto& item : node.args) items.push_back(Eval(*item, env));
      return node.kind == NodeKind::kTupleLiteral ? Value::Tuple(std::move(items)) : Value::Array(std::move(items));
    }
    case NodeKind::kObjectLiteral: return EvalObjectLiteral(node, env);
    case NodeKind::kIdentifier: return env.Lookup(node.text);
    case NodeKind::kMember: return EvalMember(node, env);
    case NodeKind::kCall: return EvalCall(node, env);
    case NodeKind::kUnary: return EvalUnary(node, env);
    case NodeKind::kBinary: return EvalBinary(node, env);
    case NodeKind::kFilter: {
      const Value operand = Eval(*node.a, env);
      line_ = node.line;
      return ApplyFilter(operand, *node.b, env);
    }
    case NodeKind::kTest: {
      const Value operand = Eval(*node.a, env);
      line_ = node.line;
      return Value::Bool(ApplyTest(node, operand, env) != node.negate);
    }
    case NodeKind::kSelect: return Eval(*node.b, env).Truthy() ? Eval(*node.a, env) : Value();
    case NodeKind::kTernary: return Eval(*node.a, env).Truthy() ? Eval(*node.b, env) : Eval(*node.c, env);
    case NodeKind::kCallStatement: return ExecCallStatement(node, env);
    default: Fail("a statement or argument form where an expression was expected");
  }
}

Value Interpreter::EvalObjectLiteral(const Node& node, Env& env) {
  ValueMap map;
  for (size_t i = 0; i < node.args.size(); ++i) {
    const Value key = Eval(*node.args[i], env);
    if (!key.is_string()) Fail(fmt::format("mapping keys must be strings: got {}", key.TypeName()));
    map.Set(key.str(), Eval(*node.body[i], env));
  }
  return Value::Object(std::move(map));
}

Value Interpreter::EvalCall(const Node& node, Env& env) {
  CallArgs args = EvalArguments(node.args, env);
  const Value fn = Eval(*node.a, env);
  line_ = node.line;
  return CallValue(fn, args, env, node.line);
}

Value Interpreter::EvalUnary(const Node& node, Env& env) {
  const Value v = Eval(*node.a, env);
  line_ = node.line;
  if (node.text == "not") return Value::Bool(!v.Truthy());
  if (!v.is_number() && !v.is_bool()) Fail(fmt::format("unknown operator '{}' for {}", node.text, v.TypeName()));
  const double result = (node.text == "-" ? -1 : 1) * v.number();
  return v.kind() == Value::Kind::kFloat ? Value::Float(result) : Value::Int(result);
}

Value Interpreter::EvalBinary(const Node& node, Env& env) {
  const std::string& op = node.text;
  const Value left = Eval(*node.a, env);
  if (op == "and") return left.Truthy() ? Eval(*node.b, env) : left;
  if (op == "or") return left.Truthy() ? left : Eval(*node.b, env);
  const Value right = Eval(*node.b, env);
  line_ = node.line;
  budget_.Work(DataBytes(left) + DataBytes(right));
  if (op == "==") return Value::Bool(LooseEquals(left, right));
  if (op == "!=") return Value::Bool(!LooseEquals(left, right));
  const bool membership = op == "in" || op == "not in";
  if (left.is_undefined() || right.is_undefined()) {
    if (right.is_undefined() && membership) return Value::Bool(op == "not in");
    Fail(fmt::format("cannot apply '{}' to an undefined value", op));
  }
  if (left.is_null() || right.is_null()) Fail(fmt::format("cannot apply '{}' to none", op));
  if (op == "~") {
    std::string joined = RawString(left) + RawString(right);
    CheckSize(joined.size());
    return Value::String(std::move(joined));
  }
  const bool left_numeric = left.is_number() || left.is_bool();
  const bool right_numeric = right.is_number() || right.is_bool();
  if (op == "**" && left_numeric && right_numeric) {
    const double a = left.number(), b = right.number();
    if (a == 0 && b < 0) Fail("0.0 cannot be raised to a negative power");
    const double result = std::pow(a, b);
    if (!std::isfinite(result)) Fail("exponentiation result is not a finite real number");
    const bool is_float = left.kind() == Value::Kind::kFloat || right.kind() == Value::Kind::kFloat || b < 0;
    return is_float ? Value::Float(result) : Value::Int(result);
  }
  if (left.is_number() && right.is_number()) {
    const double a = left.number(), b = right.number();
    const bool is_float = left.kind() == Value::Kind::kFloat || right.kind() == Value::Kind::kFloat;
    auto number = [&](double v) { return is_float ? Value::Float(v) : Value::Int(v); };
    if (op == "+") return number(a + b);
    if (op == "-") return number(a - b);
    if (op == "*") return number(a * b);
    if (op == "/") return Value::Float(a / b);
    if (op == "//") return number(std::floor(a / b));
    if (op == "%") return number(std::fmod(a, b));
    if (op == "<") return Value::Bool(a < b);
    if (op == ">") return Value::Bool(a > b);
    if (op == ">=") return Value::Bool(a >= b);
    if (op == "<=") return Value::Bool(a <= b);
  } else if (left.is_array() && right.is_array()) {
    if (op == "+") {
      std::vector<Value> items = left.items();
      items.insert(items.end(), right.items().begin(), right.items().end());
      CheckSize(items.size());
      return Value::Array(std::move(items));
    }
  } else if (right.is_array()) {
    const bool member = std::any_of(right.items().begin(), right.items().end(),
                                    [&](const Value& x) { return StrictEquals(x, left); });
    if (op == "in") return Value::Bool(member);
    if (op == "not in") return Value::Bool(!member);
  }
  if ((left.is_string() || right.is_string()) && op == "+") {
    std::string joined = RawString(left) + RawString(right);
    CheckSize(joined.size());
    return Value::String(std::move(joined));
  }
  if (left.is_string() && right.is_string() && membership) {
    const bool found = FindText(right.str(), left.str()) != std::string::npos;
    return Value::Bool(found == (op == "in"));
  }
  if (left.is_string() && right.is_object() && membership) {
    const bool found = right.map().Find(left.str()) != nullptr;
    return Value::Bool(found == (op == "in"));
  }
  Fail(fmt::format("unknown operator '{}' between {} and {}", op, left.TypeName(), right.TypeName()));
}

Value Interpreter::EvalSlice(const Value& object, const Node& slice, Env& env) {
  if (!object.is_array() && !object.is_string()) Fail("only a list or a string can be sliced");
  Value parts[3];
  const Node* nodes[3] = {slice.a.get(), slice.b.get(), slice.c.get()};
  for (int i = 0; i < 3; ++i) {
    if (nodes[i] != nullptr) parts[i] = Eval(*nodes[i], env);
    if (!parts[i].is_undefined() && parts[i].kind() != Value::Kind::kInt) {
      Fail("slice start, stop and step must be integers");
    }
  }
  budget_.Work(DataBytes(object));
  if (object.is_array()) {
    std::vector<Value> out;
    ForEachSliceIndex(static_cast<int64_t>(object.items().size()), parts[0], parts[1], parts[2],
                      [&](size_t i) { out.push_back(object.items()[i]); });
    return Value::Array(std::move(out));
  }
  // Where each code point starts (and the end), held against the render's bytes while in use.
  const std::string& text = object.str();
  const ScratchBytes scratch(budget_, (text.size() + 1) * sizeof(uint32_t));
  std::vector<uint32_t> starts;
  for (size_t pos = 0; pos < text.size(); NextCodePoint(text, &pos)) starts.push_back(static_cast<uint32_t>(pos));
  starts.push_back(static_cast<uint32_t>(text.size()));
  std::string out;
  ForEachSliceIndex(static_cast<int64_t>(starts.size() - 1), parts[0], parts[1], parts[2],
                    [&](size_t i) { out.append(text, starts[i], starts[i + 1] - starts[i]); });
  return Value::String(std::move(out));
}

Value Interpreter::EvalMember(const Node& node, Env& env) {
  const Value object = Eval(*node.a, env);
  Value property;
  if (node.computed) {
    if (node.b->kind == NodeKind::kSlice) return EvalSlice(object, *node.b, env);
    property = Eval(*node.b, env);
  } else if (node.b->kind == NodeKind::kIntLiteral) {
    property = Value::Int(node.b->number);
  } else {
    property = Value::String(node.b->text);
  }
  line_ = node.line;
  if (object.is_object() || object.is_namespace()) {
    if (!property.is_string()) Fail(fmt::format("cannot read a member with a {} key", property.TypeName()));
    if (const Value* found = object.map().Find(property.str())) return *found;
    return object.is_object() ? BuiltinMember(object, property.str()) : Value();
  }
  if (object.is_array() || object.is_string()) {
    if (property.kind() == Value::Kind::kInt) {
      // .at(): negative indices count from the end; a string indexes its code points.
      const int64_t index = static_cast<int64_t>(property.number());
      if (object.is_array()) {
        const int64_t n = static_cast<int64_t>(object.items().size());
        const int64_t i = index < 0 ? n + index : index;
        return i >= 0 && i < n ? object.items()[i] : Value();
      }
      budget_.Work(DataBytes(object));
      return CodePointAt(object.str(), index);
    }
    if (property.is_string()) {
      budget_.Work(DataBytes(object));  // `.length` counts the string's code units
      return BuiltinMember(object, property.str());
    }
    Fail(fmt::format("cannot index with a {}", property.TypeName()));
  }
  if (!property.is_string()) Fail(fmt::format("cannot read a member with a {} key", property.TypeName()));
  return BuiltinMember(object, property.str());
}

Value Interpreter::ApplyFilter(const Value& operand, const Node& filter, Env& env) {
  // A filter's work is about the size of its operand and arguments (a sort's a little more,
  // counted there), or of what it makes, which counts as it is made.
  budget_.Work(DataBytes(operand));
  if (filter.kind == NodeKind::kIdentifier) return ApplyNamedFilter(*this, operand, filter.text);
  if (filter.kind != NodeKind::kCall || !IsIdentifierNode(filter.a.get())) Fail("a filter must be a name or a call");
  CallArgs args = EvalArguments(filter.args, env);
  line_ = filter.line;
  budget_.Work(DataBytes(args));
  return ApplyCalledFilter(*this, operand, filter.a->text, filter.args, args, env);
}

bool Interpreter::ApplyTest(const Node& node, const Value& operand, Env& env) {
  Value argument;
  if (!node.args.empty()) {
    CallArgs args = EvalArguments(node.args, env);
    if (args.positional.size() != 1 || args.has_keywords) Fail(fmt::format("test '{}' takes one argument", node.text));
    argument = args.positional[0];
    line_ = node.line;
  }
  budget_.Work(DataBytes(operand) + DataBytes(argument));
  bool known = false;
  const bool result = RunTest(node.text, operand, argument, &known);
  if (!known) Fail(fmt::format("unknown test '{}'", node.text));
  return result;
}

}  // namespace kvl::jinja
