//===- weights.h - Parameters by HF name in safetensors files ----*- C++
//-*-===//
//
// Plain per-parameter tensors in and out of the training binary, for tools
// outside it (a PyTorch peer, the gradient oracle): `--init-weights` reads
// every parameter by its HF name, `--dump-grads` writes a step's gradients
// the same way. Unlike checkpoints (checkpoint.h) these files carry one
// tensor per parameter under its bare name, which is what
// safetensors.torch.load_file users and HF loaders expect.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_WEIGHTS_H
#define ACTPLACE_RUNTIME_WEIGHTS_H

#include "runtime/safetensors.h"

#include <map>
#include <string>
#include <vector>

namespace ap::rt {

/// A tensor as a weights file names and shapes it.
struct WeightSpec {
  std::string name;
  /// The parameter's storage dtype (BF16, F32 or F64).
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
};

/// Reads one tensor per spec from the safetensors file `path` as FP32 values
/// (in spec order). The file must hold exactly the specs' names, each with
/// the spec's shape and dtype F32 or the spec's own dtype, so a file written
/// for the model loads without silent rounding into FP32 masters (F64 is
/// only accepted for F64 parameters). Throws ap::rt::Error naming the file
/// and every missing, unknown, misshapen or mistyped tensor.
std::vector<std::vector<float>>
readWeightsF32(const std::string &path, const std::vector<WeightSpec> &specs);

/// Writes `values[i]` as F32 tensor `specs[i].name` with `specs[i].shape`
/// (the spec dtype is ignored) plus string metadata, atomically (via a
/// temporary file and rename).
void writeTensorsF32(const std::string &path,
                     const std::vector<WeightSpec> &specs,
                     const std::vector<std::vector<float>> &values,
                     const std::map<std::string, std::string> &metadata = {});

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_WEIGHTS_H
