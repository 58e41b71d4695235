//===- Passes.cpp - actplace pass and pipeline registration ---------------===//

#include "passes/Passes.h"
#include "passes/Pipeline.h"


namespace ap {
#define GEN_PASS_REGISTRATION
#include "passes/Passes.h.inc"

void registerAllActplacePasses() {
  registerActplacePasses();
  registerActplacePipelines();
}
} // namespace ap
