#!/usr/bin/env bash
# Runs the sanitized test binaries of BUILD_DIR (the ones named after it), two at a time, and
# fails if any test fails or any sanitizer reports (ASan aborts; UBSan halts on its first report).
set -uo pipefail
build="$1"
shift
# allocator_may_return_null: tests ask for impossible sizes on purpose and expect a clean error.
# Every report goes to a file of its own under $reports, from the test binaries and from the kvl
# processes they start (a `kvl serve` whose stderr the test captures would otherwise hide its
# report: the test sees only a connection that closed).
reports="$build/sanitizer-reports"
rm -rf "$reports"
mkdir -p "$reports"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:allocator_may_return_null=1:log_path=$reports/asan"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:log_path=$reports/ubsan"
status=0
# Left to the plain build's ctest: a load test whose streams must produce tokens while /health is
# probed; the sanitized server is too slow to generate any in its window.
excluded='-HttpTransportTest.HealthAndMetricsAnswerUnderStreamsAndSlowloris'
pids=()
names=()
for t in "$@"; do
  log="$build/$t.sanitized.log"
  (cd "$build" && "./$t" --gtest_brief=1 "--gtest_filter=$excluded" >"$(basename "$log")" 2>&1) &
  pids+=($!)
  names+=("$t")
  # Two at a time: the machine has two cores.
  if [ "${#pids[@]}" -ge 2 ]; then
    wait "${pids[0]}" || { echo "sanitize: ${names[0]} FAILED (log: $build/${names[0]}.sanitized.log)"; tail -40 "$build/${names[0]}.sanitized.log"; status=1; }
    pids=("${pids[@]:1}")
    names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || { echo "sanitize: ${names[$i]} FAILED (log: $build/${names[$i]}.sanitized.log)"; tail -40 "$build/${names[$i]}.sanitized.log"; status=1; }
done
for t in "$@"; do
  echo "sanitize: $t: $(grep -E '^\[  PASSED  \]|^\[  FAILED  \]' "$build/$t.sanitized.log" | tr '\n' ' ')"
done
for report in "$reports"/*; do
  [ -e "$report" ] || continue
  echo "sanitize: a sanitizer report ($report):"
  head -60 "$report"
  status=1
done
exit $status
