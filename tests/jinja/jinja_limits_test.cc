// Templates inside a budget: what a hostile template (a GGUF's is untrusted input) does is an
// error naming the limit it passed, never a crash, a hang or unbounded memory. Operator chains of
// 20k links and nesting inside chains are refused at parse, naming the line (and column); a
// value nested 400k deep prints, compares and frees without recursing; memory is one budget for
// everything a render holds; steps weigh the work they do; a render stops at its deadline or
// when cancelled.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <string>
#include <vector>

#include "jinja/js_text.h"
#include "kvl/jinja.h"

namespace kvl::jinja {
namespace {

std::string Repeat(const std::string& s, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += s;
  return out;
}

StatusOr<std::string> Render(const std::string& source, const RenderOptions& options = {},
                             const Context& context = {}) {
  StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return t.status();
  return t->Render(context, options);
}

// The message of a failed render ("" where it rendered).
std::string Error(const StatusOr<std::string>& out) {
  return out.ok() ? "" : std::string(out.status().message());
}

TEST(JinjaLimitsTest, OperatorChainsOf20kLinksAreRefusedAtParseNamingLineAndColumn) {
  // The chains of the probe: 40 KB templates that overflowed the stack evaluating or freeing.
  const std::pair<std::string, std::string> kChains[] = {
      {"{{ 1", "+1"},          {"{{ 'a'", "~'a'"},    {"{{ 'a'", "|lower"}, {"{{ 1", " and 1"},
      {"{{ 1", "<1"},          {"{{ x", " is defined"}, {"{% set x = [1] %}{{ x", "[0]"},
  };
  for (const auto& [head, link] : kChains) {
    const std::string source = "text\n" + head + Repeat(link, 20000) + " }}";
    const StatusOr<Template> t = Template::Parse(source);
    ASSERT_FALSE(t.ok()) << head << link;
    const std::string message(t.status().message());
    EXPECT_NE(message.find("template line 2, column "), std::string::npos) << message;
    EXPECT_NE(message.find("a chain of more than 200"), std::string::npos) << message;
    // The column is the operator's that passed the limit: 201 links in.
    const int column = std::atoi(message.c_str() + message.find("column ") + 7);
    EXPECT_EQ(column, static_cast<int>(head.size() + 200 * link.size() + 1 + (link[0] == ' ' ? 1 : 0)))
        << message;
  }
  // A chain far longer than real templates' (a few dozen links) still renders.
  EXPECT_EQ(*Render("{{ 1" + Repeat("+1", 150) + " }}"), "151");
  EXPECT_EQ(Render("{{ 'a'" + Repeat("|upper|lower", 100) + " }}").value(), "a");
}

TEST(JinjaLimitsTest, ChainsInsideParenthesesAreBoundedAsOneTree) {
  // Three levels of parentheses, each a chain of 100: 300 levels deep, though each chain and
  // the nesting are inside their own limits.
  std::string expr = "1";
  for (int i = 0; i < 3; ++i) expr = "(" + expr + Repeat("+1", 100) + ")";
  const StatusOr<Template> t = Template::Parse("a\nb\n{{ " + expr + " }}");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("template line 3: expressions and blocks nested more than 256"),
            std::string::npos)
      << t.status().message();
  // Two levels (200 deep) render.
  expr = "1";
  for (int i = 0; i < 2; ++i) expr = "(" + expr + Repeat("+1", 100) + ")";
  EXPECT_EQ(*Render("{{ " + expr + " }}"), "201");
}

// [[[...]]] `depth` levels deep, built without recursion.
Value DeepList(int depth) {
  Value v = Value::Array();
  for (int i = 0; i < depth; ++i) v = Value::Array({v});
  return v;
}

TEST(JinjaLimitsTest, ValueNested400kDeepPrintsComparesAndFreesWithoutRecursion) {
  const Context context = {{"deep", DeepList(400'000)}};
  for (const char* use : {"{{ deep }}", "{{ deep == 'x' }}", "{{ deep | tojson }}", "{{ deep ~ '' }}",
                          "{{ deep | string }}"}) {
    const StatusOr<std::string> out = Render(use, {}, context);
    EXPECT_NE(Error(out).find("nested deeper than 256 levels"), std::string::npos) << use << ": " << Error(out);
  }
  EXPECT_EQ(*Render("{{ deep | length }} {{ deep is iterable }} {{ deep == deep }}", {}, context), "1 true true");
  // Built by a loop inside the render, and freed when it ends (with the namespace holding it).
  RenderOptions options;
  options.max_steps = 10'000'000;
  options.max_seconds = 120;
  const std::string build =
      "{% set ns = namespace(v=[]) %}{% for i in range(400000) %}{% set ns.v = [ns.v] %}{% endfor %}";
  EXPECT_EQ(Render(build + "built", options).value(), "built");
  // A chain through methods: each `.get` holds the mapping it was read from.
  EXPECT_EQ(Render("{% set ns = namespace(f=none) %}{% for i in range(200000) %}{% set ns.f = {'a': ns.f}.get %}"
                   "{% endfor %}{{ ns.f('a') is not none }}",
                   options)
                .value(),
            "true");
}

TEST(JinjaLimitsTest, MemoryIsOneBudgetForEverythingTheRenderHolds) {
  // Each string stays under the per-string limit (1 MiB of 16); the list of them does not fit.
  const std::string grow =
      "{% set ns = namespace(l=[], s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
      "{% for i in range(200) %}{% set ns.l = ns.l + [ns.s ~ i] %}{% endfor %}{{ ns.l | length }}";
  RenderOptions options;
  options.max_bytes = 32 << 20;
  const std::string error = Error(Render(grow, options));
  EXPECT_NE(error.find("would hold more than 33554432 bytes at once"), std::string::npos) << error;
  // Text counts too: 1 MiB printed 12 times, under the string limit but past a budget of 8 MiB.
  const std::string print =
      "{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
      "{% for i in range(12) %}{{ ns.s }}{% endfor %}";
  RenderOptions small = options;
  small.max_bytes = 8 << 20;
  EXPECT_NE(Error(Render(print, small)).find("would hold more than 8388608 bytes"), std::string::npos)
      << Error(Render(print, small));
  // What was freed is given back: the same 1 MiB string made and dropped 200 times fits.
  const std::string churn =
      "{% set ns = namespace(s='x') %}{% for i in range(20) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
      "{% for i in range(200) %}{% set t = ns.s ~ i %}{% if loop.last %}{{ t | length }}{% endif %}{% endfor %}";
  EXPECT_EQ(Render(churn, options).value(), "1048579");
}

TEST(JinjaLimitsTest, StepsWeighTheWorkEachDoes) {
  // 2,000 iterations of a few steps each: cheap on small strings, but on a 4 MiB string each
  // concatenation is 4,096 steps of work.
  const std::string loop =
      "{% set ns = namespace(s='x') %}{% for i in range(#) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}"
      "{% for i in range(2000) %}{% if (ns.s ~ 'y') == '' %}{% endif %}{% endfor %}done";
  auto with = [&](int doublings) {
    std::string s = loop;
    s.replace(s.find('#'), 1, std::to_string(doublings));
    return s;
  };
  EXPECT_EQ(Render(with(4)).value(), "done");
  const std::string error = Error(Render(with(22)));
  EXPECT_NE(error.find("the render passed 2000000 steps"), std::string::npos) << error;
  // Quadratic built-ins are weighed as they go.
  EXPECT_NE(Error(Render("{{ range(300000) | unique | length }}")).find("passed 2000000 steps"), std::string::npos);
}

TEST(JinjaLimitsTest, DeadlineAndCancelStopARender) {
  const std::string endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
  RenderOptions options;
  options.max_steps = int64_t{1} << 50;
  options.max_seconds = 0.3;
  EXPECT_NE(Error(Render(endless, options)).find("ran past its deadline of 0.3 s"), std::string::npos);
  std::atomic<bool> cancel{true};
  options.max_seconds = 0;
  options.cancel = &cancel;
  EXPECT_NE(Error(Render(endless, options)).find("cancelled"), std::string::npos);
}

TEST(JinjaLimitsTest, PrintingAndArgumentsCannotExplode) {
  // A list holding itself twice, 40 times over, prints 2^40 items: refused at the string limit.
  EXPECT_NE(Error(Render("{% set ns = namespace(v=[1]) %}{% for i in range(40) %}{% set ns.v = [ns.v, ns.v] %}"
                         "{% endfor %}{{ ns.v }}"))
                .find("printed longer than 16777216 bytes"),
            std::string::npos);
  EXPECT_NE(Error(Render("{{ 'a\\nb' | indent(1000000000000) }}")).find("grew past"), std::string::npos);
  EXPECT_NE(Error(Render("{{ " + Repeat("[", 20) + "1" + Repeat("]", 20) + " | tojson(indent=1000000000000) }}"))
                .find("printed longer"),
            std::string::npos);
  EXPECT_NE(Error(Render("{{ '%.1000000000f' | format(1.5) }}")).find("precision"), std::string::npos);
}

TEST(JinjaLimitsTest, RecursionThroughMacrosIsBoundedByDepthNotJustCalls) {
  // 128 calls are allowed, but each nests 60 levels of expression: the evaluation depth stops it.
  const std::string source = "{% macro f(n) %}{{ " + Repeat("(", 60) + "f(n + 1)" + Repeat(" ~ 'x')", 60) +
                             " }}{% endmacro %}{{ f(0) }}";
  const std::string error = Error(Render(source));
  EXPECT_NE(error.find("evaluation nested"), std::string::npos) << error;
}

TEST(JinjaLimitsTest, SubstringSearchAgreesWithStdFindOnTrickyInputs) {
  // Periodic texts and needles over a two-letter alphabet exercise each search path (memmem up to
  // 16 bytes, KMP to 256, memmem's two-way past that).
  std::mt19937 rng(7);
  for (int round = 0; round < 400; ++round) {
    const size_t text_size = rng() % 2000;
    const size_t needle_size = 1 + rng() % 300;
    std::string text, needle;
    for (size_t i = 0; i < text_size; ++i) text += (rng() % 8 == 0) ? 'b' : 'a';
    for (size_t i = 0; i < needle_size; ++i) needle += (rng() % 8 == 0) ? 'b' : 'a';
    if (round % 3 == 0 && text_size > needle_size) needle = text.substr(rng() % (text_size - needle_size), needle_size);
    const size_t from = text_size == 0 ? 0 : rng() % (text_size + 1);
    EXPECT_EQ(FindText(text, needle, from), text.find(needle, from)) << text << " / " << needle << " / " << from;
  }
}

}  // namespace
}  // namespace kvl::jinja
