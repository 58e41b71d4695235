//===- StepToolchain.h - Where generated steps find the runtime -*- C++ -*-===//
//
// actplace-compile builds each generated step against the runtime and kernel
// headers and archives. Run from an install tree (cmake --install), it takes
// them from next to its own executable (<prefix>/include/actplace,
// <prefix>/lib), so the tree works wherever it is moved; run from the build
// tree it takes the source folder's headers and the build's archives.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_TOOLS_ACTPLACE_COMPILE_STEPTOOLCHAIN_H
#define ACTPLACE_TOOLS_ACTPLACE_COMPILE_STEPTOOLCHAIN_H

#include "llvm/ADT/StringRef.h"

#include <string>

namespace ap::tools {

/// `s` as one word for /bin/sh: single quotes, each `'` as `'\''`.
std::string shellQuote(llvm::StringRef s);

struct StepToolchain {
  /// The -I root holding runtime/ and kernels/ (unquoted).
  std::string includeRoot;
  /// Link line items after the output (archives quoted for the shell).
  std::string linkItems;
  /// Whether they come from an install tree.
  bool installed = false;
};

/// Install layout when <exe dir>/../include/actplace/runtime/abi.h exists,
/// else the build tree's compiled-in paths.
StepToolchain locateStepToolchain();

} // namespace ap::tools

#endif // ACTPLACE_TOOLS_ACTPLACE_COMPILE_STEPTOOLCHAIN_H
