//===- sha256.cpp - SHA-256 (FIPS 180-4) ----------------------------------===//
//
// A straightforward portable implementation: fingerprints hash a few hundred
// MiB per step at most, and the metrics path is not performance critical
// enough to justify SIMD variants.
//
//===----------------------------------------------------------------------===//
#include "runtime/sha256.h"

#include <cstring>

namespace ap::rt {
namespace {

/// First 32 bits of the fractional parts of the cube roots of the first 64
/// primes (FIPS 180-4 section 4.2.2).
constexpr uint32_t kRound[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu,
    0x59f111f1u, 0x923f82a4u, 0xab1c5ed5u, 0xd807aa98u, 0x12835b01u,
    0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu, 0x9bdc06a7u,
    0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu,
    0x2de92c6fu, 0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u,
    0xa831c66du, 0xb00327c8u, 0xbf597fc7u, 0xc6e00bf3u, 0xd5a79147u,
    0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u,
    0xa2bfe8a1u, 0xa81a664bu, 0xc24b8b70u, 0xc76c51a3u, 0xd192e819u,
    0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u, 0x1e376c08u,
    0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu,
    0x682e6ff3u, 0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u,
    0x90befffau, 0xa4506cebu, 0xbef9a3f7u, 0xc67178f2u};

inline uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

} // namespace

void Sha256::reset() {
  // Initial hash value: fractional parts of the square roots of the first 8
  // primes (FIPS 180-4 section 5.3.3).
  static constexpr uint32_t kInit[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u,
                                        0xa54ff53au, 0x510e527fu, 0x9b05688cu,
                                        0x1f83d9abu, 0x5be0cd19u};
  std::memcpy(state_, kInit, sizeof(state_));
  bufferLen_ = 0;
  totalBytes_ = 0;
}

void Sha256::compress(const uint8_t block[64]) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = (uint32_t(block[4 * i]) << 24) | (uint32_t(block[4 * i + 1]) << 16) |
           (uint32_t(block[4 * i + 2]) << 8) | uint32_t(block[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
  uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
    uint32_t ch = (e & f) ^ (~e & g);
    uint32_t t1 = h + s1 + ch + kRound[i] + w[i];
    uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
    uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
    uint32_t t2 = s0 + maj;
    h = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  state_[0] += a;
  state_[1] += b;
  state_[2] += c;
  state_[3] += d;
  state_[4] += e;
  state_[5] += f;
  state_[6] += g;
  state_[7] += h;
}

void Sha256::update(const void *data, size_t n) {
  if (n == 0) // data may be null; memcpy from null is undefined even for 0
    return;
  const uint8_t *p = static_cast<const uint8_t *>(data);
  totalBytes_ += n;
  if (bufferLen_ > 0) {
    size_t take = 64 - bufferLen_ < n ? 64 - bufferLen_ : n;
    std::memcpy(buffer_ + bufferLen_, p, take);
    bufferLen_ += take;
    p += take;
    n -= take;
    if (bufferLen_ < 64)
      return;
    compress(buffer_);
    bufferLen_ = 0;
  }
  // Hash whole blocks straight from the caller's memory to avoid a copy.
  while (n >= 64) {
    compress(p);
    p += 64;
    n -= 64;
  }
  if (n > 0) {
    std::memcpy(buffer_, p, n);
    bufferLen_ = n;
  }
}

std::array<uint8_t, 32> Sha256::finish() {
  uint64_t bitLen = totalBytes_ * 8;
  // Padding: a single 1 bit, zeros up to 56 mod 64, then the 64-bit
  // big-endian message length.
  uint8_t pad[72];
  size_t padLen = (bufferLen_ < 56) ? 56 - bufferLen_ : 120 - bufferLen_;
  std::memset(pad, 0, sizeof(pad));
  pad[0] = 0x80;
  for (int i = 0; i < 8; ++i)
    pad[padLen + i] = uint8_t(bitLen >> (56 - 8 * i));
  // update() would also count the padding in totalBytes_; that is harmless
  // because the length was captured above and reset() follows.
  update(pad, padLen + 8);
  std::array<uint8_t, 32> out;
  for (int i = 0; i < 8; ++i) {
    out[4 * i] = uint8_t(state_[i] >> 24);
    out[4 * i + 1] = uint8_t(state_[i] >> 16);
    out[4 * i + 2] = uint8_t(state_[i] >> 8);
    out[4 * i + 3] = uint8_t(state_[i]);
  }
  reset();
  return out;
}

std::string Sha256::hex(const std::array<uint8_t, 32> &digest) {
  static const char kDigits[] = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < 32; ++i) {
    s[2 * i] = kDigits[digest[i] >> 4];
    s[2 * i + 1] = kDigits[digest[i] & 0xf];
  }
  return s;
}

std::string sha256Hex(const void *data, size_t n) {
  Sha256 h;
  h.update(data, n);
  return Sha256::hex(h.finish());
}

} // namespace ap::rt
