// /metrics exports the cost model's prediction error per action that brought pages back, as valid
// Prometheus gauges, and nothing for actions that brought none back.
#include <gtest/gtest.h>

#include "prometheus_check.h"
#include "server/server_metrics.h"

namespace kvl {
namespace {

TEST(ServerMetricsPredictionTest, PredictionErrorGaugesPerAction) {
  EngineMetrics m;
  KvPredictionError& e = m.kv_actions[static_cast<size_t>(KvAction::kDemoteRam)].error;
  e.samples = 12;
  e.median_pct = 10.5;
  e.p90_pct = 42.25;
  const std::string text = server::ServerMetrics().Render(m);
  const testing::PrometheusCheck check = testing::CheckPrometheusText(text);
  EXPECT_TRUE(check.errors.empty()) << check.errors.front();
  EXPECT_EQ(check.types.at("kvl:kv_prediction_error_median_percent"), "gauge");
  EXPECT_NE(text.find("kvl:kv_prediction_error_median_percent{action=\"demote-ram\"} 10.5\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("kvl:kv_prediction_error_p90_percent{action=\"demote-ram\"} 42.25\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("kv_prediction_error_median_percent{action=\"demote-disk\"}"),
            std::string::npos);
}

}  // namespace
}  // namespace kvl
