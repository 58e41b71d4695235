//===- gtest_skip_main.cpp - gtest main that reports skips to ctest -------===//
//
// gtest exits 0 when every test it ran was skipped, so ctest would count a
// GPU test that never touched a GPU as passed. This main exits 77 (the
// SKIP_RETURN_CODE every unit test is registered with) when tests were
// skipped and none passed or failed, and names the skipped tests with the
// reason of each. A binary where some tests ran and others were skipped
// still passes and prints the skipped ones; the CMake files register GPU
// variants as tests of their own, so that case is left to non-GPU skips.
//
//===----------------------------------------------------------------------===//
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace {

/// The message of the GTEST_SKIP() that skipped `info` (first line only).
std::string skipReason(const testing::TestInfo &info) {
  const testing::TestResult *result = info.result();
  for (int i = 0; i < result->total_part_count(); ++i) {
    const testing::TestPartResult &part = result->GetTestPartResult(i);
    if (part.skipped()) {
      std::string message = part.message();
      return message.substr(0, message.find('\n'));
    }
  }
  return "";
}

void printSkipped(const testing::UnitTest &unit) {
  for (int s = 0; s < unit.total_test_suite_count(); ++s) {
    const testing::TestSuite *suite = unit.GetTestSuite(s);
    for (int t = 0; t < suite->total_test_count(); ++t) {
      const testing::TestInfo *info = suite->GetTestInfo(t);
      if (!info->should_run() || !info->result()->Skipped())
        continue;
      std::string reason = skipReason(*info);
      std::printf("actplace: skipped %s.%s%s%s\n", info->test_suite_name(),
                  info->name(), reason.empty() ? "" : ": ", reason.c_str());
    }
  }
}

} // namespace

int main(int argc, char **argv) {
  testing::InitGoogleTest(&argc, argv);
  int rc = RUN_ALL_TESTS();
  const testing::UnitTest &unit = *testing::UnitTest::GetInstance();
  if (rc != 0 || unit.failed_test_count() > 0)
    return rc != 0 ? rc : 1;
  if (GTEST_FLAG_GET(list_tests))
    return 0;
  int skipped = unit.skipped_test_count();
  int passed = unit.successful_test_count();
  if (passed == 0 && skipped == 0) {
    // A filter in the CMake registration that matches nothing is a
    // registration bug, not a skip.
    std::printf("actplace: no test ran (filter '%s' matched none)\n",
                GTEST_FLAG_GET(filter).c_str());
    return 1;
  }
  if (skipped == 0)
    return 0;
  printSkipped(unit);
  if (passed == 0) {
    std::printf("actplace: all %d tests skipped; exit code 77 (ctest: "
                "Skipped)\n",
                skipped);
    std::fflush(stdout);
    return 77;
  }
  std::printf("actplace: %d of %d tests skipped, %d passed\n", skipped,
              skipped + passed, passed);
  return 0;
}
