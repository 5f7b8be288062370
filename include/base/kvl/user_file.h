// The one door for files a user names (a model, a calibration profile, a prompt file): they are
// opened without blocking and refused unless they are regular files, so a FIFO, a device or a
// directory given by mistake fails at once with a message instead of hanging in open() or being
// read as an empty file.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kvl/status.h"

namespace kvl {

// Opens `path` read-only (O_CLOEXEC) and returns the descriptor, which the caller closes.
// open() gets O_NONBLOCK, so a FIFO without a writer returns at once; fstat then refuses
// anything but a regular file, and the descriptor is switched back to blocking. `what` names
// the file in messages ("model", "profile", "prompt file"). NOT_FOUND for a missing file (or a path through a file),
// INVALID_ARGUMENT for a directory, FIFO, socket or device, IO_ERROR for the rest.
StatusOr<int> OpenUserFile(const std::string& path, std::string_view what);

// The whole of a regular file, through OpenUserFile; INVALID_ARGUMENT when it is larger than
// max_bytes (a user's file must not decide how much memory is taken).
StatusOr<std::string> ReadUserFile(const std::string& path, std::string_view what,
                                   int64_t max_bytes);

}  // namespace kvl
