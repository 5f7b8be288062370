// The chat templates against the prompt strings they must produce, and their detection from the
// Jinja sources models ship.
#include "kvl/chat_template.h"

#include <gtest/gtest.h>

namespace kvl {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Name?"}};

std::string Apply(ChatTemplate t, const std::vector<ChatMessage>& messages = kConversation) {
  StatusOr<std::string> prompt = ApplyChatTemplate(t, messages);
  EXPECT_TRUE(prompt.ok()) << prompt.status().ToString();
  return prompt.ok() ? *prompt : "";
}

TEST(ChatTemplateTest, PlainJoinsContentsAndLeavesOneMessageAsItIs) {
  EXPECT_EQ(Apply(ChatTemplate::kPlain), "You are terse.\nHi\nHello.\nName?");
  EXPECT_EQ(Apply(ChatTemplate::kPlain, {{"user", "Once upon a time"}}), "Once upon a time");
}

TEST(ChatTemplateTest, EachTemplateWritesTheConversationAsItsModelsExpect) {
  const std::pair<ChatTemplate, std::string> kExpected[] = {
      {ChatTemplate::kChatMl,
       "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
       "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nName?<|im_end|>\n"
       "<|im_start|>assistant\n"},
      {ChatTemplate::kLlama2,
       "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] Name? "
       "[/INST]"},
      {ChatTemplate::kMistral, "[INST] You are terse.\n\nHi [/INST] Hello.</s>[INST] Name? [/INST]"},
      {ChatTemplate::kZephyr,
       "<|system|>\nYou are terse.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello.</s>\n"
       "<|user|>\nName?</s>\n<|assistant|>\n"},
      {ChatTemplate::kLlama3,
       "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nName?<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
  };
  for (const auto& [t, expected] : kExpected) EXPECT_EQ(Apply(t), expected) << ChatTemplateName(t);
}

TEST(ChatTemplateTest, GemmaFoldsTheSystemIntoTheFirstUserTurn) {
  EXPECT_EQ(Apply(ChatTemplate::kGemma),
            "<start_of_turn>user\nYou are terse.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
            "Hello.<end_of_turn>\n<start_of_turn>user\nName?<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ChatTemplateTest, DeveloperIsReadAsSystem) {
  EXPECT_EQ(Apply(ChatTemplate::kChatMl, {{"developer", "Be kind."}}),
            "<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, UnknownRoleAndNoMessagesAreRefusedByEveryTemplate) {
  for (ChatTemplate t : {ChatTemplate::kPlain, ChatTemplate::kLlama2, ChatTemplate::kChatMl,
                         ChatTemplate::kZephyr, ChatTemplate::kMistral, ChatTemplate::kLlama3,
                         ChatTemplate::kGemma}) {
    EXPECT_FALSE(ApplyChatTemplate(t, {{"wizard", "x"}}).ok()) << ChatTemplateName(t);
    EXPECT_FALSE(ApplyChatTemplate(t, {}).ok()) << ChatTemplateName(t);
  }
}

TEST(ChatTemplateTest, DetectsTemplatesByTheirMarkers) {
  // Excerpts of the templates these model families ship in tokenizer.chat_template.
  EXPECT_EQ(DetectChatTemplate("{% for message in messages %}{{'<|im_start|>' + message['role'] "
                               "+ '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"),
            ChatTemplate::kChatMl);
  EXPECT_EQ(DetectChatTemplate("{{ bos_token + '[INST] ' + '<<SYS>>\\n' + system_message + "
                               "'\\n<</SYS>>\\n\\n' }}"),
            ChatTemplate::kLlama2);
  EXPECT_EQ(DetectChatTemplate("{{ '[INST] ' + message['content'] + ' [/INST]' }}"),
            ChatTemplate::kMistral);
  EXPECT_EQ(DetectChatTemplate("{{ '<|user|>\\n' + message['content'] + eos_token }}"
                               "{{ '<|assistant|>' }}"),
            ChatTemplate::kZephyr);
  EXPECT_EQ(DetectChatTemplate("{% set content = '<|start_header_id|>' + message['role'] + "
                               "'<|end_header_id|>\\n\\n' %}"),
            ChatTemplate::kLlama3);
  EXPECT_EQ(DetectChatTemplate("{{ '<start_of_turn>' + role + '\\n' }}"), ChatTemplate::kGemma);
  EXPECT_EQ(DetectChatTemplate(""), ChatTemplate::kPlain);
  EXPECT_EQ(DetectChatTemplate("{{ messages }}"), ChatTemplate::kPlain);
}

TEST(ChatTemplateTest, NamesRoundTripAndUnknownNamesAreRefused) {
  for (std::string_view name : {"plain", "llama2", "chatml", "zephyr", "mistral", "llama3", "gemma"}) {
    StatusOr<ChatTemplate> t = ParseChatTemplateName(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ(ChatTemplateName(*t), name);
  }
  EXPECT_FALSE(ParseChatTemplateName("jinja").ok());
}

}  // namespace
}  // namespace kvl

namespace kvl {
namespace {

jinja::Value Messages(std::initializer_list<std::pair<const char*, const char*>> turns) {
  std::vector<jinja::Value> out;
  for (const auto& [role, content] : turns) {
    jinja::ValueMap m;
    m.Set("role", jinja::Value::String(role));
    m.Set("content", jinja::Value::String(content));
    out.push_back(jinja::Value::Object(std::move(m)));
  }
  return jinja::Value::Array(std::move(out));
}

TEST(ChatFormatterTest, RendersTheModelsJinjaTemplateAndDropsTheBosTheTokenizerAdds) {
  const char* kLlama3 =
      "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
      "{{ m.content | trim }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
      "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
  std::string reason;
  ChatFormatterOptions options{"<|begin_of_text|>", "<|eot_id|>", /*strip_bos=*/false};
  ChatFormatter f = ChatFormatter::ForModel(kLlama3, options, &reason);
  EXPECT_TRUE(f.is_jinja());
  EXPECT_EQ(reason, "");
  ChatInputs inputs;
  inputs.messages = Messages({{"user", " Hi \n"}});
  EXPECT_EQ(*f.Apply(inputs),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  options.strip_bos = true;
  f = ChatFormatter::ForModel(kLlama3, options, &reason);
  EXPECT_EQ(f.Apply(inputs)->rfind("<|start_header_id|>user", 0), 0u);
}

TEST(ChatFormatterTest, TemplateThatFailsFallsBackToTheBuiltInItsMarkersName) {
  std::string reason;
  // `{% include %}` is not a statement chat templates may use: the ChatML built-in stands in.
  ChatFormatter f = ChatFormatter::ForModel("{% include 'x' %}<|im_start|>", {}, &reason);
  EXPECT_FALSE(f.is_jinja());
  EXPECT_EQ(f.description(), "chatml");
  EXPECT_NE(reason.find("unknown statement '{% include %}'"), std::string::npos) << reason;
  // One that parses but cannot render a one-message conversation falls back too.
  f = ChatFormatter::ForModel("{{ messages | frobnicate }}[INST]", {}, &reason);
  EXPECT_EQ(f.description(), "mistral");
  EXPECT_NE(reason.find("unknown filter 'frobnicate'"), std::string::npos) << reason;
  ChatFormatter::ForModel("", {}, &reason);
  EXPECT_EQ(reason, "the model has no tokenizer.chat_template");
}

TEST(ChatFormatterTest, ErrorsTheTemplateRaisesNameTheirCause) {
  StatusOr<ChatFormatter> f = ChatFormatter::FromJinja(
      "{% if messages | length > 1 %}{{ raise_exception('only one turn, please') }}{% endif %}"
      "{{ messages[0].content }}",
      "test.jinja", {});
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ChatInputs inputs;
  inputs.messages = Messages({{"user", "a"}, {"user", "b"}});
  StatusOr<std::string> out = f->Apply(inputs);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().message(), "chat template: template line 1: raise_exception: only one turn, please");
  EXPECT_FALSE(ChatFormatter::FromJinja("{% if x %}", "bad.jinja", {}).ok());
}

}  // namespace
}  // namespace kvl
