//===- Passes.cpp - actplace pass registration ----------------------------===//

#include "passes/Passes.h"

namespace ap {
#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

void registerAllActplacePasses() { registerActplacePasses(); }
} // namespace ap
