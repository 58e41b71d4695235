//===- StepToolchain.cpp - Where generated steps find the runtime ---------===//
#include "StepToolchain.h"

#include "CompileConfig.inc"

#include "llvm/ADT/SmallString.h"
#include "llvm/ADT/StringRef.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"

namespace ap::tools {

std::string shellQuote(llvm::StringRef s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'')
      out += "'\\''";
    else
      out += c;
  }
  return out + "'";
}

namespace {

/// ACTPLACE_INSTALL_LINK_ITEMS with each {lib} replaced by `libDir`.
std::string installLinkItems(llvm::StringRef libDir) {
  std::string out;
  llvm::StringRef rest = ACTPLACE_INSTALL_LINK_ITEMS;
  while (!rest.empty()) {
    auto [item, tail] = rest.split(' ');
    rest = tail;
    if (item.empty())
      continue;
    if (!out.empty())
      out += ' ';
    if (item.consume_front("{lib}/")) {
      llvm::SmallString<256> path(libDir);
      llvm::sys::path::append(path, item);
      out += shellQuote(path);
    } else {
      out += item.str();
    }
  }
  return out;
}

} // namespace

StepToolchain locateStepToolchain() {
  // The running executable (/proc/self/exe on Linux), symlinks resolved so
  // that a link to bin/actplace-compile still finds its tree.
  std::string exe = llvm::sys::fs::getMainExecutable(
      nullptr, reinterpret_cast<void *>(&locateStepToolchain));
  llvm::SmallString<256> real;
  if (!exe.empty() && !llvm::sys::fs::real_path(exe, real)) {
    llvm::SmallString<256> prefix =
        llvm::sys::path::parent_path(llvm::sys::path::parent_path(real.str()));
    llvm::SmallString<256> include(prefix), abi;
    llvm::sys::path::append(include, "include", "actplace");
    abi = include;
    llvm::sys::path::append(abi, "runtime", "abi.h");
    if (llvm::sys::fs::exists(abi)) {
      llvm::SmallString<256> lib(prefix);
      llvm::sys::path::append(lib, "lib");
      return {include.str().str(), installLinkItems(lib), true};
    }
  }
  return {ACTPLACE_SOURCE_DIR, ACTPLACE_LINK_ITEMS, false};
}

} // namespace ap::tools
