//===- dense.h - actplace dense kernels ABI -----------------------------*- C++ -*-===//
//
// Included from kernels/kernels.h; do not include directly.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_DENSE_H
#define ACTPLACE_KERNELS_DENSE_H

#endif // ACTPLACE_KERNELS_DENSE_H
