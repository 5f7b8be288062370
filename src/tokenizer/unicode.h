// Code points for the pre-tokenizers: UTF-8 decoded as llama.cpp decodes it (so invalid bytes
// become U+FFFD at the same places), and each code point's Unicode category as flags generated
// from UnicodeData.txt (scripts/gen_unicode_tables.py -> unicode_tables.cc).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvl {

// One category flag per code point (exclusive), plus kUnicodeWhitespace (White_Space).
enum UnicodeFlag : uint16_t {
  kUnicodeUndefined = 0x0001,
  kUnicodeNumber = 0x0002,       // \p{N}
  kUnicodeLetter = 0x0004,       // \p{L}
  kUnicodeSeparator = 0x0008,    // \p{Z}
  kUnicodeMark = 0x0010,         // \p{M}
  kUnicodePunctuation = 0x0020,  // \p{P}
  kUnicodeSymbol = 0x0040,       // \p{S}
  kUnicodeControl = 0x0080,      // \p{C}
  kUnicodeWhitespace = 0x0100,   // \s
};

struct UnicodeRange {
  uint32_t first;
  uint16_t flags;
};
extern const UnicodeRange kUnicodeRanges[];
extern const size_t kUnicodeRangeCount;

inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;
inline constexpr uint32_t kReplacementCharacter = 0xFFFD;

// The flags of one code point; kUnicodeUndefined past U+10FFFF, as in llama.cpp.
uint16_t UnicodeFlags(uint32_t cpt);

// Decodes UTF-8 as llama.cpp's unicode_cpts_from_utf8 does: a lead byte's length is trusted
// when its continuation bytes are there (overlong forms and surrogates decode as they read);
// any other byte becomes one U+FFFD and decoding goes on at the next byte.
void DecodeUtf8(std::string_view text, std::vector<uint32_t>* cpts);

// Appends the UTF-8 form of a code point; one past U+10FFFF becomes U+FFFD.
void AppendUtf8(uint32_t cpt, std::string* out);

// The length of a UTF-8 character from its lead byte alone (1 for continuation bytes), as
// llama.cpp's unicode_len_utf8.
inline size_t Utf8LengthFromLead(char lead) {
  static constexpr uint8_t kLengths[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLengths[static_cast<uint8_t>(lead) >> 4];
}

// True when the text is well-formed UTF-8 (no overlong forms, surrogates or truncation).
bool IsValidUtf8(std::string_view text);

}  // namespace kvl
