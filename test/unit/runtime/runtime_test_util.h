//===- runtime_test_util.h - Test helpers -----------------------*- C++ -*-===//
//
// Backend-parameterised fixtures: every test runs on the host backend and,
// where a GPU is usable, on the cuda backend (skipped otherwise, e.g. in CI
// which has the CUDA libraries but no driver).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_RUNTIME_RUNTIME_TEST_UTIL_H
#define ACTPLACE_TEST_UNIT_RUNTIME_RUNTIME_TEST_UTIL_H

#include "runtime/device.h"
#include "runtime/error.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace ap::rt::test {

/// Whether a cuda backend can be created here (checked once).
inline bool cudaUsable() {
  static const bool usable = [] {
    std::string why;
    return createCudaBackend(0, &why) != nullptr;
  }();
  return usable;
}

/// Fixture parameterised on the backend; skips cuda without a GPU.
class BackendTest : public ::testing::TestWithParam<DeviceKind> {
protected:
  void SetUp() override {
    if (GetParam() == DeviceKind::Cuda && !cudaUsable())
      GTEST_SKIP() << "no usable GPU: cuda-backend variant skipped";
    DeviceOptions options;
    options.device = GetParam();
    options.quiet = true;
    device = std::make_unique<Device>(options);
    ASSERT_EQ(device->kind(), GetParam());
  }
  std::unique_ptr<Device> device;
};

inline std::string
backendName(const ::testing::TestParamInfo<DeviceKind> &info) {
  return deviceKindName(info.param);
}

#define AP_RT_INSTANTIATE_BACKENDS(Suite)                                      \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite,                                    \
                           ::testing::Values(::ap::rt::DeviceKind::Host,       \
                                             ::ap::rt::DeviceKind::Cuda),      \
                           ::ap::rt::test::backendName)

/// Random, never-zero-filled test data.
inline std::vector<uint8_t> randomBytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> out(n);
  for (auto &b : out)
    b = static_cast<uint8_t>(gen());
  return out;
}

/// Blocks a stream until opened: enqueue wait() as a host callback to hold
/// back everything behind it, so a test can observe "not yet complete".
/// Opens itself on destruction so a failing test never deadlocks teardown.
class Gate {
public:
  ~Gate() { open(); }
  void open() { open_->store(true, std::memory_order_release); }
  /// The callback to enqueue. It shares the flag, so it may outlive the Gate.
  std::function<void()> waiter() {
    return [flag = open_] {
      auto deadline =
          std::chrono::steady_clock::now() + std::chrono::seconds(30);
      while (!flag->load(std::memory_order_acquire) &&
             std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    };
  }

private:
  std::shared_ptr<std::atomic<bool>> open_ =
      std::make_shared<std::atomic<bool>>(false);
};

/// Expects `stmt` to throw ap::rt::Error whose message contains `needle`.
#define EXPECT_RT_ERROR(stmt, needle)                                          \
  do {                                                                         \
    try {                                                                      \
      stmt;                                                                    \
      ADD_FAILURE() << "expected an ap::rt::Error containing '" << (needle)    \
                    << "'";                                                    \
    } catch (const ::ap::rt::Error &e) {                                       \
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)         \
          << "message: " << e.what();                                          \
    }                                                                          \
  } while (0)

} // namespace ap::rt::test

#endif // ACTPLACE_TEST_UNIT_RUNTIME_RUNTIME_TEST_UTIL_H
