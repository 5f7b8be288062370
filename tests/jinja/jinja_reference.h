// The reference renderer, @huggingface/jinja, run by Node on the same templates and contexts.
//
// It comes with npm's node-llama-cpp, which also carries llama.cpp's source as a git bundle,
// whose models/templates/ holds the real chat templates. Both are installed once into
// <test binary dir>/npm-jinja (or read from KVL_NODE_LLAMA_CPP_PREFIX, a folder holding
// node_modules/node-llama-cpp, and KVL_LLAMA_CPP_DIR, a llama.cpp checkout). Without node or
// npm access the tests that need them skip, saying why.
#pragma once

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_shell.h"

namespace kvl::jinja::testing {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

struct Reference {
  std::string skip_reason;  // empty: usable
  fs::path jinja_module;    // .../@huggingface/jinja/dist/index.js
  fs::path templates_dir;   // llama.cpp's models/templates
  std::string version;      // @huggingface/jinja's
};

// A command's exit status and what it printed, stderr included (run_shell.h).
struct ShellResult {
  int status = -1;
  std::string out;
};

inline ShellResult Shell(const std::string& command) {
  const ::kvl::testing::CommandResult run = ::kvl::testing::RunShell(command + " 2>&1");
  return {run.exit_code, run.output};
}

inline fs::path CacheDir() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return (ec ? fs::temp_directory_path() : exe.parent_path()) / "npm-jinja";
}

// Holds an exclusive lock on the cache folder while it lives: ctest runs the tests that need the
// reference as separate processes, maybe at once, and only one may install and clone.
class CacheLock {
 public:
  CacheLock() {
    fs::create_directories(CacheDir());
    fd_ = ::open((CacheDir() / ".lock").c_str(), O_CREAT | O_RDWR, 0644);
    if (fd_ >= 0) ::flock(fd_, LOCK_EX);
  }
  ~CacheLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  CacheLock(const CacheLock&) = delete;
  CacheLock& operator=(const CacheLock&) = delete;

 private:
  int fd_ = -1;
};

inline Reference FindReference() {
  Reference ref;
  CacheLock lock;
  if (Shell("command -v node").status != 0) {
    ref.skip_reason = "node is not installed (apt-get install nodejs npm): no reference renderer";
    return ref;
  }
  const char* prefix_env = std::getenv("KVL_NODE_LLAMA_CPP_PREFIX");
  const fs::path prefix = prefix_env != nullptr ? fs::path(prefix_env) : CacheDir();
  const fs::path package = prefix / "node_modules" / "node-llama-cpp";
  if (!fs::exists(package / "package.json")) {
    if (Shell("command -v npm").status != 0) {
      ref.skip_reason = "npm is not installed: cannot fetch @huggingface/jinja";
      return ref;
    }
    fs::create_directories(prefix);
    // --ignore-scripts: only the package's files (the jinja dependency and llama.cpp's source
    // bundle) are needed, not its native build.
    const ShellResult npm = Shell("cd '" + prefix.string() +
                                  "' && timeout 600 npm install --prefix . node-llama-cpp@3.22.1 @huggingface/jinja@0.5.11 "
                                  "--ignore-scripts --omit=optional --no-audit --no-fund "
                                  "--loglevel=error --fetch-retries=2 --fetch-timeout=60000");
    if (npm.status != 0) {
      ref.skip_reason = "npm could not install node-llama-cpp (no network?): " + npm.out;
      return ref;
    }
  }
  ref.jinja_module = prefix / "node_modules" / "@huggingface" / "jinja" / "dist" / "index.js";
  if (!fs::exists(ref.jinja_module)) {
    ref.skip_reason = "no @huggingface/jinja beside node-llama-cpp under " + prefix.string();
    return ref;
  }
  std::ifstream version_file(prefix / "node_modules" / "@huggingface" / "jinja" / "package.json");
  ref.version = ordered_json::parse(version_file, nullptr, false).value("version", "?");

  const char* llama_env = std::getenv("KVL_LLAMA_CPP_DIR");
  fs::path llama = llama_env != nullptr ? fs::path(llama_env) : CacheDir() / "llama.cpp";
  if (!fs::exists(llama / "models" / "templates")) {
    const fs::path bundle = package / "llama" / "gitRelease.bundle";
    fs::remove_all(llama);
    const ShellResult clone = Shell("timeout 300 git clone -q '" + bundle.string() + "' '" + llama.string() + "'");
    if (clone.status != 0) {
      ref.skip_reason = "cannot clone llama.cpp from node-llama-cpp's bundle: " + clone.out;
      return ref;
    }
  }
  ref.templates_dir = llama / "models" / "templates";
  return ref;
}

inline const Reference& GetReference() {
  static const Reference ref = FindReference();
  return ref;
}

inline std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Each case is {"source": template text, "context": {...}}; each result {"ok": bool, "text":
// the output or the error message}. An empty array where Node failed (the reason in *error).
inline ordered_json RenderWithReference(const Reference& ref, const ordered_json& cases, std::string* error) {
  static constexpr char kScript[] = R"js(
import { readFileSync, writeFileSync } from 'node:fs';
const { Template } = await import(process.argv[2]);
const cases = JSON.parse(readFileSync(process.argv[3], 'utf8'));
const results = cases.map(({ source, context }) => {
  try {
    return { ok: true, text: new Template(source).render(context) };
  } catch (e) {
    return { ok: false, text: String(e && e.message) };
  }
});
writeFileSync(process.argv[4], JSON.stringify(results));
)js";
  const fs::path dir = fs::temp_directory_path() / ("kvl-jinja-ref-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  std::ofstream(dir / "render.mjs") << kScript;
  std::ofstream(dir / "cases.json") << cases.dump();
  const ShellResult node = Shell("cd '" + dir.string() + "' && timeout 300 node render.mjs 'file://" +
                                 ref.jinja_module.string() + "' cases.json results.json");
  const std::string output = ReadFile(dir / "results.json");
  fs::remove_all(dir);
  if (node.status != 0) {
    *error = node.out;
    return ordered_json::array();
  }
  ordered_json results = ordered_json::parse(output, nullptr, false);
  if (!results.is_array() || results.size() != cases.size()) {
    *error = "unexpected output from the reference: " + node.out.substr(0, 2000) + output.substr(0, 2000);
    return ordered_json::array();
  }
  return results;
}


}  // namespace kvl::jinja::testing
