//===- ModelConfig.cpp - model configs with HF-style fields ---------------===//

#include "import/ModelConfig.h"
#include "support/JsonInteger.h"

#include "support/JsonLimits.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>

using namespace ap::import;
using llvm::json::Object;
using llvm::json::Value;

bool ModelConfig::hasMixer(Mixer m) const {
  for (const LayerSpec &l : layers)
    if (l.mixer == m)
      return true;
  return false;
}

int64_t ModelConfig::rotaryDim() const {
  return static_cast<int64_t>(std::llround(headDim * partialRotaryFactor));
}

std::vector<std::pair<std::string, std::string>>
ModelConfig::computeFields() const {
  auto num = [](double v) {
    // The shortest text that reads back as the same double.
    char buf[40];
    for (int digits = 1; digits <= 17; ++digits) {
      std::snprintf(buf, sizeof(buf), "%.*g", digits, v);
      if (std::strtod(buf, nullptr) == v)
        break;
    }
    return std::string(buf);
  };
  auto i = [](int64_t v) { return std::to_string(v); };
  auto flag = [](bool v) { return std::string(v ? "true" : "false"); };
  std::string layout;
  for (const LayerSpec &l : layers) {
    switch (l.mixer) {
    case Mixer::GatedDeltaNet:
      layout += 'G';
      break;
    case Mixer::Attention:
      layout += 'A';
      break;
    case Mixer::Mla:
      layout += 'L';
      break;
    case Mixer::None:
      break;
    }
    if (l.hasMlp)
      layout += '-';
    layout += ' ';
  }
  if (!layout.empty())
    layout.pop_back();
  std::vector<std::pair<std::string, std::string>> f = {
      {"model_type", modelType},
      {"layers", layout},
      {"hidden_size", i(hiddenSize)},
      {"vocab_size", i(vocabSize)},
      {"intermediate_size", i(intermediateSize)},
      {"rms_norm_eps", num(rmsNormEps)},
      {"tie_word_embeddings", flag(tieWordEmbeddings)},
      {"zero_centered_norms", flag(zeroCenteredNorms)},
      {"initializer_range", num(initializerRange)}};
  if (hasMixer(Mixer::GatedDeltaNet)) {
    f.push_back({"linear_num_key_heads", i(linearKeyHeads)});
    f.push_back({"linear_num_value_heads", i(linearValueHeads)});
    f.push_back({"linear_key_head_dim", i(linearKeyHeadDim)});
    f.push_back({"linear_value_head_dim", i(linearValueHeadDim)});
    f.push_back({"linear_conv_kernel_dim", i(linearConvKernel)});
  }
  if (hasMixer(Mixer::Attention) || hasMixer(Mixer::Mla)) {
    f.push_back({"num_attention_heads", i(numHeads)});
    f.push_back({"rope_theta", num(ropeTheta)});
  }
  if (hasMixer(Mixer::Attention)) {
    f.push_back({"num_key_value_heads", i(numKvHeads)});
    f.push_back({"head_dim", i(headDim)});
    f.push_back({"attn_output_gate", flag(attnOutputGate)});
    f.push_back({"partial_rotary_factor", num(partialRotaryFactor)});
  }
  if (hasMixer(Mixer::Mla)) {
    f.push_back({"q_lora_rank", qLoraRank ? i(*qLoraRank) : "none"});
    f.push_back({"kv_lora_rank", i(kvLoraRank)});
    f.push_back({"qk_nope_head_dim", i(qkNopeHeadDim)});
    f.push_back({"qk_rope_head_dim", i(qkRopeHeadDim)});
    f.push_back({"v_head_dim", i(vHeadDim)});
  }
  return f;
}

namespace {
/// Largest head dimension the kernels implement.
constexpr int64_t kMaxHeadDim = 256;

/// Upper bounds on the sizes a config gives. With them every product the
/// compiler and the generated step form (tokens x width x bytes, vocab x
/// width x bytes, heads x head dim x tokens, a GDN state per chunk) stays far
/// inside int64, the type of tensor dims and of the train dialect's integer
/// attributes, and token ids fit the i32 token tensors. Each is orders of
/// magnitude above the largest published model's value.
struct SizeLimit {
  int64_t max;
  const char *why;
};
constexpr SizeLimit kWidthLimit{
    int64_t{1} << 20,
    "2^20, the largest width accepted: every tensor's byte size must fit in "
    "64 bits"};
constexpr SizeLimit kVocabLimit{
    int64_t{1} << 24,
    "2^24, the largest vocabulary accepted: token ids are 32-bit and every "
    "logits chunk's byte size must fit in 64 bits"};
constexpr SizeLimit kHeadsLimit{int64_t{1} << 12,
                                "2^12, the most heads accepted"};
constexpr SizeLimit kLayersLimit{int64_t{1} << 12,
                                 "2^12, the most layers accepted"};

/// Looks fields up in the places HF configs keep them and turns every problem
/// into one message that names file, line, field, expectation and finding.
class FieldReader {
public:
  FieldReader(llvm::StringRef text, llvm::StringRef path, const Object &root)
      : text(text), path(path), root(root) {
    textConfig = root.getObject("text_config");
    if (textConfig)
      rope = textConfig->getObject("rope_parameters");
    if (!rope)
      rope = root.getObject("rope_parameters");
  }

  /// The first error met; later ones are usually consequences.
  std::optional<std::string> error;

  /// `text_config` and `rope_parameters` hold fields; anything else there
  /// would make every field in them silently fall back to its default. Null
  /// reads as absent, as HF writes it for an unused sub-config.
  void checkContainers() {
    auto check = [&](const Object &in, llvm::StringRef key,
                     const std::string &qualified) {
      const Value *v = in.get(key);
      if (v && v->kind() != Value::Null && !v->getAsObject())
        fail(qualified,
             "expected an object of model fields, found " + describe(*v));
    };
    check(root, "text_config", "text_config");
    if (textConfig)
      check(*textConfig, "rope_parameters", "text_config.rope_parameters");
    check(root, "rope_parameters", "rope_parameters");
  }

  /// A field as HF places it: in text_config when present, else top level.
  const Value *find(llvm::StringRef key, std::string &qualified) const {
    if (textConfig)
      if (const Value *v = textConfig->get(key)) {
        qualified = ("text_config." + key).str();
        return v;
      }
    if (const Value *v = root.get(key)) {
      qualified = key.str();
      return v;
    }
    return nullptr;
  }

  const Value *findRope(llvm::StringRef key, std::string &qualified) const {
    if (rope)
      if (const Value *v = rope->get(key)) {
        qualified = (textConfig && textConfig->getObject("rope_parameters")
                         ? "text_config.rope_parameters."
                         : "rope_parameters.") +
                    key.str();
        return v;
      }
    return find(key, qualified);
  }

  void fail(const std::string &qualified, const std::string &message) {
    if (error)
      return;
    error = llvm::formatv("{0}:{1}: field '{2}': {3}", path, lineOf(qualified),
                          qualified, message)
                .str();
  }

  void failMissing(llvm::StringRef key, llvm::StringRef expected,
                   llvm::StringRef why) {
    if (error)
      return;
    error = llvm::formatv("{0}: missing field '{1}' ({2}{3}{4})", path, key,
                          expected, why.empty() ? "" : ", needed by ", why)
                .str();
  }

  void failAt(const std::string &message) {
    if (!error)
      error = (path + ": " + message).str();
  }

  std::optional<int64_t> positiveInt(llvm::StringRef key, llvm::StringRef why,
                                     const SizeLimit &limit,
                                     bool required = true) {
    std::string q;
    const Value *v = find(key, q);
    if (!v) {
      if (required)
        failMissing(key, "a positive integer", why);
      return std::nullopt;
    }
    return checkPositiveInt(*v, q, limit);
  }

  std::optional<int64_t> checkPositiveInt(const Value &v, const std::string &q,
                                          const SizeLimit &limit) {
    std::optional<int64_t> i = ap::jsonInteger(v);
    std::optional<double> d = v.getAsNumber();
    // Also numbers past int64 (1e30, 2^64 - 1): they are too large, not
    // "not an integer".
    if (i ? *i > limit.max : d && *d > static_cast<double>(limit.max)) {
      fail(q, llvm::formatv("is {0}, expected at most {1} ({2})", numberText(v),
                            limit.max, limit.why)
                  .str());
      return std::nullopt;
    }
    if (!i || *i <= 0) {
      fail(q, "expected a positive integer, found " + describe(v));
      return std::nullopt;
    }
    return i;
  }

  std::optional<double> positiveNumber(llvm::StringRef key, bool isRope,
                                       std::optional<double> fallback) {
    std::string q;
    const Value *v = isRope ? findRope(key, q) : find(key, q);
    if (!v) {
      if (!fallback)
        failMissing(key, "a positive number", "");
      return fallback;
    }
    std::optional<double> d = v->getAsNumber();
    // 1e400 parses as infinity. Float fields reach kernels that take float
    // (the GDN norm's eps), so they must also be finite as floats.
    if (!d || !(*d > 0.0) || !(*d <= FLT_MAX)) {
      fail(q, "expected a finite positive number of at most 3.4e38 (the "
              "largest float), found " +
                  describe(*v));
      return std::nullopt;
    }
    return d;
  }

  std::optional<bool> boolean(llvm::StringRef key, bool fallback) {
    std::string q;
    const Value *v = find(key, q);
    if (!v)
      return fallback;
    std::optional<bool> b = v->getAsBoolean();
    if (!b) {
      fail(q, "expected true or false, found " + describe(*v));
      return std::nullopt;
    }
    return b;
  }

  std::optional<std::string> string(llvm::StringRef key) {
    std::string q;
    const Value *v = find(key, q);
    if (!v)
      return std::nullopt;
    std::optional<llvm::StringRef> s = v->getAsString();
    if (!s) {
      fail(q, "expected a string, found " + describe(*v));
      return std::nullopt;
    }
    return s->str();
  }

  static std::string numberText(const Value &v) {
    std::string s;
    llvm::raw_string_ostream os(s);
    os << v;
    return s;
  }

  static std::string describe(const Value &v) {
    switch (v.kind()) {
    case Value::Null:
      return "null";
    case Value::Boolean:
      return *v.getAsBoolean() ? "true" : "false";
    case Value::Number:
      return "the number " + numberText(v);
    case Value::String:
      return "the string \"" + v.getAsString()->str() + "\"";
    case Value::Array:
      return "an array";
    case Value::Object:
      return "an object";
    }
    return "a value";
  }

  /// The 1-based line of the last key segment of `qualified`, searched after
  /// the line of its parent object (JSON parsers keep no positions).
  unsigned lineOf(llvm::StringRef qualified) const {
    size_t from = 0;
    llvm::SmallVector<llvm::StringRef> parts;
    qualified.split(parts, '.');
    for (llvm::StringRef part : parts) {
      // "layer_types[3]": the key, then the fourth element of its array.
      auto [key, index] = part.split('[');
      size_t at = text.find(("\"" + key + "\"").str(), from);
      if (at == llvm::StringRef::npos)
        break;
      from = at;
      unsigned element = 0;
      if (!index.empty() && !index.drop_back().getAsInteger(10, element))
        from = arrayElementOffset(from, element);
    }
    return 1 + text.take_front(from).count('\n');
  }

  /// Offset of element `element` of the array that follows offset `from`.
  size_t arrayElementOffset(size_t from, unsigned element) const {
    size_t i = text.find('[', from);
    if (i == llvm::StringRef::npos)
      return from;
    int depth = 0;
    bool inString = false;
    unsigned seen = 0;
    for (; i < text.size(); ++i) {
      char c = text[i];
      if (inString) {
        if (c == '\\')
          ++i;
        else if (c == '"')
          inString = false;
        continue;
      }
      if (c == '"') {
        inString = true;
        if (depth == 1 && seen == element)
          return i;
      } else if (c == '[' || c == '{') {
        ++depth;
      } else if (c == ']' || c == '}') {
        if (--depth == 0)
          break;
      } else if (c == ',' && depth == 1) {
        ++seen;
      } else if (depth == 1 && seen == element && !llvm::isSpace(c)) {
        return i;
      }
    }
    return from;
  }

private:
  llvm::StringRef text, path;
  const Object &root;
  const Object *textConfig = nullptr;
  const Object *rope = nullptr;
};

/// A layout of `count` layers (its `unit`s) is within kLayersLimit.
bool withinLayerLimit(FieldReader &r, const std::string &q, size_t count,
                      llvm::StringRef unit) {
  if (count <= static_cast<size_t>(kLayersLimit.max))
    return true;
  r.fail(q, llvm::formatv("has {0} {1}, expected at most {2} ({3})", count,
                          unit, kLayersLimit.max, kLayersLimit.why)
                .str());
  return false;
}

/// `layer_types`: HF decoder layers, each a mixer and an MLP.
bool readLayerTypes(FieldReader &r, const Value &types, const std::string &q,
                    std::vector<LayerSpec> &layers) {
  const llvm::json::Array *arr = types.getAsArray();
  if (!arr) {
    r.fail(q, "expected an array of layer type strings, found " +
                  FieldReader::describe(types));
    return false;
  }
  if (!withinLayerLimit(r, q, arr->size(), "entries"))
    return false;
  for (auto [i, v] : llvm::enumerate(*arr)) {
    std::optional<llvm::StringRef> s = v.getAsString();
    std::string where = q + "[" + std::to_string(i) + "]";
    LayerSpec spec;
    spec.hasMlp = true;
    if (s && *s == "linear_attention")
      spec.mixer = Mixer::GatedDeltaNet;
    else if (s && *s == "full_attention")
      spec.mixer = Mixer::Attention;
    else if (s && *s == "mla")
      spec.mixer = Mixer::Mla;
    else if (s && *s == "mlp")
      spec.mixer = Mixer::None;
    else {
      r.fail(where, "expected \"linear_attention\", \"full_attention\", "
                    "\"mla\" or \"mlp\", found " +
                        FieldReader::describe(v));
      return false;
    }
    layers.push_back(spec);
  }
  return true;
}

/// `hybrid_layer_pattern`: one block per character.
bool readLayerPattern(FieldReader &r, const Value &pat, const std::string &q,
                      std::vector<LayerSpec> &layers) {
  std::optional<llvm::StringRef> s = pat.getAsString();
  if (!s || s->empty()) {
    r.fail(q, "expected a non-empty string of G (GDN), A (attention), L "
              "(MLA) and - (MLP), found " +
                  FieldReader::describe(pat));
    return false;
  }
  if (!withinLayerLimit(r, q, s->size(), "characters"))
    return false;
  for (auto [i, c] : llvm::enumerate(*s)) {
    LayerSpec spec;
    switch (c) {
    case 'G':
      spec.mixer = Mixer::GatedDeltaNet;
      break;
    case 'A':
      spec.mixer = Mixer::Attention;
      break;
    case 'L':
      spec.mixer = Mixer::Mla;
      break;
    case '-':
      spec.hasMlp = true;
      break;
    default:
      r.fail(q, llvm::formatv("character {0} is '{1}', expected G (GDN), A "
                              "(attention), L (MLA) or - (MLP)",
                              i, c)
                    .str());
      return false;
    }
    layers.push_back(spec);
  }
  return true;
}

std::string describeLayer(const LayerSpec &l) {
  const char *mixer = l.mixer == Mixer::GatedDeltaNet ? "GDN"
                      : l.mixer == Mixer::Attention   ? "attention"
                      : l.mixer == Mixer::Mla         ? "MLA"
                                                      : nullptr;
  if (!mixer)
    return l.hasMlp ? "an MLP layer" : "an empty layer";
  return std::string(mixer) + (l.hasMlp ? " with an MLP" : " without an MLP");
}

/// Reads the layer layout: `layer_types` (HF decoder layers, mixer + MLP),
/// `hybrid_layer_pattern` (one block per character) or
/// `full_attention_interval` (Qwen3-Next style). A config that gives both
/// `layer_types` and `hybrid_layer_pattern` must describe the same layers
/// with them; otherwise which one is meant is a guess.
bool readLayers(FieldReader &r, ModelConfig &cfg,
                std::optional<int64_t> numLayers) {
  std::string q, qp;
  const Value *pat = r.find("hybrid_layer_pattern", qp);
  if (const Value *types = r.find("layer_types", q)) {
    if (!readLayerTypes(r, *types, q, cfg.layers))
      return false;
    std::vector<LayerSpec> fromPattern;
    if (pat && !readLayerPattern(r, *pat, qp, fromPattern))
      return false;
    if (pat && fromPattern.size() != cfg.layers.size()) {
      r.fail(qp, llvm::formatv("describes {0} layers but '{1}' describes {2}; "
                               "give one of the two layouts or make them "
                               "describe the same layers",
                               fromPattern.size(), q, cfg.layers.size())
                     .str());
      return false;
    }
    for (size_t i = 0; pat && i < fromPattern.size(); ++i)
      if (fromPattern[i].mixer != cfg.layers[i].mixer ||
          fromPattern[i].hasMlp != cfg.layers[i].hasMlp) {
        r.fail(qp, llvm::formatv("makes layer {0} {1} but '{2}' makes it {3}; "
                                 "give one of the two layouts or make them "
                                 "describe the same layers",
                                 i, describeLayer(fromPattern[i]), q,
                                 describeLayer(cfg.layers[i]))
                       .str());
        return false;
      }
  } else if (pat) {
    q = qp;
    if (!readLayerPattern(r, *pat, q, cfg.layers))
      return false;
  } else if (const Value *interval = r.find("full_attention_interval", q)) {
    std::optional<int64_t> n = r.checkPositiveInt(*interval, q, kLayersLimit);
    if (!n || !numLayers) {
      if (!numLayers)
        r.failMissing("num_hidden_layers", "a positive integer",
                      "full_attention_interval");
      return false;
    }
    for (int64_t i = 0; i < *numLayers; ++i)
      cfg.layers.push_back(
          {(i + 1) % *n == 0 ? Mixer::Attention : Mixer::GatedDeltaNet, true});
  } else {
    r.failAt("no layer layout: expected one of the fields 'layer_types', "
             "'hybrid_layer_pattern' or 'full_attention_interval'");
    return false;
  }
  if (cfg.layers.empty()) {
    r.fail(q, "expected at least one layer, found none");
    return false;
  }
  if (numLayers && *numLayers != static_cast<int64_t>(cfg.layers.size())) {
    std::string qn;
    r.find("num_hidden_layers", qn);
    r.fail(qn, llvm::formatv("is {0} but '{1}' describes {2} layers",
                             *numLayers, q, cfg.layers.size())
                   .str());
    return false;
  }
  return true;
}

void requireDivisible(FieldReader &r, llvm::StringRef numKey, int64_t num,
                      llvm::StringRef denKey, int64_t den) {
  if (den > 0 && num % den != 0) {
    std::string q;
    r.find(numKey, q);
    r.fail(q, llvm::formatv("is {0}, expected a multiple of '{1}' = {2}", num,
                            denKey, den)
                  .str());
  }
}

void requireHeadDim(FieldReader &r, llvm::StringRef key, int64_t dim) {
  if (dim > kMaxHeadDim) {
    std::string q;
    r.find(key, q);
    r.fail(q, llvm::formatv("is {0}, expected at most {1} (the largest head "
                            "dim the kernels implement)",
                            dim, kMaxHeadDim)
                  .str());
  }
}
} // namespace

llvm::Expected<ModelConfig> ap::import::parseModelConfig(llvm::StringRef text,
                                                         llvm::StringRef path) {
  // Before the recursive parser: bounded nesting, and no key given twice
  // (the parser would keep one of them without a word).
  if (std::optional<ap::support::JsonScanProblem> problem =
          ap::support::scanJsonLimits({text.data(), text.size()}))
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s:%u:%u: invalid config: %s",
                                   path.str().c_str(), problem->line,
                                   problem->column, problem->message.c_str());
  llvm::Expected<Value> parsed = llvm::json::parse(text);
  if (!parsed)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: invalid JSON: %s", path.str().c_str(),
                                   llvm::toString(parsed.takeError()).c_str());
  const Object *root = parsed->getAsObject();
  if (!root)
    return llvm::createStringError(llvm::inconvertibleErrorCode(),
                                   "%s: expected a JSON object at top level",
                                   path.str().c_str());

  FieldReader r(text, path, *root);
  r.checkContainers();
  ModelConfig cfg;
  cfg.modelType = r.string("model_type").value_or("");
  cfg.name =
      r.string("name_or_path").value_or(r.string("_name_or_path").value_or(""));
  // Qwen3.5 and Qwen3-Next use (1 + w) norms; a config may say so explicitly.
  bool qwenStyle = llvm::StringRef(cfg.modelType).starts_with("qwen3_5") ||
                   llvm::StringRef(cfg.modelType).starts_with("qwen3_next");
  cfg.zeroCenteredNorms =
      r.boolean("zero_centered_norms", qwenStyle).value_or(false);

  std::optional<int64_t> hidden =
      r.positiveInt("hidden_size", "every model", kWidthLimit);
  std::optional<int64_t> vocab =
      r.positiveInt("vocab_size", "every model", kVocabLimit);
  std::optional<int64_t> numLayers =
      r.positiveInt("num_hidden_layers", "", kLayersLimit,
                    /*required=*/false);
  cfg.rmsNormEps = r.positiveNumber("rms_norm_eps", false, 1e-6).value_or(0);
  cfg.initializerRange =
      r.positiveNumber("initializer_range", false, 0.02).value_or(0);
  cfg.tieWordEmbeddings = r.boolean("tie_word_embeddings", true).value_or(true);
  if (r.error)
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s",
                                   r.error->c_str());
  cfg.hiddenSize = *hidden;
  cfg.vocabSize = *vocab;

  if (!readLayers(r, cfg, numLayers))
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s",
                                   r.error->c_str());

  bool anyMlp = false;
  for (const LayerSpec &l : cfg.layers)
    anyMlp |= l.hasMlp;
  if (anyMlp)
    cfg.intermediateSize =
        r.positiveInt("intermediate_size", "MLP layers", kWidthLimit)
            .value_or(0);

  if (cfg.hasMixer(Mixer::GatedDeltaNet)) {
    const char *why = "linear_attention (GDN) layers";
    cfg.linearKeyHeads =
        r.positiveInt("linear_num_key_heads", why, kHeadsLimit).value_or(0);
    cfg.linearValueHeads =
        r.positiveInt("linear_num_value_heads", why, kHeadsLimit).value_or(0);
    cfg.linearKeyHeadDim =
        r.positiveInt("linear_key_head_dim", why, kWidthLimit).value_or(0);
    cfg.linearValueHeadDim =
        r.positiveInt("linear_value_head_dim", why, kWidthLimit).value_or(0);
    cfg.linearConvKernel =
        r.positiveInt("linear_conv_kernel_dim", why, kWidthLimit).value_or(0);
    requireDivisible(r, "linear_num_value_heads", cfg.linearValueHeads,
                     "linear_num_key_heads", cfg.linearKeyHeads);
    requireHeadDim(r, "linear_key_head_dim", cfg.linearKeyHeadDim);
    requireHeadDim(r, "linear_value_head_dim", cfg.linearValueHeadDim);
    if (cfg.linearConvKernel > 8) {
      std::string q;
      r.find("linear_conv_kernel_dim", q);
      r.fail(
          q,
          llvm::formatv("is {0}, expected 1 to 8", cfg.linearConvKernel).str());
    }
  }

  bool attention = cfg.hasMixer(Mixer::Attention);
  bool mla = cfg.hasMixer(Mixer::Mla);
  if (attention || mla) {
    const char *why = attention ? "full_attention layers" : "MLA layers";
    cfg.numHeads =
        r.positiveInt("num_attention_heads", why, kHeadsLimit).value_or(0);
    cfg.ropeTheta = r.positiveNumber("rope_theta", true, 10000.0).value_or(0);
  }
  if (attention) {
    const char *why = "full_attention layers";
    cfg.numKvHeads =
        r.positiveInt("num_key_value_heads", why, kHeadsLimit).value_or(0);
    std::optional<int64_t> headDim =
        r.positiveInt("head_dim", "", kWidthLimit, /*required=*/false);
    if (!headDim && cfg.numHeads > 0 && !r.error) {
      requireDivisible(r, "hidden_size", cfg.hiddenSize, "num_attention_heads",
                       cfg.numHeads);
      headDim = cfg.hiddenSize / cfg.numHeads;
    }
    cfg.headDim = headDim.value_or(0);
    cfg.attnOutputGate = r.boolean("attn_output_gate", false).value_or(false);
    cfg.partialRotaryFactor =
        r.positiveNumber("partial_rotary_factor", true, 1.0).value_or(1.0);
    requireDivisible(r, "num_attention_heads", cfg.numHeads,
                     "num_key_value_heads", cfg.numKvHeads);
    requireHeadDim(r, "head_dim", cfg.headDim);
    int64_t rd = cfg.rotaryDim();
    if (!r.error &&
        (cfg.partialRotaryFactor > 1.0 || rd < 2 || rd % 2 != 0 ||
         std::fabs(rd - cfg.headDim * cfg.partialRotaryFactor) > 1e-9)) {
      std::string q;
      r.findRope("partial_rotary_factor", q);
      r.fail(q.empty() ? "partial_rotary_factor" : q,
             llvm::formatv("is {0}: head_dim {1} times it must be an even "
                           "whole number of rotary dims in [2, head_dim]",
                           cfg.partialRotaryFactor, cfg.headDim)
                 .str());
    }
  }
  if (mla) {
    const char *why = "MLA layers";
    std::string q;
    // DeepSeek-V2-Lite writes null (or leaves it out), other HF configs 0:
    // both mean no q compression.
    const Value *qLora = r.find("q_lora_rank", q);
    if (qLora && qLora->kind() != Value::Null &&
        ap::jsonInteger(*qLora) != std::optional<int64_t>(0))
      cfg.qLoraRank = r.checkPositiveInt(*qLora, q, kWidthLimit);
    cfg.kvLoraRank =
        r.positiveInt("kv_lora_rank", why, kWidthLimit).value_or(0);
    cfg.qkNopeHeadDim =
        r.positiveInt("qk_nope_head_dim", why, kWidthLimit).value_or(0);
    cfg.qkRopeHeadDim =
        r.positiveInt("qk_rope_head_dim", why, kWidthLimit).value_or(0);
    cfg.vHeadDim = r.positiveInt("v_head_dim", why, kWidthLimit).value_or(0);
    if (!r.error && cfg.qkNopeHeadDim + cfg.qkRopeHeadDim > kMaxHeadDim)
      r.failAt(llvm::formatv("qk_nope_head_dim + qk_rope_head_dim = {0}, "
                             "expected at most {1}",
                             cfg.qkNopeHeadDim + cfg.qkRopeHeadDim, kMaxHeadDim)
                   .str());
    requireHeadDim(r, "v_head_dim", cfg.vHeadDim);
    if (!r.error && cfg.qkRopeHeadDim % 2 != 0) {
      r.find("qk_rope_head_dim", q);
      r.fail(q, llvm::formatv("is {0}, expected an even number (rotary pairs)",
                              cfg.qkRopeHeadDim)
                    .str());
    }
  }
  if (r.error)
    return llvm::createStringError(llvm::inconvertibleErrorCode(), "%s",
                                   r.error->c_str());
  return cfg;
}

llvm::Expected<ModelConfig> ap::import::loadModelConfig(llvm::StringRef path) {
  llvm::ErrorOr<std::unique_ptr<llvm::MemoryBuffer>> buffer =
      llvm::MemoryBuffer::getFile(path, /*IsText=*/true);
  if (!buffer)
    return llvm::createStringError(buffer.getError(), "%s: cannot read: %s",
                                   path.str().c_str(),
                                   buffer.getError().message().c_str());
  return parseModelConfig((*buffer)->getBuffer(), path);
}
