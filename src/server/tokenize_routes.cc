#include "tokenize_routes.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "json_body.h"

namespace kvl::server {
namespace {

using json = JsonValue;

ApiError BadRequest(std::string message, std::string param) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), ""};
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// A field that must be a boolean when present.
std::optional<ApiError> ReadFlag(const json& body, const char* key, bool* value) {
  if (!body.contains(key)) return std::nullopt;
  if (!body[key].is_boolean()) return BadRequest(fmt::format("'{}' must be a boolean", key), key);
  *value = body[key].get<bool>();
  return std::nullopt;
}

std::optional<ApiError> ReadId(const json& j, const Tokenizer& tok, const char* param,
                               TokenId* id) {
  if (!j.is_number_integer()) {
    return BadRequest(fmt::format("'{}' holds {}, not a token id", param, DescribeValue(j)), param);
  }
  // An unsigned value past int64's range reads as negative here: outside either way.
  const int64_t value = j.get<int64_t>();
  if (value < 0 || value >= tok.vocab_size()) {
    return BadRequest(fmt::format("token id {} is outside the vocabulary (0..{})", DescribeValue(j),
                                  tok.vocab_size() - 1),
                      param);
  }
  *id = static_cast<TokenId>(value);
  return std::nullopt;
}

// {"tokens": [ids]} or, with pieces, [{"id", "piece"}], written straight into the answer's text:
// a JSON value per token (16 bytes each, then printed one by one) made a
// 4 MiB word's answer take several times as long as tokenizing it.
std::string TokensAnswer(const std::vector<TokenId>& ids, const Tokenizer& tok, bool with_pieces) {
  std::string out = R"({"tokens":[)";
  out.reserve(out.size() + ids.size() * (with_pieces ? 32 : 5) + 2);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    if (!with_pieces) {
      fmt::format_to(std::back_inserter(out), "{}", ids[i]);
      continue;
    }
    // A piece that is not valid UTF-8 (a byte token) is given as its bytes.
    const std::string piece = tok.TokenPiece(ids[i]);
    json piece_json = piece;
    if (!IsValidUtf8(piece)) {
      piece_json = json::array();
      for (unsigned char c : piece) piece_json.push_back(static_cast<int>(c));
    }
    fmt::format_to(std::back_inserter(out), R"({{"id":{},"piece":{}}})", ids[i], Dump(piece_json));
  }
  out += "]}";
  return out;
}

// The text a /tokenize body holds, in bytes: its string or the strings of its list.
size_t ContentBytes(const json& content) {
  if (content.is_string()) return content.get_ref<const std::string&>().size();
  size_t bytes = 0;
  if (content.is_array()) {
    for (const json& element : content) {
      if (element.is_string()) bytes += element.get_ref<const std::string&>().size();
    }
  }
  return bytes;
}

TokenRouteAnswer Tokenize(const json& body, const TokenRouteContext& context) {
  const Tokenizer& tok = context.tokenizer;
  bool add_special = false, parse_special = true, with_pieces = false;
  for (const auto& [key, value] :
       {std::pair{"add_special", &add_special}, std::pair{"parse_special", &parse_special},
        std::pair{"with_pieces", &with_pieces}}) {
    if (auto error = ReadFlag(body, key, value)) return {"", error};
  }
  std::vector<TokenId> ids;
  if (body.contains("content")) {
    const json& content = body["content"];
    // As a prompt is (Engine::Submit): a text with more tokens than the context holds is refused
    // before it is tokenized, so that no request holds the tokenizer (or memory for its ids)
    // for long.
    if (const size_t bytes = ContentBytes(content);
        static_cast<int64_t>(bytes) > context.max_content_bytes) {
      return {"", BadRequest(fmt::format("'content' has {} bytes, more than any prompt can hold "
                                         "(at most {} bytes: the context's tokens at the "
                                         "longest token's bytes)",
                                         bytes, context.max_content_bytes),
                             "content")};
    }
    // A string, or a list of strings and ids: only the first element, if a string, gets the
    // BOS (as llama-server's tokenize_mixed).
    const auto add_text = [&](const json& text, bool first) {
      const std::vector<TokenId> part = tok.Encode(
          text.get_ref<const std::string&>(), EncodeOptions{first && add_special, parse_special});
      ids.insert(ids.end(), part.begin(), part.end());
    };
    if (content.is_string()) {
      add_text(content, true);
    } else if (content.is_array()) {
      bool first = true;
      for (const json& element : content) {
        if (element.is_string()) {
          add_text(element, first);
        } else {
          TokenId id;
          if (auto error = ReadId(element, tok, "content", &id)) return {"", error};
          ids.push_back(id);
        }
        first = false;
      }
    } else {
      return {"", BadRequest("'content' must be a string or a list of strings and token ids",
                             "content")};
    }
  }
  return {TokensAnswer(ids, tok, with_pieces), std::nullopt};
}

TokenRouteAnswer Detokenize(const json& body, const Tokenizer& tok) {
  std::string content;
  if (body.contains("tokens")) {
    if (!body["tokens"].is_array()) {
      return {"", BadRequest("'tokens' must be a list of token ids", "tokens")};
    }
    // Each token's piece as llama-server joins them: control tokens as their text.
    for (const json& element : body["tokens"]) {
      TokenId id;
      if (auto error = ReadId(element, tok, "tokens", &id)) return {"", error};
      content += tok.TokenPiece(id);
    }
  }
  return {Dump(json{{"content", content}}), std::nullopt};
}

}  // namespace

int64_t TokenizeContentLimit(const Tokenizer& tokenizer, int64_t context_length) {
  size_t longest = 1;
  for (TokenId id = 0; id < tokenizer.vocab_size(); ++id) {
    longest = std::max(longest, tokenizer.token_text(id).size());
  }
  return context_length * static_cast<int64_t>(longest);
}

TokenRouteAnswer AnswerTokenRoute(std::string_view path, std::string_view body,
                                  const TokenRouteContext& context) {
  json parsed;
  if (std::optional<ApiError> error = ParseJsonBody(body, &parsed)) return {"", error};
  return path == kTokenizePath ? Tokenize(parsed, context) : Detokenize(parsed, context.tokenizer);
}

}  // namespace kvl::server
