//===- JsonLimits.h - bounds checked before a JSON document is parsed -----===//
//
// llvm::json::parse recurses once per nested array or object, so a file of
// tens of thousands of '[' overflows the stack, and it keeps one of two equal
// keys without a word. The config and device-profile readers therefore scan
// their input first, without recursion, and refuse what the parser would
// mishandle. No LLVM dependency: plain C++ so that any library may use it.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_SUPPORT_JSONLIMITS_H
#define ACTPLACE_SUPPORT_JSONLIMITS_H

#include <optional>
#include <string>
#include <string_view>

namespace ap::support {

/// The most arrays and objects one JSON document may nest, the outermost
/// included. The same bound as the checkpoint header reader
/// (runtime/safetensors.cpp); no config or profile needs more than a few.
inline constexpr unsigned kMaxJsonNesting = 64;

/// Where a scan stopped and why (1-based line and byte column).
struct JsonScanProblem {
  unsigned line = 0;
  unsigned column = 0;
  std::string message;
};

/// Scans `text` without recursion. Returns the first problem: an array or
/// object nested deeper than `maxNesting`, or (with `rejectDuplicateKeys`) a
/// key that occurs twice in one object, compared after escapes are decoded.
/// Syntax errors are not reported here; the parser that runs next names them.
std::optional<JsonScanProblem>
scanJsonLimits(std::string_view text, unsigned maxNesting = kMaxJsonNesting,
               bool rejectDuplicateKeys = true);

} // namespace ap::support

#endif // ACTPLACE_SUPPORT_JSONLIMITS_H
