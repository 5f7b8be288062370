#include "js_text.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace kvl::jinja {

uint32_t NextCodePoint(std::string_view s, size_t* pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const uint8_t b0 = byte(*pos);
  int length = 0;
  uint32_t cp = 0;
  if (b0 < 0x80) {
    ++*pos;
    return b0;
  } else if ((b0 & 0xE0) == 0xC0) {
    length = 2, cp = b0 & 0x1F;
  } else if ((b0 & 0xF0) == 0xE0) {
    length = 3, cp = b0 & 0x0F;
  } else if ((b0 & 0xF8) == 0xF0) {
    length = 4, cp = b0 & 0x07;
  } else {
    ++*pos;
    return 0xFFFD;
  }
  if (*pos + length > s.size()) {
    ++*pos;
    return 0xFFFD;
  }
  for (int i = 1; i < length; ++i) {
    const uint8_t b = byte(*pos + i);
    if ((b & 0xC0) != 0x80) {
      ++*pos;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  // Overlong forms, surrogates and values past U+10FFFF are not code points.
  static constexpr uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[length] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
    ++*pos;
    return 0xFFFD;
  }
  *pos += length;
  return cp;
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::vector<std::string> SplitCodePoints(std::string_view s) {
  std::vector<std::string> out;
  for (size_t pos = 0; pos < s.size();) {
    const size_t start = pos;
    NextCodePoint(s, &pos);
    out.emplace_back(s.substr(start, pos - start));
  }
  return out;
}

namespace {

// Knuth-Morris-Pratt: linear in the text and the needle, whatever they hold.
size_t FindKmp(std::string_view text, std::string_view needle, size_t from) {
  // fallback[i]: the length of the longest proper prefix of needle[0..i] that is also its suffix.
  std::vector<uint32_t> fallback(needle.size(), 0);
  for (size_t i = 1, k = 0; i < needle.size(); ++i) {
    while (k > 0 && needle[i] != needle[k]) k = fallback[k - 1];
    if (needle[i] == needle[k]) ++k;
    fallback[i] = static_cast<uint32_t>(k);
  }
  for (size_t i = from, k = 0; i < text.size(); ++i) {
    while (k > 0 && text[i] != needle[k]) k = fallback[k - 1];
    if (text[i] == needle[k]) ++k;
    if (k == needle.size()) return i + 1 - k;
  }
  return std::string_view::npos;
}

}  // namespace

size_t FindText(std::string_view text, std::string_view needle, size_t from) {
  if (from > text.size()) return std::string_view::npos;
  if (needle.empty()) return from;
  // glibc's memmem is fast and, for needles longer than 256 bytes (the two-way algorithm), linear;
  // for shorter ones its work can reach the text's length times the needle's (seconds on 16 MiB
  // of "a" and a needle of 128 "a" and a "b"). Up to 16 bytes that is bounded well enough; between
  // the two, KMP.
  if (needle.size() > 16 && needle.size() <= 256) return FindKmp(text, needle, from);
  const void* at = ::memmem(text.data() + from, text.size() - from, needle.data(), needle.size());
  return at == nullptr ? std::string_view::npos : static_cast<size_t>(static_cast<const char*>(at) - text.data());
}

int64_t Utf16Length(std::string_view s) {
  int64_t units = 0;
  for (size_t pos = 0; pos < s.size();) units += NextCodePoint(s, &pos) >= 0x10000 ? 2 : 1;
  return units;
}

bool IsJsSpace(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000 || cp == 0xFEFF;
}

std::string_view TrimJs(std::string_view s, bool start, bool end) {
  size_t begin = 0;
  if (start) {
    while (begin < s.size()) {
      size_t next = begin;
      if (!IsJsSpace(NextCodePoint(s, &next))) break;
      begin = next;
    }
  }
  size_t stop = s.size();
  if (end) {
    while (stop > begin) {
      // Step back to the start of the last code point (past its continuation bytes).
      size_t cp_start = stop - 1;
      while (cp_start > begin && (static_cast<uint8_t>(s[cp_start]) & 0xC0) == 0x80) --cp_start;
      size_t pos = cp_start;
      const uint32_t cp = NextCodePoint(s, &pos);
      if (pos != stop || !IsJsSpace(cp)) break;
      stop = cp_start;
    }
  }
  return s.substr(begin, stop - begin);
}

std::string JsNumberToString(double v) {
  if (std::isnan(v)) return "NaN";
  if (v == 0) return "0";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  std::string sign = v < 0 ? "-" : "";
  // Shortest round-trip digits d1.d2d3...e±x, as ECMAScript's Number::toString asks for.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), std::fabs(v), std::chars_format::scientific);
  std::string_view sci(buf, end - buf);
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits += c;
  }
  const int k = static_cast<int>(digits.size());
  const int n = std::atoi(std::string(sci.substr(e + 1)).c_str()) + 1;  // value = 0.digits x 10^n
  if (k <= n && n <= 21) return sign + digits + std::string(n - k, '0');
  if (0 < n && n <= 21) return sign + digits.substr(0, n) + "." + digits.substr(n);
  if (-6 < n && n <= 0) return sign + "0." + std::string(-n, '0') + digits;
  const int exp = n - 1;
  std::string mantissa = k == 1 ? digits : digits.substr(0, 1) + "." + digits.substr(1);
  return sign + mantissa + "e" + (exp < 0 ? "-" : "+") + std::to_string(std::abs(exp));
}

std::string FloatToString(double v) {
  if (v == 0 && std::signbit(v)) return "-0.0";
  if (std::isfinite(v) && std::fmod(v, 1.0) == 0) {
    // toFixed(1) prints the exact integer below 1e21 and falls back to toString above.
    return std::fabs(v) < 1e21 ? fmt::format("{:.1f}", v) : JsNumberToString(v);
  }
  return JsNumberToString(v);
}

std::string JsonQuote(std::string_view s, bool ensure_ascii) {
  std::string out = "\"";
  for (size_t pos = 0; pos < s.size();) {
    const uint32_t cp = NextCodePoint(s, &pos);
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      default: break;
    }
    if (cp < 0x20) {
      out += fmt::format("\\u{:04x}", cp);
    } else if (ensure_ascii && cp >= 0x7F) {
      if (cp >= 0x10000) {
        const uint32_t v = cp - 0x10000;
        out += fmt::format("\\u{:04x}\\u{:04x}", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        out += fmt::format("\\u{:04x}", cp);
      }
    } else {
      AppendUtf8(cp, &out);
    }
  }
  return out + "\"";
}

namespace {

// The longest prefix of `s` that is a decimal literal: [+-]digits[.digits][e[+-]digits].
size_t DecimalPrefix(std::string_view s, bool allow_fraction) {
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  const size_t digits_start = i;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
  size_t int_digits = i - digits_start;
  if (!allow_fraction) return int_digits > 0 ? i : 0;
  size_t frac_digits = 0;
  if (i < s.size() && s[i] == '.') {
    size_t j = i + 1;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    frac_digits = j - i - 1;
    if (int_digits + frac_digits > 0) i = j;
  }
  if (int_digits + frac_digits == 0) return 0;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exp_start = j;
    while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
    if (j > exp_start) i = j;
  }
  return i;
}

}  // namespace

double JsStringToNumber(std::string_view s) {
  s = TrimJs(s, true, true);
  if (s.empty()) return 0;
  if (s == "Infinity" || s == "+Infinity") return INFINITY;
  if (s == "-Infinity") return -INFINITY;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    double v = 0;
    for (char c : s.substr(2)) {
      if (!std::isxdigit(static_cast<unsigned char>(c))) return NAN;
      v = v * 16 + (std::isdigit(static_cast<unsigned char>(c)) ? c - '0' : (std::tolower(c) - 'a' + 10));
    }
    return v;
  }
  if (DecimalPrefix(s, true) != s.size()) return NAN;
  return std::strtod(std::string(s).c_str(), nullptr);
}

bool JsParseInt(std::string_view s, double* out) {
  s = TrimJs(s, true, false);
  const size_t n = DecimalPrefix(s, false);
  if (n == 0) return false;
  *out = std::strtod(std::string(s.substr(0, n)).c_str(), nullptr);
  return true;
}

bool JsParseFloat(std::string_view s, double* out) {
  s = TrimJs(s, true, false);
  for (std::string_view inf : {"Infinity", "+Infinity", "-Infinity"}) {
    if (s.substr(0, inf.size()) == inf) {
      *out = inf[0] == '-' ? -INFINITY : INFINITY;
      return true;
    }
  }
  const size_t n = DecimalPrefix(s, true);
  if (n == 0) return false;
  *out = std::strtod(std::string(s.substr(0, n)).c_str(), nullptr);
  return true;
}

std::string AsciiUpper(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string AsciiLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace kvl::jinja
