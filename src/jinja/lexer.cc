#include "lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <stdexcept>
#include <utility>

#include "js_text.h"

namespace kvl::jinja {
namespace {

// The preprocessed text, with the source offset of each of its bytes for line numbers.
struct Source {
  std::string text;
  std::vector<uint32_t> offset;  // [text.size() + 1]

  void Append(std::string_view s, size_t source_offset) {
    for (size_t i = 0; i < s.size(); ++i) {
      text.push_back(s[i]);
      offset.push_back(static_cast<uint32_t>(source_offset + i));
    }
  }
};

bool IsLineStart(std::string_view s, size_t i) {
  if (i == 0) return true;
  const char c = s[i - 1];
  if (c == '\n' || c == '\r') return true;
  // U+2028 / U+2029 end a line for a JavaScript multiline ^ as well.
  return i >= 3 && s.substr(i - 3, 2) == "\xE2\x80" && (s[i - 1] == '\xA8' || s[i - 1] == '\xA9');
}

bool IsTagOpen(std::string_view s, size_t i) {
  return i + 1 < s.size() && s[i] == '{' && (s[i + 1] == '#' || s[i + 1] == '%' || s[i + 1] == '-');
}

// A JavaScript \s at byte `i`; its byte length in *length.
bool SpaceAt(std::string_view s, size_t i, size_t* length) {
  size_t pos = i;
  const uint32_t cp = NextCodePoint(s, &pos);
  *length = pos - i;
  return IsJsSpace(cp);
}

// The reference's preprocess(): template.replace(/^[ \t]*({[#%-])/gm, "$1"), then
// replace(/([#%-]})\n/g, "$1"), then the {% generation %} / {% endgeneration %} tags removed
// with the whitespace around them kept unless the tag's own '-' strips it.
Source Preprocess(std::string_view src) {
  if (!src.empty() && src.back() == '\n') src.remove_suffix(1);
  Source lstripped;
  for (size_t i = 0; i < src.size();) {
    if (IsLineStart(src, i)) {
      size_t j = i;
      while (j < src.size() && (src[j] == ' ' || src[j] == '\t')) ++j;
      if (j > i && IsTagOpen(src, j)) i = j;
    }
    lstripped.Append(src.substr(i, 1), i);
    ++i;
  }
  lstripped.offset.push_back(static_cast<uint32_t>(src.size()));

  Source trimmed;
  const std::string& a = lstripped.text;
  for (size_t i = 0; i < a.size(); ++i) {
    trimmed.text.push_back(a[i]);
    trimmed.offset.push_back(lstripped.offset[i]);
    if (i >= 1 && a[i] == '}' && (a[i - 1] == '#' || a[i - 1] == '%' || a[i - 1] == '-') &&
        i + 1 < a.size() && a[i + 1] == '\n') {
      ++i;  // the newline after the tag
    }
  }
  trimmed.offset.push_back(lstripped.offset.back());

  const std::string& t = trimmed.text;
  if (t.find("generation") == std::string::npos) return trimmed;
  Source out;
  size_t copied = 0;  // bytes of `t` already in `out`
  for (size_t i = 0; i + 1 < t.size(); ++i) {
    if (t[i] != '{' || t[i + 1] != '%') continue;
    size_t j = i + 2, len = 0;
    const bool lstrip = j < t.size() && t[j] == '-';
    if (lstrip) ++j;
    while (j < t.size() && SpaceAt(t, j, &len)) j += len;
    if (t.compare(j, 3, "end") == 0) j += 3;
    if (t.compare(j, 10, "generation") != 0) continue;
    j += 10;
    while (j < t.size() && SpaceAt(t, j, &len)) j += len;
    const bool rstrip = j < t.size() && t[j] == '-';
    if (rstrip) ++j;
    if (t.compare(j, 2, "%}") != 0) continue;
    j += 2;
    // The whitespace before the tag (back to what is already copied) and after it.
    size_t before = i;
    while (before > copied) {
      size_t back = before - 1;
      while (back > copied && (static_cast<uint8_t>(t[back]) & 0xC0) == 0x80) --back;
      if (!SpaceAt(t, back, &len) || back + len != before) break;
      before = back;
    }
    size_t after = j;
    while (after < t.size() && SpaceAt(t, after, &len)) after += len;
    for (size_t k = copied; k < (lstrip ? before : i); ++k) {
      out.text.push_back(t[k]), out.offset.push_back(trimmed.offset[k]);
    }
    if (!rstrip) {
      for (size_t k = j; k < after; ++k) out.text.push_back(t[k]), out.offset.push_back(trimmed.offset[k]);
    }
    copied = after;
    i = after - 1;
  }
  for (size_t k = copied; k < t.size(); ++k) out.text.push_back(t[k]), out.offset.push_back(trimmed.offset[k]);
  out.offset.push_back(trimmed.offset.back());
  return out;
}

constexpr std::array<std::pair<std::string_view, TokenType>, 29> kMappingTable = {{
    {"{%", TokenType::kOpenStatement},
    {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression},
    {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},
    {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenCurlyBracket},
    {"}", TokenType::kCloseCurlyBracket},
    {"[", TokenType::kOpenSquareBracket},
    {"]", TokenType::kCloseSquareBracket},
    {",", TokenType::kComma},
    {".", TokenType::kDot},
    {":", TokenType::kColon},
    {"|", TokenType::kPipe},
    {"<=", TokenType::kComparisonBinaryOperator},
    {">=", TokenType::kComparisonBinaryOperator},
    {"==", TokenType::kComparisonBinaryOperator},
    {"!=", TokenType::kComparisonBinaryOperator},
    {"<", TokenType::kComparisonBinaryOperator},
    {">", TokenType::kComparisonBinaryOperator},
    {"+", TokenType::kAdditiveBinaryOperator},
    {"-", TokenType::kAdditiveBinaryOperator},
    {"~", TokenType::kAdditiveBinaryOperator},
    {"**", TokenType::kExponentiationBinaryOperator},
    {"*", TokenType::kMultiplicativeBinaryOperator},
    {"//", TokenType::kMultiplicativeBinaryOperator},
    {"/", TokenType::kMultiplicativeBinaryOperator},
    {"%", TokenType::kMultiplicativeBinaryOperator},
    {"=", TokenType::kEquals},
}};

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsWordChar(char c) {
  return IsDigit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

struct LexError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Lexer {
 public:
  explicit Lexer(Source source, std::string_view original) : src_(std::move(source)) {
    for (size_t i = 0; i < original.size(); ++i) {
      if (original[i] == '\n') newlines_.push_back(i);
    }
  }

  std::vector<Token> Run();
  int line() const { return LineAt(pos_); }
  // The 1-based source line of preprocessed byte `pos`.
  int LineAt(size_t pos) const {
    const size_t offset = src_.offset[std::min(pos, src_.offset.size() - 1)];
    return 1 + static_cast<int>(std::lower_bound(newlines_.begin(), newlines_.end(), offset) - newlines_.begin());
  }
  // The 1-based byte column of preprocessed byte `pos` in its source line.
  int ColumnAt(size_t pos) const {
    const size_t offset = src_.offset[std::min(pos, src_.offset.size() - 1)];
    const int line = LineAt(pos);
    const size_t line_start = line == 1 ? 0 : newlines_[line - 2] + 1;
    return 1 + static_cast<int>(offset - line_start);
  }

 private:
  char At(size_t i) const { return i < s().size() ? s()[i] : '\0'; }
  const std::string& s() const { return src_.text; }
  void Push(TokenType type, std::string value) {
    tokens_.push_back({type, std::move(value), LineAt(token_start_), ColumnAt(token_start_)});
  }
  // The reference's consumeWhile: escapes (\n, \t, \xHH, \uHHHH, ...) decoded; input that ends
  // while the predicate still holds is an error.
  template <typename Pred>
  std::string ConsumeWhile(Pred pred);
  void StripTrailingWhitespace();
  void SkipLeadingWhitespace();

  Source src_;
  std::vector<size_t> newlines_;  // offsets of the source's '\n', for line numbers
  size_t pos_ = 0;
  size_t token_start_ = 0;
  int curly_depth_ = 0;  // inside a {{ }} expression's mapping literals, "}}" closes a mapping
  std::vector<Token> tokens_;
};

template <typename Pred>
std::string Lexer::ConsumeWhile(Pred pred) {
  std::string out;
  while (pos_ < s().size() && pred(s()[pos_])) {
    if (s()[pos_] == '\\') {
      ++pos_;
      if (pos_ >= s().size()) throw LexError("unexpected end of input after '\\'");
      const char escaped = s()[pos_++];
      if (escaped == 'x' || escaped == 'u') {
        const size_t length = escaped == 'x' ? 2 : 4;
        const std::string hex = s().substr(pos_, length);
        if (hex.size() != length ||
            !std::all_of(hex.begin(), hex.end(), [](char c) { return std::isxdigit(static_cast<unsigned char>(c)); })) {
          throw LexError(fmt::format("invalid hexadecimal escape sequence \\{}{}", escaped, hex));
        }
        AppendUtf8(static_cast<uint32_t>(std::stoul(hex, nullptr, 16)), &out);
        pos_ += length;
        continue;
      }
      static constexpr std::pair<char, char> kEscapes[] = {
          {'n', '\n'}, {'t', '\t'}, {'r', '\r'}, {'b', '\b'}, {'f', '\f'},
          {'v', '\v'}, {'\'', '\''}, {'"', '"'}, {'\\', '\\'}};
      bool known = false;
      for (auto [from, to] : kEscapes) {
        if (from == escaped) out.push_back(to), known = true;
      }
      if (!known) throw LexError(fmt::format("unexpected escaped character '{}'", escaped));
      continue;
    }
    out.push_back(s()[pos_++]);
    if (pos_ >= s().size()) throw LexError("unexpected end of input (an unclosed string or tag?)");
  }
  return out;
}

void Lexer::StripTrailingWhitespace() {
  if (tokens_.empty() || tokens_.back().type != TokenType::kText) return;
  tokens_.back().value = std::string(TrimJs(tokens_.back().value, false, true));
  if (tokens_.back().value.empty()) tokens_.pop_back();
}

void Lexer::SkipLeadingWhitespace() {
  size_t len = 0;
  while (pos_ < s().size() && SpaceAt(s(), pos_, &len)) pos_ += len;
}

std::vector<Token> Lexer::Run() {
  size_t len = 0;
  while (pos_ < s().size()) {
    token_start_ = pos_;
    const TokenType last = tokens_.empty() ? TokenType::kText : tokens_.back().type;
    if (tokens_.empty() || last == TokenType::kCloseStatement ||
        last == TokenType::kCloseExpression || last == TokenType::kComment) {
      size_t end = pos_;
      while (end < s().size() &&
             !(s()[end] == '{' && (At(end + 1) == '%' || At(end + 1) == '{' || At(end + 1) == '#'))) {
        ++end;
      }
      if (end > pos_) {
        Push(TokenType::kText, s().substr(pos_, end - pos_));
        pos_ = end;
        continue;
      }
    }
    if (At(pos_) == '{' && At(pos_ + 1) == '#') {
      pos_ += 2;
      const bool strip_before = At(pos_) == '-';
      if (strip_before) ++pos_;
      std::string comment;
      while (At(pos_) != '#' || At(pos_ + 1) != '}') {
        if (pos_ + 2 >= s().size()) throw LexError("missing end of comment tag '#}'");
        comment.push_back(s()[pos_++]);
      }
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) StripTrailingWhitespace();
      Push(TokenType::kComment, std::move(comment));
      pos_ += 2;
      if (strip_after) SkipLeadingWhitespace();
      continue;
    }
    if (s().compare(pos_, 3, "{%-") == 0) {
      StripTrailingWhitespace();
      Push(TokenType::kOpenStatement, "{%");
      pos_ += 3;
      continue;
    }
    if (s().compare(pos_, 3, "{{-") == 0) {
      StripTrailingWhitespace();
      Push(TokenType::kOpenExpression, "{{");
      curly_depth_ = 0;
      pos_ += 3;
      continue;
    }
    // Whitespace inside a tag separates tokens; reaching the end here is an unclosed tag.
    while (pos_ < s().size() && SpaceAt(s(), pos_, &len)) {
      pos_ += len;
      if (pos_ >= s().size()) throw LexError("unexpected end of input inside a tag (unclosed '{%' or '{{'?)");
    }
    token_start_ = pos_;
    if (s().compare(pos_, 3, "-%}") == 0) {
      Push(TokenType::kCloseStatement, "%}");
      pos_ += 3;
      SkipLeadingWhitespace();
      continue;
    }
    if (s().compare(pos_, 3, "-}}") == 0) {
      Push(TokenType::kCloseExpression, "}}");
      pos_ += 3;
      SkipLeadingWhitespace();
      continue;
    }
    const char c = At(pos_);
    if (c == '-' || c == '+') {
      const TokenType prev = tokens_.empty() ? TokenType::kText : tokens_.back().type;
      if (prev == TokenType::kText) throw LexError(fmt::format("unexpected character '{}'", c));
      const bool binary = prev == TokenType::kIdentifier || prev == TokenType::kNumericLiteral ||
                          prev == TokenType::kStringLiteral || prev == TokenType::kCloseParen ||
                          prev == TokenType::kCloseSquareBracket;
      if (!binary) {
        ++pos_;
        std::string num = ConsumeWhile(IsDigit);
        if (!num.empty() && At(pos_) == '.' && IsDigit(At(pos_ + 1))) {
          ++pos_;
          num.push_back('.');
          num += ConsumeWhile(IsDigit);
        }
        Push(num.empty() ? TokenType::kUnaryOperator : TokenType::kNumericLiteral, std::string(1, c) + num);
        continue;
      }
    }
    bool matched = false;
    for (const auto& [seq, type] : kMappingTable) {
      if (seq[0] != c || (seq == "}}" && curly_depth_ > 0)) continue;
      if (s().compare(pos_, seq.size(), seq) != 0) continue;
      Push(type, std::string(seq));
      if (type == TokenType::kOpenExpression) curly_depth_ = 0;
      if (type == TokenType::kOpenCurlyBracket) ++curly_depth_;
      if (type == TokenType::kCloseCurlyBracket) --curly_depth_;
      pos_ += seq.size();
      matched = true;
      break;
    }
    if (matched) continue;
    if (c == '\'' || c == '"') {
      ++pos_;
      std::string str = ConsumeWhile([c](char ch) { return ch != c; });
      Push(TokenType::kStringLiteral, std::move(str));
      ++pos_;
      continue;
    }
    if (IsDigit(c)) {
      std::string num = ConsumeWhile(IsDigit);
      if ((tokens_.empty() || tokens_.back().type != TokenType::kDot) && At(pos_) == '.' &&
          IsDigit(At(pos_ + 1))) {
        ++pos_;
        num.push_back('.');
        num += ConsumeWhile(IsDigit);
      }
      Push(TokenType::kNumericLiteral, std::move(num));
      continue;
    }
    if (IsWordChar(c)) {
      Push(TokenType::kIdentifier, ConsumeWhile(IsWordChar));
      continue;
    }
    size_t cp_end = pos_;
    NextCodePoint(s(), &cp_end);
    throw LexError(fmt::format("unexpected character '{}'", s().substr(pos_, cp_end - pos_)));
  }
  return std::move(tokens_);
}

}  // namespace

std::string_view TokenTypeName(TokenType type) {
  static constexpr std::string_view kNames[] = {
      "text", "number", "string", "identifier", "'='", "'('", "')'", "'{%'", "'%}'", "'{{'",
      "'}}'", "'['", "']'", "'{'", "'}'", "','", "'.'", "':'", "'|'", "operator", "operator",
      "'**'", "comparison", "unary operator", "comment"};
  return kNames[static_cast<int>(type)];
}

StatusOr<std::vector<Token>> Tokenize(std::string_view source) {
  Lexer lexer(Preprocess(source), source);
  try {
    return lexer.Run();
  } catch (const LexError& e) {
    return InvalidArgumentError(fmt::format("template line {}: syntax error: {}", lexer.line(), e.what()));
  }
}

}  // namespace kvl::jinja
