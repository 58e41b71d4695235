//===- rng.cpp - Philox4x32-10 streams and parameter init -----------------===//
#include "runtime/rng.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

namespace ap::rt {
namespace {

// Multipliers and Weyl key increments of Philox4x32 (Salmon et al. 2011).
constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;

/// Tag in the last counter word of the key derivation, so a derived key can
/// never coincide with a data block evaluated under the seed itself.
constexpr uint32_t kDeriveTag = 0x6b657931u; // "key1"

inline void mulhilo(uint32_t a, uint32_t b, uint32_t &hi, uint32_t &lo) {
  uint64_t p = uint64_t(a) * uint64_t(b);
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}

} // namespace

std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                      std::array<uint32_t, 2> key) {
  for (int round = 0; round < 10; ++round) {
    // The key is bumped between rounds, never before the first one.
    if (round > 0) {
      key[0] += kPhiloxW0;
      key[1] += kPhiloxW1;
    }
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kPhiloxM0, ctr[0], hi0, lo0);
    mulhilo(kPhiloxM1, ctr[2], hi1, lo1);
    ctr = {hi1 ^ ctr[1] ^ key[0], lo1, hi0 ^ ctr[3] ^ key[1], lo0};
  }
  return ctr;
}

uint64_t streamIdForName(std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull; // FNV-1a 64 offset basis
  for (unsigned char c : name) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

PhiloxStream::PhiloxStream(const RngKey &k) {
  if (k.step > 0xffffffffull)
    throw std::invalid_argument("PhiloxStream: step " + std::to_string(k.step) +
                                " does not fit the 32-bit counter word");
  std::array<uint32_t, 4> ctr = {uint32_t(k.stream), uint32_t(k.stream >> 32),
                                 k.rank, kDeriveTag};
  std::array<uint32_t, 4> d =
      philox4x32_10(ctr, {uint32_t(k.seed), uint32_t(k.seed >> 32)});
  key_ = {d[0], d[1]};
  step_ = uint32_t(k.step);
  microbatch_ = k.microbatch;
}

std::array<uint32_t, 4> PhiloxStream::block(uint64_t blockIndex) const {
  return philox4x32_10(
      {uint32_t(blockIndex), uint32_t(blockIndex >> 32), step_, microbatch_},
      key_);
}

uint32_t PhiloxStream::word(uint64_t index) const {
  return block(index / 4)[index % 4];
}

void PhiloxStream::fillWords(uint32_t *out, size_t n, uint64_t offset) const {
  size_t i = 0;
  // Unaligned head, then whole blocks, then the tail: each block is computed
  // once, and values are the same whatever the offset.
  while (i < n && (offset + i) % 4 != 0) {
    out[i] = word(offset + i);
    ++i;
  }
  while (i + 4 <= n) {
    std::array<uint32_t, 4> b = block((offset + i) / 4);
    out[i] = b[0];
    out[i + 1] = b[1];
    out[i + 2] = b[2];
    out[i + 3] = b[3];
    i += 4;
  }
  for (; i < n; ++i)
    out[i] = word(offset + i);
}

namespace {

/// Processes a stream in bounded chunks so that large tensors need no
/// temporary of their own size.
constexpr size_t kChunk = 4096;

inline double unit24(uint32_t w) { return double(w >> 8) * (1.0 / 16777216.0); }

} // namespace

void PhiloxStream::fillUniform(float *out, size_t n, float a, float b,
                               uint64_t offset) const {
  uint32_t words[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    size_t m = std::min(kChunk, n - base);
    fillWords(words, m, offset + base);
    for (size_t i = 0; i < m; ++i)
      out[base + i] =
          float(double(a) + (double(b) - double(a)) * unit24(words[i]));
  }
}

void PhiloxStream::fillNormal(float *out, size_t n, float mean, float std,
                              uint64_t offset) const {
  if (offset % 2 != 0)
    throw std::invalid_argument("PhiloxStream::fillNormal: offset " +
                                std::to_string(offset) +
                                " must be even (Box-Muller pairs)");
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  uint32_t words[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    size_t m = std::min(kChunk, n - base);
    size_t mEven = (m + 1) & ~size_t(1);
    fillWords(words, mEven, offset + base);
    for (size_t i = 0; i < m; i += 2) {
      // u1 in (0, 1] keeps the logarithm finite; 32 bits each.
      double u1 = (double(words[i]) + 1.0) * (1.0 / 4294967296.0);
      double u2 = double(words[i + 1]) * (1.0 / 4294967296.0);
      double r = std::sqrt(-2.0 * std::log(u1));
      out[base + i] =
          float(double(mean) + double(std) * r * std::cos(kTwoPi * u2));
      if (i + 1 < m)
        out[base + i + 1] =
            float(double(mean) + double(std) * r * std::sin(kTwoPi * u2));
    }
  }
}

void PhiloxStream::fillTokens(int32_t *out, size_t n, uint32_t vocab,
                              uint64_t offset) const {
  if (vocab == 0 || vocab > 0x7fffffffu)
    throw std::invalid_argument("PhiloxStream::fillTokens: bad vocab size " +
                                std::to_string(vocab));
  uint32_t words[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    size_t m = std::min(kChunk, n - base);
    fillWords(words, m, offset + base);
    for (size_t i = 0; i < m; ++i)
      out[base + i] = int32_t((uint64_t(words[i]) * vocab) >> 32);
  }
}

//===----------------------------------------------------------------------===//
// Parameter init
//===----------------------------------------------------------------------===//

namespace {

std::string trim(const std::string &s) {
  size_t b = s.find_first_not_of(" \t");
  size_t e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

double parseNumber(const std::string &text, const std::string &whole) {
  std::string t = trim(text);
  char *end = nullptr;
  double v = std::strtod(t.c_str(), &end);
  if (t.empty() || end != t.c_str() + t.size() || !std::isfinite(v))
    throw std::invalid_argument("init spec '" + whole + "': '" + t +
                                "' is not a finite number");
  return v;
}

} // namespace

InitSpec parseInitSpec(const std::string &text) {
  std::string s = trim(text);
  if (s == "zeros")
    return InitSpec::zeros();
  if (s == "ones")
    return InitSpec::ones();
  size_t open = s.find('(');
  if (open == std::string::npos || s.back() != ')')
    throw std::invalid_argument(
        "init spec '" + text +
        "': expected zeros, ones, normal(mean,std), uniform(a,b) or "
        "log_uniform(a,b)");
  std::string kind = trim(s.substr(0, open));
  std::string args = s.substr(open + 1, s.size() - open - 2);
  size_t comma = args.find(',');
  if (comma == std::string::npos ||
      args.find(',', comma + 1) != std::string::npos)
    throw std::invalid_argument("init spec '" + text +
                                "': expected exactly two arguments");
  double a = parseNumber(args.substr(0, comma), text);
  double b = parseNumber(args.substr(comma + 1), text);
  if (kind == "normal") {
    if (b < 0)
      throw std::invalid_argument("init spec '" + text + "': negative std");
    return InitSpec::normal(a, b);
  }
  if (kind == "uniform" || kind == "log_uniform") {
    if (!(a < b))
      throw std::invalid_argument("init spec '" + text + "': need a < b");
    if (kind == "log_uniform" && !(a > 0))
      throw std::invalid_argument("init spec '" + text +
                                  "': log_uniform needs 0 < a");
    return kind == "uniform" ? InitSpec::uniform(a, b)
                             : InitSpec::logUniform(a, b);
  }
  throw std::invalid_argument("init spec '" + text + "': unknown kind '" +
                              kind + "'");
}

std::string formatInitSpec(const InitSpec &spec) {
  auto num = [](double v) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.17g", v);
    return std::string(buf);
  };
  switch (spec.kind) {
  case InitKind::Zeros:
    return "zeros";
  case InitKind::Ones:
    return "ones";
  case InitKind::Normal:
    return "normal(" + num(spec.a) + "," + num(spec.b) + ")";
  case InitKind::Uniform:
    return "uniform(" + num(spec.a) + "," + num(spec.b) + ")";
  case InitKind::LogUniform:
    return "log_uniform(" + num(spec.a) + "," + num(spec.b) + ")";
  }
  return "?";
}

void initParameter(const InitSpec &spec, const RngKey &key,
                   ap::kernels::DType dtype, void *out, size_t n,
                   uint64_t offset) {
  using ap::kernels::DType;
  if (dtype != DType::BF16 && dtype != DType::F32 && dtype != DType::F64)
    throw std::invalid_argument(
        "initParameter: parameters must be BF16, F32 or F64");
  PhiloxStream stream(key);
  float values[kChunk];
  for (size_t base = 0; base < n; base += kChunk) {
    size_t m = std::min(kChunk, n - base);
    switch (spec.kind) {
    case InitKind::Zeros:
    case InitKind::Ones:
      for (size_t i = 0; i < m; ++i)
        values[i] = spec.kind == InitKind::Ones ? 1.0f : 0.0f;
      break;
    case InitKind::Normal:
      stream.fillNormal(values, m, float(spec.a), float(spec.b), offset + base);
      break;
    case InitKind::Uniform:
      stream.fillUniform(values, m, float(spec.a), float(spec.b),
                         offset + base);
      break;
    case InitKind::LogUniform: {
      uint32_t words[kChunk];
      stream.fillWords(words, m, offset + base);
      for (size_t i = 0; i < m; ++i)
        values[i] =
            float(std::log(spec.a + (spec.b - spec.a) * unit24(words[i])));
      break;
    }
    }
    switch (dtype) {
    case DType::BF16: {
      auto *o = static_cast<ap::kernels::bf16 *>(out) + base;
      for (size_t i = 0; i < m; ++i)
        o[i] = ap::kernels::bf16(values[i]);
      break;
    }
    case DType::F32: {
      auto *o = static_cast<float *>(out) + base;
      for (size_t i = 0; i < m; ++i)
        o[i] = values[i];
      break;
    }
    default: {
      auto *o = static_cast<double *>(out) + base;
      for (size_t i = 0; i < m; ++i)
        o[i] = values[i];
      break;
    }
    }
  }
}

std::string RngState::serialize() const {
  return "philox4x32_10;seed=" + std::to_string(seed) +
         ";step=" + std::to_string(step);
}

RngState RngState::deserialize(const std::string &text) {
  RngState st;
  unsigned long long seed = 0, step = 0;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "philox4x32_10;seed=%llu;step=%llu%n", &seed,
                  &step, &consumed) != 2 ||
      size_t(consumed) != text.size())
    throw std::invalid_argument("RngState: malformed state '" + text + "'");
  st.seed = seed;
  st.step = step;
  return st;
}

} // namespace ap::rt
