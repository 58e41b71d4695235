//===- random_data.h - random test inputs for kernel tests ----*- C++ -*-===//
//
// Seeded float64 inputs shared by the kernel tests (never zeros: kernels are
// checked on random data).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TEST_UNIT_KERNELS_RANDOM_DATA_H
#define ACTPLACE_TEST_UNIT_KERNELS_RANDOM_DATA_H

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace ap::test {

using Vec = std::vector<double>;

/// n samples of N(0, s^2).
inline Vec randn(size_t n, uint64_t seed, double s = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, s);
  Vec v(n);
  for (auto &x : v)
    x = d(rng);
  return v;
}

/// `rows` rows of `d` N(0, 1) samples, each scaled to unit L2 norm (the
/// GDN recurrence sees L2-normalised q, k).
inline Vec unitRows(size_t rows, size_t d, uint64_t seed) {
  Vec v = randn(rows * d, seed);
  for (size_t r = 0; r < rows; ++r) {
    double s = 0;
    for (size_t i = 0; i < d; ++i)
      s += v[r * d + i] * v[r * d + i];
    for (size_t i = 0; i < d; ++i)
      v[r * d + i] /= std::sqrt(s);
  }
  return v;
}

/// n samples of U(lo, hi).
inline Vec uniform(size_t n, uint64_t seed, double lo, double hi) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (auto &x : v)
    x = d(rng);
  return v;
}

/// n random bytes (any value, zeros included: for copy tests).
inline std::vector<uint8_t> randomBytes(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto &b : v)
    b = static_cast<uint8_t>(rng() >> 56);
  return v;
}

} // namespace ap::test

#endif // ACTPLACE_TEST_UNIT_KERNELS_RANDOM_DATA_H
