// A kvl synth shape written to a temporary file and loaded (the file removed again): the model
// tests' way to get each architecture's config as Model::Load reads it.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "kvl/model.h"
#include "kvl/synthetic_model.h"

namespace kvl::testing {

inline std::unique_ptr<Model> LoadShape(const std::string& shape, const std::string& type = "f32") {
  SynthOptions o;
  o.shape = FindModelShape(shape).value();
  EXPECT_TRUE(ParseSynthType(type, &o));
  o.output_path = ::testing::TempDir() + "/arch-" + shape + "-" + type + ".gguf";
  Status written = WriteSyntheticModel(o);
  EXPECT_TRUE(written.ok()) << written.ToString();
  StatusOr<std::unique_ptr<Model>> m = Model::Load(o.output_path);
  EXPECT_TRUE(m.ok()) << shape << ": " << m.status().ToString();
  std::filesystem::remove(o.output_path);
  return m.ok() ? std::move(*m) : nullptr;
}

}  // namespace kvl::testing
