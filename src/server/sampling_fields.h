// A completion request's sampling fields: OpenAI's, vLLM's and llama-server's names for them,
// with each endpoint's defaults, read into SamplingParams.
#pragma once

#include <optional>

#include "api_request.h"
#include "field_reader.h"
#include "kvl/sampling.h"

namespace kvl::server {

// OpenAI's defaults on /v1/* (temperature 1, top_p 1, top-k, min-p and penalties off, the
// frequency and presence penalties over the generated tokens); llama-server's on /completion
// (SamplingParams' own defaults, those penalties over the repeat_last_n window). llama-server's
// `samplers` list turns off the samplers it leaves out, and is refused where it asks for an
// order or a sampler this chain does not have.
std::optional<ApiError> ReadSamplingFields(FieldReader& fields, Endpoint endpoint,
                                           const ApiContext& context, SamplingParams* out);

}  // namespace kvl::server
