// Text and number conversions as JavaScript performs them, since the reference renderer is
// JavaScript: what counts as whitespace for trim(), how a number prints, how JSON.stringify
// quotes a string, how parseInt reads one. Strings are UTF-8 here and UTF-16 there; each helper
// says where that shows.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvl::jinja {

// The next code point of `s` at `*pos`, advancing it; a byte that starts no valid UTF-8
// sequence reads as U+FFFD and advances by one.
uint32_t NextCodePoint(std::string_view s, size_t* pos);
void AppendUtf8(uint32_t cp, std::string* out);
// The string's code points, each as its UTF-8 bytes (Array.from(string)).
std::vector<std::string> SplitCodePoints(std::string_view s);
// The first `needle` in `text` at or after `from`, or npos, in linear time whatever the
// inputs (std::string::find compares at every offset: quadratic on "aaa...ab" in "aaa...a").
size_t FindText(std::string_view text, std::string_view needle, size_t from = 0);
// String.prototype.length: UTF-16 code units.
int64_t Utf16Length(std::string_view s);

// JavaScript's WhiteSpace and LineTerminator set (what \s, trim() and trimEnd() match).
bool IsJsSpace(uint32_t cp);
std::string_view TrimJs(std::string_view s, bool start, bool end);

// Number.prototype.toString(): shortest round-trip digits, exponent past 1e21 and below 1e-6.
std::string JsNumberToString(double v);
// The reference's FloatValue printing: "1.0" for integral values, "-0.0", else as JavaScript.
std::string FloatToString(double v);
// JSON.stringify of a string; ensure_ascii escapes everything from U+007F as \uXXXX.
std::string JsonQuote(std::string_view s, bool ensure_ascii);
// Number(string) as loose equality converts it: NaN where it is not a number.
double JsStringToNumber(std::string_view s);
// parseInt(s, 10) and parseFloat(s); false where JavaScript gives NaN.
bool JsParseInt(std::string_view s, double* out);
bool JsParseFloat(std::string_view s, double* out);

// toUpperCase / toLowerCase for ASCII letters (the only case mapping implemented).
std::string AsciiUpper(std::string_view s);
std::string AsciiLower(std::string_view s);

}  // namespace kvl::jinja
