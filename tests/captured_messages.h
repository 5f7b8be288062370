#pragma once
// What a component says on its messages stream, captured through a real FILE* as the engine's
// stderr would be (ObtainProfile, the profile keeper).

#include <cstdio>
#include <string>

#include "kvl/status.h"

namespace kvl::testing {

class CapturedMessages {
 public:
  CapturedMessages() : file_(std::tmpfile()) { KVL_CHECK(file_ != nullptr); }
  ~CapturedMessages() { std::fclose(file_); }
  CapturedMessages(const CapturedMessages&) = delete;
  CapturedMessages& operator=(const CapturedMessages&) = delete;
  FILE* file() { return file_; }
  // Everything written so far; writing goes on at the end.
  std::string Text() {
    std::fflush(file_);
    std::rewind(file_);
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), file_)) > 0) text.append(buf, n);
    std::fseek(file_, 0, SEEK_END);
    return text;
  }

 private:
  FILE* file_;
};

}  // namespace kvl::testing
