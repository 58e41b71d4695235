//===- safetensors.h - safetensors reader and writer ------------*- C++ -*-===//
//
// The checkpoint container (docs/checkpoint-format.md), chosen so that
// PyTorch users read our checkpoints with `safetensors.torch.load_file` and we
// read HF weights. Layout: an 8-byte little-endian header length N, N bytes of
// JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
// {string: string}}, then the data section; offsets are relative to it.
//
// The reader validates everything it is given (lengths, offsets contiguous and
// inside the file, sizes matching dtype x shape, no duplicate names) and
// throws ap::rt::Error with the file name and the problem, so a truncated or
// corrupt file can never be half-loaded. The header is JSON read and written
// with nlohmann-json (runtime/json.h), strict, with duplicate keys and deep
// nesting refused.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_SAFETENSORS_H
#define ACTPLACE_RUNTIME_SAFETENSORS_H

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ap::rt {

/// safetensors element types (the names are the format's dtype strings).
enum class StDType {
  BOOL,
  U8,
  I8,
  I16,
  U16,
  F16,
  BF16,
  I32,
  U32,
  F32,
  F64,
  I64,
  U64
};

size_t stDTypeSize(StDType t);
const char *stDTypeName(StDType t);
/// Returns false for an unknown dtype string.
bool parseStDType(const std::string &name, StDType &out);

struct StTensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  /// Byte range in the data section.
  uint64_t begin = 0, end = 0;
  uint64_t numElements() const;
  uint64_t bytes() const { return end - begin; }
};

/// Collects tensors (not copied: the memory must stay valid until write) and
/// metadata, then writes one file atomically.
class SafetensorsWriter {
public:
  void add(const std::string &name, StDType dtype,
           const std::vector<int64_t> &shape, const void *data, size_t bytes);
  void setMetadata(const std::string &key, const std::string &value);

  struct WriteOptions {
    /// Store the SHA-256 of the data section in metadata under this key
    /// (empty: none).
    std::string checksumKey = "actplace.sha256";
    /// fsync the file and its directory (off only in tests that write many
    /// files).
    bool sync = true;
    /// Test hook: throw after writing this many bytes, as a crash would,
    /// to check that the previous file at `path` survives.
    uint64_t failAfterBytes = UINT64_MAX;
  };

  /// Writes `path` via a temporary file in the same directory, fsync and
  /// rename, so readers see either the old file or the complete new one.
  void write(const std::string &path) const { write(path, WriteOptions()); }
  void write(const std::string &path, const WriteOptions &options) const;

  /// The 8-byte length prefix plus the padded JSON header the file would
  /// start with (data offsets assigned, checksum included if requested).
  std::string header(const WriteOptions &options) const;

private:
  struct Entry {
    StTensorInfo info;
    const void *data;
  };
  std::vector<Entry> ordered() const;
  std::string checksum() const;

  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

/// A validated, memory-mapped safetensors file.
class SafetensorsFile {
public:
  /// Maps and validates `path`; throws ap::rt::Error naming the file and the
  /// problem (missing, truncated, bad header, inconsistent offsets).
  static SafetensorsFile open(const std::string &path);
  /// Validates an in-memory image (tests, network transfers).
  static SafetensorsFile fromBytes(std::vector<uint8_t> bytes,
                                   const std::string &what);

  SafetensorsFile(SafetensorsFile &&) noexcept;
  SafetensorsFile &operator=(SafetensorsFile &&) noexcept;
  ~SafetensorsFile();

  const std::string &path() const { return path_; }
  /// Tensors in data-offset order.
  const std::vector<StTensorInfo> &tensors() const { return tensors_; }
  const StTensorInfo *find(const std::string &name) const;
  const uint8_t *data(const StTensorInfo &t) const {
    return dataSection_ + t.begin;
  }
  const std::map<std::string, std::string> &metadata() const {
    return metadata_;
  }
  /// The metadata value or an empty string.
  std::string meta(const std::string &key) const;

  /// Recomputes the SHA-256 of the data section and compares it with the
  /// metadata entry `key`; throws ap::rt::Error on mismatch or when the entry
  /// is missing.
  void verifyChecksum(const std::string &key = "actplace.sha256") const;

private:
  SafetensorsFile() = default;
  void parse();

  std::string path_;
  // Either a mapping (mapBase_/mapSize_) or an owned image (bytes_).
  void *mapBase_ = nullptr;
  size_t mapSize_ = 0;
  std::vector<uint8_t> bytes_;
  const uint8_t *image_ = nullptr;
  size_t imageSize_ = 0;
  const uint8_t *dataSection_ = nullptr;
  uint64_t dataBytes_ = 0;
  std::vector<StTensorInfo> tensors_;
  std::map<std::string, size_t> byName_;
  std::map<std::string, std::string> metadata_;
};

/// Writes `bytes` to `path` through a temporary file, fsync and rename (used
/// for index and "latest" files next to the shards).
void writeFileAtomically(const std::string &path, const std::string &bytes,
                         bool sync = true);

/// A JSON string literal for `s` (quotes and escapes; bytes that are not
/// valid UTF-8 become U+FFFD). The JSON documents themselves are read and
/// written with runtime/json.h.
std::string jsonQuote(const std::string &s);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_SAFETENSORS_H
