//===- sha256.h - SHA-256 digests for fingerprints ----------------*- C++
//-*-===//
//
// FIPS 180-4 SHA-256. Used for the bit-for-bit fingerprints in the metrics
// line (loss, grads, params, optimizer) and for checkpoint checksums, so two
// runs can be compared by digest instead of by re-reading tensors.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_SHA256_H
#define ACTPLACE_RUNTIME_SHA256_H

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace ap::rt {

/// Incremental SHA-256. Feed bytes with update() in any chunking; finish()
/// pads, returns the digest and resets the object so it can be reused.
class Sha256 {
public:
  Sha256() { reset(); }

  /// Appends `n` bytes. `data` may be null when `n` is 0.
  void update(const void *data, size_t n);

  /// Completes the digest and resets the state to the empty message.
  std::array<uint8_t, 32> finish();

  /// Lower-case hexadecimal spelling of a digest (64 characters).
  static std::string hex(const std::array<uint8_t, 32> &digest);

private:
  void reset();
  void compress(const uint8_t block[64]);

  uint32_t state_[8];
  uint8_t buffer_[64];
  size_t bufferLen_ = 0;
  uint64_t totalBytes_ = 0;
};

/// One-shot digest of a byte range as lower-case hex.
std::string sha256Hex(const void *data, size_t n);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_SHA256_H
