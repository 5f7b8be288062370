// `kvl serve`: the OpenAI-compatible server (src/server) on the flags ParseCommandLine checked.
#include <fmt/format.h>

#include "cli.h"

namespace kvl::cli {

int ServeCommand(const ServeArgs& args) {
  if (const Status s = Serve(args.serve); !s.ok()) {
    fmt::print(stderr, "kvl: {}\n", s.ToString());
    return 1;
  }
  return 0;
}

}  // namespace kvl::cli
