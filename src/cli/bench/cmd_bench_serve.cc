// `kvl bench serve`: a load generator against a running OpenAI-compatible server, in the style of
// `vllm bench serve`. N requests to POST /v1/completions, either C at a time (--concurrency) or
// arriving as a Poisson process (--rate); streamed (SSE) or not. Prompts are words, or random token
// ids (--random-ids) for exact token counts; a shared prefix exercises the server's prefix cache,
// and the server's own counts of prompt and cached tokens are reported. Bounded: it talks to the
// one host:port given, every request has a time limit, and it ends after N requests.
#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"

namespace kvl::cli {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

// Short common words: most are one token in a small vocabulary.
constexpr const char* kWords[] = {
    "the", "cat", "sat", "on", "a", "mat", "and", "the", "dog", "ran", "to", "park", "with",
    "his", "ball", "she", "saw", "big", "red", "tree", "in", "sun", "was", "happy", "they",
    "played", "all", "day", "little", "girl", "named", "lily", "went", "home", "one", "bird",
    "sang", "song", "boy", "found", "box", "toy", "mom", "said", "yes", "friend", "we", "can"};
constexpr size_t kNumWords = sizeof(kWords) / sizeof(kWords[0]);

std::string Words(std::mt19937_64& rng, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    if (!out.empty()) out += ' ';
    out += kWords[rng() % kNumWords];
  }
  return out;
}

// --random-ids draws from these ids: ordinary tokens both in a small vocabulary (stories260K has
// 512) and in Llama's, past the control and byte tokens (0..258 in both).
constexpr int32_t kFirstRandomId = 259;
constexpr int32_t kNumRandomIds = 250;

json RandomIds(std::mt19937_64& rng, int n) {
  json ids = json::array();
  for (int i = 0; i < n; ++i) {
    ids.push_back(kFirstRandomId + static_cast<int32_t>(rng() % kNumRandomIds));
  }
  return ids;
}

struct RequestResult {
  bool ok = false;
  std::string error;
  double ttft_s = 0, e2e_s = 0;
  int64_t completion_tokens = 0;
  int64_t prompt_tokens = 0;  // the server's count (usage)
  int64_t cached_tokens = 0;  // of them, found in its prefix cache
  std::vector<double> itl_s;  // gaps between token frames (streamed only)
};

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// The server's token counts from a usage object.
void ReadUsage(const json& usage, RequestResult* r) {
  r->completion_tokens = usage.value("completion_tokens", int64_t{0});
  r->prompt_tokens = usage.value("prompt_tokens", int64_t{0});
  const auto details = usage.find("prompt_tokens_details");
  if (details != usage.end() && details->is_object()) {
    r->cached_tokens = details->value("cached_tokens", int64_t{0});
  }
}

RequestResult SendOne(const BenchServeArgs& args, const json& prompt) {
  RequestResult r;
  httplib::Client client(args.host, args.port);
  const auto limit = std::chrono::duration<double>(args.timeout_s);
  const time_t sec = static_cast<time_t>(args.timeout_s);
  const time_t usec = static_cast<time_t>((args.timeout_s - sec) * 1e6);
  client.set_connection_timeout(std::min<time_t>(sec, 5), sec >= 5 ? 0 : usec);
  client.set_read_timeout(sec, usec);
  client.set_write_timeout(sec, usec);

  json body = {{"prompt", prompt}, {"max_tokens", args.max_tokens}, {"temperature", 0},
               {"ignore_eos", true}};
  if (!args.model.empty()) body["model"] = args.model;
  if (args.stream) {
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
  }
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  if (!args.api_key.empty()) req.set_header("Authorization", "Bearer " + args.api_key);

  const Clock::time_point start = Clock::now();
  std::string buffer;   // SSE bytes not yet split into events; or the whole plain body
  bool first = true, done = false, too_long = false;
  Clock::time_point last;
  std::string frame_error;
  if (args.stream) {
    req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
      const Clock::time_point now = Clock::now();
      if (now - start > limit) {
        too_long = true;
        return false;
      }
      buffer.append(data, n);
      size_t end;
      while ((end = buffer.find("\n\n")) != std::string::npos) {
        std::string event = buffer.substr(0, end);
        buffer.erase(0, end + 2);
        if (!event.starts_with("data: ")) continue;
        const std::string payload = event.substr(6);
        if (payload == "[DONE]") {
          done = true;
          continue;
        }
        json frame = json::parse(payload, nullptr, /*allow_exceptions=*/false);
        if (frame.is_discarded()) {
          frame_error = "a frame that is not JSON";
          return false;
        }
        if (frame.contains("error")) {
          frame_error = frame["error"].dump();
          return false;
        }
        if (frame.contains("usage") && frame["usage"].is_object()) ReadUsage(frame["usage"], &r);
        if (frame.contains("choices") && frame["choices"].is_array() && !frame["choices"].empty() &&
            !frame["choices"][0].value("text", std::string()).empty()) {
          if (first) {
            r.ttft_s = Seconds(start, now);
            first = false;
          } else {
            r.itl_s.push_back(Seconds(last, now));
          }
          last = now;
        }
      }
      return true;
    };
  }
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  r.e2e_s = Seconds(start, Clock::now());
  if (too_long) {
    r.error = fmt::format("over the {} s time limit", args.timeout_s);
    return r;
  }
  if (!frame_error.empty()) {
    r.error = "stream: " + frame_error;
    return r;
  }
  if (!sent) {
    r.error = fmt::format("{} ({}:{})", httplib::to_string(error), args.host, args.port);
    return r;
  }
  if (res.status != 200) {
    r.error = fmt::format("HTTP {}: {}", res.status, args.stream ? buffer : res.body);
    if (r.error.size() > 300) r.error.resize(300);
    return r;
  }
  if (args.stream) {
    if (!done) {
      r.error = "stream ended without [DONE]";
      return r;
    }
    if (first) r.ttft_s = r.e2e_s;  // no token frame at all
  } else {
    json out = json::parse(res.body, nullptr, false);
    if (out.is_discarded() || !out.contains("usage") || !out["usage"].is_object()) {
      r.error = "response without usage";
      return r;
    }
    ReadUsage(out["usage"], &r);
    r.ttft_s = r.e2e_s;
  }
  r.ok = true;
  return r;
}

struct Summary {
  double mean = 0, median = 0, p99 = 0;
};

Summary Summarize(std::vector<double> v) {
  Summary s;
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  const size_t n = v.size();
  s.median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  // Linear interpolation between closest ranks (numpy's default, as vllm uses).
  const double pos = 0.99 * (n - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, n - 1);
  s.p99 = v[lo] + (v[hi] - v[lo]) * (pos - lo);
  return s;
}

}  // namespace

int BenchServeCommand(const BenchServeArgs& args) {
  // Prompts: the shared prefix (the same words, or ids, in every prompt), then each request's own.
  std::mt19937_64 rng(args.seed);
  const int prefix_words = std::min(args.shared_prefix, args.prompt_tokens);
  std::vector<json> prompts(args.num_requests);
  if (args.random_ids) {
    const json prefix = RandomIds(rng, prefix_words);
    for (json& p : prompts) {
      p = prefix;
      for (const json& id : RandomIds(rng, args.prompt_tokens - prefix_words)) p.push_back(id);
    }
  } else {
    const std::string prefix = Words(rng, prefix_words);
    for (json& p : prompts) {
      const std::string own = Words(rng, args.prompt_tokens - prefix_words);
      p = prefix.empty() ? own : own.empty() ? prefix : prefix + " " + own;
    }
  }
  // Arrival offsets: all at once (concurrency caps them) or a Poisson process at --rate.
  std::vector<double> arrival(args.num_requests, 0.0);
  int workers;
  if (args.rate > 0) {
    std::exponential_distribution<double> gap(args.rate);
    double t = 0;
    for (double& a : arrival) {
      a = t;
      t += gap(rng);
    }
    // Requests in flight are capped so that a slow server cannot make threads without bound.
    workers = std::min(args.num_requests, args.concurrency > 0 ? args.concurrency : 256);
  } else {
    workers = std::min(args.num_requests, std::max(args.concurrency, 1));
  }

  std::vector<RequestResult> results(args.num_requests);
  std::atomic<int> next{0};
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&] {
      for (int i; (i = next.fetch_add(1)) < args.num_requests;) {
        std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                  std::chrono::duration<double>(arrival[i])));
        results[i] = SendOne(args, prompts[i]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  const double duration = Seconds(start, Clock::now());

  int ok = 0, failed = 0;
  int64_t output_tokens = 0, prompt_tokens = 0, cached_tokens = 0;
  std::vector<double> ttft, tpot, itl, e2e;
  std::string first_error;
  for (const RequestResult& r : results) {
    if (!r.ok) {
      ++failed;
      if (first_error.empty()) first_error = r.error;
      continue;
    }
    ++ok;
    output_tokens += r.completion_tokens;
    prompt_tokens += r.prompt_tokens;
    cached_tokens += r.cached_tokens;
    ttft.push_back(r.ttft_s * 1e3);
    e2e.push_back(r.e2e_s * 1e3);
    if (r.completion_tokens > 1) {
      tpot.push_back((r.e2e_s - r.ttft_s) * 1e3 / static_cast<double>(r.completion_tokens - 1));
    }
    for (double g : r.itl_s) itl.push_back(g * 1e3);
  }
  const Summary s_ttft = Summarize(ttft), s_tpot = Summarize(tpot), s_itl = Summarize(itl),
                s_e2e = Summarize(e2e);
  const double req_per_s = duration > 0 ? ok / duration : 0;
  const double tok_per_s = duration > 0 ? output_tokens / duration : 0;
  const double prompt_mean = ok > 0 ? static_cast<double>(prompt_tokens) / ok : 0;
  const double cached_mean = ok > 0 ? static_cast<double>(cached_tokens) / ok : 0;

  if (args.output == "json") {
    auto sum = [](const Summary& s) {
      return json{{"mean", s.mean}, {"median", s.median}, {"p99", s.p99}};
    };
    json out = {{"host", args.host},
                {"port", args.port},
                {"stream", args.stream},
                {"num_requests", args.num_requests},
                {"concurrency", args.rate > 0 ? args.concurrency : std::max(args.concurrency, 1)},
                {"rate", args.rate},
                {"prompt_tokens", args.prompt_tokens},
                {"shared_prefix", prefix_words},
                {"random_ids", args.random_ids},
                {"prompt_tokens_mean", prompt_mean},
                {"cached_tokens_mean", cached_mean},
                {"max_tokens", args.max_tokens},
                {"requests_ok", ok},
                {"requests_failed", failed},
                {"duration_s", duration},
                {"request_throughput", req_per_s},
                {"output_tokens", output_tokens},
                {"output_throughput", tok_per_s},
                {"ttft_ms", sum(s_ttft)},
                {"tpot_ms", sum(s_tpot)},
                {"itl_ms", sum(s_itl)},
                {"e2e_ms", sum(s_e2e)}};
    if (!first_error.empty()) out["first_error"] = first_error;
    std::fputs((out.dump(2) + "\n").c_str(), stdout);
  } else {
    std::string t;
    t += fmt::format(
        "kvl bench serve: {}:{}, {} requests, {}, {} prompt {} ({} shared), "
        "max_tokens {}{}\n\n",
        args.host, args.port, args.num_requests,
        args.rate > 0 ? fmt::format("Poisson rate {}/s", args.rate)
                      : fmt::format("concurrency {}", std::max(args.concurrency, 1)),
        args.prompt_tokens, args.random_ids ? "token ids" : "words", prefix_words, args.max_tokens,
        args.stream ? ", streamed" : "");
    t += "| metric | value |\n| --- | ---: |\n";
    t += fmt::format("| requests ok | {} |\n| requests failed | {} |\n", ok, failed);
    t += fmt::format("| duration (s) | {:.2f} |\n| requests/s | {:.2f} |\n", duration, req_per_s);
    t += fmt::format("| output tokens | {} |\n| output tok/s | {:.2f} |\n", output_tokens,
                     tok_per_s);
    t += fmt::format("| prompt tokens, mean (cached) | {:.1f} ({:.1f}) |\n", prompt_mean,
                     cached_mean);
    auto row = [&](const char* name, const Summary& s) {
      t += fmt::format("| {} mean / median / p99 (ms) | {:.2f} / {:.2f} / {:.2f} |\n", name,
                       s.mean, s.median, s.p99);
    };
    row("TTFT", s_ttft);
    row("TPOT", s_tpot);
    row("ITL", s_itl);
    row("E2E", s_e2e);
    std::fputs(t.c_str(), stdout);
  }
  std::fflush(stdout);
  if (failed > 0) {
    std::fprintf(stderr, "kvl bench serve: %d of %d requests failed; first: %s\n", failed,
                 args.num_requests, first_error.c_str());
  }
  // Nonzero when nothing got through (no server, wrong key, ...): the numbers mean nothing then.
  return ok == 0 ? 1 : 0;
}

}  // namespace kvl::cli
