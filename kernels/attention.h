//===- attention.h - actplace attention kernels ABI ---------------*- C++ -*-===//
//
// Included from kernels/kernels.h; do not include directly.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_ATTENTION_H
#define ACTPLACE_KERNELS_ATTENTION_H

#endif // ACTPLACE_KERNELS_ATTENTION_H
