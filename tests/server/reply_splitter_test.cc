// Replies split into reasoning, content and tool calls: a stream fed one byte at a time gives
// out, joined, what the whole text gives, and never sends text it would have to take back (the
// start of a marker); the forced-call grammars accept the calls each family writes and nothing
// the parser would not read back as a call.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kvl/grammar.h"
#include "kvl/grammar_matcher.h"
#include "server/reply_splitter.h"
#include "server/tool_request.h"

namespace kvl::server {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

// Byte by byte, every delta joined; `sent_before_end` what went out before Finish.
ReplyDelta Streamed(std::string_view text, const ReplyOptions& options,
                    std::string* sent_before_end = nullptr) {
  ReplySplitter splitter(options);
  ReplyDelta all;
  auto join = [&](ReplyDelta d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
    for (ReplyToolCall& c : d.calls) all.calls.push_back(std::move(c));
  };
  for (char c : text) join(splitter.Add(std::string_view(&c, 1)));
  if (sent_before_end != nullptr) *sent_before_end = all.reasoning + "|" + all.content;
  join(splitter.Finish());
  return all;
}

void ExpectSame(const ReplyDelta& a, const ReplyDelta& b) {
  EXPECT_EQ(a.reasoning, b.reasoning);
  EXPECT_EQ(a.content, b.content);
  ASSERT_EQ(a.calls.size(), b.calls.size());
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].index, b.calls[i].index);
    EXPECT_EQ(a.calls[i].name, b.calls[i].name);
    EXPECT_EQ(json::parse(a.calls[i].arguments), json::parse(b.calls[i].arguments));
  }
}

ReplyOptions Tools(ToolCallFormat format) {
  ReplyOptions o;
  o.parse_tools = true;
  o.format = format;
  return o;
}

TEST(ReplySplitterTest, HermesCallsStreamAsTheyCloseAndTextAroundThemIsContent) {
  const std::string text =
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": "
      "{\"tz\": \"CET\"}}\n</tool_call>";
  const ReplyOptions o = Tools(ToolCallFormat::kHermes);
  const ReplyDelta whole = SplitReply(text, o);
  EXPECT_EQ(whole.content, "Let me look.\n");
  ASSERT_EQ(whole.calls.size(), 2u);
  EXPECT_EQ(whole.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(whole.calls[0].arguments), json({{"city", "Paris"}}));
  EXPECT_EQ(whole.calls[1].index, 1);
  EXPECT_TRUE(whole.calls[0].id.starts_with("call_"));
  EXPECT_EQ(whole.calls[0].id.size(), 5u + 24u);
  EXPECT_NE(whole.calls[0].id, whole.calls[1].id);
  ExpectSame(Streamed(text, o), whole);

  // The first call goes out as soon as it closes, before the reply ends.
  ReplySplitter splitter(o);
  const size_t first_close = text.find("</tool_call>") + 12;
  ReplyDelta early = splitter.Add(text.substr(0, first_close));
  ASSERT_EQ(early.calls.size(), 1u);
  EXPECT_EQ(early.calls[0].name, "get_weather");
  EXPECT_EQ(early.content, "Let me look.\n");

  // parallel_tool_calls false: only the first.
  ReplyOptions single = o;
  single.parallel = false;
  EXPECT_EQ(SplitReply(text, single).calls.size(), 1u);
  EXPECT_EQ(Streamed(text, single).calls.size(), 1u);
}

TEST(ReplySplitterTest, TextThatMayOpenACallIsHeldUntilDecided) {
  const ReplyOptions o = Tools(ToolCallFormat::kHermes);
  ReplySplitter splitter(o);
  EXPECT_EQ(splitter.Add("Sure <tool_c").content, "Sure ");
  // Not a call after all: the held text goes out with what follows.
  EXPECT_EQ(splitter.Add("ar is red").content, "<tool_car is red");
  // A half-written call at the end is content, whole.
  std::string before_end;
  const ReplyDelta half = Streamed("A <tool_call>{\"name\": \"f\", \"argu", o, &before_end);
  EXPECT_TRUE(half.calls.empty());
  EXPECT_EQ(half.content, "A <tool_call>{\"name\": \"f\", \"argu");
  EXPECT_EQ(before_end, "|A ");
}

TEST(ReplySplitterTest, ReasoningIsSplitOutAndStreamedWithoutTheClosingTag) {
  ReplyOptions o;
  o.split_reasoning = true;
  const std::string text = "<think>\nThe user greets me.\n</think>\n\nHello!";
  const ReplyDelta whole = SplitReply(text, o);
  EXPECT_EQ(whole.reasoning, "The user greets me.\n");
  EXPECT_EQ(whole.content, "Hello!");
  std::string before_end;
  ExpectSame(Streamed(text, o, &before_end), whole);
  EXPECT_EQ(before_end, "The user greets me.\n|Hello!");
  // No reasoning at all: the content as it is, leading space kept.
  EXPECT_EQ(SplitReply(" plain answer", o).content, " plain answer");
  EXPECT_TRUE(SplitReply(" plain answer", o).reasoning.empty());
  // A prompt that opened the reasoning (DeepSeek-R1): the reply starts inside it.
  ReplyOptions open = o;
  open.reasoning_open = true;
  const ReplyDelta r1 = SplitReply("step 1, step 2</think>42", open);
  EXPECT_EQ(r1.reasoning, "step 1, step 2");
  EXPECT_EQ(r1.content, "42");
  // Cut off inside the reasoning: all of it is reasoning.
  const ReplyDelta cut = SplitReply("<think>still thinking", o);
  EXPECT_EQ(cut.reasoning, "still thinking");
  EXPECT_EQ(cut.content, "");
  // Reasoning, then a call (Qwen3).
  ReplyOptions both = Tools(ToolCallFormat::kHermes);
  both.split_reasoning = true;
  const std::string qwen3 =
      "<think>I need the weather.</think>\n\n<tool_call>\n{\"name\": \"w\", \"arguments\": "
      "{}}\n</tool_call>";
  const ReplyDelta call = SplitReply(qwen3, both);
  EXPECT_EQ(call.reasoning, "I need the weather.");
  EXPECT_EQ(call.content, "");
  ASSERT_EQ(call.calls.size(), 1u);
  ExpectSame(Streamed(qwen3, both), call);
}

TEST(ReplySplitterTest, JsonCallsAreHeldWholeAndMistralIdsKept) {
  const ReplyOptions llama = Tools(ToolCallFormat::kLlama3);
  std::string before_end;
  const std::string text = "{\"name\": \"f\", \"parameters\": {\"x\": 1}}";
  const ReplyDelta r = Streamed(text, llama, &before_end);
  EXPECT_EQ(before_end, "|");
  ASSERT_EQ(r.calls.size(), 1u);
  EXPECT_EQ(r.content, "");
  // JSON that is not a call is content, sent at the end.
  EXPECT_EQ(Streamed("{\"a\": 1}", llama).content, "{\"a\": 1}");
  // Families with no call syntax: {"name", "arguments"} or {"tool_calls": [...]} in the content.
  const ReplyDelta generic = SplitReply(
      "{\"tool_calls\": [{\"name\": \"a\", \"arguments\": {}}, {\"name\": \"b\", \"arguments\": "
      "{\"y\": [1]}}]}",
      Tools(ToolCallFormat::kNone));
  ASSERT_EQ(generic.calls.size(), 2u);
  EXPECT_EQ(generic.calls[1].name, "b");

  const ReplyOptions mistral = Tools(ToolCallFormat::kMistral);
  const ReplyDelta m = Streamed(
      "Calling.[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}, \"id\": \"abc123XYZ\"}, "
      "{\"name\": \"neg\", \"arguments\": {\"x\": 2}, \"id\": \"bad id\"}]",
      mistral);
  EXPECT_EQ(m.content, "Calling.");
  ASSERT_EQ(m.calls.size(), 2u);
  EXPECT_EQ(m.calls[0].id, "abc123XYZ");
  EXPECT_EQ(m.calls[1].id.size(), 9u);  // a new id its template accepts
  EXPECT_NE(m.calls[1].id, "bad id");
}

ToolRequest WeatherTools(ToolChoice choice, bool parallel) {
  ToolRequest t;
  t.tools = ojson::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 8},
                     "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time"}}])");
  t.choice = choice;
  t.function = choice == ToolChoice::kNamed ? "get_time" : "";
  t.parallel = parallel;
  return t;
}

bool GrammarAccepts(const std::string& gbnf, std::string_view text) {
  StatusOr<std::shared_ptr<const Grammar>> grammar = ParseGbnf(gbnf);
  EXPECT_TRUE(grammar.ok()) << grammar.status().ToString() << "\n" << gbnf;
  if (!grammar.ok()) return false;
  GrammarMatcher matcher(*grammar);
  const GrammarMatcher::StateId end = matcher.NextBytes(matcher.current(), text);
  return end != GrammarMatcher::kDead && matcher.IsAccepting(end);
}

TEST(ToolCallGrammarTest, ForcedCallsInEachFamilysSyntaxParseBackAsCalls) {
  struct Case {
    ToolCallFormat format;
    std::string call;  // one call of get_weather as the family writes it
    std::string two;   // two calls, where the family writes several
  };
  const std::string args = R"({"city": "Oslo", "unit": "c"})";
  const Case cases[] = {
      {ToolCallFormat::kHermes,
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args + "}\n</tool_call>",
       "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": " + args +
           "}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>"},
      {ToolCallFormat::kLlama3, "{\"name\": \"get_weather\", \"parameters\": " + args + "}", ""},
      {ToolCallFormat::kMistral,
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + args +
           ", \"id\": \"a1b2c3d4e\"}]",
       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": " + args +
           ", \"id\": \"a1b2c3d4e\"}, {\"name\": \"get_time\", \"arguments\": {}, \"id\": "
           "\"zzzzzzzzz\"}]"},
      {ToolCallFormat::kNone, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": " +
                                  args + "}]}",
       ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(static_cast<int>(c.format));
    std::string gbnf;
    ASSERT_FALSE(ToolCallGrammar(WeatherTools(ToolChoice::kRequired, true), c.format, &gbnf));
    EXPECT_TRUE(GrammarAccepts(gbnf, c.call)) << gbnf;
    EXPECT_EQ(ParseToolCalls(c.call, c.format).tool_calls.size(), 1u);
    if (!c.two.empty()) {
      EXPECT_TRUE(GrammarAccepts(gbnf, c.two)) << gbnf;
      EXPECT_EQ(ParseToolCalls(c.two, c.format).tool_calls.size(), 2u);
    }
    // What the schema refuses, the grammar refuses: an unknown function, a city past maxLength,
    // a unit outside the enum, text before the call.
    std::string bad = c.call;
    bad.replace(bad.find("get_weather"), 11, "get_wether");
    EXPECT_FALSE(GrammarAccepts(gbnf, bad));
    bad = c.call;
    bad.replace(bad.find("Oslo"), 4, "Oslo-Gardermoen");
    EXPECT_FALSE(GrammarAccepts(gbnf, bad));
    bad = c.call;
    bad.replace(bad.find("\"c\""), 3, "\"k\"");
    EXPECT_FALSE(GrammarAccepts(gbnf, bad));
    EXPECT_FALSE(GrammarAccepts(gbnf, "Sure! " + c.call));
    // Named: only that function.
    ASSERT_FALSE(ToolCallGrammar(WeatherTools(ToolChoice::kNamed, false), c.format, &gbnf));
    EXPECT_FALSE(GrammarAccepts(gbnf, c.call));
  }
  std::string gbnf;
  ASSERT_FALSE(ToolCallGrammar(WeatherTools(ToolChoice::kRequired, false), ToolCallFormat::kHermes,
                               &gbnf));
  EXPECT_FALSE(GrammarAccepts(gbnf, cases[0].two));  // parallel off: one call
  ASSERT_FALSE(ToolCallGrammar(WeatherTools(ToolChoice::kAuto, true), ToolCallFormat::kHermes,
                               &gbnf));
  EXPECT_EQ(gbnf, "");  // auto: the model decides
}

// Qwen3-Coder / Qwen3.5's XML tags: the forced call's grammar writes each parameter as the
// template does (a string bare, within its maxLength; an enum's word; JSON otherwise), and what
// it accepts parses back to the call.
TEST(ToolCallGrammarTest, ForcedXmlFunctionCallsParseBackTyped) {
  ToolRequest t = WeatherTools(ToolChoice::kRequired, true);
  t.tools[0]["function"]["parameters"]["properties"]["days"] = {{"type", "integer"},
                                                                 {"minimum", 1}};
  std::string gbnf;
  ASSERT_FALSE(ToolCallGrammar(t, ToolCallFormat::kXmlFunction, &gbnf));
  const std::string call =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
      "<parameter=unit>\nc\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
      "</tool_call>";
  EXPECT_TRUE(GrammarAccepts(gbnf, call)) << gbnf;
  const std::string time = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>";
  EXPECT_TRUE(GrammarAccepts(gbnf, call + "\n" + time));
  // days is optional; city and unit are not.
  std::string without_days = call;
  without_days.erase(without_days.find("<parameter=days>"),
                     std::string("<parameter=days>\n3\n</parameter>\n").size());
  EXPECT_TRUE(GrammarAccepts(gbnf, without_days));
  std::string bad = call;
  bad.erase(bad.find("<parameter=city>"), std::string("<parameter=city>\nOslo\n</parameter>\n").size());
  EXPECT_FALSE(GrammarAccepts(gbnf, bad));
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"Oslo", "Oslo-Gardermoen"}, {"\nc\n", "\nk\n"}, {"\n3\n", "\n0\n"},
           {"\n3\n", "\nthree\n"}, {"get_weather", "get_wether"}}) {
    bad = call;
    bad.replace(bad.find(from), from.size(), to);
    EXPECT_FALSE(GrammarAccepts(gbnf, bad)) << to;
  }
  ReplyOptions o;
  o.parse_tools = true;
  o.format = ToolCallFormat::kXmlFunction;
  o.parameter_types = ParameterTypes(t);
  const ReplyDelta d = SplitReply(call, o);
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(d.calls[0].arguments),
            nlohmann::json({{"city", "Oslo"}, {"unit", "c"}, {"days", 3}}));
  ASSERT_FALSE(ToolCallGrammar(WeatherTools(ToolChoice::kNamed, false),
                               ToolCallFormat::kXmlFunction, &gbnf));
  EXPECT_FALSE(GrammarAccepts(gbnf, call));
  EXPECT_TRUE(GrammarAccepts(gbnf, time));
  EXPECT_FALSE(GrammarAccepts(gbnf, time + "\n" + time));  // parallel off
}

TEST(ToolRequestTest, ToolChoiceIsCheckedAgainstTheTools) {
  ToolRequest t;
  auto read = [&](const char* body) {
    t = ToolRequest();
    return ReadToolRequest(ojson::parse(body), &t);
  };
  const char* tools = R"("tools": [{"type": "function", "function": {"name": "f"}}])";
  auto unknown = read((std::string("{") + tools +
                       R"(, "tool_choice": {"type": "function", "function": {"name": "g"}}})")
                          .c_str());
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->param, "tool_choice");
  EXPECT_NE(unknown->message.find("\"g\""), std::string::npos) << unknown->message;
  auto required = read(R"({"tool_choice": "required"})");
  ASSERT_TRUE(required);
  EXPECT_NE(required->message.find("needs 'tools'"), std::string::npos);
  EXPECT_TRUE(read(R"({"tool_choice": "sometimes"})"));
  EXPECT_TRUE(read(R"({"tools": [{"type": "function", "function": {}}]})"));
  EXPECT_TRUE(read(R"({"reasoning_format": "hidden"})"));
  EXPECT_FALSE(read((std::string("{") + tools + R"(, "tool_choice": "none"})").c_str()));
  EXPECT_FALSE(t.uses_tools());
  EXPECT_FALSE(read((std::string("{") + tools + R"(, "parallel_tool_calls": false})").c_str()));
  EXPECT_TRUE(t.uses_tools());
  EXPECT_FALSE(t.parallel);
  // A parameters schema the grammar cannot enforce: a 400 naming the keyword.
  ASSERT_FALSE(read(R"({"tools": [{"type": "function", "function": {"name": "f", "parameters":
                 {"type": "object", "properties": {"x": {"type": "integer", "multipleOf": 3}}}}}],
                 "tool_choice": "required"})"));
  std::string gbnf;
  auto uncompilable = ToolCallGrammar(t, ToolCallFormat::kHermes, &gbnf);
  ASSERT_TRUE(uncompilable);
  EXPECT_EQ(uncompilable->param, "tools");
  EXPECT_NE(uncompilable->message.find("multipleOf"), std::string::npos) << uncompilable->message;
}

}  // namespace
}  // namespace kvl::server
