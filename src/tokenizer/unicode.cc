#include "unicode.h"

#include <memory>

namespace kvl {
namespace {

// Every code point's flags in one flat array, expanded from the generated ranges once (about
// 1 ms, 2.2 MB): the pre-tokenizers look up every code point of every text.
const uint16_t* FlagTable() {
  static const std::unique_ptr<uint16_t[]> table = [] {
    auto flags = std::make_unique<uint16_t[]>(kMaxCodepoint + 1);
    for (size_t i = 0; i < kUnicodeRangeCount; ++i) {
      const uint32_t end = i + 1 < kUnicodeRangeCount ? kUnicodeRanges[i + 1].first
                                                      : kMaxCodepoint + 1;
      for (uint32_t c = kUnicodeRanges[i].first; c < end; ++c) flags[c] = kUnicodeRanges[i].flags;
    }
    return flags;
  }();
  return table.get();
}

}  // namespace

uint16_t UnicodeFlags(uint32_t cpt) {
  static const uint16_t* const table = FlagTable();
  return cpt <= kMaxCodepoint ? table[cpt] : uint16_t{kUnicodeUndefined};
}

void DecodeUtf8(std::string_view text, std::vector<uint32_t>* cpts) {
  cpts->clear();
  cpts->reserve(text.size());
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const auto continues = [&](size_t i) { return i < text.size() && (byte(i) & 0xC0) == 0x80; };
  size_t pos = 0;
  while (pos < text.size()) {
    const uint8_t lead = byte(pos);
    if (lead < 0x80) {
      cpts->push_back(lead);
      pos += 1;
    } else if ((lead & 0xE0) == 0xC0 && continues(pos + 1)) {
      cpts->push_back((uint32_t{lead} & 0x1F) << 6 | (byte(pos + 1) & 0x3F));
      pos += 2;
    } else if ((lead & 0xF0) == 0xE0 && continues(pos + 1) && continues(pos + 2)) {
      cpts->push_back((uint32_t{lead} & 0x0F) << 12 | (uint32_t{byte(pos + 1)} & 0x3F) << 6 |
                      (byte(pos + 2) & 0x3F));
      pos += 3;
    } else if ((lead & 0xF8) == 0xF0 && continues(pos + 1) && continues(pos + 2) &&
               continues(pos + 3)) {
      cpts->push_back((uint32_t{lead} & 0x07) << 18 | (uint32_t{byte(pos + 1)} & 0x3F) << 12 |
                      (uint32_t{byte(pos + 2)} & 0x3F) << 6 | (byte(pos + 3) & 0x3F));
      pos += 4;
    } else {
      cpts->push_back(kReplacementCharacter);
      pos += 1;
    }
  }
}

void AppendUtf8(uint32_t cpt, std::string* out) {
  if (cpt > kMaxCodepoint) cpt = kReplacementCharacter;
  if (cpt < 0x80) {
    out->push_back(static_cast<char>(cpt));
  } else if (cpt < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cpt >> 6)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else if (cpt < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cpt >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cpt >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cpt >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cpt & 0x3F)));
  }
}

bool IsValidUtf8(std::string_view text) {
  size_t pos = 0;
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  while (pos < text.size()) {
    const uint8_t lead = byte(pos);
    size_t length;
    uint32_t cpt;
    if (lead < 0x80) {
      ++pos;
      continue;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
      cpt = lead & 0x1F;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      cpt = lead & 0x0F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      cpt = lead & 0x07;
    } else {
      return false;
    }
    if (pos + length > text.size()) return false;
    for (size_t i = 1; i < length; ++i) {
      if ((byte(pos + i) & 0xC0) != 0x80) return false;
      cpt = cpt << 6 | (byte(pos + i) & 0x3F);
    }
    if ((length == 3 && (cpt < 0x800 || (cpt >= 0xD800 && cpt <= 0xDFFF))) ||
        (length == 4 && (cpt < 0x10000 || cpt > kMaxCodepoint))) {
      return false;
    }
    pos += length;
  }
  return true;
}

}  // namespace kvl
