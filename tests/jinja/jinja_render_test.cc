// The interpreter on small templates whose output the reference (@huggingface/jinja 0.5.11)
// was run on by hand; each expectation is what it printed.
#include <gtest/gtest.h>

#include <string>

#include "kvl/jinja.h"

namespace kvl::jinja {
namespace {

std::string Render(std::string_view source, const Context& context = {}) {
  StatusOr<Template> t = Template::Parse(source);
  if (!t.ok()) return "PARSE ERROR: " + t.status().message();
  StatusOr<std::string> out = t->Render(context);
  if (!out.ok()) return "RENDER ERROR: " + out.status().message();
  return *out;
}

TEST(JinjaRender, TextAndExpressions) {
  EXPECT_EQ(Render("hello {{ name }}!", {{"name", Value::String("world")}}), "hello world!");
  EXPECT_EQ(Render("{{ 1 + 2 }} {{ 7 // 2 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.0 }} {{ -7 % 3 }}"),
            "3 3 3.5 1024 1.0 -1");
  EXPECT_EQ(Render("{{ 'a' ~ 1 ~ 1.0 }}|{{ 'a' + 2 }}|{{ true }}|{{ none }}|{{ undefined_name }}"),
            "a11|a2|true||");
  EXPECT_EQ(Render("{{ [1, 'a', none] }} {{ {'k': [1.5, true]} }}"), "[1, \"a\", null] {\"k\": [1.5, true]}");
}

}  // namespace
}  // namespace kvl::jinja
