// Template text -> tokens, as the reference lexer cuts them: its preprocessing (one trailing
// newline dropped, lstrip_blocks, trim_blocks, the transformers-only {% generation %} tag
// removed), whitespace control ({%- -%} {{- -}} {#- -#}) and its token classes. Each token
// keeps the line of the source it came from, for error messages.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kvl/status.h"

namespace kvl::jinja {

enum class TokenType {
  kText,
  kNumericLiteral,
  kStringLiteral,
  kIdentifier,
  kEquals,
  kOpenParen,
  kCloseParen,
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kOpenSquareBracket,
  kCloseSquareBracket,
  kOpenCurlyBracket,
  kCloseCurlyBracket,
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditiveBinaryOperator,        // + - ~
  kMultiplicativeBinaryOperator,  // * / // %
  kExponentiationBinaryOperator,  // **
  kComparisonBinaryOperator,      // < > <= >= == !=
  kUnaryOperator,                 // - + before an operand
  kComment,
};

std::string_view TokenTypeName(TokenType type);

struct Token {
  TokenType type;
  std::string value;
  int line;
  int column = 0;  // 1-based, in bytes of the source line
};

StatusOr<std::vector<Token>> Tokenize(std::string_view source);

}  // namespace kvl::jinja
