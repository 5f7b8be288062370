// Tokens -> the template's AST, with the reference parser's grammar and precedence:
// ternary < or < and < not < comparison/in < + - ~ < * / // % < ** < is < | filter < unary
// sign < call/member < primary.
#pragma once

#include <memory>
#include <vector>

#include "ast.h"
#include "kvl/status.h"
#include "lexer.h"

namespace kvl::jinja {

// INVALID_ARGUMENT naming the line and the construct: an unclosed or unbalanced block, an
// unknown statement, a token where another was expected, nesting deeper than a limit.
StatusOr<std::unique_ptr<Program>> Parse(std::vector<Token> tokens);

}  // namespace kvl::jinja
