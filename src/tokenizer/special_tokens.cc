// Special tokens as llama.cpp's vocabulary code finds and splits them: the end-of-turn and
// end-of-generation tokens known by their text, the per-model space stripping, and the split of
// a text at special-token texts, the longest first, before any pre-tokenization.
#include <algorithm>
#include <cctype>
#include <cstring>

#include "kvl/tokenizer.h"

namespace kvl {
namespace {

constexpr uint8_t kStripLeft = 1;   // spaces before the token belong to it
constexpr uint8_t kStripRight = 2;  // spaces after the token belong to it

// Texts of end-of-turn tokens that files often leave without an eot_token_id.
constexpr std::string_view kEndOfTurnTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<\xEF\xBD\x9C" "end\xE2\x96\x81of\xE2\x96\x81sentence\xEF\xBD\x9C>",
    "<end_of_utterance>",
};
// Texts of tokens that end a generation (llama.cpp's list).
constexpr std::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]",
    "<|end_of_text|>", "<end_of_utterance>",
};

bool IsSpecialType(TokenType type) {
  return type == TokenType::kControl || type == TokenType::kUserDefined ||
         type == TokenType::kUnknown;
}

// C's isspace in the "C" locale, which llama.cpp strips with.
bool IsAsciiSpace(char c) { return c == ' ' || (c >= '\t' && c <= '\r'); }

}  // namespace

Status Tokenizer::InitSpecialTokens(const std::string& model_name) {
  const size_t n = tokens_.size();
  const auto find_any = [&](const auto& texts) {
    TokenId best = -1;
    for (std::string_view text : texts) {
      const TokenId id = FindToken(text);
      if (id >= 0 && (best < 0 || id < best)) best = id;
    }
    return best;
  };
  // A token found by its text is control, whatever the file says (llama.cpp overrides it too).
  if (eot_ < 0) {
    eot_ = find_any(kEndOfTurnTexts);
    if (eot_ >= 0) types_[static_cast<size_t>(eot_)] = TokenType::kControl;
  }
  if (eom_ < 0) {
    eom_ = FindToken("<|eom_id|>");
    if (eom_ >= 0) types_[static_cast<size_t>(eom_)] = TokenType::kControl;
  }

  is_eog_.assign(n, false);
  for (std::string_view text : kEndOfGenerationTexts) {
    const TokenId id = FindToken(text);
    if (id < 0) continue;
    is_eog_[static_cast<size_t>(id)] = true;
    types_[static_cast<size_t>(id)] = TokenType::kControl;
  }
  // gpt-oss's message markers are always printed.
  for (std::string_view text : {"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"}) {
    if (const TokenId id = FindToken(text); id >= 0) {
      types_[static_cast<size_t>(id)] = TokenType::kUserDefined;
    }
  }
  for (TokenId id : {eos_, eot_, eom_}) {
    if (id >= 0) is_eog_[static_cast<size_t>(id)] = true;
  }
  // Where <|return|> and <|call|> (gpt-oss) or <|calls|> and <|flush|> (Solar-Open) end a turn,
  // <|end|> only ends a message: not the end of the generation.
  const auto eog_text = [&](std::string_view text) {
    const TokenId id = FindToken(text);
    return id >= 0 && is_eog_[static_cast<size_t>(id)];
  };
  if (eog_text("<|end|>") && ((eog_text("<|return|>") && eog_text("<|call|>")) ||
                              (eog_text("<|calls|>") && eog_text("<|flush|>")))) {
    const TokenId end = FindToken("<|end|>");
    is_eog_[static_cast<size_t>(end)] = false;
    types_[static_cast<size_t>(end)] = TokenType::kUserDefined;
  }
  // Gemma-4 (its <|tool_response> token): </s> is text, not the end.
  if (eog_text("<|tool_response>") && eog_text("</s>")) {
    const TokenId s = FindToken("</s>");
    is_eog_[static_cast<size_t>(s)] = false;
    types_[static_cast<size_t>(s)] = TokenType::kNormal;
  }
  eog_ids_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (is_eog_[i]) eog_ids_.push_back(static_cast<TokenId>(i));
  }

  special_tokens_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (IsSpecialType(types_[i])) special_tokens_.push_back(static_cast<TokenId>(i));
  }
  std::stable_sort(special_tokens_.begin(), special_tokens_.end(), [&](TokenId a, TokenId b) {
    return tokens_[static_cast<size_t>(a)].size() > tokens_[static_cast<size_t>(b)].size();
  });
  // The index PartitionSpecial scans the text with: special tokens by their first two bytes
  // (one-byte tokens by their byte).
  special_prefixes_.clear();
  for (bool& b : special_first_byte_) b = false;
  for (auto& list : special_one_byte_) list.clear();
  for (size_t order = 0; order < special_tokens_.size(); ++order) {
    const std::string& text = tokens_[static_cast<size_t>(special_tokens_[order])];
    const auto b0 = static_cast<uint8_t>(text[0]);
    special_first_byte_[b0] = true;
    if (text.size() == 1) {
      special_one_byte_[b0].push_back(static_cast<uint32_t>(order));
    } else {
      special_prefixes_.emplace_back(static_cast<uint16_t>(b0 << 8 | static_cast<uint8_t>(text[1])),
                                     static_cast<uint32_t>(order));
    }
  }
  std::stable_sort(special_prefixes_.begin(), special_prefixes_.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });

  // Phi-3 strips the spaces after its special tokens (llama.cpp knows it by the model's name),
  // but not after <unk>, <s> and <|endoftext|>.
  strip_.assign(n, 0);
  std::string lower_name = model_name;
  std::transform(lower_name.begin(), lower_name.end(), lower_name.begin(),
                 [](char c) { return static_cast<char>(std::tolower(static_cast<uint8_t>(c))); });
  if (lower_name.find("phi-3") != std::string::npos ||
      lower_name.find("phi3") != std::string::npos) {
    for (TokenId id : special_tokens_) strip_[static_cast<size_t>(id)] |= kStripRight;
    if (const TokenId id = FindToken("</s>"); id >= 0) strip_[static_cast<size_t>(id)] |= kStripRight;
    for (std::string_view text : {"<unk>", "<s>", "<|endoftext|>"}) {
      if (const TokenId id = FindToken(text); id >= 0) {
        strip_[static_cast<size_t>(id)] &= static_cast<uint8_t>(~kStripRight);
      }
    }
  }
  return Status::Ok();
}

void Tokenizer::PartitionSpecial(std::string_view text, bool parse_special,
                                 std::vector<Fragment>* fragments) const {
  fragments->assign(1, Fragment{0, text.size(), -1});
  if (special_tokens_.empty()) return;
  const auto active = [&](size_t order) {
    const TokenType type = types_[static_cast<size_t>(special_tokens_[order])];
    return parse_special || (type != TokenType::kControl && type != TokenType::kUnknown);
  };
  // Every place a special token's text occurs, found in one pass over the text: a position is
  // looked at only when its first two bytes start some special token. (Searching the text once
  // per special token, as llama.cpp does, costs a pass per token: 256 of them for Llama-3.)
  std::vector<std::pair<uint32_t, size_t>> occurrences;  // (order, position)
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t i = 0; i < text.size(); ++i) {
    const uint8_t b0 = bytes[i];
    if (!special_first_byte_[b0]) continue;
    const auto try_order = [&](uint32_t order) {
      const std::string& needle = tokens_[static_cast<size_t>(special_tokens_[order])];
      if (needle.size() <= text.size() - i && active(order) &&
          std::memcmp(needle.data(), text.data() + i, needle.size()) == 0) {
        occurrences.emplace_back(order, i);
      }
    };
    for (uint32_t order : special_one_byte_[b0]) try_order(order);
    if (i + 1 >= text.size()) continue;
    const uint16_t prefix = static_cast<uint16_t>(b0 << 8 | bytes[i + 1]);
    const auto range = std::equal_range(
        special_prefixes_.begin(), special_prefixes_.end(), std::pair<uint16_t, uint32_t>(prefix, 0),
        [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto it = range.first; it != range.second; ++it) try_order(it->second);
  }
  if (occurrences.empty()) return;
  std::stable_sort(occurrences.begin(), occurrences.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });

  // Each special token in turn, the longest first, splits every text fragment left at each of
  // its occurrences (leftmost first, not overlapping); later (shorter) tokens see only what is
  // left between, as llama.cpp's tokenizer_st_partition.
  std::vector<Fragment> next;
  for (size_t k = 0; k < occurrences.size();) {
    const uint32_t order = occurrences[k].first;
    size_t k_end = k;
    while (k_end < occurrences.size() && occurrences[k_end].first == order) ++k_end;
    const TokenId special = special_tokens_[order];
    const size_t length = tokens_[static_cast<size_t>(special)].size();
    const uint8_t strip = strip_[static_cast<size_t>(special)];
    next.clear();
    size_t o = k;  // the next occurrence to place; occurrences and fragments are both in order
    for (const Fragment& f : *fragments) {
      if (f.token >= 0) {
        next.push_back(f);
        continue;
      }
      const size_t end = f.offset + f.length;
      size_t base = f.offset;
      while (o < k_end && occurrences[o].second < base) ++o;
      while (o < k_end && base < end) {
        const size_t match = occurrences[o].second;
        if (match + length > end) break;  // past this fragment
        if (match < base) {
          ++o;
          continue;
        }
        size_t left_end = match;
        if (strip & kStripLeft) {
          while (left_end > base && IsAsciiSpace(text[left_end - 1])) --left_end;
        }
        if (left_end > base) next.push_back({base, left_end - base, -1});
        next.push_back({match, length, special});
        base = match + length;
        if (strip & kStripRight) {
          while (base < end && IsAsciiSpace(text[base])) ++base;
        }
        ++o;
      }
      if (base < end) next.push_back({base, end - base, -1});
    }
    fragments->swap(next);
    k = k_end;
  }
}

}  // namespace kvl
