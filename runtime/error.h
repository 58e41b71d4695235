//===- error.h - Runtime error type and check macros ------------*- C++ -*-===//
//
// Every failure the runtime detects (a CUDA call that failed, a broken
// offload invariant, a pinned-slot ownership error, a bad flag) is reported as
// an ap::rt::Error whose message names what was being done, so a training
// binary dies with one readable line instead of a corrupted result.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_ERROR_H
#define ACTPLACE_RUNTIME_ERROR_H

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace ap::rt {

/// The runtime's one exception type. Messages start with the component
/// ("pinned pool: ...", "offload engine: ...") so logs stay greppable.
class Error : public std::runtime_error {
public:
  explicit Error(const std::string &message) : std::runtime_error(message) {}
};

namespace detail {
/// Builds a message from stream-insertable parts; keeps call sites one line.
template <typename... Parts> std::string concat(const Parts &...parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
} // namespace detail

/// Throws ap::rt::Error with the concatenation of the arguments.
template <typename... Parts> [[noreturn]] void fail(const Parts &...parts) {
  throw Error(detail::concat(parts...));
}

/// The first `maxShown` of `problems`, one per indented line, then how many
/// more: the body of an error that reports every mismatch of a file at once.
inline std::string listProblems(const std::vector<std::string> &problems,
                                size_t maxShown) {
  std::string msg;
  size_t shown = problems.size() < maxShown ? problems.size() : maxShown;
  for (size_t i = 0; i < shown; ++i)
    msg += "\n  " + problems[i];
  if (shown < problems.size())
    msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
  return msg;
}

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_ERROR_H
