//===- gdn.h - actplace gdn kernels ABI -----------------------------*- C++ -*-===//
//
// Included from kernels/kernels.h; do not include directly.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_GDN_H
#define ACTPLACE_KERNELS_GDN_H

#endif // ACTPLACE_KERNELS_GDN_H
