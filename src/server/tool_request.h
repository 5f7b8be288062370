// A chat request's tool fields (issue 42): `tools`, `tool_choice`, `parallel_tool_calls`, and
// `reasoning_format`, validated, and for tool_choice "required" or a named function the grammar
// that makes the reply a call: each tool's `parameters` schema (kvl/json_schema_grammar.h)
// inside the call syntax of the template's family, so that even an untrained model writes a
// call the parser (tool_calls.h) reads back. Nothing here touches the engine.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "api_request.h"
#include "reply_splitter.h"
#include "tool_calls.h"

namespace kvl::server {

enum class ToolChoice { kNone, kAuto, kRequired, kNamed };

struct ToolRequest {
  nlohmann::ordered_json tools = nlohmann::ordered_json::array();  // as sent, validated
  ToolChoice choice = ToolChoice::kAuto;
  std::string function;  // kNamed: the function's name
  bool parallel = true;  // parallel_tool_calls
  bool split_reasoning = true;  // reasoning_format: "none" keeps the reasoning in the content
  // Tools are rendered into the prompt and the reply parsed for calls.
  bool uses_tools() const { return !tools.empty() && choice != ToolChoice::kNone; }
};

// Reads and checks the fields; 400s name the field (an unknown function in tool_choice by its
// name, "required" without tools, a tool without a function name).
std::optional<ApiError> ReadToolRequest(const nlohmann::ordered_json& body, ToolRequest* out);

// The GBNF that forces a call for tool_choice required / named, in `format`'s syntax (at most
// kMaxForcedCalls calls where parallel calls are allowed). A parameters schema the grammar
// layer cannot compile is a 400 naming the tool and the keyword. Empty for auto and none.
std::optional<ApiError> ToolCallGrammar(const ToolRequest& tools, ToolCallFormat format,
                                        std::string* gbnf);
inline constexpr int kMaxForcedCalls = 4;

// The tools' declared parameter types (tool_calls.h), for reading XML-tag calls back.
ToolParameterTypes ParameterTypes(const ToolRequest& tools);

}  // namespace kvl::server
