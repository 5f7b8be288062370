// `kvl serve`'s flags and their validation (the command itself: cmd_serve.cc).
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "command_flags.h"
#include "kvl/chat_template.h"

namespace kvl::cli {

CommandFlags DeclareServeFlags(CLI::App* app, ServeArgs* serve) {
  CLI::App* cmd =
      app->add_subcommand("serve", "OpenAI-compatible HTTP server (completions, chat, /metrics)");
  cmd->add_option("-m,--model", serve->serve.engine.model_path, "GGUF model file")->required();
  cmd->add_option("--host", serve->serve.host, "address to listen on")->capture_default_str();
  cmd->add_option("--port", serve->serve.port, "port to listen on; 0 = any free port")
      ->capture_default_str();
  cmd->add_option(
      "--api-key", serve->serve.api_key,
      "require 'Authorization: Bearer KEY' on every route but /health, /v1/models and the web "
      "page");
  cmd->add_option("--api-key-open", serve->serve.api_key_open_routes,
                  "routes that need no key even with --api-key: /metrics, /tokenize, /detokenize "
                  "(comma-separated)")
      ->delimiter(',');
  cmd->add_option("-a,--alias", serve->serve.alias,
                  "the model's name in /v1/models and in replies (default: the file's name)");
  cmd->add_flag("--lenient", serve->serve.lenient,
                "ignore request fields this server does not honour (named in an "
                "X-Kvl-Ignored-Fields header and the log) instead of refusing them with a 400");
  cmd->add_option("--parallel", serve->parallel, "sequences served at once (-np)")
      ->capture_default_str();
  cmd->add_option("--threads-http", serve->serve.http_threads,
                  "threads for the handlers of large requests; 0 = 4 (connections cost no thread)")
      ->capture_default_str();
  cmd->add_option("--chat-template", serve->serve.chat_template,
                  "force a built-in chat template: plain, llama2, chatml, zephyr, mistral, "
                  "llama3, gemma (default: the model's own Jinja template)");
  cmd->add_option("--chat-template-file", serve->serve.chat_template_file,
                  "render this Jinja chat template instead of the model's");
  AddChatTemplateLimitFlags(cmd, &serve->serve.chat_template_limits);
  cmd->add_option("--max-body", serve->max_body, "largest request body, e.g. 8MiB")
      ->capture_default_str();
  cmd->add_option("--cors-origin", serve->serve.cors_origin,
                  "let browsers on this origin (e.g. https://app.example, or *) call the "
                  "API: CORS headers and preflights (default: off)");
  cmd->add_option("--shutdown-grace", serve->serve.shutdown_grace_seconds,
                  "seconds running requests may finish after SIGINT/SIGTERM")
      ->capture_default_str();
  cmd->add_option("--watchdog-seconds", serve->serve.engine.watchdog_seconds,
                  "/health answers 503 once no engine step has ended for this long while "
                  "requests wait (or one step has run this long); 0 = no watchdog")
      ->capture_default_str();
  cmd->add_flag("!--no-webui", serve->serve.webui,
                "do not serve the chat page at / (GET /v1/kv/state stays)");
  cmd->add_option("--kv-events", serve->kv_events,
                  "publish vLLM's KV events (the blocks the prefix cache stores and removes) on "
                  "a ZeroMQ PUB socket for KV-aware routers: tcp://*:PORT binds, "
                  "tcp://HOST:PORT connects (docs/KV_EVENTS.md)");
  cmd->add_option("--kv-events-replay", serve->kv_events_replay,
                  "answer replay requests (from a sequence number) on a ZeroMQ ROUTER socket "
                  "bound here, e.g. tcp://*:5558; needs --kv-events");
  cmd->add_option("--kv-events-topic", serve->kv_events_topic,
                  "the topic frame of every KV events message (default: empty, as vLLM)");
  AddEngineFlags(cmd, &serve->serve.engine, &serve->kv_budget);
  return {cmd, ParsedCommand::Kind::kServe, [serve] { return ValidateServeArgs(serve); }};
}

namespace {

// --cors-origin is sent back as a header value: "*" or a scheme://host[:port] origin, nothing
// that could end the header line or name a path.
Status CheckCorsOrigin(const std::string& origin) {
  if (origin.empty() || origin == "*") return Status::Ok();
  const bool http = origin.starts_with("http://") || origin.starts_with("https://");
  const size_t host_at = origin.find("://") + 3;
  bool clean = http && host_at < origin.size();
  for (size_t i = 0; clean && i < origin.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(origin[i]);
    clean = c > 0x20 && c < 0x7f && !(i >= host_at && c == '/');
  }
  if (!clean) {
    return InvalidArgumentError(fmt::format(
        "--cors-origin '{}' is not an origin: give * or scheme://host[:port], e.g. "
        "https://app.example",
        origin));
  }
  return Status::Ok();
}

// A ZeroMQ address the publisher can bind or connect; the replay socket needs the publisher, and
// the events describe the prefix cache, so they need it on.
Status CheckKvEventsFlags(const ServeArgs& args) {
  for (const auto& [flag, address] : {std::pair<const char*, const std::string&>{
                                          "--kv-events", args.kv_events},
                                      {"--kv-events-replay", args.kv_events_replay}}) {
    if (address.empty()) continue;
    const bool known = address.starts_with("tcp://") || address.starts_with("ipc://") ||
                       address.starts_with("inproc://");
    if (!known || address.find("://") + 3 == address.size()) {
      return InvalidArgumentError(fmt::format(
          "{} '{}' is not a ZeroMQ address: give tcp://*:PORT (bind), tcp://HOST:PORT "
          "(connect) or ipc://PATH",
          flag, address));
    }
  }
  if (args.kv_events.empty() && (!args.kv_events_replay.empty() || !args.kv_events_topic.empty())) {
    return InvalidArgumentError("--kv-events-replay and --kv-events-topic need --kv-events");
  }
  if (!args.kv_events.empty() && !args.serve.engine.prefix_cache) {
    return InvalidArgumentError(
        "--kv-events publishes the prefix cache's blocks: it cannot be used with the prefix "
        "cache off");
  }
  return Status::Ok();
}

}  // namespace

Status ValidateServeArgs(ServeArgs* args) {
  KVL_RETURN_IF_ERROR(CheckRange("-np (--parallel)", args->parallel, 1, kMaxSeqs));
  KVL_RETURN_IF_ERROR(CheckRange("--port", args->serve.port, 0, 65535));
  KVL_RETURN_IF_ERROR(CheckRange("--threads-http", args->serve.http_threads, 0, 1024));
  if (!(args->serve.shutdown_grace_seconds >= 0 && args->serve.shutdown_grace_seconds <= 3600)) {
    return InvalidArgumentError("--shutdown-grace must be in [0, 3600] seconds");
  }
  if (!args->serve.chat_template.empty()) {
    KVL_RETURN_IF_ERROR(ParseChatTemplateName(args->serve.chat_template).status());
    if (!args->serve.chat_template_file.empty()) {
      return InvalidArgumentError("--chat-template and --chat-template-file exclude each other");
    }
  }
  KVL_RETURN_IF_ERROR(CheckChatTemplateLimits(args->serve.chat_template_limits));
  KVL_ASSIGN_OR_RETURN(args->serve.max_body_bytes, ParsePositiveBytes(args->max_body, "--max-body"));
  KVL_RETURN_IF_ERROR(CheckCorsOrigin(args->serve.cors_origin));
  for (const std::string& route : args->serve.api_key_open_routes) {
    if (std::find(std::begin(kApiKeyOpenableRoutes), std::end(kApiKeyOpenableRoutes), route) ==
        std::end(kApiKeyOpenableRoutes)) {
      return InvalidArgumentError(fmt::format(
          "--api-key-open '{}': only /metrics, /tokenize and /detokenize can be opened", route));
    }
  }
  KVL_RETURN_IF_ERROR(CheckKvEventsFlags(*args));
  // Serving runs -np sequences at once, exactly (the engine's default of 16 is not a floor).
  EngineOptions engine = args->serve.engine;
  engine.max_seqs = args->parallel;
  KVL_ASSIGN_OR_RETURN(args->serve.engine, EngineOptionsFor(engine, args->parallel, args->kv_budget));
  return Status::Ok();
}

}  // namespace kvl::cli
