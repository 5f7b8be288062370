// kvl run: stream generated text to stdout, timings to stderr (as llama.cpp does).
#include <fmt/format.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "cli/cli.h"

namespace kvl::cli {

int RunCommand(const RunArgs& args) {
  GenerateRequest request;
  request.prompt = args.prompt;
  if (!args.prompt_file.empty()) {
    std::ifstream in(args.prompt_file, std::ios::binary);
    if (!in) {
      fmt::print(stderr, "kvl: cannot read prompt file '{}'\n", args.prompt_file);
      return 1;
    }
    std::stringstream text;
    text << in.rdbuf();
    request.prompt = text.str();
  }
  request.add_bos = !args.no_bos;
  request.max_new_tokens = args.num_predict;
  request.sampling = args.sampling;
  if (Status s = request.sampling.Validate(); !s.ok()) {
    fmt::print(stderr, "kvl: {}\n", s.message());
    return 1;
  }

  StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(args.engine);
  if (!engine.ok()) {
    fmt::print(stderr, "kvl: {}\n", engine.status().ToString());
    return 1;
  }
  Engine& e = **engine;
  const ModelConfig& c = e.model().config();
  fmt::print(stderr, "kvl: model {} ({}, {}, {} layers, dim {}), {} threads, {} kernels, ctx {}\n",
             c.name, e.model().weight_type_name(), FormatParams(e.model().num_parameters()),
             c.num_layers, c.dim, e.num_threads(), ops::IsaName(e.isa()), e.context_length());

  // The prompt is echoed (as llama.cpp does) so the output reads as one text.
  std::fputs(request.prompt.c_str(), stdout);
  std::fflush(stdout);
  StatusOr<GenerateResult> result = e.Generate(request, [](int32_t, std::string_view piece) {
    std::fwrite(piece.data(), 1, piece.size(), stdout);
    std::fflush(stdout);
    return true;
  });
  std::fputc('\n', stdout);
  if (!result.ok()) {
    fmt::print(stderr, "kvl: {}\n", result.status().ToString());
    return 1;
  }
  const GenerateStats& st = result->stats;
  auto line = [](const char* what, double ms, int64_t n) {
    fmt::print(stderr, "kvl: {:>16} = {:10.2f} ms / {:5} tokens ({:8.2f} ms per token, {:8.2f} tokens per second)\n",
               what, ms, n, n > 0 ? ms / n : 0.0, ms > 0 ? 1000.0 * n / ms : 0.0);
  };
  line("prompt eval time", st.prompt_ms, st.prompt_tokens);
  line("eval time", st.generate_ms, st.generated_tokens);
  fmt::print(stderr, "kvl: stop reason: {}\n", result->stop_reason);
  return 0;
}

}  // namespace kvl::cli
