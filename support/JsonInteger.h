//===- JsonInteger.h - a JSON number as int64, without undefined behaviour
//-===//
//
// llvm::json::Value::getAsInteger converts a double that compares equal to
// INT64_MAX as a double (2^63, e.g. "9223372036854775807.") to int64_t,
// which is undefined behaviour (found by fuzz_config). jsonInteger decides
// doubles of that magnitude itself: they are no int64.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_SUPPORT_JSONINTEGER_H
#define ACTPLACE_SUPPORT_JSONINTEGER_H

#include "llvm/Support/JSON.h"

#include <cmath>
#include <cstdint>
#include <optional>

namespace ap {

/// `v` as an int64 when it is an integer, or a double holding an integer
/// strictly inside int64's range; nullopt otherwise.
inline std::optional<int64_t> jsonInteger(const llvm::json::Value &v) {
  // Integer-typed values (the non-negative ones read as uint64) convert
  // with range checks; only doubles reach the conversion at issue.
  if (v.getAsUINT64())
    return v.getAsInteger();
  constexpr double kLimit = 9223372036854775808.0; // 2^63
  if (std::optional<double> d = v.getAsNumber(); d && std::fabs(*d) >= kLimit)
    return std::nullopt;
  return v.getAsInteger();
}

} // namespace ap

#endif // ACTPLACE_SUPPORT_JSONINTEGER_H
