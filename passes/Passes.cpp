//===- Passes.cpp - actplace pass and pipeline registration ---------------===//

#include "passes/Passes.h"
#include "passes/Pipeline.h"

namespace ap {
#define GEN_PASS_REGISTRATION
#include "passes/train/TrainPasses.h.inc"
#define GEN_PASS_REGISTRATION
#include "passes/conversion/TrainToExec/TrainToExecPasses.h.inc"
#define GEN_PASS_REGISTRATION
#include "passes/exec/ExecPasses.h.inc"

void registerAllActplacePasses() {
  registerActplaceTrainPasses();
  registerActplaceTrainToExecPasses();
  registerActplaceExecPasses();
  registerActplacePipelines();
}
} // namespace ap
