// The kvl binary: every subcommand lives in src/cli.
#include "cli/cli.h"

int main(int argc, char** argv) { return kvl::cli::Main(argc, argv); }
