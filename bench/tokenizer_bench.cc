// Tokenizer speed: how long a vocabulary takes to load (the GGUF's metadata read and the
// tokenizer built from it) and how fast a text encodes, per vocabulary. The text is a file, or a
// mixed-language text built here (English prose, code, digits, CJK, Devanagari, Arabic, emoji,
// runs of white space), written out with --write-text so llama-tokenize can encode the same bytes
// (scripts/bench-tokenize.sh compares the two programs end to end).
//
// Usage: tokenizer_bench -m VOCAB.gguf [-m ...] [-f TEXT | --mb 10] [--write-text PATH]
//                        [--reps 3] [--json]
#include <fmt/format.h>

#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kvl/gguf.h"
#include "kvl/tokenizer.h"

namespace {

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// CPU time of this process (all threads), in milliseconds: on a shared machine the wall time
// also counts the time other processes held the cores.
double CpuMs() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Deterministic mixed text: paragraphs of several scripts and code, cycled to `bytes`.
std::string MixedText(size_t bytes) {
  const char* parts[] = {
      "The quick brown fox doesn't jump over the lazy dog; it's 3.14159 times quicker than "
      "you'd think, and THAT'S why we've measured it 1234567 times.\n\n",
      "def tokenize(text: str) -> list[int]:\n    return [ord(c) for c in text if c != '\\t']\n\n"
      "    for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; }\r\n",
      "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE3\x83\x86\xE3\x82\xAD\xE3\x82\xB9"
      "\xE3\x83\x88\xE3\x81\xA8\xE4\xB8\xAD\xE6\x96\x87\xE6\x96\x87\xE6\x9C\xAC\xEF\xBC\x8C"
      "\xE8\xBF\x98\xE6\x9C\x89\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4\xE3\x80\x82\n",
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87 "
      "\xE0\xA4\xA6\xE0\xA5\x81\xE0\xA4\xA8\xE0\xA4\xBF\xE0\xA4\xAF\xE0\xA4\xBE, "
      "\xD9\x85\xD8\xB1\xD8\xAD\xD8\xA8\xD8\xA7 \xD8\xA8\xD8\xA7\xD9\x84\xD8\xB9\xD8\xA7"
      "\xD9\x84\xD9\x85\xD9\x8E \xD9\x84\xD9\x90\xD9\x84\xD9\x92 \n",
      "Emoji: \xF0\x9F\x91\xA8\xE2\x80\x8D\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x91\xA7 "
      "\xF0\x9F\xA6\x99 caf\xC3\xA9 na\xC3\xAFve \xC3\x85ngstr\xC3\xB6m   \t\t  tabs\n\n\n",
      "    indented    with     many      spaces and\u00a0no-break and numbers 000123 42 7\n",
  };
  std::string text;
  text.reserve(bytes + 256);
  for (size_t i = 0; text.size() < bytes; ++i) text += parts[(i * 7 + i / 6) % 6];
  text.resize(bytes);
  // Do not end inside a multi-byte character.
  while (!text.empty() && (static_cast<unsigned char>(text.back()) & 0xC0) == 0x80) text.pop_back();
  if (!text.empty() && static_cast<unsigned char>(text.back()) >= 0xC0) text.pop_back();
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> vocabs;
  std::string text_path, write_path;
  double mb = 10;
  int reps = 3;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "-m") {
      vocabs.push_back(next());
    } else if (a == "-f") {
      text_path = next();
    } else if (a == "--mb") {
      mb = std::stod(next());
    } else if (a == "--write-text") {
      write_path = next();
    } else if (a == "--reps") {
      reps = std::max(1, std::stoi(next()));
    } else if (a == "--json") {
      json = true;
    } else {
      std::fprintf(stderr,
                   "usage: tokenizer_bench -m VOCAB.gguf [-m ...] [-f TEXT | --mb 10] "
                   "[--write-text PATH] [--reps 3] [--json]\n");
      return 2;
    }
  }
  std::string text;
  if (!text_path.empty()) {
    std::ifstream in(text_path, std::ios::binary);
    std::stringstream s;
    s << in.rdbuf();
    text = s.str();
  } else {
    text = MixedText(static_cast<size_t>(mb * 1e6));
  }
  if (!write_path.empty()) std::ofstream(write_path, std::ios::binary) << text;

  std::vector<std::string> rows;
  if (!json) {
    fmt::print("text: {:.2f} MB\n", text.size() / 1e6);
    fmt::print("| vocab | tokens in vocab | load ms | load CPU ms | encode ms | MB/s | tokens |\n");
    fmt::print("|---|---:|---:|---:|---:|---:|---:|\n");
  }
  for (const std::string& path : vocabs) {
    std::vector<double> load_ms, load_cpu_ms, encode_ms;
    std::unique_ptr<kvl::Tokenizer> tok;
    for (int r = 0; r < reps; ++r) {
      const auto start = Clock::now();
      const double cpu_start = CpuMs();
      auto file = kvl::GgufFile::Open(path);
      if (!file.ok()) {
        std::fprintf(stderr, "%s\n", file.status().ToString().c_str());
        return 1;
      }
      auto loaded = kvl::Tokenizer::FromGguf(**file);
      if (!loaded.ok()) {
        std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
        return 1;
      }
      load_ms.push_back(MsSince(start));
      load_cpu_ms.push_back(CpuMs() - cpu_start);
      tok = std::move(*loaded);
    }
    size_t count = 0;
    for (int r = 0; r < reps; ++r) {
      const auto start = Clock::now();
      count = tok->Encode(text, kvl::EncodeOptions{true, false}).size();
      encode_ms.push_back(MsSince(start));
    }
    const double load = Median(load_ms), load_cpu = Median(load_cpu_ms), encode = Median(encode_ms);
    const double mbps = text.size() / 1e6 / (encode / 1e3);
    std::string name = path.substr(path.find_last_of('/') + 1);
    if (json) {
      rows.push_back(fmt::format(
          "{{\"vocab\":\"{}\",\"vocab_size\":{},\"load_ms\":{:.2f},\"load_cpu_ms\":{:.2f},"
          "\"encode_ms\":{:.1f},\"mb_per_s\":{:.2f},\"tokens\":{},\"text_bytes\":{}}}",
          name, tok->vocab_size(), load, load_cpu, encode, mbps, count, text.size()));
    } else {
      fmt::print("| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.2f} | {} |\n", name, tok->vocab_size(),
                 load, load_cpu, encode, mbps, count);
    }
  }
  if (json) {
    fmt::print("[");
    for (size_t i = 0; i < rows.size(); ++i) fmt::print("{}{}", i ? "," : "", rows[i]);
    fmt::print("]\n");
  }
  return 0;
}
