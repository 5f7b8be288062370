// Tool fields and forced-call grammars: see tool_request.h.
#include "tool_request.h"

#include <fmt/format.h>

#include <algorithm>

#include "json_body.h"
#include "kvl/json_schema_grammar.h"

namespace kvl::server {
namespace {

using json = nlohmann::ordered_json;
using json_schema::GbnfLiteral;

ApiError Bad(std::string_view param, std::string message) {
  return ApiError{400, std::move(message), "invalid_request_error", std::string(param), ""};
}

const json* Field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

std::optional<ApiError> ReadTools(const json& tools, ToolRequest* out) {
  if (!tools.is_array()) return Bad("tools", "'tools' must be an array");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& tool = tools[i];
    const std::string param = fmt::format("tools[{}]", i);
    if (!tool.is_object()) return Bad(param, fmt::format("'{}' must be an object", param));
    if (tool.contains("type") && tool["type"] != "function") {
      return Bad(param + ".type", fmt::format("'{}.type' must be \"function\"", param));
    }
    if (!tool.contains("function") || !tool["function"].is_object()) {
      return Bad(param + ".function", fmt::format("'{}.function' must be an object", param));
    }
    const json& function = tool["function"];
    if (!function.contains("name") || !function["name"].is_string() ||
        function["name"].get_ref<const std::string&>().empty()) {
      return Bad(param + ".function.name",
                 fmt::format("'{}.function.name' must be a non-empty string", param));
    }
    if (function.contains("parameters") && !function["parameters"].is_null() &&
        !function["parameters"].is_object()) {
      return Bad(param + ".function.parameters",
                 fmt::format("'{}.function.parameters' must be a JSON schema object", param));
    }
  }
  out->tools = tools;
  return std::nullopt;
}

bool HasFunction(const json& tools, const std::string& name) {
  for (const json& tool : tools) {
    if (tool["function"]["name"] == name) return true;
  }
  return false;
}

std::optional<ApiError> ReadChoice(const json& choice, ToolRequest* out) {
  if (choice.is_string()) {
    const std::string& text = choice.get_ref<const std::string&>();
    if (text == "none") {
      out->choice = ToolChoice::kNone;
    } else if (text == "auto") {
      out->choice = ToolChoice::kAuto;
    } else if (text == "required") {
      out->choice = ToolChoice::kRequired;
    } else {
      return Bad("tool_choice", fmt::format("'tool_choice' {} is not \"none\", \"auto\", "
                                            "\"required\" or {{\"type\": \"function\", "
                                            "\"function\": {{\"name\": ...}}}}",
                                            BoundedQuote(text)));
    }
  } else if (choice.is_object() && choice.contains("function") && choice["function"].is_object() &&
             choice["function"].contains("name") && choice["function"]["name"].is_string()) {
    out->choice = ToolChoice::kNamed;
    out->function = choice["function"]["name"].get<std::string>();
    if (!HasFunction(out->tools, out->function)) {
      return Bad("tool_choice", fmt::format("'tool_choice' names the function {}, which is not "
                                            "among 'tools'",
                                            BoundedQuote(out->function)));
    }
  } else {
    return Bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or "
                              "{\"type\": \"function\", \"function\": {\"name\": ...}}");
  }
  if ((out->choice == ToolChoice::kRequired) && out->tools.empty()) {
    return Bad("tool_choice", "'tool_choice' \"required\" needs 'tools'");
  }
  return std::nullopt;
}

// One call of `tool` as a JSON object, its keys in the family's order.
json CallSchema(const json& tool, ToolCallFormat format) {
  const json& function = tool["function"];
  json parameters = function.contains("parameters") && !function["parameters"].is_null()
                        ? function["parameters"]
                        : json{{"type", "object"}, {"properties", json::object()}};
  json properties = json::object();
  properties["name"] = {{"const", function["name"]}};
  properties[format == ToolCallFormat::kLlama3 ? "parameters" : "arguments"] = parameters;
  json required = json::array({"name", format == ToolCallFormat::kLlama3 ? "parameters"
                                                                          : "arguments"});
  if (format == ToolCallFormat::kMistral) {
    // Mistral's templates refuse a call whose id is not 9 letters and digits.
    properties["id"] = {{"type", "string"}, {"pattern", "^[a-zA-Z0-9]{9}$"}};
    required.push_back("id");
  }
  return {{"type", "object"},
          {"properties", std::move(properties)},
          {"required", std::move(required)},
          {"additionalProperties", false}};
}

// The longest string value a forced XML-tag call may write (JSON strings are bounded the same
// way by the schema grammar; a bare text value has no closing quote to end it).
constexpr int kMaxXmlTextValue = 4096;

// Whether the templates write a parameter's value as bare text: a string, or (no type given)
// one of string words or a string constant (`args_value | string`).
bool IsTextParameter(const json& schema) {
  if (!schema.is_object()) return false;
  if (schema.contains("type")) return schema["type"] == "string";
  auto all_strings = [](const json& words) {
    return words.is_array() && !words.empty() &&
           std::all_of(words.begin(), words.end(), [](const json& w) { return w.is_string(); });
  };
  return (schema.contains("enum") && all_strings(schema["enum"])) ||
         (schema.contains("const") && schema["const"].is_string());
}

// A forced call in the XML-tag format (Qwen3-Coder, Qwen3.5): per tool, its parameters in the
// schema's order, the required ones always and the others optionally; a string parameter's
// value is bare text without '<' within its length bounds (its enum's words where it has one; a
// `pattern` is not enforced on bare text: the pattern compiler writes JSON strings), any other a
// JSON value of its schema, compiled in one schema whose $defs the rules refer to
// ("ref-<name>").
StatusOr<std::string> XmlCallGrammar(const ToolRequest& tools) {
  json defs = json::object();
  json refs = json::array();
  std::string calls, rules;
  int tool_index = 0;
  for (const json& tool : tools.tools) {
    const json& function = tool["function"];
    if (tools.choice == ToolChoice::kNamed && function["name"] != tools.function) continue;
    const json parameters = function.contains("parameters") && function["parameters"].is_object()
                                ? function["parameters"]
                                : json::object();
    const json properties = parameters.contains("properties") ? parameters["properties"]
                                                              : json::object();
    const json required = parameters.contains("required") ? parameters["required"] : json::array();
    const std::string rule = fmt::format("kvl-xml-call-{}", tool_index);
    std::string body =
        GbnfLiteral("<tool_call>\n<function=" + function["name"].get<std::string>() + ">\n");
    int property_index = 0;
    for (const auto& [key, schema] : properties.items()) {
      std::string value;
      if (IsTextParameter(schema)) {
        if (schema.contains("enum")) {
          for (const json& word : schema["enum"]) {
            value += (value.empty() ? "(" : " | ") + GbnfLiteral(word.get<std::string>());
          }
          value += ")";
        } else if (schema.contains("const")) {
          value = GbnfLiteral(schema["const"].get<std::string>());
        } else {
          value = fmt::format("[^<]{{{},{}}}", schema.value("minLength", 0),
                              std::min(schema.value("maxLength", kMaxXmlTextValue),
                                       kMaxXmlTextValue));
        }
      } else {
        const std::string name = fmt::format("kvl-xml-{}-{}", tool_index, property_index);
        defs[name] = schema;
        refs.push_back({{"$ref", "#/$defs/" + name}});
        value = "ref-" + name;
      }
      std::string part = GbnfLiteral("<parameter=" + key + ">\n") + " " + value + " " +
                         GbnfLiteral("\n</parameter>\n");
      const bool is_required = std::find(required.begin(), required.end(), key) != required.end();
      body += " " + (is_required ? part : "(" + part + ")?");
      ++property_index;
    }
    body += " " + GbnfLiteral("</function>\n</tool_call>");
    rules += rule + " ::= " + body + "\n";
    calls += (calls.empty() ? "" : " | ") + rule;
    ++tool_index;
  }
  if (!refs.empty()) {
    StatusOr<std::string> values =
        JsonSchemaToGbnf(json{{"$defs", std::move(defs)}, {"anyOf", std::move(refs)}});
    if (!values.ok()) return values.status();
    // Its root (any one of the values) is renamed out of the way; the rules it refers to are
    // the ones the calls use.
    constexpr std::string_view kRoot = "root ::= ";
    std::string value_rules = std::move(*values);
    if (value_rules.starts_with(kRoot)) value_rules.replace(0, kRoot.size(), "kvl-xml-values ::= ");
    rules += value_rules;
  }
  const int more = tools.parallel ? kMaxForcedCalls - 1 : 0;
  return fmt::format("root ::= kvl-xml-call (\"\\n\" kvl-xml-call){{0,{}}}\n"
                     "kvl-xml-call ::= {}\n{}",
                     more, calls, rules);
}

}  // namespace

std::optional<ApiError> ReadToolRequest(const json& body, ToolRequest* out) {
  if (const json* tools = Field(body, "tools")) {
    if (auto e = ReadTools(*tools, out)) return e;
  }
  if (const json* choice = Field(body, "tool_choice")) {
    if (auto e = ReadChoice(*choice, out)) return e;
  }
  if (const json* parallel = Field(body, "parallel_tool_calls")) {
    if (!parallel->is_boolean()) {
      return Bad("parallel_tool_calls", "'parallel_tool_calls' must be a boolean");
    }
    out->parallel = parallel->get<bool>();
  }
  if (const json* format = Field(body, "reasoning_format")) {
    // llama-server's values: deepseek(-legacy) and auto split the reasoning out; none keeps it.
    static constexpr std::string_view kKnown[] = {"none", "auto", "deepseek", "deepseek-legacy"};
    const bool known =
        format->is_string() && std::find(std::begin(kKnown), std::end(kKnown),
                                         format->get_ref<const std::string&>()) != std::end(kKnown);
    if (!known) {
      return Bad("reasoning_format", fmt::format("'reasoning_format' must be \"none\", \"auto\", "
                                                 "\"deepseek\" or \"deepseek-legacy\", got {}",
                                                 DescribeValue(*format)));
    }
    out->split_reasoning = *format != "none";
  }
  return std::nullopt;
}

std::optional<ApiError> ToolCallGrammar(const ToolRequest& tools, ToolCallFormat format,
                                        std::string* gbnf) {
  gbnf->clear();
  if (tools.choice != ToolChoice::kRequired && tools.choice != ToolChoice::kNamed) {
    return std::nullopt;
  }
  if (format == ToolCallFormat::kXmlFunction) {
    StatusOr<std::string> grammar = XmlCallGrammar(tools);
    if (!grammar.ok()) {
      return Bad("tools", fmt::format("a tool's parameters cannot be enforced for "
                                      "'tool_choice': {}",
                                      grammar.status().message()));
    }
    *gbnf = std::move(*grammar);
    return std::nullopt;
  }
  json any_of = json::array();
  for (const json& tool : tools.tools) {
    if (tools.choice == ToolChoice::kNamed && tool["function"]["name"] != tools.function) continue;
    any_of.push_back(CallSchema(tool, format));
  }
  const json schema = any_of.size() == 1 ? any_of[0] : json{{"anyOf", std::move(any_of)}};
  StatusOr<std::string> call = JsonSchemaToGbnf(schema);
  if (!call.ok()) {
    return Bad("tools", fmt::format("a tool's parameters cannot be enforced for 'tool_choice': {}",
                                    call.status().message()));
  }
  // The schema's root becomes one call inside the family's syntax.
  constexpr std::string_view kRoot = "root ::= ";
  std::string rules = call->substr(kRoot.size());
  rules.insert(0, "kvl-call ::= ");
  const int more = tools.parallel ? kMaxForcedCalls - 1 : 0;
  std::string root;
  switch (format) {
    case ToolCallFormat::kXmlFunction:  // written above
    case ToolCallFormat::kHermes:
      root = fmt::format(
          "root ::= kvl-tagged-call (\"\\n\" kvl-tagged-call){{0,{}}}\n"
          "kvl-tagged-call ::= \"<tool_call>\\n\" kvl-call \"\\n</tool_call>\"\n",
          more);
      break;
    case ToolCallFormat::kMistral:
      root = fmt::format("root ::= \"[TOOL_CALLS][\" kvl-call (\",\" space kvl-call){{0,{}}} \"]\"\n",
                         more);
      break;
    case ToolCallFormat::kLlama3:
      root = "root ::= kvl-call\n";  // Llama 3.x writes one JSON call per reply
      break;
    case ToolCallFormat::kNone:
      root = more == 0 ? "root ::= kvl-call\n"
                       : fmt::format("root ::= \"{{\" space \"\\\"tool_calls\\\"\" space \":\" "
                                     "space \"[\" space kvl-call (\",\" space kvl-call){{0,{}}} "
                                     "\"]\" space \"}}\" space\n",
                                     more);
      break;
  }
  *gbnf = root + rules;
  return std::nullopt;
}

ToolParameterTypes ParameterTypes(const ToolRequest& tools) {
  ToolParameterTypes types;
  for (const json& tool : tools.tools) {
    const json& function = tool["function"];
    auto& declared = types[function["name"].get<std::string>()];
    if (!function.contains("parameters") || !function["parameters"].is_object()) continue;
    const json& parameters = function["parameters"];
    if (!parameters.contains("properties") || !parameters["properties"].is_object()) continue;
    for (const auto& [key, schema] : parameters["properties"].items()) {
      if (schema.is_object() && schema.contains("type") && schema["type"].is_string()) {
        declared[key] = schema["type"].get<std::string>();
      }
    }
  }
  return types;
}

}  // namespace kvl::server
