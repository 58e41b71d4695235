//===- json.h - JSON documents of the runtime (nlohmann-json) ---*- C++ -*-===//
//
// The runtime reads and writes its JSON (safetensors headers, checkpoint
// run configurations and index files, the --op-times files) with
// nlohmann-json. Objects keep their insertion order (ordered_json), so what
// is written comes out in the order it was built and what is read is
// visited in file order. Not included by runtime.h: generated steps never
// see nlohmann.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_JSON_H
#define ACTPLACE_RUNTIME_JSON_H

#include <nlohmann/json.hpp>

#include <string>

namespace ap::rt {

using Json = nlohmann::ordered_json;

/// The most arrays and objects a value may sit in: the document itself is
/// at depth 0, and a value deeper than this is refused (no header or index
/// needs more than 3).
inline constexpr int kMaxJsonDepth = 64;

/// Parses `text` as one JSON document (RFC 8259, strict: no comments, no
/// trailing commas, strings valid UTF-8), refusing what nlohmann would
/// accept silently: a key given twice in one object (nlohmann keeps one of
/// the two) and values nested deeper than kMaxJsonDepth. Throws
/// ap::rt::Error "<what>: malformed JSON ...", with the byte offset for a
/// syntax error.
Json parseJson(const std::string &text, const std::string &what);

/// `value` as JSON text, compact or with `indent` spaces per level; a
/// string that is not valid UTF-8 is an ap::rt::Error naming `what` (such a
/// file would not read back).
std::string dumpJson(const Json &value, const std::string &what,
                     int indent = -1);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_JSON_H
