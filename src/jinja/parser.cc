#include "parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

namespace kvl::jinja {
namespace {

// Deeper nesting than this (parentheses, blocks) is refused rather than recursed into, so a
// hostile template cannot overflow the stack.
constexpr int kMaxNesting = 200;
// A chain of one operator (`a + b + ...`, `x | f | g ...`, `v[i][j]...`) is parsed by a loop
// but becomes a tree as deep as the chain is long, which evaluating it walks recursively: both
// are bounded, far above what real chat templates use (their longest chains have a few dozen
// links, their trees are a few dozen levels deep).
constexpr int kMaxChainLinks = 200;
constexpr int kMaxTreeDepth = 256;

struct ParseError : std::runtime_error {
  ParseError(int line, const std::string& message)
      : std::runtime_error(fmt::format("template line {}: {}", line, message)) {}
  ParseError(const Token& at, const std::string& message)
      : std::runtime_error(fmt::format("template line {}, column {}: {}", at.line, at.column, message)) {}
};

using NodePtr = std::unique_ptr<Node>;

NodePtr MakeNode(NodeKind kind, int line) {
  auto node = std::make_unique<Node>();
  node->kind = kind;
  node->line = line;
  return node;
}

// Whether `root` (a macro or call body) reads the name, as the reference finds `kwargs` and
// `varargs` loads to decide whether a macro accepts extra arguments. An explicit stack: the
// body's depth is checked only once the whole template is parsed.
bool ReadsName(const Node& root, const std::string& name) {
  std::vector<const Node*> stack = {&root};
  while (!stack.empty()) {
    const Node& node = *stack.back();
    stack.pop_back();
    if (node.kind == NodeKind::kIdentifier && node.text == name) return true;
    // A member's name (`x.kwargs`) and a filter's (`x | kwargs`) are not loads of the name.
    if ((node.kind == NodeKind::kMember && !node.computed) ||
        ((node.kind == NodeKind::kFilter || node.kind == NodeKind::kFilterStatement) && node.b &&
         node.b->kind == NodeKind::kIdentifier)) {
      if (node.a) stack.push_back(node.a.get());
      continue;
    }
    for (const Node* child : {node.a.get(), node.b.get(), node.c.get()}) {
      if (child != nullptr) stack.push_back(child);
    }
    for (const auto* list : {&node.args, &node.body, &node.alternate}) {
      for (const NodePtr& child : *list) {
        if (child) stack.push_back(child.get());
      }
    }
  }
  return false;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  std::unique_ptr<Program> Run() {
    auto program = std::make_unique<Program>();
    while (current_ < tokens_.size()) program->body.push_back(ParseAny());
    return program;
  }

 private:
  // Nesting guard: one per recursive descent that can nest without bound.
  struct Depth {
    explicit Depth(Parser* p) : parser(p) {
      if (++parser->depth_ > kMaxNesting) {
        throw ParseError(parser->tokens_[std::min(parser->current_, parser->tokens_.size() - 1)],
                         fmt::format("nesting deeper than {} levels", kMaxNesting));
      }
    }
    ~Depth() { --parser->depth_; }
    Parser* parser;
  };

  int Line() const {
    if (tokens_.empty()) return 1;
    return tokens_[std::min(current_, tokens_.size() - 1)].line;
  }
  bool Is(TokenType type, size_t ahead = 0) const {
    return current_ + ahead < tokens_.size() && tokens_[current_ + ahead].type == type;
  }
  bool IsIdentifier(std::string_view name, size_t ahead = 0) const {
    return Is(TokenType::kIdentifier, ahead) && tokens_[current_ + ahead].value == name;
  }
  bool IsStatement(std::initializer_list<std::string_view> names) const {
    if (!Is(TokenType::kOpenStatement) || !Is(TokenType::kIdentifier, 1)) return false;
    for (std::string_view name : names) {
      if (tokens_[current_ + 1].value == name) return true;
    }
    return false;
  }
  const Token& Expect(TokenType type, std::string_view what) {
    if (current_ >= tokens_.size()) {
      throw ParseError(Line(), fmt::format("expected {} but the template ended", what));
    }
    const Token& token = tokens_[current_++];
    if (token.type != type) {
      throw ParseError(token.line, fmt::format("expected {}, got {} '{}'", what,
                                               TokenTypeName(token.type), token.value));
    }
    return token;
  }
  void ExpectIdentifier(std::string_view name) {
    if (!IsIdentifier(name)) {
      throw ParseError(Line(), fmt::format("expected '{}'", name));
    }
    ++current_;
  }
  // The statements of a block up to one of `ends`; the template ending first is an unclosed
  // block, named with the line it opened on.
  void ParseBlockUntil(std::initializer_list<std::string_view> ends, std::string_view opener,
                       int open_line, std::vector<NodePtr>* out) {
    open_blocks_.push_back({std::string(opener), open_line, std::string(ClosingTag(ends))});
    while (!IsStatement(ends)) {
      if (current_ >= tokens_.size()) {
        throw ParseError(open_line, fmt::format("'{{% {} %}}' is never closed (expected '{{% {} %}}' "
                                                "before the end of the template)",
                                                opener, ClosingTag(ends)));
      }
      out->push_back(ParseAny());
    }
    open_blocks_.pop_back();
  }
  static std::string_view ClosingTag(std::initializer_list<std::string_view> ends) {
    return *ends.begin() == std::string_view("elif") ? std::string_view("endif") : *ends.begin();
  }

  NodePtr ParseAny();
  NodePtr ParseStatement();
  NodePtr ParseSet(int line);
  NodePtr ParseIf(int line);
  NodePtr ParseMacro(int line);
  NodePtr ParseFor(int line);
  NodePtr ParseExpressionSequence(bool primary);
  NodePtr ParseExpression() { return ParseIfExpression(); }
  NodePtr ParseIfExpression();
  NodePtr ParseOr();
  NodePtr ParseAnd();
  NodePtr ParseNot();
  NodePtr ParseComparison();
  NodePtr ParseAdditive();
  NodePtr ParseMultiplicative();
  NodePtr ParsePower();
  NodePtr ParseTest();
  static bool TakesTestArgument(const std::string& test);
  bool StartsTestArgument() const;
  NodePtr ParseFilter();
  NodePtr ParseUnarySign();
  NodePtr ParseCallMember();
  NodePtr ParseCall(NodePtr callee);
  void ParseArgs(bool parameters, std::vector<NodePtr>* out);
  NodePtr ParseMemberArguments();
  NodePtr ParseMember(NodePtr object);
  NodePtr ParsePrimary();

  // One more link of an operator chain (the operator at `at`): refused past kMaxChainLinks.
  void CountLinkAt(int* links, size_t at) const {
    if (++*links <= kMaxChainLinks) return;
    const Token& op = tokens_[at];
    throw ParseError(op, fmt::format("a chain of more than {} '{}' operations in one expression (the limit "
                                     "keeps evaluation from recursing without bound)",
                                     kMaxChainLinks, op.value));
  }
  void CountLink(int* links) const { CountLinkAt(links, current_); }

  NodePtr Binary(const std::string& op, int line, NodePtr left, NodePtr right) {
    NodePtr node = MakeNode(NodeKind::kBinary, line);
    node->text = op;
    node->a = std::move(left);
    node->b = std::move(right);
    return node;
  }

  struct OpenBlock {
    std::string opener;
    int line;
    std::string closer;
  };

  std::vector<Token> tokens_;
  size_t current_ = 0;
  int depth_ = 0;
  std::vector<OpenBlock> open_blocks_;  // the blocks being parsed, innermost last
};

NodePtr Parser::ParseAny() {
  Depth depth(this);
  const Token& token = tokens_[current_];
  switch (token.type) {
    case TokenType::kComment: {
      NodePtr node = MakeNode(NodeKind::kComment, token.line);
      ++current_;
      return node;
    }
    case TokenType::kText: {
      NodePtr node = MakeNode(NodeKind::kText, token.line);
      node->text = token.value;
      ++current_;
      return node;
    }
    case TokenType::kOpenStatement:
      return ParseStatement();
    case TokenType::kOpenExpression: {
      ++current_;
      NodePtr node = ParseExpression();
      Expect(TokenType::kCloseExpression, "'}}'");
      return node;
    }
    default:
      throw ParseError(token.line, fmt::format("unexpected {} '{}'", TokenTypeName(token.type), token.value));
  }
}

NodePtr Parser::ParseStatement() {
  const int line = Expect(TokenType::kOpenStatement, "'{%'").line;
  if (!Is(TokenType::kIdentifier)) {
    throw ParseError(line, "expected a statement name after '{%'");
  }
  const std::string name = tokens_[current_++].value;
  auto expect_end = [&](std::string_view end) {
    Expect(TokenType::kOpenStatement, fmt::format("'{{% {} %}}'", end));
    ExpectIdentifier(end);
    Expect(TokenType::kCloseStatement, "'%}'");
  };
  if (name == "set") return ParseSet(line);
  if (name == "if") {
    NodePtr node = ParseIf(line);
    expect_end("endif");
    return node;
  }
  if (name == "macro") {
    NodePtr node = ParseMacro(line);
    expect_end("endmacro");
    return node;
  }
  if (name == "for") {
    NodePtr node = ParseFor(line);
    expect_end("endfor");
    return node;
  }
  if (name == "call") {
    NodePtr node = MakeNode(NodeKind::kCallStatement, line);
    if (Is(TokenType::kOpenParen)) ParseArgs(true, &node->args);
    NodePtr callee = ParsePrimary();
    if (callee->kind != NodeKind::kIdentifier) throw ParseError(line, "expected a macro name after 'call'");
    NodePtr call = MakeNode(NodeKind::kCall, line);
    call->a = std::move(callee);
    ParseArgs(false, &call->args);
    node->a = std::move(call);
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseBlockUntil({"endcall"}, "call", line, &node->body);
    node->uses_kwargs = ReadsName(*node, "kwargs");
    node->uses_varargs = ReadsName(*node, "varargs");
    expect_end("endcall");
    return node;
  }
  if (name == "break" || name == "continue") {
    Expect(TokenType::kCloseStatement, "'%}'");
    return MakeNode(name == "break" ? NodeKind::kBreak : NodeKind::kContinue, line);
  }
  if (name == "filter") {
    NodePtr node = MakeNode(NodeKind::kFilterStatement, line);
    NodePtr filter = ParsePrimary();
    if (filter->kind == NodeKind::kIdentifier && Is(TokenType::kOpenParen)) filter = ParseCall(std::move(filter));
    node->a = std::move(filter);
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseBlockUntil({"endfilter"}, "filter", line, &node->body);
    expect_end("endfilter");
    return node;
  }
  static constexpr std::string_view kBlockTags[] = {"endif", "endfor", "endmacro", "endset", "endcall",
                                                     "endfilter", "elif", "else"};
  if (std::find(std::begin(kBlockTags), std::end(kBlockTags), name) != std::end(kBlockTags)) {
    if (open_blocks_.empty()) throw ParseError(line, fmt::format("'{{% {} %}}' outside any block", name));
    const OpenBlock& open = open_blocks_.back();
    throw ParseError(line, fmt::format("'{{% {} %}}' does not fit the '{{% {} %}}' opened at line {} (expected "
                                       "'{{% {} %}}')",
                                       name, open.opener, open.line, open.closer));
  }
  throw ParseError(line, fmt::format("unknown statement '{{% {} %}}'", name));
}

NodePtr Parser::ParseSet(int line) {
  NodePtr node = MakeNode(NodeKind::kSet, line);
  node->a = ParseExpressionSequence(false);
  if (Is(TokenType::kEquals)) {
    ++current_;
    node->b = ParseExpressionSequence(false);
  } else {
    Expect(TokenType::kCloseStatement, "'%}' or '='");
    ParseBlockUntil({"endset"}, "set", line, &node->body);
    Expect(TokenType::kOpenStatement, "'{%'");
    ExpectIdentifier("endset");
  }
  Expect(TokenType::kCloseStatement, "'%}'");
  return node;
}

NodePtr Parser::ParseIf(int line) {
  Depth depth(this);
  NodePtr node = MakeNode(NodeKind::kIf, line);
  node->a = ParseExpression();
  Expect(TokenType::kCloseStatement, "'%}'");
  ParseBlockUntil({"elif", "else", "endif"}, "if", line, &node->body);
  if (IsStatement({"elif"})) {
    const int elif_line = tokens_[current_].line;
    current_ += 2;
    node->alternate.push_back(ParseIf(elif_line));
  } else if (IsStatement({"else"})) {
    current_ += 2;
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseBlockUntil({"endif"}, "if", line, &node->alternate);
  }
  return node;
}

NodePtr Parser::ParseMacro(int line) {
  NodePtr node = MakeNode(NodeKind::kMacro, line);
  NodePtr name = ParsePrimary();
  if (name->kind != NodeKind::kIdentifier) throw ParseError(line, "expected a name after 'macro'");
  node->text = name->text;
  ParseArgs(true, &node->args);
  Expect(TokenType::kCloseStatement, "'%}'");
  ParseBlockUntil({"endmacro"}, "macro", line, &node->body);
  node->uses_kwargs = ReadsName(*node, "kwargs");
  node->uses_varargs = ReadsName(*node, "varargs");
  return node;
}

NodePtr Parser::ParseExpressionSequence(bool primary) {
  const int line = Line();
  NodePtr first = primary ? ParsePrimary() : ParseExpression();
  if (!Is(TokenType::kComma)) return first;
  NodePtr tuple = MakeNode(NodeKind::kTupleLiteral, line);
  tuple->args.push_back(std::move(first));
  while (Is(TokenType::kComma)) {
    ++current_;
    tuple->args.push_back(primary ? ParsePrimary() : ParseExpression());
  }
  return tuple;
}

NodePtr Parser::ParseFor(int line) {
  NodePtr node = MakeNode(NodeKind::kFor, line);
  node->a = ParseExpressionSequence(true);
  if (node->a->kind != NodeKind::kIdentifier && node->a->kind != NodeKind::kTupleLiteral) {
    throw ParseError(line, "expected a name or names for the loop variable");
  }
  if (!IsIdentifier("in")) throw ParseError(line, "expected 'in' after the loop variable");
  ++current_;
  NodePtr iterable = ParseExpression();
  // `for x in xs if cond`: the reference filters the items before the loop.
  if (iterable->kind == NodeKind::kSelect) {
    node->b = std::move(iterable->a);
    node->c = std::move(iterable->b);
  } else {
    node->b = std::move(iterable);
  }
  Expect(TokenType::kCloseStatement, "'%}'");
  ParseBlockUntil({"endfor", "else"}, "for", line, &node->body);
  if (IsStatement({"else"})) {
    current_ += 2;
    Expect(TokenType::kCloseStatement, "'%}'");
    ParseBlockUntil({"endfor"}, "for", line, &node->alternate);
  }
  return node;
}

NodePtr Parser::ParseIfExpression() {
  Depth depth(this);
  const int line = Line();
  NodePtr a = ParseOr();
  if (!IsIdentifier("if")) return a;
  ++current_;
  NodePtr test = ParseOr();
  if (IsIdentifier("else")) {
    ++current_;
    NodePtr node = MakeNode(NodeKind::kTernary, line);
    node->a = std::move(test);
    node->b = std::move(a);
    node->c = ParseIfExpression();
    return node;
  }
  NodePtr node = MakeNode(NodeKind::kSelect, line);
  node->a = std::move(a);
  node->b = std::move(test);
  return node;
}

NodePtr Parser::ParseOr() {
  NodePtr left = ParseAnd();
  int links = 0;
  while (IsIdentifier("or")) {
    CountLink(&links);
    const int line = tokens_[current_++].line;
    left = Binary("or", line, std::move(left), ParseAnd());
  }
  return left;
}

NodePtr Parser::ParseAnd() {
  NodePtr left = ParseNot();
  int links = 0;
  while (IsIdentifier("and")) {
    CountLink(&links);
    const int line = tokens_[current_++].line;
    left = Binary("and", line, std::move(left), ParseNot());
  }
  return left;
}

NodePtr Parser::ParseNot() {
  if (!IsIdentifier("not")) return ParseComparison();
  Depth depth(this);
  NodePtr node = MakeNode(NodeKind::kUnary, tokens_[current_++].line);
  node->text = "not";
  node->a = ParseNot();
  return node;
}

NodePtr Parser::ParseComparison() {
  NodePtr left = ParseAdditive();
  int links = 0;
  while (true) {
    std::string op;
    const size_t op_at = current_;
    const int line = Line();
    if (IsIdentifier("not") && IsIdentifier("in", 1)) {
      op = "not in";
      current_ += 2;
    } else if (IsIdentifier("in")) {
      op = "in";
      ++current_;
    } else if (Is(TokenType::kComparisonBinaryOperator)) {
      op = tokens_[current_++].value;
    } else {
      break;
    }
    CountLinkAt(&links, op_at);
    left = Binary(op, line, std::move(left), ParseAdditive());
  }
  return left;
}

NodePtr Parser::ParseAdditive() {
  NodePtr left = ParseMultiplicative();
  int links = 0;
  while (Is(TokenType::kAdditiveBinaryOperator)) {
    CountLink(&links);
    const Token& op = tokens_[current_++];
    left = Binary(op.value, op.line, std::move(left), ParseMultiplicative());
  }
  return left;
}

NodePtr Parser::ParseMultiplicative() {
  NodePtr left = ParsePower();
  int links = 0;
  while (Is(TokenType::kMultiplicativeBinaryOperator)) {
    CountLink(&links);
    const Token& op = tokens_[current_++];
    left = Binary(op.value, op.line, std::move(left), ParsePower());
  }
  return left;
}

NodePtr Parser::ParsePower() {
  NodePtr left = ParseTest();
  int links = 0;
  while (Is(TokenType::kExponentiationBinaryOperator)) {
    CountLink(&links);
    const Token& op = tokens_[current_++];
    left = Binary(op.value, op.line, std::move(left), ParseTest());
  }
  return left;
}

bool Parser::TakesTestArgument(const std::string& test) {
  static constexpr std::string_view kTests[] = {"equalto", "eq", "ne", "sameas", "divisibleby", "lt",
                                                "le", "gt", "ge", "in"};
  return std::find(std::begin(kTests), std::end(kTests), test) != std::end(kTests);
}

bool Parser::StartsTestArgument() const {
  if (Is(TokenType::kIdentifier)) {
    for (std::string_view word : {"else", "or", "and", "if", "is", "not", "in"}) {
      if (IsIdentifier(word)) return false;
    }
    return true;
  }
  return Is(TokenType::kStringLiteral) || Is(TokenType::kNumericLiteral) || Is(TokenType::kOpenSquareBracket) ||
         Is(TokenType::kOpenCurlyBracket);
}

NodePtr Parser::ParseTest() {
  NodePtr operand = ParseFilter();
  int links = 0;
  while (IsIdentifier("is")) {
    CountLink(&links);
    const int line = tokens_[current_++].line;
    NodePtr node = MakeNode(NodeKind::kTest, line);
    if (IsIdentifier("not")) {
      node->negate = true;
      ++current_;
    }
    NodePtr test = ParsePrimary();
    if (test->kind != NodeKind::kIdentifier) throw ParseError(line, "expected a test name after 'is'");
    node->text = test->text;
    node->a = std::move(operand);
    // Beyond the reference (which cannot parse them): a test's argument as Python's Jinja takes
    // it, `is divisibleby(3)` or `is equalto 'x'`. Only where the reference fails to parse, so
    // what it renders is unchanged.
    if (Is(TokenType::kOpenParen)) {
      ParseArgs(false, &node->args);
    } else if (TakesTestArgument(node->text) && StartsTestArgument()) {
      node->args.push_back(ParsePrimary());
    }
    operand = std::move(node);
  }
  return operand;
}

NodePtr Parser::ParseFilter() {
  NodePtr operand = ParseUnarySign();
  int links = 0;
  while (Is(TokenType::kPipe)) {
    CountLink(&links);
    const int line = tokens_[current_++].line;
    NodePtr filter = ParsePrimary();
    if (filter->kind != NodeKind::kIdentifier) throw ParseError(line, "expected a filter name after '|'");
    if (Is(TokenType::kOpenParen)) filter = ParseCall(std::move(filter));
    NodePtr node = MakeNode(NodeKind::kFilter, line);
    node->a = std::move(operand);
    node->b = std::move(filter);
    operand = std::move(node);
  }
  return operand;
}

NodePtr Parser::ParseUnarySign() {
  if (current_ < tokens_.size() &&
      (Is(TokenType::kUnaryOperator) || Is(TokenType::kAdditiveBinaryOperator)) &&
      (tokens_[current_].value == "-" || tokens_[current_].value == "+")) {
    Depth depth(this);
    NodePtr node = MakeNode(NodeKind::kUnary, tokens_[current_].line);
    node->text = tokens_[current_++].value;
    node->a = ParseUnarySign();
    return node;
  }
  return ParseCallMember();
}

NodePtr Parser::ParseCallMember() {
  NodePtr member = ParseMember(ParsePrimary());
  if (Is(TokenType::kOpenParen)) return ParseCall(std::move(member));
  return member;
}

NodePtr Parser::ParseCall(NodePtr callee) {
  Depth depth(this);
  NodePtr node = MakeNode(NodeKind::kCall, callee->line);
  node->a = std::move(callee);
  ParseArgs(false, &node->args);
  node = ParseMember(std::move(node));
  if (Is(TokenType::kOpenParen)) node = ParseCall(std::move(node));
  return node;
}

void Parser::ParseArgs(bool parameters, std::vector<NodePtr>* out) {
  Expect(TokenType::kOpenParen, "'('");
  bool saw_keyword = false;
  bool saw_spread = false;
  while (!Is(TokenType::kCloseParen)) {
    if (current_ >= tokens_.size()) throw ParseError(Line(), "unclosed '(' in an argument list");
    const int line = Line();
    const bool keyword_spread = Is(TokenType::kExponentiationBinaryOperator);
    const bool spread = Is(TokenType::kMultiplicativeBinaryOperator) && tokens_[current_].value == "*";
    if (parameters && (keyword_spread || spread)) {
      throw ParseError(line, "argument unpacking is not allowed in parameter declarations");
    }
    if (keyword_spread) {
      ++current_;
      NodePtr node = MakeNode(NodeKind::kKeywordSpread, line);
      node->a = ParseExpression();
      out->push_back(std::move(node));
      if (Is(TokenType::kComma)) ++current_;
      if (!Is(TokenType::kCloseParen)) throw ParseError(line, "'**' must be applied to the final argument");
      break;
    }
    NodePtr argument;
    if (spread) {
      if (saw_spread) throw ParseError(line, "only one '*' argument unpacking is allowed");
      saw_spread = true;
      ++current_;
      argument = MakeNode(NodeKind::kSpread, line);
      argument->a = ParseExpression();
    } else {
      argument = ParseExpression();
      if (Is(TokenType::kEquals)) {
        ++current_;
        if (argument->kind != NodeKind::kIdentifier) {
          throw ParseError(line, parameters ? "expected a name for a parameter" : "expected a name for a keyword argument");
        }
        NodePtr keyword = MakeNode(NodeKind::kKeywordArg, line);
        keyword->text = argument->text;
        keyword->a = ParseExpression();
        argument = std::move(keyword);
      }
      if (parameters && argument->kind != NodeKind::kIdentifier && argument->kind != NodeKind::kKeywordArg) {
        throw ParseError(line, "expected a name for a parameter");
      }
      if (parameters) {
        for (const NodePtr& p : *out) {
          if (p->text == argument->text) throw ParseError(line, fmt::format("duplicate parameter '{}'", p->text));
        }
      }
      if (argument->kind == NodeKind::kKeywordArg) {
        saw_keyword = true;
      } else if (saw_keyword) {
        throw ParseError(line, parameters ? "a parameter without a default follows one with a default"
                                          : "positional arguments must come before keyword arguments");
      } else if (saw_spread) {
        throw ParseError(line, "positional arguments must not follow '*' unpacking");
      }
    }
    out->push_back(std::move(argument));
    if (Is(TokenType::kComma)) ++current_;
  }
  Expect(TokenType::kCloseParen, "')'");
}

NodePtr Parser::ParseMemberArguments() {
  const int line = Line();
  std::vector<NodePtr> slices;
  bool is_slice = false;
  while (!Is(TokenType::kCloseSquareBracket)) {
    if (current_ >= tokens_.size()) throw ParseError(line, "unclosed '['");
    if (Is(TokenType::kColon)) {
      slices.push_back(nullptr);
      ++current_;
      is_slice = true;
    } else {
      slices.push_back(ParseExpression());
      if (Is(TokenType::kColon)) {
        ++current_;
        is_slice = true;
      }
    }
  }
  if (slices.empty()) throw ParseError(line, "expected an index or a slice inside '[]'");
  if (!is_slice) return std::move(slices[0]);
  if (slices.size() > 3) throw ParseError(line, "a slice takes at most 3 parts");
  NodePtr node = MakeNode(NodeKind::kSlice, line);
  slices.resize(3);
  node->a = std::move(slices[0]);
  node->b = std::move(slices[1]);
  node->c = std::move(slices[2]);
  return node;
}

NodePtr Parser::ParseMember(NodePtr object) {
  int links = 0;
  while (Is(TokenType::kDot) || Is(TokenType::kOpenSquareBracket)) {
    CountLink(&links);
    const bool computed = Is(TokenType::kOpenSquareBracket);
    const int line = tokens_[current_++].line;
    NodePtr node = MakeNode(NodeKind::kMember, line);
    node->computed = computed;
    if (computed) {
      Depth depth(this);
      node->b = ParseMemberArguments();
      Expect(TokenType::kCloseSquareBracket, "']'");
    } else {
      node->b = ParsePrimary();
      if (node->b->kind != NodeKind::kIdentifier && node->b->kind != NodeKind::kIntLiteral) {
        throw ParseError(line, "expected a name or an integer after '.'");
      }
    }
    node->a = std::move(object);
    object = std::move(node);
  }
  return object;
}

NodePtr Parser::ParsePrimary() {
  Depth depth(this);
  if (current_ >= tokens_.size()) throw ParseError(Line(), "expected an expression but the template ended");
  const Token& token = tokens_[current_++];
  switch (token.type) {
    case TokenType::kNumericLiteral: {
      const bool is_float = token.value.find('.') != std::string::npos;
      NodePtr node = MakeNode(is_float ? NodeKind::kFloatLiteral : NodeKind::kIntLiteral, token.line);
      node->number = std::strtod(token.value.c_str(), nullptr);
      return node;
    }
    case TokenType::kStringLiteral: {
      NodePtr node = MakeNode(NodeKind::kStringLiteral, token.line);
      node->text = token.value;
      while (Is(TokenType::kStringLiteral)) node->text += tokens_[current_++].value;
      return node;
    }
    case TokenType::kIdentifier: {
      NodePtr node = MakeNode(NodeKind::kIdentifier, token.line);
      node->text = token.value;
      return node;
    }
    case TokenType::kOpenParen: {
      NodePtr node = ParseExpressionSequence(false);
      Expect(TokenType::kCloseParen, "')'");
      return node;
    }
    case TokenType::kOpenSquareBracket: {
      NodePtr node = MakeNode(NodeKind::kArrayLiteral, token.line);
      while (!Is(TokenType::kCloseSquareBracket)) {
        if (current_ >= tokens_.size()) throw ParseError(token.line, "unclosed '['");
        node->args.push_back(ParseExpression());
        if (Is(TokenType::kComma)) ++current_;
      }
      ++current_;
      return node;
    }
    case TokenType::kOpenCurlyBracket: {
      NodePtr node = MakeNode(NodeKind::kObjectLiteral, token.line);
      while (!Is(TokenType::kCloseCurlyBracket)) {
        if (current_ >= tokens_.size()) throw ParseError(token.line, "unclosed '{'");
        node->args.push_back(ParseExpression());
        Expect(TokenType::kColon, "':' between a key and its value");
        node->body.push_back(ParseExpression());
        if (Is(TokenType::kComma)) ++current_;
      }
      ++current_;
      return node;
    }
    default:
      throw ParseError(token.line, fmt::format("unexpected {} '{}'", TokenTypeName(token.type), token.value));
  }
}

}  // namespace

StatusOr<std::unique_ptr<Program>> Parse(std::vector<Token> tokens) {
  Parser parser(std::move(tokens));
  std::unique_ptr<Program> program;
  try {
    program = parser.Run();
  } catch (const ParseError& e) {
    return InvalidArgumentError(e.what());
  }
  // Each chain and each recursion is bounded above, but chains inside parentheses inside chains
  // add up: the tree's depth, which evaluation recurses through, is bounded as a whole.
  if (const Node* deep = FindNodeDeeperThan(program->body, kMaxTreeDepth)) {
    return InvalidArgumentError(fmt::format(
        "template line {}: expressions and blocks nested more than {} levels deep (an operator chain "
        "and parentheses or blocks around it count together)",
        deep->line, kMaxTreeDepth));
  }
  return program;
}

}  // namespace kvl::jinja
