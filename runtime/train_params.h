//===- train_params.h - a training run's parameters -------------*- C++ -*-===//
//
// The parameter side of the training binary's run (trainer.cpp): writing a
// parameter's initial values (its tensor-parallel part of the whole
// tensor), loading --init-weights, writing --dump-grads, the arena ranges
// of the parameters, and the whole model a pipeline's stage programs make.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_RUNTIME_TRAIN_PARAMS_H
#define ACTPLACE_RUNTIME_TRAIN_PARAMS_H

#include "runtime/tensor_parts.h"
#include "runtime/trainer.h"
#include "runtime/weights.h"

#include <string>
#include <vector>

namespace ap::rt {

/// Bytes of one element of `d`, signed for offset arithmetic.
int64_t elemBytes(kernels::DType d);
/// A parameter's initial FP32 values (its init rule, the run's seed), the
/// `span` of them this rank holds.
std::vector<float> initialValues(const ParamEntry &e, const ShardSpan &span,
                                 uint64_t seed);
/// A tensor-parallel rank's initial values of a split parameter: its part
/// of the whole tensor's values, so any tensor-parallel size starts from
/// the same model.
std::vector<float> tensorParallelPart(const ParamEntry &e, int rank, int size,
                                      uint64_t seed);
/// The shape of a parameter's whole tensor (its part's with the split
/// dimension times the tensor-parallel size).
std::vector<int64_t> wholeShape(const ParamEntry &e);
/// The arena byte ranges of every parameter's compute copy (the state a
/// run compares across ranks).
std::vector<ByteRange> paramRanges(const Program &p, StepRunner &r);
/// How a parameter split over `ranks` tensor-parallel ranks lies in its
/// whole tensor.
TensorPartLayout partLayoutOf(const ParamEntry &e, int ranks);
/// This rank's span of a parameter's values (all of them when not sharded).
std::vector<float> sliceOf(std::vector<float> full, const ShardSpan &span);
/// The safetensors type of a storage type.
StDType stDTypeOf(kernels::DType d);
/// One program holding every stage's parameters, for --init-weights and
/// the checks over the whole model.
Program wholeModelOf(const std::vector<Program> &stages);
/// Writes FP32 values `v` into a parameter's compute copy (and master).
void writeParameter(StepRunner &r, const ParamEntry &e,
                    const std::vector<float> &v);
/// --init-weights: every parameter from a safetensors file of the whole
/// model (`whole`), this program's part of each.
void loadInitWeights(const Program &whole, const Program &p, StepRunner &r,
                     const std::string &path);
/// --dump-grads: the step's gradients (clipped by `clipCoef`, as the
/// optimizer saw them) to a safetensors file.
void dumpGrads(const Program &p, StepRunner &r, const std::string &path,
               int32_t tokenCount, float clipCoef);

} // namespace ap::rt

#endif // ACTPLACE_RUNTIME_TRAIN_PARAMS_H
