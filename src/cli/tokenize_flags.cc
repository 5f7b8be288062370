// `kvl tokenize`'s flags and their validation (the command itself: cmd_tokenize.cc).
#include "command_flags.h"

namespace kvl::cli {

CommandFlags DeclareTokenizeFlags(CLI::App* app, TokenizeArgs* tokenize) {
  CLI::App* cmd = app->add_subcommand("tokenize", "text to token ids with a model's vocabulary alone");
  cmd->add_option("-m,--model", tokenize->model_path, "GGUF file (vocab-only is enough)")
      ->required();
  CLI::Option* prompt = cmd->add_option("-p,--prompt", tokenize->prompt, "text");
  cmd->add_option("-f,--file", tokenize->prompt_file, "file whose whole content is the text")
      ->excludes(prompt);
  cmd->add_flag("--ids", tokenize->ids, "print only the ids, as [1, 2, 3]");
  cmd->add_flag("--pieces", tokenize->pieces, "print the pieces as a JSON array");
  cmd->add_flag("--parse-special", tokenize->parse_special,
                "control-token texts in the text become those tokens");
  cmd->add_flag("--no-bos", tokenize->no_bos,
                "no BOS (or EOS) even where the vocabulary asks for one");
  cmd->add_flag("--show-count", tokenize->show_count, "print the number of tokens");
  cmd->add_flag("-e,--escape,!--no-escape", tokenize->escape,
                "process escapes (\\n, \\t, \\xNN, ...) in the text, as llama-tokenize "
                "(default: on)");
  return {cmd, ParsedCommand::Kind::kTokenize, [tokenize, prompt]() -> Status {
            // An empty -p is a text (of no tokens); no -p and no -f is not.
            if (tokenize->prompt_file.empty() && prompt->count() == 0) {
              return InvalidArgumentError("kvl tokenize: give the text with -p TEXT or -f FILE");
            }
            return Status::Ok();
          }};
}

}  // namespace kvl::cli
