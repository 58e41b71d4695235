//===- abi_program.h - ap_program to the runtime's Program ------*- C++ -*-===//
//
// The C++ side of the compiler-runtime contract: how a program description
// of runtime/abi.h becomes the runtime's Program (runtime/trainer.h), so that
// what generated code sets can be checked field by field.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_ABI_PROGRAM_H
#define ACTPLACE_RUNTIME_ABI_PROGRAM_H

#include "runtime/abi.h"
#include "runtime/trainer.h"

#include <vector>

namespace ap::rt {

/// The runtime's Program for `p`, every field checked; an Error names the
/// field, its value and what was expected (ap_train_main prints it).
Program programOfAbi(const ap_program &p);

/// The programs of a pipelined binary (ap_train_main_stages), each checked
/// by programOfAbi, in stage order: stages[s] must be stage s of
/// numStages, and all must agree on the data-parallel layout, microbatches,
/// batch, seq and vocab.
std::vector<Program> programsOfAbiStages(const ap_program *const *stages,
                                         int32_t numStages);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_ABI_PROGRAM_H
