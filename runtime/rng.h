//===- rng.h - Counter-based Philox RNG for init and synthetic data -*- C++
//-*-===//
//
// Deterministic random numbers for parameter initialisation and synthetic
// tokens. Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as
// 1, 2, 3", SC'11) is counter based: word i of a stream is a pure function of
// (key, i), so results never depend on chunking, threads, placement or how
// far a previous run got. That is what makes runs reproducible and resumable:
// a resumed run regenerates exactly the numbers of the uninterrupted one.
//
// A stream is named by RngKey = (seed, step, microbatch, rank, stream id).
// (seed, rank, stream) are folded into the 64-bit Philox key by one Philox
// evaluation (a keyed derivation, so nearby ids give unrelated keys); (step,
// microbatch) and the block index form the 128-bit counter.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_RNG_H
#define ACTPLACE_RUNTIME_RNG_H

#include "kernels/kernels.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ap::rt {

/// The Philox4x32 bijection with 10 rounds, as in Random123's
/// philox4x32_R(10, ctr, key). Exposed for the known-answer tests.
std::array<uint32_t, 4> philox4x32_10(std::array<uint32_t, 4> ctr,
                                      std::array<uint32_t, 2> key);

/// Identifies one independent stream of random words.
struct RngKey {
  uint64_t seed = 0;
  /// Optimizer step; limited to 2^32 - 1 (it occupies one counter word).
  uint64_t step = 0;
  uint32_t microbatch = 0;
  uint32_t rank = 0;
  /// What the numbers are for: a parameter (see streamIdForName), the
  /// synthetic token source, a dropout mask, ...
  uint64_t stream = 0;
};

/// Stable 64-bit id of a name (FNV-1a), so that a parameter's init does not
/// depend on the order in which parameters are declared.
uint64_t streamIdForName(std::string_view name);

/// Well-known stream ids of the runtime's own consumers.
inline constexpr uint64_t kSyntheticTokenStream = 0x746f6b656e73ull; // "tokens"
inline constexpr uint64_t kShuffleStream = 0x73687566666c65ull; // "shuffle"

/// A random stream: word i is philox(counter(step, microbatch, i / 4),
/// derivedKey(seed, rank, stream))[i % 4]. Cheap to construct; const methods
/// are thread-safe.
class PhiloxStream {
public:
  explicit PhiloxStream(const RngKey &key);

  /// Random 32-bit word number `index` of the stream.
  uint32_t word(uint64_t index) const;
  /// Words [offset, offset + n).
  void fillWords(uint32_t *out, size_t n, uint64_t offset = 0) const;

  /// Element i = a + (b - a) * u with u in [0, 1) from word offset + i
  /// (24 random bits, so every value is an exact float).
  void fillUniform(float *out, size_t n, float a, float b,
                   uint64_t offset = 0) const;
  /// Normal(mean, std) by Box-Muller: elements 2j and 2j+1 of the stream use
  /// words 2j and 2j+1 (computed in double, rounded once to float). `offset`
  /// must be even, so a shard of a tensor sees the same values as the whole.
  void fillNormal(float *out, size_t n, float mean, float std,
                  uint64_t offset = 0) const;
  /// Integers in [0, vocab) by multiply-shift of word offset + i (bias below
  /// vocab / 2^32, irrelevant for synthetic data).
  void fillTokens(int32_t *out, size_t n, uint32_t vocab,
                  uint64_t offset = 0) const;

  std::array<uint32_t, 2> philoxKey() const { return key_; }

private:
  std::array<uint32_t, 4> block(uint64_t blockIndex) const;

  std::array<uint32_t, 2> key_;
  uint32_t step_;
  uint32_t microbatch_;
};

/// Parameter initialisers (the train dialect's init specs).
enum class InitKind { Zeros, Ones, Normal, Uniform, LogUniform };

struct InitSpec {
  InitKind kind = InitKind::Zeros;
  /// Normal: mean and std. Uniform / LogUniform: the interval [a, b).
  /// LogUniform stores log(U(a, b)) - GDN's A_log = log(A), A ~ U(a, b).
  double a = 0.0;
  double b = 1.0;

  static InitSpec zeros() { return {InitKind::Zeros, 0, 0}; }
  static InitSpec ones() { return {InitKind::Ones, 0, 0}; }
  static InitSpec normal(double mean, double std) {
    return {InitKind::Normal, mean, std};
  }
  static InitSpec uniform(double a, double b) {
    return {InitKind::Uniform, a, b};
  }
  static InitSpec logUniform(double a, double b) {
    return {InitKind::LogUniform, a, b};
  }
};

/// Parses "zeros", "ones", "normal(0,0.02)", "uniform(-1,1)",
/// "log_uniform(1,16)". Throws std::invalid_argument with the text on error.
InitSpec parseInitSpec(const std::string &text);
std::string formatInitSpec(const InitSpec &spec);

/// Fills `n` elements of a parameter (dtype BF16, F32 or F64) whose first
/// element is element `offset` of the full tensor (for tensor-parallel
/// shards; must be even for Normal). Values are generated in float and then
/// rounded to the storage type, so a BF16 copy equals the rounded F32 master.
/// The key is normally paramInitKey(seed, name).
void initParameter(const InitSpec &spec, const RngKey &key,
                   ap::kernels::DType dtype, void *out, size_t n,
                   uint64_t offset = 0);

/// The key used to initialise parameter `name` (step 0, microbatch 0, rank 0:
/// every rank computes the same full tensor and takes its shard).
inline RngKey paramInitKey(uint64_t seed, std::string_view name) {
  return RngKey{seed, 0, 0, 0, streamIdForName(name)};
}

/// What a checkpoint needs to resume the random streams: they are counter
/// based, so the seed and the step are the whole state.
struct RngState {
  uint64_t seed = 0;
  uint64_t step = 0;
  std::string serialize() const;
  /// Throws std::invalid_argument on malformed text.
  static RngState deserialize(const std::string &text);
  bool operator==(const RngState &o) const {
    return seed == o.seed && step == o.step;
  }
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_RNG_H
