// kvl tokenize: text to ids with a model's vocabulary alone (the GGUF's metadata: no tensor is
// read, so vocab-only files and files of any architecture work), printed as llama-tokenize prints
// them: "id -> 'piece'" lines, or [1, 2, 3] with --ids.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "cli.h"
#include "kvl/gguf.h"
#include "kvl/tokenizer.h"

namespace kvl::cli {
namespace {

StatusOr<std::string> ReadText(const TokenizeArgs& args) {
  if (args.prompt_file.empty()) return args.prompt;
  std::ifstream in(args.prompt_file, std::ios::binary);
  if (!in) return NotFoundError(fmt::format("cannot open '{}'", args.prompt_file));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return IoError(fmt::format("cannot read '{}'", args.prompt_file));
  return text.str();
}

// llama-tokenize's escapes: \n \r \t \' \" \\ and \xNN (two characters strtol reads as hex);
// any other backslash stays as it is, with the character after it.
void ProcessEscapes(std::string* text) {
  std::string& s = *text;
  size_t out = 0;
  for (size_t in = 0; in < s.size(); ++in) {
    if (s[in] != '\\' || in + 1 >= s.size()) {
      s[out++] = s[in];
      continue;
    }
    const char c = s[++in];
    switch (c) {
      case 'n': s[out++] = '\n'; continue;
      case 'r': s[out++] = '\r'; continue;
      case 't': s[out++] = '\t'; continue;
      case '\'': case '"': case '\\': s[out++] = c; continue;
      case 'x':
        if (in + 2 < s.size()) {
          const char hex[3] = {s[in + 1], s[in + 2], 0};
          char* end = nullptr;
          const long value = std::strtol(hex, &end, 16);
          if (end == hex + 2) {
            in += 2;
            s[out++] = static_cast<char>(value);
            continue;
          }
        }
        break;
      default:
        break;
    }
    s[out++] = '\\';
    s[out++] = c;
  }
  s.resize(out);
}

// A piece as JSON: a string where it is valid UTF-8, else its bytes (as llama-server does).
nlohmann::json PieceJson(const std::string& piece) {
  if (IsValidUtf8(piece)) return piece;
  nlohmann::json bytes = nlohmann::json::array();
  for (unsigned char c : piece) bytes.push_back(static_cast<int>(c));
  return bytes;
}

}  // namespace

int TokenizeCommand(const TokenizeArgs& args) {
  const auto fail = [](const Status& status) {
    fmt::print(stderr, "kvl tokenize: {}\n", status.ToString());
    return 1;
  };
  StatusOr<std::string> text = ReadText(args);
  if (!text.ok()) return fail(text.status());
  if (args.escape) ProcessEscapes(&*text);
  StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(args.model_path);
  if (!file.ok()) return fail(file.status());
  StatusOr<std::unique_ptr<Tokenizer>> tokenizer = Tokenizer::FromGguf(**file);
  if (!tokenizer.ok()) return fail(tokenizer.status());
  const Tokenizer& tok = **tokenizer;

  const std::vector<TokenId> ids =
      tok.Encode(*text, EncodeOptions{!args.no_bos, args.parse_special});
  std::string out;
  if (args.pieces) {
    nlohmann::json j = nlohmann::json::array();
    for (TokenId id : ids) {
      nlohmann::json piece = PieceJson(tok.TokenPiece(id));
      j.push_back(args.ids ? nlohmann::json{{"id", id}, {"piece", piece}} : piece);
    }
    out = j.dump() + "\n";
  } else if (args.ids) {
    out.reserve(ids.size() * 8);
    out.push_back('[');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) out.append(", ");
      out.append(fmt::format_int(ids[i]).str());
    }
    out.append("]\n");
  } else {
    for (TokenId id : ids) out.append(fmt::format("{:6d} -> '{}'\n", id, tok.TokenPiece(id)));
  }
  if (args.show_count) out.append(fmt::format("Total number of tokens: {}\n", ids.size()));
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (Status s = FlushStdout(); !s.ok()) return fail(s);
  return 0;
}

}  // namespace kvl::cli
