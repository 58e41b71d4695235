//===- data.h - Training data sources and a resumable cursor ------*- C++
//-*-===//
//
// Where the token microbatches come from. Three sources:
//   - synthetic: Philox tokens, no file needed (the default, for tests and
//     benchmarks);
//   - a memory-mapped token file of little-endian uint16 or uint32 ids (the
//     nanoGPT / Megatron ".bin" convention without an index);
//   - raw text through the byte-level tokenizer (each byte is a token id in
//     0..255), so a demo trains on real text with no tokenizer dependency.
//
// A microbatch is read as [B, T+1] tokens; tokens = [:, :T] and labels =
// [:, 1:] (next-token prediction). Which tokens a microbatch gets is a pure
// function of (seed, step, g), g = microbatch * worldSize + rank the global
// microbatch: resuming at a cursor gives the same data as the uninterrupted
// run, ranks never read the same sample, and a step's global batch (g over
// [0, M*N)) is the same sequences whether it runs as M*N microbatches on
// one rank or M on each of N (docs/tools.md, "Running on several ranks").
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_DATA_H
#define ACTPLACE_RUNTIME_DATA_H

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ap::rt {

enum class DataSourceKind { Synthetic, TokenFile, ByteText };

struct DataConfig {
  DataSourceKind kind = DataSourceKind::Synthetic;
  /// TokenFile / ByteText: the file.
  std::string path;
  /// TokenFile: bytes per token id, 2 (uint16) or 4 (uint32).
  int tokenBytes = 2;
  /// Synthetic: ids are drawn in [0, vocabSize). Files: every id read must be
  /// below it (checked, an error names the offending position). ByteText
  /// needs vocabSize >= 256.
  uint32_t vocabSize = 256;
  uint64_t seed = 0;
  /// Sequences per microbatch on this rank (B) and their length (T).
  int64_t batch = 1;
  int64_t seqLen = 16;
  uint32_t microbatchesPerStep = 1;
  /// Data-parallel position of this process.
  uint32_t rank = 0;
  uint32_t worldSize = 1;
  /// Files: false = one sequential pass over non-overlapping windows (wrapping
  /// into the next epoch); true = every epoch visits each window exactly
  /// once in a pseudo-random order (a Philox-keyed permutation per epoch,
  /// shared by all ranks so that they still read disjoint windows).
  bool shuffle = false;
  /// Packed sequences: a label whose token is this id (the end of a
  /// document) becomes `ignoreIndex`, so the loss does not train the
  /// separator to predict the next document's first token. -1: none.
  int64_t documentSeparator = -1;
  int32_t ignoreIndex = -100;
};

/// Parses a --data value: "synthetic", "tokens:PATH" (uint16), "tokens16:PATH",
/// "tokens32:PATH" or "text:PATH", into `config` (other fields untouched).
/// Throws ap::rt::Error on an unknown form.
void parseDataSource(const std::string &spec, DataConfig &config);

/// Where the data stream stands: the next (step, microbatch) to read, plus the
/// identity of the source so that a checkpoint cannot silently resume on a
/// different file or layout.
struct DataCursor {
  uint64_t step = 0;
  uint32_t microbatch = 0;
  /// Digest of what decides the tokens of a step: the source's kind, size
  /// and content digest (DataLoader::contentDigest), the seed, the sequence
  /// length and the global batch in sequences. The split of a step into
  /// microbatches and ranks is not part of it.
  std::string sourceId;

  std::string serialize() const;
  /// Throws ap::rt::Error on malformed text.
  static DataCursor deserialize(const std::string &text);
  bool operator==(const DataCursor &o) const {
    return step == o.step && microbatch == o.microbatch &&
           sourceId == o.sourceId;
  }
};

/// Byte-level tokenizer: token id = byte value.
std::vector<int32_t> byteEncode(const std::string &text);
/// Inverse of byteEncode; ids outside 0..255 become '?'.
std::string byteDecode(const int32_t *ids, size_t n);

class MappedFile;

/// Produces microbatches. Construction opens (memory-maps) the file and
/// validates the layout. fill() is const and thread-safe.
class DataLoader {
public:
  explicit DataLoader(const DataConfig &config);
  ~DataLoader();
  DataLoader(const DataLoader &) = delete;
  DataLoader &operator=(const DataLoader &) = delete;

  const DataConfig &config() const { return config_; }
  /// Tokens in the source (0 for synthetic: unbounded).
  uint64_t numTokens() const { return numTokens_; }
  /// The source's identity, without its path: "synthetic", or the kind,
  /// the size in bytes and the content digest ("text, 5000 bytes, sha256
  /// <hex>"). Equal for the same content anywhere.
  const std::string &sourceDescription() const { return description_; }

  /// Files up to this size are hashed whole; larger ones by kDigestBlocks
  /// evenly spaced blocks of kDigestBlockBytes (the first and the last
  /// included), so opening a corpus of terabytes reads 64 MiB.
  static constexpr size_t kWholeDigestBytes = size_t(64) << 20;
  static constexpr size_t kDigestBlockBytes = size_t(1) << 20;
  static constexpr uint64_t kDigestBlocks = 64;
  /// SHA-256 (hex) of `size` bytes as described above.
  static std::string contentDigest(const uint8_t *data, size_t size);
  /// Elements of one tokens (or labels) buffer: B * T.
  size_t microbatchElements() const {
    return size_t(config_.batch) * size_t(config_.seqLen);
  }

  /// The global index of this rank's `microbatch` within a step:
  /// microbatch * worldSize + rank, in [0, M*N). Data is keyed by it, so
  /// microbatch m of rank r on N ranks reads what microbatch m*N+r reads on
  /// one rank with M*N microbatches.
  uint64_t globalMicrobatch(uint32_t microbatch) const {
    return uint64_t(microbatch) * config_.worldSize + config_.rank;
  }
  /// The [B, T+1] window layout of microbatch (step, microbatch).
  void fillRaw(uint64_t step, uint32_t microbatch, int32_t *raw) const;
  /// tokens[B, T] and labels[B, T] (labels[b, t] = raw[b, t + 1]).
  void fill(uint64_t step, uint32_t microbatch, int32_t *tokens,
            int32_t *labels) const;

  /// Fills the microbatch at the cursor and advances it (microbatch, then
  /// step).
  void next(int32_t *tokens, int32_t *labels);
  DataCursor cursor() const { return cursor_; }
  /// Continues from a saved cursor; throws ap::rt::Error when the cursor was
  /// taken over a different source or layout.
  void restore(const DataCursor &cursor);

private:
  /// Position of window `index` in the shuffled order of `epoch`.
  uint64_t permuteWindow(uint64_t epoch, uint64_t index) const;
  /// Token id at position `pos` of the file (checked against the vocab).
  int32_t fileToken(uint64_t pos) const;

  DataConfig config_;
  std::unique_ptr<MappedFile> file_;
  uint64_t numTokens_ = 0;
  uint64_t numWindows_ = 0;
  std::string description_;
  DataCursor cursor_;
};

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_DATA_H
