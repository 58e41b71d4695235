//===- ModelConfig.h - model configs with HF-style fields ---------*- C++
//-*-===//
//
// Reads a model config JSON (flat, or the HF Qwen3.5 layout with text fields
// under `text_config` and rope settings under `rope_parameters`) into a
// validated ModelConfig. Every error names the file, the field (with the line
// it sits on), what was expected and what was found. Refused besides wrong
// types: JSON nested deeper than support/JsonLimits.h allows, a key given
// twice in one object, non-finite floats, sizes above the limits that keep
// every size the compiler derives inside int64 (ModelConfig.cpp), and
// `layer_types` and `hybrid_layer_pattern` that describe different layers.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_IMPORT_MODELCONFIG_H
#define ACTPLACE_IMPORT_MODELCONFIG_H

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ap::import {

/// The token mixer of a decoder layer.
enum class Mixer { None, GatedDeltaNet, Attention, Mla };

struct LayerSpec {
  Mixer mixer = Mixer::None;
  bool hasMlp = false;
};

struct ModelConfig {
  std::string name;
  std::string modelType;
  int64_t hiddenSize = 0;
  int64_t vocabSize = 0;
  int64_t intermediateSize = 0;
  double rmsNormEps = 1e-6;
  bool tieWordEmbeddings = true;
  /// Qwen3.5/Qwen3-Next model norms are (1 + w) with w initialised to 0.
  bool zeroCenteredNorms = false;
  double initializerRange = 0.02;
  std::vector<LayerSpec> layers;

  // Gated DeltaNet.
  int64_t linearKeyHeads = 0, linearValueHeads = 0;
  int64_t linearKeyHeadDim = 0, linearValueHeadDim = 0;
  int64_t linearConvKernel = 0;

  // Full attention (also the head count of MLA).
  int64_t numHeads = 0, numKvHeads = 0, headDim = 0;
  bool attnOutputGate = false;
  double partialRotaryFactor = 1.0;
  double ropeTheta = 10000.0;

  // MLA.
  std::optional<int64_t> qLoraRank;
  int64_t kvLoraRank = 0, qkNopeHeadDim = 0, qkRopeHeadDim = 0, vHeadDim = 0;

  bool hasMixer(Mixer m) const;
  /// Rotary dims of full attention: head_dim * partial_rotary_factor.
  int64_t rotaryDim() const;
  /// Every setting that shapes what the model computes (all but its name),
  /// by its HF field name, as exact text (floats round-trip). A checkpoint
  /// records them, so that a resume under a model that computes something
  /// else is refused naming the field.
  std::vector<std::pair<std::string, std::string>> computeFields() const;
};

/// Parses and validates `path`.
llvm::Expected<ModelConfig> loadModelConfig(llvm::StringRef path);
/// Parses and validates config text; `path` is used in messages only.
llvm::Expected<ModelConfig> parseModelConfig(llvm::StringRef text,
                                             llvm::StringRef path);

} // namespace ap::import

#endif // ACTPLACE_IMPORT_MODELCONFIG_H
