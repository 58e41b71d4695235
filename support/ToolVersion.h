//===- ToolVersion.h - --version of the LLVM-based tools --------*- C++ -*-===//
//
// The compiler tools parse flags with llvm::cl, whose --version prints only
// LLVM's version; this replaces it with the release and the compiler-runtime
// ABI version (support/Version.h), then the LLVM release the tool was built
// with.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_SUPPORT_TOOLVERSION_H
#define ACTPLACE_SUPPORT_TOOLVERSION_H

#include "support/Version.h"

#include "llvm/Config/llvm-config.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

namespace ap {

/// Call before the tool parses its command line.
inline void setToolVersionPrinter(const char *tool) {
  llvm::cl::SetVersionPrinter([tool](llvm::raw_ostream &os) {
    os << versionText(tool) << "LLVM " << LLVM_VERSION_STRING << "\n";
  });
}

} // namespace ap

#endif // ACTPLACE_SUPPORT_TOOLVERSION_H
