// What a llama.cpp user types, met before CLI11 parses it: the GPU and attention flags that
// mean nothing on this CPU engine are taken out with a one-line note (so `kvl serve -m F -ngl 99
// -fa on` runs as llama-server's command line did), and a flag the command does not have is named
// with the closest one it does have ("did you mean"), instead of CLI11's "arguments were not
// expected" or, worse, `-ngl 99` read as `-n gl`.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

#include "kvl/status.h"

namespace kvl::cli {

struct InertFlagsRemoved {
  std::vector<std::string> args;   // argv without the inert flags and their values
  std::vector<std::string> notes;  // one per flag removed, for stderr
};

// Removes llama.cpp's flags that have no effect here (-ngl, -fa / --flash-attn, --mlock, --jinja,
// -sm, -ts, -mg, -dev, -nkvo, -cb, --metrics ...) with their values. argv excludes the program.
InertFlagsRemoved RemoveInertLlamaFlags(const std::vector<std::string>& argv);

// INVALID_ARGUMENT naming the first flag in argv (the words after "kvl", command words
// included) that the named command does not declare, with the closest declared flag when one is
// near; Ok when every flag is known or the command itself is unknown (CLI11 reports that).
Status CheckFlagsAreKnown(CLI::App& app, const std::vector<std::string>& argv);

}  // namespace kvl::cli
