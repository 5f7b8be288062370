// Where tests find the shared model files and the kvl binary (set by CMake).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace kvl::testing {

inline std::string SharedModelPath(const std::string& file) {
  return std::string(KVL_SHARED_MODELS_DIR) + "/" + file;
}
inline std::string Stories260KPath() { return SharedModelPath("stories260K.gguf"); }

// A cost profile path this test process owns (its engines calibrate once into it and share it):
// named by the PID, removed when the process first asks for it and when it exits. A file left
// there by an earlier process with the same PID would otherwise be loaded, and one of an older
// profile version is refused at a path the user gave (it happened on a machine with 249 of them).
inline const std::string& ProcessProfilePath() {
  struct Owned {
    std::string path = (std::filesystem::temp_directory_path() /
                        ("kvl-test-profile-" + std::to_string(::getpid()) + ".json"))
                           .string();
    Owned() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
    ~Owned() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  };
  static const Owned owned;
  return owned.path;
}

// The 64 greedy ids from BOS, from ../shared/models/README.md.
inline const std::vector<int32_t>& Stories260KGreedyReference() {
  static const std::vector<int32_t> ids = {
      403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426, 338,
      401, 396, 267, 337, 410, 408, 419, 292, 411, 322, 265, 282, 295, 433, 426, 385,
      328, 432, 358, 394, 261, 370, 432, 352, 266, 268, 388, 426, 338, 391, 266, 267,
      337, 335, 312, 432, 398, 312, 286, 267, 414, 270, 333, 415, 426, 13,  438, 310};
  return ids;
}

// Eight short story openings: the prompt set of the batching and KV-action exactness tests.
inline const std::vector<std::string>& StoryPrompts() {
  static const std::vector<std::string> prompts = {
      "Once upon a time",    "The little dog",       "Lily wanted to",       "One day, a boy named Tom",
      "The sun was shining", "Sam and his mom went", "There was a big tree", "The cat sat on"};
  return prompts;
}

}  // namespace kvl::testing
