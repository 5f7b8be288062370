// `kvl bench spec`'s flags and their validation (the command: cmd_bench_spec.cc).
#include "command_flags.h"
#include "kvl/engine.h"

namespace kvl::cli {

CommandFlags DeclareBenchSpecFlags(CLI::App* bench, BenchSpecArgs* bsp) {
  CLI::App* cmd = bench->add_subcommand(
      "spec", "speculative decoding against plain decoding: acceptance, tokens per step and "
              "tok/s on workloads that repeat their input and on prose; the verify step's cost");
  cmd->add_option("-m,--model", bsp->model_path, "GGUF model file")->required();
  cmd->add_option("-t,--threads", bsp->num_threads, "threads; 0 = every core");
  cmd->add_option("--spec", bsp->spec,
                  "drafter: auto | ngram | suffix, or several, comma-separated (each compared "
                  "with plain decoding in the same runs)")
      ->check([](const std::string& list) -> std::string {
        for (const std::string& mode : SpecModesOf(list)) {
          if (mode != "auto" && mode != "ngram" && mode != "suffix") {
            return "--spec takes auto, ngram or suffix (comma-separated), got '" + mode + "'";
          }
        }
        return "";
      })
      ->capture_default_str();
  cmd->add_option("--model-draft", bsp->draft_model,
                  "draft model (-md): its rows (--spec draft) beside the drafter's");
  cmd->add_option("--draft-max", bsp->draft_max, "most draft tokens per step")
      ->check(CLI::Range(1, kMaxDraftTokens))
      ->capture_default_str();
  cmd->add_option("-n,--n-gen", bsp->n_gen, "tokens generated per workload")
      ->check(CLI::Range(2, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--depth", bsp->depth, "context tokens of the step-cost measurement")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("-c,--ctx-size", bsp->context_length, "engine context")
      ->check(CLI::Range(int64_t{64}, kMaxContextTokens))
      ->capture_default_str();
  cmd->add_option("-r,--repetitions", bsp->repetitions, "step-cost timings (median kept)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--runs", bsp->runs, "runs of each workload, plain and speculative in turn "
                                       "(the median tok/s is kept)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--workloads", bsp->workloads,
                  "only these workloads, comma-separated (retell, document-qa, chat-quote, "
                  "agent-repeat, agent-nearly, chat-resubmit, edit, prose)")
      ->check([](const std::string& list) -> std::string {
        for (const std::string& name : SpecModesOf(list)) {
          if (!IsBenchSpecWorkload(name)) return "--workloads: no workload '" + name + "'";
        }
        return "";
      });
  cmd->add_flag("--spec-force", bsp->spec_force,
                "send every draft the drafter offers (the drafter's acceptance without the cost "
                "model's choices; tok/s then shows what sending everything costs)");
  cmd->add_flag("--steps-only", bsp->steps_only, "measure the step cost alone (no workloads)");
  cmd->add_option("-o,--output", bsp->output, "table | json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  cmd->add_option("--json", bsp->json_path, "write the figures as JSON");
  return {cmd, ParsedCommand::Kind::kBenchSpec, [bsp] {
            // A negative -t reached the thread pool unchecked.
            return CheckRange("-t (--threads; 0 = every core)", bsp->num_threads, 0, kMaxThreads);
          }};
}

}  // namespace kvl::cli
