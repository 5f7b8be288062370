#include "sampling_fields.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <random>
#include <string>
#include <string_view>

namespace kvl::server {
namespace {

// The samplers of kvlattice's chain, in the order it applies them (llama.cpp's default order).
enum ChainSampler { kPenalties, kTopK, kTopP, kMinP, kTemperature, kChainSize };
constexpr std::string_view kChainNames[] = {"penalties", "top_k", "top_p", "min_p",
                                            "temperature"};

// llama.cpp's names and aliases (common_sampler_types_from_names): one of the chain's, an inert
// one (its own fields are refused unless off, so listing it changes nothing), or -2: unknown.
constexpr int kInert = -1;
int SamplerIndex(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::replace(name.begin(), name.end(), '-', '_');
  if (name == "penalties") return kPenalties;
  if (name == "top_k" || name == "topk") return kTopK;
  if (name == "top_p" || name == "topp" || name == "nucleus") return kTopP;
  if (name == "min_p" || name == "minp") return kMinP;
  if (name == "temperature" || name == "temp") return kTemperature;
  if (name == "dry" || name == "typ_p" || name == "typp" || name == "typ" || name == "xtc" ||
      name == "top_n_sigma" || name == "topnsigma") {
    return kInert;
  }
  return -2;
}

// Which of the chain's samplers `samplers` keeps, in order; an error names what cannot be run.
std::optional<ApiError> ReadSamplers(const JsonValue& list, bool keep[kChainSize]) {
  if (!list.is_array()) {
    return BadField("samplers", "'samplers' must be an array of sampler names, e.g. "
                                "[\"penalties\", \"top_k\", \"top_p\", \"min_p\", \"temperature\"]");
  }
  std::fill(keep, keep + kChainSize, false);
  int last = -1;
  for (const JsonValue& entry : list) {
    if (!entry.is_string()) return BadField("samplers", "'samplers' must hold strings");
    const std::string& name = entry.get_ref<const std::string&>();
    const int index = SamplerIndex(name);
    if (index == -2) {
      return BadField("samplers",
                      fmt::format("'samplers': {} is not a sampler kvlattice has (it runs "
                                  "penalties, top_k, top_p, min_p, temperature; dry, typ_p, xtc "
                                  "and top_n_sigma only at their off values)",
                                  BoundedQuote(name)));
    }
    if (index == kInert) continue;
    if (keep[index] || index < last) {
      return BadField("samplers",
                      fmt::format("'samplers': kvlattice applies its samplers once each, in the "
                                  "order penalties, top_k, top_p, min_p, temperature; {} is out of "
                                  "that order or repeated",
                                  BoundedQuote(name)));
    }
    keep[index] = true;
    last = index;
  }
  return std::nullopt;
}

// OpenAI's {"token id": bias} or llama-server's [[token id, bias], ...].
std::optional<ApiError> ReadLogitBias(const JsonValue& bias, const ApiContext& context,
                                      SamplingParams* s) {
  auto add = [&](int64_t id, const JsonValue& value) -> std::optional<ApiError> {
    // Checked here, not left to the engine, whose refusal could not say which field it was.
    if (context.vocab_size > 0 && id >= context.vocab_size) {
      return BadField("logit_bias",
                      fmt::format("logit_bias names token {}, outside the vocabulary [0, {})", id,
                                  context.vocab_size));
    }
    if (value.is_boolean()) {
      return BadField("logit_bias", fmt::format("logit_bias: token {}: false (a ban) is not "
                                                "supported; send -100",
                                                id));
    }
    if (!value.is_number() || !(value.get<double>() >= -100 && value.get<double>() <= 100)) {
      return BadField("logit_bias",
                      fmt::format("logit_bias: the bias of token {} must be in [-100, 100]", id));
    }
    s->logit_bias.emplace_back(static_cast<int32_t>(id), value.get<float>());
    return std::nullopt;
  };
  if (bias.is_object()) {
    for (const auto& [key, value] : bias.items()) {
      int32_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0) {
        return BadField("logit_bias",
                        fmt::format("logit_bias: {} is not a token id", BoundedQuote(key)));
      }
      if (auto e = add(id, value)) return e;
    }
    return std::nullopt;
  }
  if (!bias.is_array()) {
    return BadField("logit_bias", "'logit_bias' must be an object {\"token id\": bias} or an "
                                  "array of [token id, bias] pairs");
  }
  for (const JsonValue& pair : bias) {
    if (!pair.is_array() || pair.size() != 2 || !pair[0].is_number_integer() ||
        pair[0].get<int64_t>() < 0 || pair[0].get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return BadField("logit_bias", "'logit_bias' pairs must be [token id, bias] (tokens named "
                                    "by their text are not supported)");
    }
    if (auto e = add(pair[0].get<int64_t>(), pair[1])) return e;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ReadSamplingFields(FieldReader& f, Endpoint endpoint,
                                           const ApiContext& context, SamplingParams* s) {
  const bool native = endpoint == Endpoint::kLlamaCompletion;
  const SamplingParams llama_defaults;
  double temperature = native ? llama_defaults.temperature : 1.0;
  double top_p = native ? llama_defaults.top_p : 1.0;
  double min_p = native ? llama_defaults.min_p : 0.0;
  int64_t top_k = native ? llama_defaults.top_k : 0;
  double repeat_penalty = 1.0, llama_repeat_penalty = 0.0;
  double frequency_penalty = 0.0, presence_penalty = 0.0;
  int64_t repeat_last_n = llama_defaults.repeat_last_n;
  if (!f.Number("temperature", 0.0, 100.0, false, &temperature) ||
      !f.Number("top_p", 0.0, 1.0, true, &top_p) || !f.Number("min_p", 0.0, 1.0, false, &min_p) ||
      !f.Number("repetition_penalty", 0.0, 100.0, true, &repeat_penalty) ||
      !f.Number("repeat_penalty", 0.0, 100.0, true, &llama_repeat_penalty) ||
      !f.Number("frequency_penalty", -2.0, 2.0, false, &frequency_penalty) ||
      !f.Number("presence_penalty", -2.0, 2.0, false, &presence_penalty) ||
      !f.Integer("repeat_last_n", -1, std::numeric_limits<int32_t>::max(), &repeat_last_n) ||
      !f.Integer("top_k", -1, std::numeric_limits<int32_t>::max(), &top_k)) {
    return f.error;
  }
  // vLLM's repetition_penalty and llama-server's repeat_penalty are one penalty.
  if (llama_repeat_penalty != 0.0) {
    if (f.Find("repetition_penalty") != nullptr && repeat_penalty != llama_repeat_penalty) {
      return BadField("repeat_penalty", "'repeat_penalty' and 'repetition_penalty' name the same "
                                        "penalty with different values; send one");
    }
    repeat_penalty = llama_repeat_penalty;
  }
  // A seed is any integer that fits 64 bits: negative ones are taken as their two's complement,
  // except llama-server's -1 on /completion, which asks for a random seed.
  const JsonValue* seed = f.Find("seed");
  if (seed != nullptr && !seed->is_number_integer()) {
    return BadField("seed", "'seed' must be an integer");
  }
  if (seed != nullptr && native && seed->is_number_integer() && seed->get<int64_t>() == -1) {
    seed = nullptr;
  }
  if (const JsonValue* bias = f.Find("logit_bias")) {
    if (auto e = ReadLogitBias(*bias, context, s)) return e;
  }
  bool keep[kChainSize];
  std::fill(keep, keep + kChainSize, true);
  if (const JsonValue* samplers = f.Find("samplers")) {
    if (auto e = ReadSamplers(*samplers, keep)) return e;
  }
  s->temperature = keep[kTemperature] ? static_cast<float>(temperature) : 1.0f;
  s->top_p = keep[kTopP] ? static_cast<float>(top_p) : 1.0f;
  s->min_p = keep[kMinP] ? static_cast<float>(min_p) : 0.0f;
  s->top_k = keep[kTopK] && top_k > 0 ? static_cast<int32_t>(top_k) : 0;  // -1: off, as vLLM
  s->repeat_penalty = keep[kPenalties] ? static_cast<float>(repeat_penalty) : 1.0f;
  s->frequency_penalty = keep[kPenalties] ? static_cast<float>(frequency_penalty) : 0.0f;
  s->presence_penalty = keep[kPenalties] ? static_cast<float>(presence_penalty) : 0.0f;
  s->repeat_last_n = static_cast<int32_t>(repeat_last_n);
  s->penalty_scope = native ? SamplingParams::PenaltyScope::kRepeatWindow
                            : SamplingParams::PenaltyScope::kGenerated;
  if (seed != nullptr) {
    s->seed = seed->is_number_unsigned() ? seed->get<uint64_t>()
                                         : static_cast<uint64_t>(seed->get<int64_t>());
  } else {
    static thread_local std::mt19937_64 rng{std::random_device{}()};
    s->seed = rng();
  }
  if (const Status st = s->Validate(); !st.ok()) return BadField("", st.message());
  return std::nullopt;
}

}  // namespace kvl::server
