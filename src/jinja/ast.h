// The parsed template: one node type for statements and expressions, whose fields each kind
// uses as listed beside it (the shape of the reference's AST, flattened).
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace kvl::jinja {

enum class NodeKind {
  // Statements.
  kText,             // text
  kComment,          // renders nothing
  kIf,               // a: test; body; alternate (an elif is a nested kIf)
  kFor,              // a: target (identifier or tuple); b: iterable; c: `if` filter or null;
                     // body; alternate: the else block
  kBreak,
  kContinue,
  kSet,              // a: target; b: value, or null for a block set (body)
  kMacro,            // text: name; args: parameters; body
  kCallStatement,    // a: the kCall; args: caller's parameters; body
  kFilterStatement,  // a: the filter (identifier or call); body
  // Expressions.
  kIntLiteral,       // number
  kFloatLiteral,     // number
  kStringLiteral,    // text
  kArrayLiteral,     // args: items
  kTupleLiteral,     // args: items
  kObjectLiteral,    // args: keys; body: values
  kIdentifier,       // text
  kMember,           // a: object; b: property; computed: a[b] rather than a.b
  kCall,             // a: callee; args
  kUnary,            // text: operator; a
  kBinary,           // text: operator; a, b
  kFilter,           // a: operand; b: filter (identifier or call)
  kTest,             // a: operand; text: test name; negate; args: the test's argument
  kSelect,           // a: value; b: condition (`a if b` with no else)
  kTernary,          // a: condition; b: if true; c: if false
  kSlice,            // a: start; b: stop; c: step (each may be null)
  kKeywordArg,       // text: name; a: value
  kSpread,           // a: *value
  kKeywordSpread,    // a: **value
};

struct Node {
  Node() = default;
  // Frees the nodes below with an explicit stack: a template's chains and nesting are bounded
  // at parse, but a tree refused half-built (or one deeper than any limit) is freed too, and no
  // depth of it may overflow the stack.
  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  NodeKind kind;
  int line = 0;
  std::string text;
  double number = 0;
  bool computed = false;
  bool negate = false;
  // A macro or call block that reads `kwargs` / `varargs` collects extra arguments into them.
  bool uses_kwargs = false;
  bool uses_varargs = false;
  std::unique_ptr<Node> a, b, c;
  std::vector<std::unique_ptr<Node>> args;
  std::vector<std::unique_ptr<Node>> body;
  std::vector<std::unique_ptr<Node>> alternate;
};

struct Program {
  std::vector<std::unique_ptr<Node>> body;
};

// The first node found deeper than `max_depth` below `body` (the statements at the top are at
// depth 1), or null. Walks with an explicit stack, so it can be asked of any tree.
const Node* FindNodeDeeperThan(const std::vector<std::unique_ptr<Node>>& body, int max_depth);

}  // namespace kvl::jinja
