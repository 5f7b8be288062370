// Integer ranges as digit grammars: [lo, hi] split by digit count, each same-length range split
// at its first digit (the construction regex range generators use), so that the grammar
// accepts exactly the integers of the range written in canonical decimal.
#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <vector>

#include "json_schema_parts.h"

namespace kvl::json_schema {
namespace {

// The open side's bound: 16 digits, as the number rules' integral part.
constexpr uint64_t kOpenBound = 9999999999999999ull;

std::string DigitClass(char lo, char hi) {
  if (lo == hi) return fmt::format("[{}]", lo);
  return fmt::format("[{}-{}]", lo, hi);
}

std::string AnyDigits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return fmt::format("[0-9]{{{}}}", n);
}

// The decimal strings of the same length from x to y (x <= y).
std::string SameLength(const std::string& x, const std::string& y) {
  const size_t n = x.size();
  if (n == 1) return DigitClass(x[0], y[0]);
  const std::string x_rest = x.substr(1), y_rest = y.substr(1);
  if (x[0] == y[0]) return fmt::format("[{}] {}", x[0], SameLength(x_rest, y_rest));
  const bool x_rest_min = x_rest == std::string(n - 1, '0');
  const bool y_rest_max = y_rest == std::string(n - 1, '9');
  std::vector<std::string> alts;
  char middle_lo = static_cast<char>(x[0] + 1), middle_hi = static_cast<char>(y[0] - 1);
  if (x_rest_min) {
    middle_lo = x[0];
  } else {
    alts.push_back(fmt::format("[{}] ({})", x[0], SameLength(x_rest, std::string(n - 1, '9'))));
  }
  if (y_rest_max) middle_hi = y[0];
  if (middle_lo <= middle_hi) {
    alts.push_back(fmt::format("{} {}", DigitClass(middle_lo, middle_hi), AnyDigits(n - 1)));
  }
  if (!y_rest_max) {
    alts.push_back(fmt::format("[{}] ({})", y[0], SameLength(std::string(n - 1, '0'), y_rest)));
  }
  std::string out;
  for (const std::string& alt : alts) out += (out.empty() ? "" : " | ") + alt;
  return alts.size() == 1 ? out : "(" + out + ")";
}

uint64_t PowerOfTen(size_t n) {
  uint64_t p = 1;
  for (size_t i = 0; i < n; ++i) p *= 10;
  return p;
}

// The non-negative integers in [a, b].
std::string NonNegative(uint64_t a, uint64_t b) {
  std::vector<std::string> alts;
  const size_t a_digits = std::to_string(a).size(), b_digits = std::to_string(b).size();
  for (size_t digits = a_digits; digits <= b_digits; ++digits) {
    const uint64_t lo = std::max(a, digits == 1 ? 0 : PowerOfTen(digits - 1));
    const uint64_t hi = std::min(b, PowerOfTen(digits) - 1);
    if (lo > hi) continue;
    alts.push_back(SameLength(std::to_string(lo), std::to_string(hi)));
  }
  std::string out;
  for (const std::string& alt : alts) out += (out.empty() ? "" : " | ") + alt;
  return alts.size() == 1 ? out : "(" + out + ")";
}

uint64_t Magnitude(int64_t v) {
  return v < 0 ? static_cast<uint64_t>(-(v + 1)) + 1 : static_cast<uint64_t>(v);
}

}  // namespace

std::string IntegerRangeGbnf(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  // Each side as a signed value within the open bound.
  const int64_t bound = static_cast<int64_t>(kOpenBound);
  // (A bound already past 16 digits opens the other side to the end of int64.)
  const int64_t from = lo ? *lo : (hi && *hi < -bound ? INT64_MIN : -bound);
  const int64_t to = hi ? *hi : (lo && *lo > bound ? INT64_MAX : bound);
  if (from > to) return "";
  std::vector<std::string> alts;
  if (from < 0) {
    // Negative values -1 .. from: "-" and their magnitudes.
    const uint64_t smallest = to < 0 ? Magnitude(to) : 1;
    alts.push_back("\"-\" " + NonNegative(smallest, Magnitude(from)));
  }
  if (to >= 0) alts.push_back(NonNegative(from < 0 ? 0 : static_cast<uint64_t>(from),
                                          static_cast<uint64_t>(to)));
  std::string out;
  for (const std::string& alt : alts) out += (out.empty() ? "" : " | ") + ("(" + alt + ")");
  return "(" + out + ")";
}

}  // namespace kvl::json_schema
