#include "llama_flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <string_view>

namespace kvl::cli {
namespace {

// How an inert flag takes its value: none (--mlock), always (-ngl 99), or only when the next
// word is one of the on/off words (llama.cpp's -fa took none before it took on|off|auto).
enum class InertValue { kNone, kRequired, kSwitchWord };

struct InertFlag {
  std::array<std::string_view, 3> names;  // unused entries empty
  InertValue value;
  std::string_view why;  // finishes "ignored: ..."
};

constexpr InertFlag kInertFlags[] = {
    {{"-ngl", "--gpu-layers", "--n-gpu-layers"}, InertValue::kRequired,
     "kvl computes on the CPU; there are no GPU layers to offload"},
    {{"-fa", "--flash-attn"}, InertValue::kSwitchWord,
     "kvl's attention is always fused and tiled (flash-style) on the CPU"},
    {{"--mlock"}, InertValue::kNone, "kvl does not pin the weights in RAM"},
    {{"--jinja"}, InertValue::kNone, "chat templates always render with kvl's own Jinja"},
    {{"-sm", "--split-mode"}, InertValue::kRequired, "one CPU device: nothing to split"},
    {{"-ts", "--tensor-split"}, InertValue::kRequired, "one CPU device: nothing to split"},
    {{"-mg", "--main-gpu"}, InertValue::kRequired, "kvl computes on the CPU"},
    {{"-dev", "--device"}, InertValue::kRequired, "kvl computes on the CPU"},
    {{"-nkvo", "--no-kv-offload"}, InertValue::kNone,
     "the KV cache is in RAM already (and kvl moves pages to its tiers itself)"},
    {{"-cb", "--cont-batching"}, InertValue::kNone, "kvl always batches continuously"},
    {{"--metrics"}, InertValue::kNone, "kvl serve always serves /metrics"},
};

bool IsSwitchWord(std::string_view w) {
  return w == "on" || w == "off" || w == "auto" || w == "0" || w == "1" || w == "true" ||
         w == "false";
}

const InertFlag* FindInert(std::string_view name) {
  for (const InertFlag& f : kInertFlags) {
    for (std::string_view n : f.names) {
      if (!n.empty() && n == name) return &f;
    }
  }
  return nullptr;
}

bool IsNumber(std::string_view s) {
  double value = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), value);
  return !s.empty() && ec == std::errc() && ptr == s.data() + s.size();
}

bool TakesValue(const CLI::Option* option) { return option->get_items_expected_min() > 0; }

size_t EditDistance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// The declared flag closest to `typed`, or "" when none is close enough to be what was meant:
// a few edits away (a third of the name, at least 2), or one name a prefix of the other.
std::string ClosestFlag(CLI::App& command, std::string_view typed) {
  const std::string_view bare = typed.substr(typed.find_first_not_of('-'));
  std::string best;
  size_t best_distance = SIZE_MAX;
  auto consider = [&](const std::string& name, std::string_view dashes) {
    size_t d = EditDistance(bare, name);
    const bool prefix = bare.size() >= 3 && name.size() >= 3 &&
                        (name.starts_with(bare) || bare.starts_with(name));
    if (prefix) d = std::min<size_t>(d, 1);
    if (d < best_distance) {
      best_distance = d;
      best = std::string(dashes) + name;
    }
  };
  for (const CLI::Option* option : command.get_options()) {
    for (const std::string& name : option->get_lnames()) consider(name, "--");
    for (const std::string& name : option->get_snames()) consider(name, "-");
  }
  const size_t allowed = std::max<size_t>(2, bare.size() / 3);
  return best_distance <= allowed ? best : "";
}

CLI::App* FindSubcommand(CLI::App& parent, std::string_view name) {
  for (CLI::App* sub : parent.get_subcommands([](CLI::App*) { return true; })) {
    if (sub->get_name() == name) return sub;
  }
  return nullptr;
}

}  // namespace

InertFlagsRemoved RemoveInertLlamaFlags(const std::vector<std::string>& argv) {
  InertFlagsRemoved out;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {  // what follows is not flags
      out.args.insert(out.args.end(), argv.begin() + static_cast<std::ptrdiff_t>(i), argv.end());
      break;
    }
    const size_t eq = arg.find('=');
    const std::string_view name = std::string_view(arg).substr(0, eq);
    const InertFlag* flag = i > 0 ? FindInert(name) : nullptr;  // argv[0] is the command
    if (flag == nullptr) {
      out.args.push_back(arg);
      continue;
    }
    std::string typed = arg;
    const bool has_next = i + 1 < argv.size();
    if (eq == std::string::npos &&
        ((flag->value == InertValue::kRequired && has_next) ||
         (flag->value == InertValue::kSwitchWord && has_next && IsSwitchWord(argv[i + 1])))) {
      typed += " " + argv[++i];
    }
    out.notes.push_back(fmt::format("note: {} ignored: {}", typed, flag->why));
  }
  return out;
}

Status CheckFlagsAreKnown(CLI::App& app, const std::vector<std::string>& argv) {
  if (argv.empty()) return Status::Ok();
  CLI::App* command = FindSubcommand(app, argv[0]);
  if (command == nullptr) return Status::Ok();
  std::string command_name = argv[0];
  size_t i = 1;
  if (argv.size() > 1) {
    if (CLI::App* sub = FindSubcommand(*command, argv[1])) {
      command = sub;
      command_name += " " + argv[1];
      i = 2;
    }
  }
  for (; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-' || IsNumber(arg)) continue;  // a value or a positional
    const CLI::Option* option = nullptr;
    bool value_attached = false;
    if (arg.starts_with("--")) {
      const size_t eq = arg.find('=');
      option = command->get_option_no_throw(arg.substr(0, eq));
      value_attached = eq != std::string::npos;
    } else {
      // -x, -x=V, or a short flag with its number attached (-n32, -t2), as CLI11 reads them.
      option = command->get_option_no_throw(arg.substr(0, 2));
      if (option != nullptr && arg.size() > 2) {
        const std::string_view rest = std::string_view(arg).substr(2);
        value_attached = TakesValue(option) && (rest[0] == '=' || IsNumber(rest));
        if (!value_attached) option = nullptr;
      }
    }
    if (option == nullptr) {
      const std::string closest = ClosestFlag(*command, arg.substr(0, arg.find('=')));
      return InvalidArgumentError(
          closest.empty()
              ? fmt::format("{} has no flag '{}' (kvl {} --help lists them)", command_name,
                            arg, command_name)
              : fmt::format("{} has no flag '{}': did you mean {}?", command_name, arg,
                            closest));
    }
    if (TakesValue(option) && !value_attached) ++i;  // its value may look like a flag ("-5,16")
  }
  return Status::Ok();
}

}  // namespace kvl::cli
