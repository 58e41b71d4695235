//===- TritonKernel.cpp - Triton-compiled kernels as op implementations ---===//
#include "codegen/TritonKernel.h"

#include "support/JsonInteger.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"

using namespace mlir;

namespace ap::codegen {
namespace {

llvm::Error err(const llvm::Twine &msg) {
  return llvm::createStringError(llvm::inconvertibleErrorCode(), msg);
}

/// "in0", "out1", "n", "rows:i64", "eps:f32" (TritonKernel.h).
std::optional<TritonArg> parseArg(llvm::StringRef spec, std::string &why) {
  auto [base, type] = spec.split(':');
  TritonArg a;
  int index = 0;
  llvm::StringRef rest = base;
  if (rest.consume_front("in") && !rest.empty() &&
      !rest.getAsInteger(10, index)) {
    a.kind = TritonArg::Input;
  } else if (rest = base; rest.consume_front("out") && !rest.empty() &&
                          !rest.getAsInteger(10, index)) {
    a.kind = TritonArg::Output;
  } else {
    if (base != "n" && base != "rows" && base != "cols" && base != "dim" &&
        base != "eps") {
      why = "'" + spec.str() +
            "' is not inK, outK or a size (n, rows, cols, dim, eps)";
      return std::nullopt;
    }
    a.kind = TritonArg::Size;
    a.size = base == "dim" ? "cols" : base.str();
  }
  if (a.kind != TritonArg::Size) {
    if (index < 0 || index > 15) {
      why = "'" + spec.str() + "': buffer index out of range";
      return std::nullopt;
    }
    a.index = index;
    a.type = 'p';
    if (!type.empty()) {
      why = "'" + spec.str() + "': a buffer takes no type";
      return std::nullopt;
    }
    return a;
  }
  if (type.empty())
    type = a.size == "eps" ? "f32" : "i32";
  if (type == "i32")
    a.type = 'i';
  else if (type == "i64")
    a.type = 'l';
  else if (type == "f32")
    a.type = 'f';
  else {
    why = "'" + spec.str() + "': type '" + type.str() +
          "' (expected i32, i64 or f32)";
    return std::nullopt;
  }
  if ((a.size == "eps") != (a.type == 'f')) {
    why = "'" + spec.str() + "': eps is an f32, sizes are integers";
    return std::nullopt;
  }
  return a;
}

std::string argSpec(const TritonArg &a) {
  switch (a.kind) {
  case TritonArg::Input:
    return "in" + std::to_string(a.index);
  case TritonArg::Output:
    return "out" + std::to_string(a.index);
  case TritonArg::Size:
    return a.size + (a.type == 'i' ? ":i32" : a.type == 'l' ? ":i64" : ":f32");
  }
  return "";
}

/// "64", "n", "cdiv(n, 1024)".
std::optional<TritonGridDim> parseGrid(llvm::StringRef spec, std::string &why) {
  spec = spec.trim();
  TritonGridDim d;
  auto isSize = [](llvm::StringRef s) {
    return s == "n" || s == "rows" || s == "cols" || s == "dim";
  };
  if (!spec.getAsInteger(10, d.value)) {
    if (d.value < 1 || d.value > 0x7fffffff) {
      why = "'" + spec.str() + "' is not a grid size from 1 to 2^31-1";
      return std::nullopt;
    }
    return d;
  }
  if (isSize(spec)) {
    d.size = spec == "dim" ? "cols" : spec.str();
    return d;
  }
  llvm::StringRef rest = spec;
  if (rest.consume_front("cdiv(") && rest.consume_back(")")) {
    auto [s, k] = rest.split(',');
    s = s.trim();
    k = k.trim();
    if (isSize(s) && !k.getAsInteger(10, d.divisor) && d.divisor >= 1) {
      d.size = s == "dim" ? "cols" : s.str();
      return d;
    }
  }
  why = "'" + spec.str() +
        "' (expected a number, n, rows, cols, dim or cdiv(SIZE, K))";
  return std::nullopt;
}

std::string gridSpec(const TritonGridDim &d) {
  if (d.size.empty())
    return std::to_string(d.value);
  if (d.divisor == 1)
    return d.size;
  return "cdiv(" + d.size + ", " + std::to_string(d.divisor) + ")";
}

/// The parameter count of `.entry name(...)` in `ptx`, or -1 when absent.
int64_t ptxEntryParams(llvm::StringRef ptx, llvm::StringRef name) {
  std::string head = (".entry " + name + "(").str();
  size_t at = ptx.find(head);
  if (at == llvm::StringRef::npos)
    return -1;
  size_t end = ptx.find(')', at);
  if (end == llvm::StringRef::npos)
    return -1;
  llvm::StringRef list = ptx.slice(at + head.size(), end);
  int64_t n = 0;
  for (size_t p = list.find(".param"); p != llvm::StringRef::npos;
       p = list.find(".param", p + 6))
    ++n;
  return n;
}

/// The N of `.target sm_N[a]`, or -1.
int64_t ptxTargetArch(llvm::StringRef ptx) {
  size_t at = ptx.find(".target sm_");
  if (at == llvm::StringRef::npos)
    return -1;
  llvm::StringRef digits = ptx.drop_front(at + 11).take_while(llvm::isDigit);
  int64_t arch = -1;
  if (digits.getAsInteger(10, arch))
    return -1;
  return arch;
}

} // namespace

std::string TritonKernel::kinds() const {
  std::string k;
  for (const TritonArg &a : args)
    k.push_back(a.type);
  return k;
}

llvm::Expected<int64_t> tritonGridValue(const TritonGridDim &dim, int64_t n,
                                        int64_t rows, int64_t cols) {
  if (dim.size.empty())
    return dim.value;
  int64_t v = dim.size == "n" ? n : dim.size == "rows" ? rows : cols;
  int64_t g = (v + dim.divisor - 1) / dim.divisor;
  if (g < 1 || g > 0x7fffffff)
    return err("grid dimension " + gridSpec(dim) + " is " + llvm::Twine(g) +
               " (expected 1 to 2^31-1)");
  return g;
}

llvm::Expected<TritonKernel> loadTritonKernel(llvm::StringRef manifestPath) {
  auto read = [](llvm::StringRef path) -> llvm::Expected<std::string> {
    auto buf = llvm::MemoryBuffer::getFile(path);
    if (!buf)
      return err(path + ": cannot read: " + buf.getError().message());
    return (*buf)->getBuffer().str();
  };
  auto parse = [](llvm::StringRef path,
                  llvm::StringRef text) -> llvm::Expected<llvm::json::Object> {
    llvm::Expected<llvm::json::Value> v = llvm::json::parse(text);
    if (!v)
      return err(path + ": not JSON: " + llvm::toString(v.takeError()));
    if (!v->getAsObject())
      return err(path + ": expected a JSON object");
    return std::move(*v->getAsObject());
  };

  TritonKernel k;
  k.manifest = manifestPath.str();
  auto mtext = read(manifestPath);
  if (!mtext)
    return mtext.takeError();
  auto manifest = parse(manifestPath, *mtext);
  if (!manifest)
    return manifest.takeError();
  auto field = [&](llvm::StringRef path, llvm::StringRef name,
                   const llvm::Twine &what) {
    return err(path + ": field '" + name + "': " + what);
  };
  std::optional<llvm::StringRef> op = manifest->getString("op");
  if (!op || !op->starts_with("train."))
    return field(manifestPath, "op",
                 "expected the train op it implements "
                 "(\"train.swiglu\", ...)");
  k.op = op->str();
  std::optional<llvm::StringRef> metaName = manifest->getString("metadata");
  if (!metaName || metaName->empty())
    return field(manifestPath, "metadata",
                 "expected the Triton metadata JSON's path");
  llvm::SmallString<256> dir(manifestPath);
  llvm::sys::path::remove_filename(dir);
  auto resolve = [&](llvm::StringRef p) {
    if (llvm::sys::path::is_absolute(p))
      return p.str();
    llvm::SmallString<256> full(dir);
    llvm::sys::path::append(full, p);
    return std::string(full.str());
  };
  std::string metaPath = resolve(*metaName);
  std::string ptxPath;
  if (std::optional<llvm::StringRef> p = manifest->getString("ptx"))
    ptxPath = resolve(*p);
  else {
    llvm::SmallString<256> stem(metaPath);
    llvm::sys::path::replace_extension(stem, "ptx");
    ptxPath = std::string(stem.str());
  }

  const llvm::json::Array *args = manifest->getArray("args");
  if (!args || args->empty())
    return field(manifestPath, "args",
                 "expected the kernel's parameters in order (inK, outK, n, "
                 "rows, cols, eps)");
  for (const llvm::json::Value &a : *args) {
    std::optional<llvm::StringRef> s = a.getAsString();
    std::string why = "expected strings";
    std::optional<TritonArg> arg = s ? parseArg(*s, why) : std::nullopt;
    if (!arg)
      return field(manifestPath, "args", why);
    k.args.push_back(*arg);
  }
  if (k.args.size() > 24)
    return field(manifestPath, "args", "more than 24 parameters");
  const llvm::json::Array *grid = manifest->getArray("grid");
  if (!grid || grid->size() != 3)
    return field(manifestPath, "grid", "expected three dimensions");
  for (auto [i, g] : llvm::enumerate(*grid)) {
    std::string why;
    std::string spec;
    if (std::optional<llvm::StringRef> s = g.getAsString())
      spec = s->str();
    else if (std::optional<int64_t> v = ap::jsonInteger(g))
      spec = std::to_string(*v);
    else
      return field(manifestPath, "grid", "expected numbers or size strings");
    std::optional<TritonGridDim> d = parseGrid(spec, why);
    if (!d)
      return field(manifestPath, "grid", why);
    k.grid[i] = *d;
  }

  // Triton's metadata.
  auto metaText = read(metaPath);
  if (!metaText)
    return metaText.takeError();
  auto meta = parse(metaPath, *metaText);
  if (!meta)
    return meta.takeError();
  std::optional<llvm::StringRef> name = meta->getString("name");
  if (!name || name->empty())
    return field(metaPath, "name",
                 "expected the kernel's entry name (a "
                 "Triton 3.x metadata JSON)");
  k.name = name->str();
  auto integer = [&](llvm::StringRef key) -> std::optional<int64_t> {
    const llvm::json::Value *v = meta->get(key);
    return v ? ap::jsonInteger(*v) : std::nullopt;
  };
  std::optional<int64_t> warps = integer("num_warps");
  if (!warps || *warps < 1 || *warps > 32)
    return field(metaPath, "num_warps", "expected 1 to 32");
  k.numWarps = *warps;
  std::optional<int64_t> shared = integer("shared");
  if (!shared || *shared < 0 || *shared > 232448)
    return field(metaPath, "shared",
                 "expected the dynamic shared memory bytes, 0 to 232448 "
                 "(227 KiB, an H200's most per block)");
  k.sharedBytes = *shared;
  if (std::optional<int64_t> ctas = integer("num_ctas"); ctas && *ctas != 1)
    return field(metaPath, "num_ctas",
                 "is " + llvm::Twine(*ctas) +
                     "; thread-block clusters are not supported (compile with "
                     "num_ctas=1)");
  const llvm::json::Object *target = meta->getObject("target");
  if (!target)
    return field(metaPath, "target",
                 "expected {\"backend\": \"cuda\", \"arch\": N, "
                 "\"warp_size\": 32} (the shape of Triton 3.x metadata)");
  if (target->getString("backend") != llvm::StringRef("cuda"))
    return field(metaPath, "target.backend", "expected \"cuda\"");
  const llvm::json::Value *archV = target->get("arch");
  std::optional<int64_t> arch = archV ? ap::jsonInteger(*archV) : std::nullopt;
  if (!arch)
    return field(metaPath, "target.arch", "expected a number (90 for sm_90)");
  if (*arch > 90)
    return field(metaPath, "target.arch",
                 "is " + llvm::Twine(*arch) +
                     ", newer than the sm_90 GPUs this binary targets");
  k.arch = *arch;
  const llvm::json::Value *warpV = target->get("warp_size");
  if (!warpV || ap::jsonInteger(*warpV) != std::optional<int64_t>(32))
    return field(metaPath, "target.warp_size", "expected 32");
  // The launch ABI's hidden trailing pointers (global scratch; profile
  // scratch from Triton 3.5), which must be unused.
  for (llvm::StringRef key : {"global_scratch_size", "profile_scratch_size"}) {
    if (!meta->get(key))
      continue;
    std::optional<int64_t> size = integer(key);
    if (!size || *size != 0)
      return field(metaPath, key,
                   "expected 0: kernels that need Triton's scratch memory are "
                   "not supported");
    ++k.hiddenParams;
  }
  if (!meta->get("global_scratch_size") && meta->get("profile_scratch_size"))
    return field(metaPath, "global_scratch_size",
                 "missing beside profile_scratch_size (not the shape of "
                 "Triton 3.x metadata)");

  auto ptx = read(ptxPath);
  if (!ptx)
    return ptx.takeError();
  k.ptx = std::move(*ptx);
  int64_t ptxArch = ptxTargetArch(k.ptx);
  if (ptxArch < 0)
    return err(ptxPath + ": no '.target sm_N' line (not PTX?)");
  if (ptxArch > 90)
    return err(ptxPath + ": .target sm_" + llvm::Twine(ptxArch) +
               " is newer than the sm_90 GPUs this binary targets");
  int64_t params = ptxEntryParams(k.ptx, k.name);
  if (params < 0)
    return err(ptxPath + ": no '.entry " + k.name + "(' (the metadata's name)");
  int64_t expected = int64_t(k.args.size()) + k.hiddenParams;
  if (params != expected)
    return err(ptxPath + ": entry " + k.name + " takes " + llvm::Twine(params) +
               " parameters; the manifest maps " + llvm::Twine(k.args.size()) +
               (k.hiddenParams ? " plus " + llvm::Twine(k.hiddenParams) +
                                     " hidden scratch pointers"
                               : llvm::Twine("")) +
               " (" + manifestPath + ", field 'args')");
  return k;
}

DictionaryAttr TritonKernel::toAttr(MLIRContext *ctx) const {
  Builder b(ctx);
  SmallVector<Attribute> argAttrs, gridAttrs;
  for (const TritonArg &a : args)
    argAttrs.push_back(b.getStringAttr(argSpec(a)));
  for (const TritonGridDim &g : grid)
    gridAttrs.push_back(b.getStringAttr(gridSpec(g)));
  return b.getDictionaryAttr({
      b.getNamedAttr("op", b.getStringAttr(op)),
      b.getNamedAttr("name", b.getStringAttr(name)),
      b.getNamedAttr("ptx", b.getStringAttr(ptx)),
      b.getNamedAttr("args", b.getArrayAttr(argAttrs)),
      b.getNamedAttr("grid", b.getArrayAttr(gridAttrs)),
      b.getNamedAttr("num_warps", b.getI64IntegerAttr(numWarps)),
      b.getNamedAttr("shared", b.getI64IntegerAttr(sharedBytes)),
      b.getNamedAttr("hidden", b.getI64IntegerAttr(hiddenParams)),
      b.getNamedAttr("manifest", b.getStringAttr(manifest)),
  });
}

std::optional<TritonKernel> TritonKernel::fromAttr(DictionaryAttr attr,
                                                   std::string &error) {
  TritonKernel k;
  auto str = [&](llvm::StringRef key) -> std::optional<std::string> {
    if (auto s = attr.getAs<StringAttr>(key))
      return s.getValue().str();
    error = "a Triton kernel entry has no string '" + key.str() + "'";
    return std::nullopt;
  };
  auto num = [&](llvm::StringRef key, int64_t lo,
                 int64_t hi) -> std::optional<int64_t> {
    auto i = attr.getAs<IntegerAttr>(key);
    if (i && i.getInt() >= lo && i.getInt() <= hi)
      return i.getInt();
    error = "a Triton kernel entry's '" + key.str() + "' is not an integer " +
            std::to_string(lo) + " to " + std::to_string(hi);
    return std::nullopt;
  };
  auto op = str("op"), name = str("name"), ptx = str("ptx"),
       manifest = str("manifest");
  auto warps = num("num_warps", 1, 32), shared = num("shared", 0, 232448),
       hidden = num("hidden", 0, 2);
  if (!op || !name || !ptx || !manifest || !warps || !shared || !hidden)
    return std::nullopt;
  k.op = *op;
  k.name = *name;
  k.ptx = *ptx;
  k.manifest = *manifest;
  k.numWarps = *warps;
  k.sharedBytes = *shared;
  k.hiddenParams = *hidden;
  auto args = attr.getAs<ArrayAttr>("args");
  auto grid = attr.getAs<ArrayAttr>("grid");
  if (!args || args.empty() || !grid || grid.size() != 3) {
    error = "a Triton kernel entry needs 'args' and three 'grid' strings";
    return std::nullopt;
  }
  for (Attribute a : args) {
    auto s = dyn_cast<StringAttr>(a);
    std::string why = "an arg is not a string";
    std::optional<TritonArg> arg =
        s ? parseArg(s.getValue(), why) : std::nullopt;
    if (!arg) {
      error = "Triton kernel " + k.name + ": args: " + why;
      return std::nullopt;
    }
    k.args.push_back(*arg);
  }
  for (auto [i, g] : llvm::enumerate(grid)) {
    auto s = dyn_cast<StringAttr>(g);
    std::string why = "a grid entry is not a string";
    std::optional<TritonGridDim> d =
        s ? parseGrid(s.getValue(), why) : std::nullopt;
    if (!d) {
      error = "Triton kernel " + k.name + ": grid: " + why;
      return std::nullopt;
    }
    k.grid[i] = *d;
  }
  return k;
}

} // namespace ap::codegen
