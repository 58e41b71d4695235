//===- data.cpp - Synthetic, token-file and byte-text data sources --------===//
#include "runtime/data.h"

#include "runtime/error.h"
#include "runtime/rng.h"
#include "runtime/sha256.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace ap::rt {

/// A read-only memory map of a whole file. Token files can be far larger than
/// memory; mapping lets the page cache do the reading.
class MappedFile {
public:
  explicit MappedFile(const std::string &path) : path_(path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      fail("data: cannot open '", path, "': ", std::strerror(errno));
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int e = errno;
      ::close(fd);
      fail("data: cannot stat '", path, "': ", std::strerror(e));
    }
    size_ = size_t(st.st_size);
    if (size_ == 0) {
      ::close(fd);
      fail("data: '", path, "' is empty");
    }
    void *p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    ::close(fd);
    if (p == MAP_FAILED)
      fail("data: cannot mmap '", path, "': ", std::strerror(e));
    data_ = static_cast<const uint8_t *>(p);
  }
  ~MappedFile() { ::munmap(const_cast<uint8_t *>(data_), size_); }
  const uint8_t *data() const { return data_; }
  size_t size() const { return size_; }

private:
  std::string path_;
  const uint8_t *data_ = nullptr;
  size_t size_ = 0;
};

void parseDataSource(const std::string &spec, DataConfig &config) {
  auto withPath = [&](const char *prefix) -> bool {
    size_t n = std::strlen(prefix);
    if (spec.compare(0, n, prefix) != 0)
      return false;
    config.path = spec.substr(n);
    if (config.path.empty())
      fail("data: '", spec, "' names no file");
    return true;
  };
  if (spec == "synthetic") {
    config.kind = DataSourceKind::Synthetic;
    config.path.clear();
  } else if (withPath("tokens:") || withPath("tokens16:")) {
    config.kind = DataSourceKind::TokenFile;
    config.tokenBytes = 2;
  } else if (withPath("tokens32:")) {
    config.kind = DataSourceKind::TokenFile;
    config.tokenBytes = 4;
  } else if (withPath("text:")) {
    config.kind = DataSourceKind::ByteText;
  } else {
    fail("data: unknown source '", spec,
         "' (expected synthetic, tokens:PATH, tokens16:PATH, tokens32:PATH or "
         "text:PATH)");
  }
}

std::string DataCursor::serialize() const {
  return "step=" + std::to_string(step) +
         ";microbatch=" + std::to_string(microbatch) + ";source=" + sourceId;
}

DataCursor DataCursor::deserialize(const std::string &text) {
  DataCursor c;
  unsigned long long step = 0;
  unsigned mb = 0;
  int consumed = 0;
  if (std::sscanf(text.c_str(), "step=%llu;microbatch=%u;source=%n", &step, &mb,
                  &consumed) != 2 ||
      consumed == 0)
    fail("data: malformed cursor '", text, "'");
  c.step = step;
  c.microbatch = mb;
  c.sourceId = text.substr(size_t(consumed));
  if (c.sourceId.size() != 64 ||
      c.sourceId.find_first_not_of("0123456789abcdef") != std::string::npos)
    fail("data: malformed cursor '", text, "' (bad source id)");
  return c;
}

std::vector<int32_t> byteEncode(const std::string &text) {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i)
    ids[i] = int32_t(static_cast<unsigned char>(text[i]));
  return ids;
}

std::string byteDecode(const int32_t *ids, size_t n) {
  std::string s(n, '?');
  for (size_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && ids[i] < 256)
      s[i] = char(static_cast<unsigned char>(ids[i]));
  return s;
}

DataLoader::DataLoader(const DataConfig &config) : config_(config) {
  if (config_.batch <= 0 || config_.seqLen <= 0)
    fail("data: batch (", config_.batch, ") and sequence length (",
         config_.seqLen, ") must be positive");
  if (config_.microbatchesPerStep == 0)
    fail("data: microbatches per step must be positive");
  if (config_.worldSize == 0 || config_.rank >= config_.worldSize)
    fail("data: rank ", config_.rank, " outside world of ", config_.worldSize);
  if (config_.vocabSize == 0 || config_.vocabSize > 0x7fffffffu)
    fail("data: bad vocabulary size ", config_.vocabSize);

  // The source id covers what decides which tokens a step reads: the
  // source and its content, the seed, the sequence length and the global
  // batch (sequences per step over all ranks). How a step's sequences are
  // split into microbatches and ranks is left out: file windows and
  // synthetic tokens are both numbered by the global microbatch
  // (globalMicrobatch), so the same global batch split over other ranks
  // reads the same sequences. (Another micro-batch size B reads other
  // synthetic tokens: a key draws one microbatch of B rows.)
  Sha256 id;
  auto mix = [&](uint64_t v) { id.update(&v, sizeof(v)); };
  mix(uint64_t(config_.kind));
  mix(config_.seed);
  mix(uint64_t(config_.seqLen));
  mix(uint64_t(config_.batch) * config_.microbatchesPerStep *
      config_.worldSize);
  mix(config_.shuffle);
  mix(config_.vocabSize);

  if (config_.kind == DataSourceKind::Synthetic) {
    description_ = "synthetic";
  } else {
    if (config_.kind == DataSourceKind::ByteText) {
      if (config_.vocabSize < 256)
        fail("data: byte-level text needs a vocabulary of at least 256 ids, "
             "model has ",
             config_.vocabSize);
      config_.tokenBytes = 1;
    } else if (config_.tokenBytes != 2 && config_.tokenBytes != 4) {
      fail("data: token width must be 2 or 4 bytes, got ", config_.tokenBytes);
    }
    file_ = std::make_unique<MappedFile>(config_.path);
    if (file_->size() % size_t(config_.tokenBytes) != 0)
      fail("data: '", config_.path, "' has ", file_->size(),
           " bytes, not a multiple of the token width ", config_.tokenBytes,
           " (wrong tokens16/tokens32?)");
    numTokens_ = file_->size() / size_t(config_.tokenBytes);
    if (numTokens_ < uint64_t(config_.seqLen) + 1)
      fail("data: '", config_.path, "' holds ", numTokens_,
           " tokens, fewer than one sequence of ", config_.seqLen + 1);
    // Windows of T+1 tokens overlapping by one, so every token is a label
    // exactly once per epoch.
    numWindows_ = (numTokens_ - 1) / uint64_t(config_.seqLen);
    mix(uint64_t(config_.tokenBytes));
    mix(numTokens_);
    std::string content = contentDigest(file_->data(), file_->size());
    id.update(content.data(), content.size());
    description_ =
        std::string(config_.kind == DataSourceKind::ByteText ? "text"
                    : config_.tokenBytes == 2                ? "tokens16"
                                                             : "tokens32") +
        ", " + std::to_string(file_->size()) + " bytes, " +
        (file_->size() <= kWholeDigestBytes ? "sha256 " : "sampled sha256 ") +
        content;
  }
  cursor_.sourceId = Sha256::hex(id.finish());
}

std::string DataLoader::contentDigest(const uint8_t *data, size_t size) {
  Sha256 h;
  if (size <= kWholeDigestBytes) {
    h.update(data, size);
    return Sha256::hex(h.finish());
  }
  // kDigestBlocks blocks of kDigestBlockBytes, evenly spaced from the first
  // to the last byte: a fixed cost however large the corpus.
  uint64_t span = size - kDigestBlockBytes;
  for (uint64_t i = 0; i < kDigestBlocks; ++i) {
    uint64_t at = span * i / (kDigestBlocks - 1);
    h.update(data + at, kDigestBlockBytes);
  }
  return Sha256::hex(h.finish());
}

DataLoader::~DataLoader() = default;

int32_t DataLoader::fileToken(uint64_t pos) const {
  const uint8_t *p = file_->data() + pos * uint64_t(config_.tokenBytes);
  uint32_t v;
  switch (config_.tokenBytes) {
  case 1:
    v = p[0];
    break;
  case 2:
    v = uint32_t(p[0]) | uint32_t(p[1]) << 8;
    break;
  default:
    v = uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 |
        uint32_t(p[3]) << 24;
    break;
  }
  if (v >= config_.vocabSize)
    fail("data: token ", v, " at position ", pos, " of '", config_.path,
         "' is outside the vocabulary of ", config_.vocabSize);
  return int32_t(v);
}

uint64_t DataLoader::permuteWindow(uint64_t epoch, uint64_t index) const {
  // A 4-round balanced Feistel network on 2h bits (2^(2h) >= numWindows_,
  // so at most 4x the domain) keyed by (seed, epoch) with Philox as the round
  // function, restricted to [0, numWindows_) by cycle walking: a bijection
  // on the windows, so each is read exactly once per epoch.
  int h = 1;
  while ((uint64_t(1) << (2 * h)) < numWindows_)
    ++h;
  const uint64_t mask = (uint64_t(1) << h) - 1;
  PhiloxStream round(RngKey{config_.seed, 0, 0, 0, kShuffleStream + epoch});
  uint64_t x = index;
  do {
    uint64_t l = x >> h, r = x & mask;
    for (uint64_t k = 0; k < 4; ++k) {
      uint64_t f = (uint64_t(round.word((k << 33) | (2 * r))) << 32) |
                   round.word((k << 33) | (2 * r + 1));
      uint64_t next = l ^ (f & mask);
      l = r;
      r = next;
    }
    x = (l << h) | r;
  } while (x >= numWindows_);
  return x;
}

void DataLoader::fillRaw(uint64_t step, uint32_t microbatch,
                         int32_t *raw) const {
  if (microbatch >= config_.microbatchesPerStep)
    fail("data: microbatch ", microbatch, " of a step with ",
         config_.microbatchesPerStep);
  const uint64_t B = uint64_t(config_.batch), T = uint64_t(config_.seqLen);
  const uint64_t g = globalMicrobatch(microbatch);
  if (config_.kind == DataSourceKind::Synthetic) {
    // Keyed by the global microbatch (rank 0 in the key's rank word), so a
    // world of one keys exactly as before ranks existed, and another split
    // of the same global batch (M microbatches on N ranks against M*N on
    // one) draws the same tokens.
    RngKey key{config_.seed, step, uint32_t(g), 0, kSyntheticTokenStream};
    PhiloxStream(key).fillTokens(raw, size_t(B * (T + 1)), config_.vocabSize);
    return;
  }
  // Global sample number: consecutive over (step, global microbatch, row),
  // so the ranks of one step read disjoint consecutive windows and the
  // step's global batch is samples [step*M*N*B, (step+1)*M*N*B) however it
  // is split.
  uint64_t first =
      (step * config_.microbatchesPerStep * config_.worldSize + g) * B;
  for (uint64_t b = 0; b < B; ++b) {
    uint64_t sample = first + b;
    uint64_t window = sample % numWindows_;
    if (config_.shuffle)
      window = permuteWindow(sample / numWindows_, window);
    uint64_t start = window * T;
    for (uint64_t t = 0; t <= T; ++t)
      raw[b * (T + 1) + t] = fileToken(start + t);
  }
}

void DataLoader::fill(uint64_t step, uint32_t microbatch, int32_t *tokens,
                      int32_t *labels) const {
  const size_t B = size_t(config_.batch), T = size_t(config_.seqLen);
  std::vector<int32_t> raw(B * (T + 1));
  fillRaw(step, microbatch, raw.data());
  for (size_t b = 0; b < B; ++b) {
    std::memcpy(tokens + b * T, raw.data() + b * (T + 1), T * sizeof(int32_t));
    std::memcpy(labels + b * T, raw.data() + b * (T + 1) + 1,
                T * sizeof(int32_t));
  }
}

void DataLoader::next(int32_t *tokens, int32_t *labels) {
  fill(cursor_.step, cursor_.microbatch, tokens, labels);
  if (config_.documentSeparator >= 0) {
    const int64_t n = config_.batch * config_.seqLen;
    for (int64_t i = 0; i < n; ++i)
      if (tokens[i] == config_.documentSeparator)
        labels[i] = config_.ignoreIndex;
  }
  if (++cursor_.microbatch == config_.microbatchesPerStep) {
    cursor_.microbatch = 0;
    ++cursor_.step;
  }
}

void DataLoader::restore(const DataCursor &cursor) {
  if (cursor.sourceId != cursor_.sourceId)
    fail("data: the checkpoint's data cursor was taken over a different source "
         "or layout (source id ",
         cursor.sourceId, ", this run ", cursor_.sourceId,
         "): the same data (content), seed, sequence length and global "
         "batch are needed to resume");
  if (cursor.microbatch >= config_.microbatchesPerStep)
    fail("data: cursor microbatch ", cursor.microbatch, " out of range");
  cursor_ = cursor;
}

} // namespace ap::rt
