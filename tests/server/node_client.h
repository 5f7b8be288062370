// Node.js clients for the server tests: npm packages installed once into a folder of the build
// tree and reused, and a script run with them that prints one JSON line. A test skips, saying
// why, where node or npm is missing or the packages cannot be fetched (no network).
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace kvl::testing {

struct ShellResult {
  int status = -1;
  std::string out;  // stdout and stderr
};

inline ShellResult RunShell(const std::string& command) {
  ShellResult run;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return run;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof(buf), pipe)) > 0;) run.out.append(buf, n);
  const int status = ::pclose(pipe);
  run.status = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// `packages` ("openai@4 ajv@8 ...") installed under <kvl binary's folder>/<folder>; "" when
// they are there, else why not.
inline std::string InstallNpmPackages(const std::string& folder, const std::string& packages) {
  if (RunShell("command -v node").status != 0) {
    return "node is not installed (apt-get install nodejs npm)";
  }
  const std::filesystem::path dir = std::filesystem::path(KVL_KVL_BINARY).parent_path() / folder;
  const std::filesystem::path installed = dir / ".kvl-installed";
  if (std::filesystem::exists(installed)) return "";
  if (RunShell("command -v npm").status != 0) return "npm is not installed";
  std::filesystem::create_directories(dir);
  // Tests of one folder run in parallel (ctest -j): one npm at a time installs there, under a
  // lock, and the marker is written inside it once the install succeeded; the others wait and
  // find it (two npm installs into one folder at once left a package half written).
  const ShellResult npm = RunShell(
      "cd '" + dir.string() + "' && flock .kvl-install.lock sh -c 'test -f .kvl-installed || "
      "{ timeout 300 npm install --prefix . " + packages +
      " --no-audit --no-fund --loglevel=error --fetch-retries=2 --fetch-timeout=60000 && "
      "echo \"" + packages + "\" > .kvl-installed; }'");
  if (npm.status != 0 || !std::filesystem::exists(installed)) {
    return "npm could not install " + packages + " (no network?): " + npm.out;
  }
  return "";
}

// Writes `script` as <folder>/<name> and runs it with node, `env` before it ("K=V K2=V2"); the
// last line of its output that is a JSON object, or a discarded value (the output in *log).
inline nlohmann::json RunNodeScript(const std::string& folder, const std::string& name,
                                    const std::string& script, const std::string& env,
                                    int timeout_seconds, std::string* log) {
  const std::filesystem::path path =
      std::filesystem::path(KVL_KVL_BINARY).parent_path() / folder / name;
  std::ofstream(path) << script;
  const ShellResult node = RunShell(env + " timeout " + std::to_string(timeout_seconds) +
                                    " node '" + path.string() + "'");
  *log = node.out;
  if (node.status != 0) return nlohmann::json(nlohmann::json::value_t::discarded);
  const size_t line = node.out.rfind("\n{");
  return nlohmann::json::parse(node.out.substr(line == std::string::npos ? 0 : line + 1), nullptr,
                               /*allow_exceptions=*/false);
}

}  // namespace kvl::testing
