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
  const std::string log = (cache / "fetch.log").string();
  const std::string command = std::string(KVL_SOURCE_DIR) + "/scripts/fetch-llama-vocab.sh '" +
                              cache.string() + "' >'" + log + "' 2>&1";
  if (std::system(command.c_str()) != 0) {
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    *why_not = "could not fetch llama.cpp's vocab files (npm node-llama-cpp): " + text.str();
    return "";
  }
  return dir.string();
}

inline std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace kvl::testing
