//===- KernelGen.cpp - MLIR for element-wise and row-wise groups ----------===//
//
// One per-element (or per-row) body per op group, emitted twice: inside scf
// loops of a func.func for the host, and inside a gpu.func where each thread
// takes one element (or one row). The body mirrors the reference kernel of
// the op (kernels/reference/dense/dense_ref.cpp) operation by operation, so
// that both lowerings compute the reference's bits wherever the underlying
// instructions are correctly rounded (docs/kernelgen.md).
//
//===----------------------------------------------------------------------===//
#include "kernelgen/KernelGen.h"

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/GPU/IR/GPUDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMDialect.h"
#include "mlir/Dialect/LLVMIR/LLVMTypes.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/MemRef/IR/MemRef.h"
#include "mlir/Dialect/SCF/IR/SCF.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/BuiltinTypes.h"

#include "llvm/ADT/StringSwitch.h"

#include <cmath>
#include <functional>
#include <tuple>

using namespace mlir;

namespace ap::kernelgen {

namespace {

struct ChunkCtx;

/// The C library's log1p of float, which host kernels call.
constexpr llvm::StringLiteral kLog1pf = "log1pf";

/// Emits the per-element code of every group; `gpu` picks pointer address
/// space 1 (global) and the gpu memref memory space.
class Emitter {
public:
  Emitter(OpBuilder &b, Location loc, bool gpu) : b(b), loc(loc), gpu(gpu) {}

  Type ptrType() {
    return LLVM::LLVMPointerType::get(b.getContext(), gpu ? 1 : 0);
  }
  Type storage(ElemType t) {
    return t == ElemType::BF16 ? Type(b.getBF16Type()) : Type(b.getF32Type());
  }

  Value cIndex(int64_t v) { return arith::ConstantIndexOp::create(b, loc, v); }
  Value cF32(float v) {
    return arith::ConstantOp::create(b, loc, b.getF32FloatAttr(v));
  }
  Value cF64(double v) {
    return arith::ConstantOp::create(b, loc, b.getF64FloatAttr(v));
  }
  Value cI32(uint32_t v) {
    return arith::ConstantOp::create(b, loc, b.getI32IntegerAttr(int32_t(v)));
  }
  Value toIndex(Value i64) {
    return arith::IndexCastOp::create(b, loc, b.getIndexType(), i64);
  }

  /// A memref over raw storage `ptr`: rank 1 of `size` elements, or rank 2
  /// [rows, cols] with row stride `stride` (elements). The descriptor is
  /// built in the LLVM dialect and cast, so the kernel's ABI stays plain
  /// pointers while its body indexes memrefs.
  Value memref(Value ptr, Type elem, ArrayRef<Value> sizes,
               ArrayRef<Value> strides) {
    MLIRContext *ctx = b.getContext();
    int64_t rank = static_cast<int64_t>(sizes.size());
    Type i64 = b.getI64Type();
    Type arr = LLVM::LLVMArrayType::get(i64, rank);
    auto descTy = LLVM::LLVMStructType::getLiteral(
        ctx, {ptrType(), ptrType(), i64, arr, arr});
    Value d = LLVM::PoisonOp::create(b, loc, descTy);
    d = LLVM::InsertValueOp::create(b, loc, d, ptr, ArrayRef<int64_t>{0});
    d = LLVM::InsertValueOp::create(b, loc, d, ptr, ArrayRef<int64_t>{1});
    Value zero = LLVM::ConstantOp::create(b, loc, i64, b.getI64IntegerAttr(0));
    d = LLVM::InsertValueOp::create(b, loc, d, zero, ArrayRef<int64_t>{2});
    for (int64_t i = 0; i < rank; ++i) {
      d = LLVM::InsertValueOp::create(b, loc, d, sizes[i],
                                      ArrayRef<int64_t>{3, i});
      d = LLVM::InsertValueOp::create(b, loc, d, strides[i],
                                      ArrayRef<int64_t>{4, i});
    }
    Attribute space;
    if (gpu)
      space = gpu::AddressSpaceAttr::get(ctx, gpu::AddressSpace::Global);
    SmallVector<int64_t> shape(rank, ShapedType::kDynamic);
    MemRefLayoutAttrInterface layout;
    if (rank == 2)
      layout = StridedLayoutAttr::get(ctx, 0, {ShapedType::kDynamic, 1});
    auto ty = MemRefType::get(shape, elem, layout, space);
    return UnrealizedConversionCastOp::create(b, loc, ty, d).getResult(0);
  }
  Value memref1(Value ptr, Type elem, Value n) {
    Value one = LLVM::ConstantOp::create(b, loc, b.getI64Type(),
                                         b.getI64IntegerAttr(1));
    return memref(ptr, elem, {n}, {one});
  }
  Value memref2(Value ptr, Type elem, Value rows, Value cols, Value stride) {
    Value one = LLVM::ConstantOp::create(b, loc, b.getI64Type(),
                                         b.getI64IntegerAttr(1));
    return memref(ptr, elem, {rows, cols}, {stride, one});
  }

  /// Loads one element widened to f32: bf16 bits shifted into the high half
  /// of an f32 (exact, as bf16::toFloat). Inside a row chunk (`chunk`), an
  /// element of the chunk comes from the chunk's loads of that operand.
  Value load(Value m, ValueRange idx);
  /// A storage value (bf16 or f32) as f32, exactly.
  Value widen(Value v) {
    if (v.getType().isF32())
      return v;
    return widenBits(arith::BitcastOp::create(b, loc, b.getI16Type(), v));
  }
  /// bf16 bits (i16) as f32, exactly.
  Value widenBits(Value bits) {
    Value w = arith::ExtUIOp::create(b, loc, b.getI32Type(), bits);
    w = arith::ShLIOp::create(b, loc, w, cI32(16));
    return arith::BitcastOp::create(b, loc, b.getF32Type(), w);
  }

  /// An f32 rounded to storage type `elem`: bf16 by round to nearest even
  /// on the bits, NaN kept quiet and non-zero, exactly as bf16::fromFloat
  /// (the same bits on host and GPU, whatever the target's own conversion
  /// instruction does with NaN).
  Value narrow(Value v, Type elem) {
    if (elem.isF32())
      return v;
    Type i32 = b.getI32Type(), i16 = b.getI16Type();
    Value u = arith::BitcastOp::create(b, loc, i32, v);
    Value mag = arith::AndIOp::create(b, loc, u, cI32(0x7fffffffu));
    Value isNan = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ugt, mag,
                                        cI32(0x7f800000u));
    Value hi = arith::ShRUIOp::create(b, loc, u, cI32(16));
    Value quiet = arith::OrIOp::create(b, loc, hi, cI32(0x40u));
    Value lsb = arith::AndIOp::create(b, loc, hi, cI32(1u));
    Value bias = arith::AddIOp::create(b, loc, lsb, cI32(0x7fffu));
    Value sum = arith::AddIOp::create(b, loc, u, bias);
    Value rounded = arith::ShRUIOp::create(b, loc, sum, cI32(16));
    Value bits32 = arith::SelectOp::create(b, loc, isNan, quiet, rounded);
    Value bits = arith::TruncIOp::create(b, loc, i16, bits32);
    return arith::BitcastOp::create(b, loc, elem, bits);
  }

  /// Stores an f32 rounded to the memref's element type (narrow); inside a
  /// vector row chunk, with the chunk's other elements when it ends.
  void store(Value v, Value m, ValueRange idx);

  Value add(Value x, Value y) { return arith::AddFOp::create(b, loc, x, y); }
  Value sub(Value x, Value y) { return arith::SubFOp::create(b, loc, x, y); }
  Value mul(Value x, Value y) { return arith::MulFOp::create(b, loc, x, y); }
  Value div(Value x, Value y) { return arith::DivFOp::create(b, loc, x, y); }
  /// Correctly rounded square root, as std::sqrt. On the GPU the NVPTX
  /// intrinsic of sqrt.rn.f32 (no flush of denormals): convert-gpu-to-nvvm
  /// maps math.sqrt to libdevice's __nv_sqrtf, which is the approximate
  /// sqrt unless the module asks for precise sqrt through nvvm-reflect, and
  /// it rejects llvm.intr.sqrt.
  Value sqrt(Value x) {
    if (gpu)
      return LLVM::CallIntrinsicOp::create(
                 b, loc, x.getType(),
                 b.getStringAttr(x.getType().isF64() ? "llvm.nvvm.sqrt.rn.d"
                                                     : "llvm.nvvm.sqrt.rn.f"),
                 ValueRange{x})
          .getResult(0);
    return math::SqrtOp::create(b, loc, x);
  }
  /// log(1 + x) as the C library's log1pf: on the host a call to log1pf
  /// itself (MLIR's math-to-LLVM lowering would approximate it); on the GPU
  /// libdevice's __nv_log1pf.
  Value log1p(Value x);
  /// 1 / (1 + exp(-x)), the reference's sigmoid.
  Value sigmoid(Value x) {
    Value e = math::ExpOp::create(b, loc, arith::NegFOp::create(b, loc, x));
    return div(cF32(1.0f), add(cF32(1.0f), e));
  }

  OpBuilder &b;
  Location loc;
  bool gpu;
  /// The row chunk whose elements load and store go through (or null).
  ChunkCtx *chunk = nullptr;
};

/// The raw view of a memref built by Emitter::memref: its pointer and row
/// stride (i64; null for rank 1), read back from the descriptor's inserts.
struct RawView {
  Value ptr, stride;
  Type elem;
  int64_t rank;
};
RawView rawView(Value m) {
  auto ty = cast<MemRefType>(m.getType());
  RawView v{Value(), Value(), ty.getElementType(), ty.getRank()};
  Value d = m.getDefiningOp<UnrealizedConversionCastOp>()->getOperand(0);
  while (auto ins = d.getDefiningOp<LLVM::InsertValueOp>()) {
    ArrayRef<int64_t> pos = ins.getPosition();
    if (pos.size() == 1 && pos[0] == 1)
      v.ptr = ins.getValue();
    if (v.rank == 2 && pos.size() == 2 && pos[0] == 4 && pos[1] == 0)
      v.stride = ins.getValue();
    d = ins.getContainer();
  }
  assert(v.ptr && (v.rank == 1 || v.stride) && "not a kernelgen memref");
  return v;
}

int64_t bytesOfElem(Type t) { return t.isF32() ? 4 : 2; }

/// True (i1) where every memref's storage is aligned for a chunk of `vec`
/// elements at a multiple of `vec` (16 bytes): its pointer aligned to vec
/// elements and, in rank 2, its row stride a multiple of vec.
Value chunksAligned(Emitter &e, ArrayRef<Value> memrefs, int64_t vec) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type i64 = b.getI64Type();
  auto c64 = [&](int64_t v) {
    return LLVM::ConstantOp::create(b, loc, i64, b.getI64IntegerAttr(v));
  };
  Value ok = arith::ConstantOp::create(b, loc, b.getBoolAttr(true));
  auto zeroAfterMask = [&](Value x, int64_t mask) {
    Value low = LLVM::AndOp::create(b, loc, x, c64(mask));
    return LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::eq, low, c64(0));
  };
  for (Value m : memrefs) {
    RawView v = rawView(m);
    Value addr = LLVM::PtrToIntOp::create(b, loc, i64, v.ptr);
    ok = arith::AndIOp::create(
        b, loc, ok, zeroAfterMask(addr, vec * bytesOfElem(v.elem) - 1));
    if (v.stride)
      ok = arith::AndIOp::create(b, loc, ok, zeroAfterMask(v.stride, vec - 1));
  }
  return ok;
}

/// rowGroupWork's row condition: chunksAligned over `memrefs`, evaluated in
/// the emitter the work is built in.
std::function<Value(Emitter &)> chunksAlignedOf(SmallVector<Value> memrefs,
                                                int64_t vec) {
  return [=](Emitter &in) { return chunksAligned(in, memrefs, vec); };
}

/// One chunk of `vec` consecutive elements of a row, [c0, c0 + vec): the
/// element indices js, and per memref the elements loaded (f32) and the
/// values to store (storage type). With `vector`, each memref's chunk is
/// one aligned vector load and one vector store (flush); otherwise every
/// element is a scalar load (all of a memref's chunk at its first use) and
/// stores happen at once. The elements and the arithmetic on them are the
/// same either way.
struct ChunkCtx {
  Value c0;
  int64_t vec;
  bool vector;
  SmallVector<Value, 8> js;
  llvm::DenseMap<Value, SmallVector<Value, 8>> loaded;
  llvm::DenseMap<Value, SmallVector<Value, 8>> stores;
  SmallVector<Value, 4> storeOrder;

  ChunkCtx(Emitter &e, Value c0, int64_t vec, bool vector)
      : c0(c0), vec(vec), vector(vector) {
    for (int64_t k = 0; k < vec; ++k)
      js.push_back(
          k == 0 ? c0
                 : Value(arith::AddIOp::create(e.b, e.loc, c0, e.cIndex(k))));
  }
  /// The position of `j` in the chunk, or -1.
  int64_t indexOf(Value j) const {
    for (int64_t k = 0; k < vec; ++k)
      if (js[k] == j)
        return k;
    return -1;
  }
  /// The address of the chunk in memref `m` (row `idx[0]` in rank 2).
  Value address(Emitter &e, Value m, ValueRange idx) {
    RawView v = rawView(m);
    Type i64 = e.b.getI64Type();
    Value off = arith::IndexCastOp::create(e.b, e.loc, i64, c0);
    if (v.rank == 2) {
      Value r = arith::IndexCastOp::create(e.b, e.loc, i64, idx[0]);
      off = LLVM::AddOp::create(
          e.b, e.loc, LLVM::MulOp::create(e.b, e.loc, r, v.stride), off);
    }
    Type et = v.elem.isF32() ? Type(e.b.getF32Type()) : Type(e.b.getI16Type());
    return LLVM::GEPOp::create(e.b, e.loc, v.ptr.getType(), et, v.ptr,
                               ValueRange{off});
  }
  Value load(Emitter &e, Value m, ValueRange idx, int64_t k) {
    auto it = loaded.find(m);
    if (it == loaded.end()) {
      SmallVector<Value, 8> elems;
      Type elem = cast<MemRefType>(m.getType()).getElementType();
      if (vector) {
        bool f32 = elem.isF32();
        Type et = f32 ? Type(e.b.getF32Type()) : Type(e.b.getI16Type());
        Value x = LLVM::LoadOp::create(e.b, e.loc, VectorType::get({vec}, et),
                                       address(e, m, idx),
                                       unsigned(vec * bytesOfElem(elem)));
        for (int64_t i = 0; i < vec; ++i) {
          Value el = LLVM::ExtractElementOp::create(
              e.b, e.loc, x,
              LLVM::ConstantOp::create(e.b, e.loc, e.b.getI32Type(),
                                       e.b.getI32IntegerAttr(int32_t(i))));
          elems.push_back(f32 ? el : e.widenBits(el));
        }
      } else {
        for (int64_t i = 0; i < vec; ++i) {
          SmallVector<Value, 2> at(idx.begin(), idx.end());
          at.back() = js[i];
          elems.push_back(e.widen(memref::LoadOp::create(e.b, e.loc, m, at)));
        }
      }
      it = loaded.try_emplace(m, std::move(elems)).first;
    }
    return it->second[k];
  }
  void flush(Emitter &e) {
    for (Value m : storeOrder) {
      Type elem = cast<MemRefType>(m.getType()).getElementType();
      bool f32 = elem.isF32();
      Type et = f32 ? Type(e.b.getF32Type()) : Type(e.b.getI16Type());
      Value x = LLVM::PoisonOp::create(e.b, e.loc, VectorType::get({vec}, et));
      SmallVector<Value, 8> &vals = stores[m];
      for (int64_t i = 0; i < vec; ++i) {
        assert(vals[i] && "a vector chunk stores every element");
        Value el = f32 ? vals[i]
                       : Value(arith::BitcastOp::create(
                             e.b, e.loc, e.b.getI16Type(), vals[i]));
        x = LLVM::InsertElementOp::create(
            e.b, e.loc, x, el,
            LLVM::ConstantOp::create(e.b, e.loc, e.b.getI32Type(),
                                     e.b.getI32IntegerAttr(int32_t(i))));
      }
      SmallVector<Value, 2> idx;
      if (cast<MemRefType>(m.getType()).getRank() == 2)
        idx.push_back(rowOf[m]);
      LLVM::StoreOp::create(e.b, e.loc, x, address(e, m, idx),
                            unsigned(vec * bytesOfElem(elem)));
    }
    storeOrder.clear();
    stores.clear();
  }
  /// The row index of each rank-2 memref stored to.
  llvm::DenseMap<Value, Value> rowOf;
};

Value Emitter::log1p(Value x) {
  if (gpu)
    return math::Log1pOp::create(b, loc, x);
  // buildHostModule declares log1pf (the calls are built inside loops that
  // are not in the module yet, so they cannot add it themselves).
  return func::CallOp::create(b, loc, kLog1pf, TypeRange{b.getF32Type()},
                              ValueRange{x})
      .getResult(0);
}

Value Emitter::load(Value m, ValueRange idx) {
  if (chunk) {
    int64_t k = chunk->indexOf(idx.back());
    if (k >= 0)
      return chunk->load(*this, m, idx, k);
  }
  return widen(memref::LoadOp::create(b, loc, m, idx));
}

void Emitter::store(Value v, Value m, ValueRange idx) {
  Type elem = cast<MemRefType>(m.getType()).getElementType();
  if (chunk && chunk->vector) {
    int64_t k = chunk->indexOf(idx.back());
    if (k >= 0) {
      auto [it, fresh] = chunk->stores.try_emplace(m);
      if (fresh) {
        it->second.assign(chunk->vec, Value());
        chunk->storeOrder.push_back(m);
        if (idx.size() == 2)
          chunk->rowOf[m] = idx[0];
      }
      it->second[k] = narrow(v, elem);
      return;
    }
  }
  memref::StoreOp::create(b, loc, narrow(v, elem), m, idx);
}

/// A kernel's parameters by kind: pointers first, then i64 integers, then
/// f32 scalars (kernelParams' order, KernelAbi.h).
struct Params {
  SmallVector<std::string> ptrs, ints, floats;
};

Params paramsOf(const GroupSpec &s) {
  Params p;
  // Workspace pointers are pointers (they follow the others).
  for (const KernelParam &k : kernelParams(s))
    (k.kind == 'p' || k.kind == 'w' ? p.ptrs
     : k.kind == 'l'                ? p.ints
                                    : p.floats)
        .push_back(k.name);
  return p;
}

/// Named access to a kernel's block arguments.
struct Args {
  Params names;
  ValueRange values;
  Value get(llvm::StringRef name) const {
    size_t i = 0;
    for (const auto *list : {&names.ptrs, &names.ints, &names.floats})
      for (const std::string &n : *list) {
        if (n == name)
          return values[i];
        ++i;
      }
    llvm_unreachable("unknown kernel parameter");
  }
};

/// How a group's work is split: items over `shape` (index values: {n}
/// elements or rows, or {rows, cols} elements), and the code of one item
/// given its indices. The code before the items (memrefs, scalars) runs
/// once per kernel invocation (per thread on the GPU).
using ItemFn = std::function<void(Emitter &, ValueRange)>;
/// A GPU body written for the whole block: thread and block ids (index) and
/// the block's shared f32 array (Work::sharedFloats).
using BlockFn = std::function<void(Emitter &, Value, Value, Value)>;
struct Work {
  SmallVector<Value, 2> shape;
  ItemFn item;
  /// When set, the GPU kernel is this body instead of the item mapping,
  /// with a shared array of sharedFloats f32 (none when 0; the host runs
  /// `item` per element of `shape` as usual). Without it, GPU item t of
  /// the entry's launch (gpuEntries) runs `item`: with threadsPerItem > 1
  /// (a warp per row) given (row, lane), on the host (row) with the lanes
  /// emulated inside rowSum.
  BlockFn gpuBlock;
  int64_t sharedFloats = 0;
  /// The shared array's element type (null: f32).
  Type sharedElem;
};

/// The lane of a warp-per-row item (GPU), null on the host.
Value laneOf(ValueRange idx) { return idx.size() > 1 ? idx[1] : Value(); }

/// A host scratch array of 2 x kLanes f32 for the reduction emulation
/// (allocated once per kernel call, in the function's entry); null on the
/// GPU, where the lanes are threads.
Value rowScratch(Emitter &e) {
  if (e.gpu)
    return Value();
  return memref::AllocaOp::create(
      e.b, e.loc, MemRefType::get({2 * kLanes}, e.b.getF32Type()));
}

using TermFn = llvm::function_ref<Value(Emitter &, Value)>;

/// Terms a strided sum computes before adding them: their loads are issued
/// together, so a thread waits for memory once per kSumUnroll terms rather
/// than once per term. The adds stay one after the other in increasing j.
constexpr int64_t kSumUnroll = 4;

/// Sum of term(j) for j = first, first + stride, ... < n, from 0 (`zero`,
/// of the terms' type; null: f32), in increasing j (one lane's or one row
/// group's partial): kSumUnroll terms an iteration while they all exist,
/// then one at a time.
Value stridedSum(Emitter &e, Value first, Value n, TermFn term,
                 int64_t stride = kLanes, Value zero = Value()) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value lanes = e.cIndex(stride);
  // Groups start below n - (kSumUnroll - 1) * stride (signed: n may be
  // smaller); the loop carries the next j for the tail.
  Value groupEnd =
      arith::SubIOp::create(b, loc, n, e.cIndex((kSumUnroll - 1) * stride));
  auto groups = scf::ForOp::create(
      b, loc, first, groupEnd, e.cIndex(kSumUnroll * stride),
      ValueRange{zero ? zero : e.cF32(0.0f), first},
      [&](OpBuilder &nb, Location nl, Value j, ValueRange acc) {
        Emitter in(nb, nl, e.gpu);
        SmallVector<Value, kSumUnroll> terms;
        for (int64_t u = 0; u < kSumUnroll; ++u)
          terms.push_back(
              term(in, u == 0 ? j
                              : Value(arith::AddIOp::create(
                                    nb, nl, j, in.cIndex(u * stride)))));
        Value sum = acc[0];
        for (Value t : terms)
          sum = in.add(sum, t);
        Value next =
            arith::AddIOp::create(nb, nl, j, in.cIndex(kSumUnroll * stride));
        scf::YieldOp::create(nb, nl, ValueRange{sum, next});
      });
  auto tail = scf::ForOp::create(
      b, loc, groups.getResult(1), n, lanes, ValueRange{groups.getResult(0)},
      [&](OpBuilder &nb, Location nl, Value j, ValueRange acc) {
        Emitter in(nb, nl, e.gpu);
        Value t = term(in, j);
        scf::YieldOp::create(nb, nl, in.add(acc[0], t));
      });
  return tail.getResult(0);
}

/// One step of a host reduction tree: scratch[dest + i] = scratch[i] +
/// scratch[partner(i)] for i in [0, count) (dest 0: in place).
void hostPairSums(
    Emitter &e, Value scratch, Value count, Value dest,
    llvm::function_ref<Value(OpBuilder &, Location, Value)> partner) {
  scf::ForOp::create(
      e.b, e.loc, e.cIndex(0), count, e.cIndex(1), ValueRange{},
      [&](OpBuilder &nb, Location nl, Value i, ValueRange) {
        Emitter in(nb, nl, false);
        Value v =
            in.add(memref::LoadOp::create(nb, nl, scratch, i),
                   memref::LoadOp::create(nb, nl, scratch, partner(nb, nl, i)));
        Value at = arith::AddIOp::create(nb, nl, i, dest);
        memref::StoreOp::create(nb, nl, v, scratch, at);
        scf::YieldOp::create(nb, nl);
      });
}

/// The host's butterfly over the kLanes partials in scratch[0, kLanes):
/// p[l] = p[l] + p[l ^ k] for k = 16, 8, 4, 2, 1 (new values staged in
/// scratch[kLanes, 2 kLanes), then copied back); the result is p[0].
void hostButterfly(Emitter &e, Value scratch) {
  Value lanes = e.cIndex(kLanes);
  for (int64_t k = kLanes / 2; k >= 1; k /= 2) {
    Value kv = e.cIndex(k);
    hostPairSums(e, scratch, lanes, lanes,
                 [&](OpBuilder &nb, Location nl, Value l) -> Value {
                   return arith::XOrIOp::create(nb, nl, l, kv);
                 });
    scf::ForOp::create(e.b, e.loc, e.cIndex(0), lanes, e.cIndex(1),
                       ValueRange{},
                       [&](OpBuilder &nb, Location nl, Value l, ValueRange) {
                         Value at = arith::AddIOp::create(nb, nl, l, lanes);
                         Value v = memref::LoadOp::create(nb, nl, scratch, at);
                         memref::StoreOp::create(nb, nl, v, scratch, l);
                         scf::YieldOp::create(nb, nl);
                       });
  }
}

/// The halving tree over scratch[0, count) on the host: p[t] = p[t] + p[t +
/// k] for t < k, k = count / 2, ..., 1 (in place: a level reads only
/// indices it does not write); returns p[0].
Value hostHalving(Emitter &e, Value scratch, int64_t count) {
  Value zero = e.cIndex(0);
  for (int64_t k = count / 2; k >= 1; k /= 2) {
    Value kv = e.cIndex(k);
    hostPairSums(e, scratch, kv, zero,
                 [&](OpBuilder &nb, Location nl, Value t) -> Value {
                   return arith::AddIOp::create(nb, nl, t, kv);
                 });
  }
  return memref::LoadOp::create(e.b, e.loc, scratch, ValueRange{zero});
}

/// The value of sum() where `cond` holds, else `zero` (GPU code: a thread
/// outside the work contributes the neutral partial).
Value valueIf(Emitter &e, Value cond,
              const std::function<Value(Emitter &)> &sum,
              const std::function<Value(Emitter &)> &zero) {
  auto op = scf::IfOp::create(
      e.b, e.loc, cond,
      [&](OpBuilder &nb, Location nl) {
        Emitter in(nb, nl, true);
        scf::YieldOp::create(nb, nl, sum(in));
      },
      [&](OpBuilder &nb, Location nl) {
        Emitter in(nb, nl, true);
        scf::YieldOp::create(nb, nl, zero(in));
      });
  return op.getResult(0);
}

/// A block's halving tree in shared memory: stores `mine` at shared[tid],
/// then for k = count / 2, ..., 1 the threads at `level` < k add
/// shared[tid + k * stride] into shared[tid], a barrier after each step
/// (level: a thread's group, whose partials sit `stride` apart).
void sharedHalve(Emitter &e, Value shared, Value tid, Value mine, Value level,
                 int64_t count, int64_t stride) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  memref::StoreOp::create(b, loc, mine, shared, tid);
  gpu::BarrierOp::create(b, loc);
  for (int64_t k = count / 2; k >= 1; k /= 2) {
    Value below = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult,
                                        level, e.cIndex(k));
    scf::IfOp::create(b, loc, below, [&](OpBuilder &nb, Location nl) {
      Emitter in(nb, nl, true);
      Value other = arith::AddIOp::create(nb, nl, tid, in.cIndex(k * stride));
      Value v = in.add(memref::LoadOp::create(nb, nl, shared, tid),
                       memref::LoadOp::create(nb, nl, shared, other));
      memref::StoreOp::create(nb, nl, v, shared, tid);
      scf::YieldOp::create(nb, nl);
    });
    gpu::BarrierOp::create(b, loc);
  }
}

/// Runs body(in, j) for the elements of a row that lane `lane` owns, in
/// increasing j: the chunks c = lane, lane + kLanes, ... of `vec` elements
/// [c vec, c vec + vec) below the last whole chunk (inside a ChunkCtx:
/// vector loads and stores where `aligned` holds, scalar ones otherwise),
/// then, in the lane owning it, the short last chunk element by element.
/// `acc` is threaded through body (a sum) or empty (a pass with stores).
SmallVector<Value, 1> forLaneChunks(
    Emitter &e, Value lane, Value n, int64_t vec, Value aligned, ValueRange acc,
    llvm::function_ref<SmallVector<Value, 1>(Emitter &, Value, ValueRange)>
        body) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value vecIdx = e.cIndex(vec);
  Value full = arith::DivUIOp::create(b, loc, n, vecIdx);
  auto chunks = [&](OpBuilder &ob, Location ol, bool vector) {
    Emitter o(ob, ol, e.gpu);
    auto loop = scf::ForOp::create(
        ob, ol, lane, full, o.cIndex(kLanes), acc,
        [&](OpBuilder &nb, Location nl, Value c, ValueRange it) {
          Emitter in(nb, nl, e.gpu);
          ChunkCtx ctx(in, arith::MulIOp::create(nb, nl, c, in.cIndex(vec)),
                       vec, vector);
          in.chunk = &ctx;
          SmallVector<Value, 1> cur(it.begin(), it.end());
          for (int64_t k = 0; k < vec; ++k)
            cur = body(in, ctx.js[k], cur);
          ctx.flush(in);
          scf::YieldOp::create(nb, nl, cur);
        });
    return SmallVector<Value, 1>(loop.getResults());
  };
  SmallVector<Value, 1> cur;
  if (aligned) {
    auto ifOp = scf::IfOp::create(
        b, loc, aligned,
        [&](OpBuilder &nb, Location nl) {
          scf::YieldOp::create(nb, nl, chunks(nb, nl, true));
        },
        [&](OpBuilder &nb, Location nl) {
          scf::YieldOp::create(nb, nl, chunks(nb, nl, false));
        });
    cur.assign(ifOp.getResults().begin(), ifOp.getResults().end());
  } else {
    cur = chunks(b, loc, false);
  }
  // The last chunk when short: elements [full vec, n) in lane full % kLanes.
  Value tailStart = arith::MulIOp::create(b, loc, full, vecIdx);
  Value owner = arith::RemUIOp::create(b, loc, full, e.cIndex(kLanes));
  Value mine =
      arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, lane, owner);
  auto tail = scf::IfOp::create(
      b, loc, mine,
      [&](OpBuilder &nb, Location nl) {
        auto loop = scf::ForOp::create(
            nb, nl, tailStart, n, Emitter(nb, nl, e.gpu).cIndex(1), cur,
            [&](OpBuilder &fb, Location fl, Value j, ValueRange it) {
              Emitter in(fb, fl, e.gpu);
              scf::YieldOp::create(fb, fl, body(in, j, it));
            });
        scf::YieldOp::create(nb, nl, loop.getResults());
      },
      [&](OpBuilder &nb, Location nl) { scf::YieldOp::create(nb, nl, cur); });
  return SmallVector<Value, 1>(tail.getResults());
}

/// kernelgen's row sum of term(j), j in [0, n) (KernelGen.h, Numerics):
/// lane l sums the elements of its chunks in increasing j from 0
/// (forLaneChunks), then the lanes' partials meet in the butterfly: on the
/// GPU through warp shuffles (every lane gets the sum); on the host the
/// kLanes partials one after the other into `scratch`, then the same
/// butterfly.
Value rowSum(Emitter &e, Value lane, Value scratch, Value n, int64_t vec,
             Value aligned, TermFn term) {
  auto partial = [&](Emitter &on, Value l, Value al) {
    return forLaneChunks(
        on, l, n, vec, al, ValueRange{on.cF32(0.0f)},
        [&](Emitter &in, Value j, ValueRange acc) -> SmallVector<Value, 1> {
          return {in.add(acc[0], term(in, j))};
        })[0];
  };
  if (e.gpu) {
    Value acc = partial(e, lane, aligned);
    for (int32_t k = int32_t(kLanes / 2); k >= 1; k /= 2) {
      auto other = gpu::ShuffleOp::create(e.b, e.loc, acc, k, int32_t(kLanes),
                                          gpu::ShuffleMode::XOR);
      acc = e.add(acc, other.getShuffleResult());
    }
    return acc;
  }
  scf::ForOp::create(
      e.b, e.loc, e.cIndex(0), e.cIndex(kLanes), e.cIndex(1), ValueRange{},
      [&](OpBuilder &nb, Location nl, Value l, ValueRange) {
        Emitter in(nb, nl, false);
        memref::StoreOp::create(nb, nl, partial(in, l, Value()), scratch, l);
        scf::YieldOp::create(nb, nl);
      });
  hostButterfly(e, scratch);
  return memref::LoadOp::create(e.b, e.loc, scratch, ValueRange{e.cIndex(0)});
}

/// Runs body(j) for every j in [0, n) of a row: the lane's chunks on the
/// GPU (forLaneChunks), all j in order on the host.
void forEachInRow(Emitter &e, Value lane, Value n, int64_t vec, Value aligned,
                  llvm::function_ref<void(Emitter &, Value)> body) {
  if (lane) {
    forLaneChunks(e, lane, n, vec, aligned, ValueRange{},
                  [&](Emitter &in, Value j, ValueRange) {
                    body(in, j);
                    return SmallVector<Value, 1>{};
                  });
    return;
  }
  scf::ForOp::create(e.b, e.loc, e.cIndex(0), n, e.cIndex(1), ValueRange{},
                     [&](OpBuilder &nb, Location nl, Value j, ValueRange) {
                       Emitter in(nb, nl, e.gpu);
                       body(in, j);
                       scf::YieldOp::create(nb, nl);
                     });
}

/// Where a row of `n` elements can be held in registers: its operands
/// aligned for vector chunks of `vec` (`aligned`), the row whole chunks, at
/// least one; returns that condition and the row's chunk count.
std::pair<Value, Value> wholeAlignedChunks(Emitter &e, Value aligned, Value n,
                                           int64_t vec) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value vecIdx = e.cIndex(vec);
  Value full = arith::DivUIOp::create(b, loc, n, vecIdx);
  Value whole = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq,
                                      arith::RemUIOp::create(b, loc, n, vecIdx),
                                      e.cIndex(0));
  Value some = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::uge, full,
                                     e.cIndex(1));
  Value ok = arith::AndIOp::create(
      b, loc, arith::AndIOp::create(b, loc, aligned, whole), some);
  return {ok, full};
}

/// GPU code: thenBody where `cond` holds, elseBody otherwise.
void gpuIfElse(Emitter &e, Value cond,
               llvm::function_ref<void(Emitter &)> thenBody,
               llvm::function_ref<void(Emitter &)> elseBody) {
  scf::IfOp::create(
      e.b, e.loc, cond,
      [&](OpBuilder &nb, Location nl) {
        Emitter on(nb, nl, true);
        thenBody(on);
        scf::YieldOp::create(nb, nl);
      },
      [&](OpBuilder &nb, Location nl) {
        Emitter on(nb, nl, true);
        elseBody(on);
        scf::YieldOp::create(nb, nl);
      });
}

/// Runs body once per row: on the GPU in lane 0 only.
void oncePerRow(Emitter &e, Value lane,
                llvm::function_ref<void(Emitter &)> body) {
  if (!lane) {
    body(e);
    return;
  }
  Value isFirst = arith::CmpIOp::create(e.b, e.loc, arith::CmpIPredicate::eq,
                                        lane, e.cIndex(0));
  scf::IfOp::create(e.b, e.loc, isFirst, [&](OpBuilder &nb, Location nl) {
    Emitter in(nb, nl, e.gpu);
    body(in);
    scf::YieldOp::create(nb, nl);
  });
}

/// A row-wise kernel's work on one row r: the row sum's term(r, j), the
/// row's value from that sum (between(r, lane, sum): its scalar outputs,
/// such as rstd, stored once per row: oncePerRow), and the output pass
/// body(r, j, value).
struct RowPasses {
  std::function<Value(Emitter &, Value, Value)> term;
  std::function<Value(Emitter &, Value, Value, Value)> between;
  std::function<void(Emitter &, Value, Value, Value)> body;
};

/// Row r in two passes over memory: the row sum (rowSum), `between`, then
/// the output pass (forEachInRow). The host's form, and the GPU's for rows
/// the register path does not take.
void rowTwoPasses(Emitter &e, const RowPasses &p, Value r, Value lane,
                  Value scratch, Value n, int64_t vec, Value aligned) {
  Value sum = rowSum(e, lane, scratch, n, vec, aligned,
                     [&](Emitter &in, Value j) { return p.term(in, r, j); });
  Value v = p.between(e, r, lane, sum);
  forEachInRow(e, lane, n, vec, aligned,
               [&](Emitter &in, Value j) { p.body(in, r, j, v); });
}

/// Flushes the vector stores of `ctx` where `cond` holds. A stored operand
/// read later in the same chunk is then taken from the stored values
/// (widened from storage: the bits a read-back gives) instead of memory.
void flushIf(Emitter &e, ChunkCtx &ctx, Value cond) {
  if (ctx.storeOrder.empty())
    return;
  for (Value m : ctx.storeOrder)
    if (!ctx.loaded.count(m)) {
      SmallVector<Value, 8> back;
      for (Value v : ctx.stores[m])
        back.push_back(e.widen(v));
      ctx.loaded[m] = std::move(back);
    }
  scf::IfOp::create(e.b, e.loc, cond, [&](OpBuilder &nb, Location nl) {
    Emitter in(nb, nl, true);
    ctx.flush(in);
    scf::YieldOp::create(nb, nl);
  });
}

/// The GPU kernel of a row-wise group whose rows are independent: warp w of
/// block b takes the `rpw` rows from r0 = (8 b + w) rpw (gpuEntries,
/// GroupSpec::rowsPerWarp). With rpw > 1, where the rows' operands are
/// aligned (`aligned`, computed in the block) and a row is K whole chunks a
/// lane or fewer (K rpw <= 4: n / vec <= 32 K, n % vec = 0), the lanes load
/// their chunks of the rpw rows at once and keep them in registers for both
/// passes, so a warp has rpw rows' loads in flight instead of one chunk's:
/// chunk k of lane l is c = l + 32 k as in forLaneChunks, a lane without it
/// loads chunk 0 instead, leaves it out of the sum (a select: the sum's adds
/// and order are the loop's) and stores nothing; rows past the end repeat
/// r0's loads and store nothing but r0's own scalars again (the same bits).
/// Other rows run rowTwoPasses one after the other. With `keepOne` (rpw 1,
/// GroupSpec::rowInRegisters) a row of up to kRowsPerWarp chunks a lane
/// takes the register path alone: read once instead of twice. The same
/// elements and arithmetic per row either way, so the bits are the host's.
BlockFn rowGroupBlock(Value rowsIdx, Value n, int64_t vec,
                      std::function<Value(Emitter &)> alignedOf,
                      RowPasses passes, int64_t rpw, bool keepOne) {
  return [=](Emitter &e, Value tid, Value bid, Value) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    auto cmp = [](Emitter &in, arith::CmpIPredicate p, Value x, Value y) {
      return arith::CmpIOp::create(in.b, in.loc, p, x, y).getResult();
    };
    auto andOf = [](Emitter &in, Value x, Value y) {
      return arith::AndIOp::create(in.b, in.loc, x, y).getResult();
    };
    Value lanes = e.cIndex(kLanes);
    Value lane = arith::RemUIOp::create(b, loc, tid, lanes);
    Value warp = arith::DivUIOp::create(b, loc, tid, lanes);
    Value item = arith::AddIOp::create(
        b, loc,
        arith::MulIOp::create(b, loc, bid, e.cIndex(kBlockSize / kLanes)),
        warp);
    Value r0 = arith::MulIOp::create(b, loc, item, e.cIndex(rpw));
    Value any = cmp(e, arith::CmpIPredicate::ult, r0, rowsIdx);
    scf::IfOp::create(b, loc, any, [&](OpBuilder &ob, Location ol) {
      Emitter in(ob, ol, true);
      Value aligned = alignedOf(in), regs, full;
      std::tie(regs, full) = wholeAlignedChunks(in, aligned, n, vec);
      // K chunks a lane of all rpw rows at once.
      auto inRegisters = [&](Emitter &q, int64_t K) {
        int64_t G = rpw;
        for (int64_t g0 = 0; g0 < rpw; g0 += G) {
          SmallVector<Value, 4> rc, valid;
          for (int64_t t = 0; t < G; ++t) {
            Value rt = arith::AddIOp::create(q.b, q.loc, r0, q.cIndex(g0 + t));
            Value ok = cmp(q, arith::CmpIPredicate::ult, rt, rowsIdx);
            valid.push_back(ok);
            rc.push_back(arith::SelectOp::create(q.b, q.loc, ok, rt, r0));
          }
          SmallVector<Value, 4> has;
          SmallVector<std::unique_ptr<ChunkCtx>, 16> ctx; // [t * K + k]
          for (int64_t k = 0; k < K; ++k) {
            Value c =
                arith::AddIOp::create(q.b, q.loc, lane, q.cIndex(k * kLanes));
            Value mine = cmp(q, arith::CmpIPredicate::ult, c, full);
            has.push_back(mine);
          }
          for (int64_t t = 0; t < G; ++t)
            for (int64_t k = 0; k < K; ++k) {
              Value c =
                  arith::AddIOp::create(q.b, q.loc, lane, q.cIndex(k * kLanes));
              Value at =
                  arith::SelectOp::create(q.b, q.loc, has[k], c, q.cIndex(0));
              ctx.push_back(std::make_unique<ChunkCtx>(
                  q, arith::MulIOp::create(q.b, q.loc, at, q.cIndex(vec)), vec,
                  /*vector=*/true));
            }
          // Every term first (their loads issued together), then each
          // row's sum in the loop's order.
          SmallVector<SmallVector<Value, 32>, 4> terms(G);
          for (int64_t t = 0; t < G; ++t)
            for (int64_t k = 0; k < K; ++k) {
              ChunkCtx &cx = *ctx[t * K + k];
              q.chunk = &cx;
              for (int64_t i = 0; i < vec; ++i)
                terms[t].push_back(passes.term(q, rc[t], cx.js[i]));
              q.chunk = nullptr;
            }
          SmallVector<Value, 4> acc;
          for (int64_t t = 0; t < G; ++t) {
            Value a = q.cF32(0.0f);
            for (int64_t k = 0; k < K; ++k) {
              Value sum = a;
              for (int64_t i = 0; i < vec; ++i)
                sum = q.add(sum, terms[t][k * vec + i]);
              a = arith::SelectOp::create(q.b, q.loc, has[k], sum, a);
              flushIf(q, *ctx[t * K + k], andOf(q, has[k], valid[t]));
            }
            acc.push_back(a);
          }
          for (int32_t k = int32_t(kLanes / 2); k >= 1; k /= 2)
            for (int64_t t = 0; t < G; ++t) {
              auto other =
                  gpu::ShuffleOp::create(q.b, q.loc, acc[t], k, int32_t(kLanes),
                                         gpu::ShuffleMode::XOR);
              acc[t] = q.add(acc[t], other.getShuffleResult());
            }
          for (int64_t t = 0; t < G; ++t) {
            Value v = passes.between(q, rc[t], lane, acc[t]);
            for (int64_t k = 0; k < K; ++k) {
              ChunkCtx &cx = *ctx[t * K + k];
              q.chunk = &cx;
              for (int64_t i = 0; i < vec; ++i)
                passes.body(q, rc[t], cx.js[i], v);
              q.chunk = nullptr;
              flushIf(q, cx, andOf(q, has[k], valid[t]));
            }
          }
        }
      };
      auto oneByOne = [&](Emitter &q) {
        Value end = arith::MinUIOp::create(
            q.b, q.loc, arith::AddIOp::create(q.b, q.loc, r0, q.cIndex(rpw)),
            rowsIdx);
        scf::ForOp::create(
            q.b, q.loc, r0, end, q.cIndex(1), ValueRange{},
            [&](OpBuilder &nb, Location nl, Value r, ValueRange) {
              Emitter on(nb, nl, true);
              rowTwoPasses(on, passes, r, lane, Value(), n, vec, aligned);
              scf::YieldOp::create(nb, nl);
            });
      };
      // if (K = 1 holds the rows) ... else if (K = 2) ... else if (K = 4)
      // ... else one by one.
      std::function<void(Emitter &, int64_t)> choose = [&](Emitter &q,
                                                           int64_t K) {
        if ((rpw == 1 && !keepOne) || K * rpw > kRowsPerWarp) {
          oneByOne(q);
          return;
        }
        Value fits = andOf(
            q, regs,
            cmp(q, arith::CmpIPredicate::ule, full, q.cIndex(K * kLanes)));
        gpuIfElse(
            q, fits, [&](Emitter &on) { inRegisters(on, K); },
            [&](Emitter &on) { choose(on, 2 * K); });
      };
      choose(in, 1);
      scf::YieldOp::create(ob, ol);
    });
  };
}

/// One operand of an element-wise group: raw storage `ptr` of element type
/// `elem`, rank 2 [rows, cols] with row stride `stride` (elements), or rank
/// 1 when stride is null; `m` is its memref (Emitter::memref).
struct Operand {
  Value ptr, stride, m;
  Type elem;
};

/// An element-wise group: the same f32 function of the inputs' element
/// (r, c) (or i) gives the outputs' element, no element depends on another.
/// `fn` gets the inputs widened to f32 and returns one f32 per output, which
/// are rounded to storage. Every input is loaded before any output is
/// stored, so an output may alias an input (same element).
struct ElementWise {
  SmallVector<Operand, 4> ins, outs;
  std::function<SmallVector<Value, 4>(Emitter &, ArrayRef<Value>)> fn;
  /// Index extents: rows (null for rank 1) and cols (rank 1: n).
  Value rows, cols;
  /// Elements per GPU thread (vectorOf).
  int64_t vector = 1;
};

/// Host: items (r, c) (or i) in increasing order, scalar loads and stores.
/// GPU: thread t takes `vector` consecutive elements of a row, c0 = (t %
/// chunks) * vector of row t / chunks (chunks = ceil(cols / vector)); where
/// every operand's address of c0 is 16-byte aligned (base pointers aligned,
/// strides multiples of `vector`) and the chunk is whole, one vector load
/// per input and one vector store per output, else the elements one by one.
/// The arithmetic per element is the same either way, so the bits are.
Work elementWiseWork(Emitter &e, ElementWise ew) {
  SmallVector<Value, 2> shape;
  if (ew.rows)
    shape.push_back(ew.rows);
  shape.push_back(ew.cols);
  ItemFn item = [ew](Emitter &e, ValueRange idx) {
    SmallVector<Value, 4> in;
    for (const Operand &o : ew.ins)
      in.push_back(e.load(o.m, idx));
    SmallVector<Value, 4> out = ew.fn(e, in);
    for (auto [o, v] : llvm::zip_equal(ew.outs, out))
      e.store(v, o.m, idx);
  };
  BlockFn block = [ew, item](Emitter &e, Value tid, Value bid, Value) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Type i64 = b.getI64Type();
    int64_t vec = ew.vector;
    Value vecIdx = e.cIndex(vec);
    Value bdim = gpu::BlockDimOp::create(b, loc, gpu::Dimension::x);
    Value t = arith::AddIOp::create(
        b, loc, arith::MulIOp::create(b, loc, bid, bdim), tid);
    // chunks = ceil(cols / vec).
    Value chunks = arith::DivUIOp::create(
        b, loc, arith::AddIOp::create(b, loc, ew.cols, e.cIndex(vec - 1)),
        vecIdx);
    Value total = ew.rows
                      ? Value(arith::MulIOp::create(b, loc, ew.rows, chunks))
                      : chunks;
    Value inRange =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, t, total);
    scf::IfOp::create(b, loc, inRange, [&](OpBuilder &nb, Location nl) {
      Emitter in(nb, nl, true);
      Value r, chunk = t;
      if (ew.rows) {
        r = arith::DivUIOp::create(nb, nl, t, chunks);
        chunk = arith::RemUIOp::create(nb, nl, t, chunks);
      }
      Value c0 = arith::MulIOp::create(nb, nl, chunk, vecIdx);
      // Whole chunk and every operand aligned: vector path.
      Value c1 = arith::AddIOp::create(nb, nl, c0, vecIdx);
      Value ok =
          arith::CmpIOp::create(nb, nl, arith::CmpIPredicate::ule, c1, ew.cols);
      auto zero64 = [&] {
        return LLVM::ConstantOp::create(nb, nl, i64, nb.getI64IntegerAttr(0));
      };
      auto bytesOf = [](const Operand &o) {
        return int64_t(o.elem.isF32() ? 4 : 2);
      };
      for (const auto *list : {&ew.ins, &ew.outs})
        for (const Operand &o : *list) {
          Value addr = LLVM::PtrToIntOp::create(nb, nl, i64, o.ptr);
          Value mis = LLVM::AndOp::create(
              nb, nl, addr,
              LLVM::ConstantOp::create(
                  nb, nl, i64, nb.getI64IntegerAttr(vec * bytesOf(o) - 1)));
          Value good = LLVM::ICmpOp::create(nb, nl, LLVM::ICmpPredicate::eq,
                                            mis, zero64());
          ok = arith::AndIOp::create(nb, nl, ok, good);
          if (!o.stride)
            continue;
          Value smis = LLVM::AndOp::create(
              nb, nl, o.stride,
              LLVM::ConstantOp::create(nb, nl, i64,
                                       nb.getI64IntegerAttr(vec - 1)));
          ok = arith::AndIOp::create(
              nb, nl, ok,
              LLVM::ICmpOp::create(nb, nl, LLVM::ICmpPredicate::eq, smis,
                                   zero64()));
        }
      Value r64 =
          r ? Value(arith::IndexCastOp::create(nb, nl, i64, r)) : Value();
      Value c64 = arith::IndexCastOp::create(nb, nl, i64, c0);
      auto addressOf = [&](OpBuilder &ob, Location ol, const Operand &o) {
        Value off = c64;
        if (o.stride)
          off = LLVM::AddOp::create(
              ob, ol, LLVM::MulOp::create(ob, ol, r64, o.stride), c64);
        Type et =
            o.elem.isF32() ? Type(ob.getF32Type()) : Type(ob.getI16Type());
        return LLVM::GEPOp::create(ob, ol, o.ptr.getType(), et, o.ptr,
                                   ValueRange{off});
      };
      scf::IfOp::create(
          nb, nl, ok,
          [&](OpBuilder &vb, Location vl) {
            Emitter v(vb, vl, true);
            SmallVector<SmallVector<Value, 4>> lanesIn(vec);
            for (const Operand &o : ew.ins) {
              bool f32 = o.elem.isF32();
              Type et = f32 ? Type(vb.getF32Type()) : Type(vb.getI16Type());
              Value x = LLVM::LoadOp::create(vb, vl, VectorType::get({vec}, et),
                                             addressOf(vb, vl, o),
                                             unsigned(vec * bytesOf(o)));
              for (int64_t k = 0; k < vec; ++k) {
                Value kk = LLVM::ConstantOp::create(vb, vl, vb.getI32Type(),
                                                    vb.getI32IntegerAttr(k));
                Value el = LLVM::ExtractElementOp::create(vb, vl, x, kk);
                lanesIn[k].push_back(f32 ? el : v.widenBits(el));
              }
            }
            SmallVector<SmallVector<Value, 4>> lanesOut;
            for (int64_t k = 0; k < vec; ++k)
              lanesOut.push_back(ew.fn(v, lanesIn[k]));
            for (auto [oi, o] : llvm::enumerate(ew.outs)) {
              bool f32 = o.elem.isF32();
              Type et = f32 ? Type(vb.getF32Type()) : Type(vb.getI16Type());
              Type vt = VectorType::get({vec}, et);
              Value x = LLVM::PoisonOp::create(vb, vl, vt);
              for (int64_t k = 0; k < vec; ++k) {
                Value el = v.narrow(lanesOut[k][oi], o.elem);
                if (!f32)
                  el = arith::BitcastOp::create(vb, vl, vb.getI16Type(), el);
                Value kk = LLVM::ConstantOp::create(vb, vl, vb.getI32Type(),
                                                    vb.getI32IntegerAttr(k));
                x = LLVM::InsertElementOp::create(vb, vl, x, el, kk);
              }
              LLVM::StoreOp::create(vb, vl, x, addressOf(vb, vl, o),
                                    unsigned(vec * bytesOf(o)));
            }
            scf::YieldOp::create(vb, vl);
          },
          [&](OpBuilder &sb, Location sl) {
            Value end = arith::MinUIOp::create(sb, sl, c1, ew.cols);
            scf::ForOp::create(
                sb, sl, c0, end, Emitter(sb, sl, true).cIndex(1), ValueRange{},
                [&](OpBuilder &fb, Location fl, Value c, ValueRange) {
                  Emitter f(fb, fl, true);
                  SmallVector<Value, 2> idx;
                  if (r)
                    idx.push_back(r);
                  idx.push_back(c);
                  item(f, idx);
                  scf::YieldOp::create(fb, fl);
                });
            scf::YieldOp::create(sb, sl);
          });
      scf::YieldOp::create(nb, nl);
    });
  };
  Work work{shape, item};
  work.gpuBlock = block;
  return work;
}

/// A 2-d element-wise group over [rows, cols] of spec.dtype storage: its
/// extents and vector width, and `op(ptr, stride)` naming an operand by its
/// pointer and row-stride parameters.
struct Grid2D {
  ElementWise ew;
  std::function<Operand(const char *, const char *)> op;
};
Grid2D grid2D(Emitter &e, const GroupSpec &s, const Args &a) {
  Type st = e.storage(s.dtype);
  Value rows = a.get("rows"), cols = a.get("cols");
  Grid2D g;
  g.ew.rows = e.toIndex(rows);
  g.ew.cols = e.toIndex(cols);
  g.ew.vector = vectorOf(s);
  g.op = [&e, a, st, rows, cols](const char *ptr, const char *stride) {
    Value p = a.get(ptr), str = a.get(stride);
    return Operand{p, str, e.memref2(p, st, rows, cols, str), st};
  };
  return g;
}

Work swiGluWork(Emitter &e, const GroupSpec &s, const Args &a, bool backward) {
  Grid2D g = grid2D(e, s, a);
  ElementWise &ew = g.ew;
  auto &op = g.op;
  ew.ins = {op("gate", "gateStride"), op("up", "upStride")};
  if (!backward) {
    ew.outs = {op("y", "yStride")};
    // g * s * u, as swiGluValue.
    ew.fn = [](Emitter &e, ArrayRef<Value> in) -> SmallVector<Value, 4> {
      Value gv = in[0], uv = in[1];
      return {e.mul(e.mul(gv, e.sigmoid(gv)), uv)};
    };
    return elementWiseWork(e, ew);
  }
  ew.ins.push_back(op("dy", "dyStride"));
  ew.outs = {op("dgate", "dgateStride"), op("dup", "dupStride")};
  bool withY = s.recomputeY;
  if (withY)
    ew.outs.push_back(op("y", "yStride"));
  ew.fn = [withY](Emitter &e, ArrayRef<Value> in) -> SmallVector<Value, 4> {
    Value gv = in[0], uv = in[1], d = in[2];
    Value sg = e.sigmoid(gv);
    Value one = e.cF32(1.0f);
    // d * u * s * (1 + g * (1 - s)), left to right as written.
    Value dgv =
        e.mul(e.mul(e.mul(d, uv), sg), e.add(one, e.mul(gv, e.sub(one, sg))));
    SmallVector<Value, 4> out{dgv, e.mul(d, e.mul(gv, sg))};
    if (withY)
      out.push_back(e.mul(e.mul(gv, sg), uv));
    return out;
  };
  return elementWiseWork(e, ew);
}

/// The sigmoid output gate, the reference's sigmoidGateForward /
/// sigmoidGateBackward per element: y = o * s; do = d * s and dgate =
/// ((d * o) * s) * (1 - s), left to right as written, s = sigmoid(gate).
Work sigmoidGateWork(Emitter &e, const GroupSpec &s, const Args &a,
                     bool backward) {
  Grid2D g = grid2D(e, s, a);
  ElementWise &ew = g.ew;
  auto &op = g.op;
  ew.ins = {op("o", "oStride"), op("gate", "gateStride")};
  if (!backward) {
    ew.outs = {op("y", "yStride")};
    ew.fn = [](Emitter &e, ArrayRef<Value> in) -> SmallVector<Value, 4> {
      return {e.mul(in[0], e.sigmoid(in[1]))};
    };
    return elementWiseWork(e, ew);
  }
  ew.ins.push_back(op("dy", "dyStride"));
  ew.outs = {op("dout", "doStride"), op("dgate", "dgateStride")};
  ew.fn = [](Emitter &e, ArrayRef<Value> in) -> SmallVector<Value, 4> {
    Value o = in[0], d = in[2];
    Value sg = e.sigmoid(in[1]);
    Value one = e.cF32(1.0f);
    return {e.mul(d, sg), e.mul(e.mul(e.mul(d, o), sg), e.sub(one, sg))};
  };
  return elementWiseWork(e, ew);
}

Work residualAddWork(Emitter &e, const GroupSpec &s, const Args &a) {
  Type st = e.storage(s.dtype);
  Value n = a.get("n");
  auto op = [&](const char *ptr) {
    Value p = a.get(ptr);
    return Operand{p, Value(), e.memref1(p, st, n), st};
  };
  ElementWise ew;
  ew.cols = e.toIndex(n);
  ew.vector = vectorOf(s);
  ew.ins = {op("a"), op("b")};
  ew.outs = {op("y")};
  ew.fn = [](Emitter &e, ArrayRef<Value> in) -> SmallVector<Value, 4> {
    return {e.add(in[0], in[1])};
  };
  return elementWiseWork(e, ew);
}

/// One row r of RMSNorm forward, the reference's per-element code in
/// kernelgen's row order: the sum of squares of element(j) (rowSum), rs = 1
/// / sqrt(ss / dim + eps), rstd[r] = rs, then y[r, j] = (x[r, j] * rs) *
/// w_eff[j] with x read from `x`. The plain norm's element(j) loads x[r, j];
/// a fused group computes, stores and returns it, so both share this code
/// and its order. On the GPU each lane reads back only the x it stored.
RowPasses rmsNormPasses(Value dimF, Value eps, Value w, bool zc, Value rstd,
                        Value x, Value y,
                        std::function<Value(Emitter &, Value, Value)> element) {
  RowPasses p;
  p.term = [=](Emitter &in, Value r, Value j) {
    Value v = element(in, r, j);
    return in.mul(v, v);
  };
  p.between = [=](Emitter &e, Value r, Value lane, Value ss) {
    Value rs = e.div(e.cF32(1.0f), e.sqrt(e.add(e.div(ss, dimF), eps)));
    if (rstd)
      oncePerRow(e, lane, [&](Emitter &in) {
        memref::StoreOp::create(in.b, in.loc, rs, rstd, ValueRange{r});
      });
    return rs;
  };
  p.body = [=](Emitter &in, Value r, Value j, Value rs) {
    Value wv = in.load(w, {j});
    Value weff = zc ? in.add(in.cF32(1.0f), wv) : wv;
    in.store(in.mul(in.mul(in.load(x, {r, j}), rs), weff), y, {r, j});
  };
  return p;
}

/// The Work of a row-wise group whose rows are independent: on the host
/// row by row in two passes, on the GPU rowGroupBlock's `rpw` rows a warp.
Work rowGroupWork(Value rowsIdx, Value n, int64_t vec, Value scratch,
                  std::function<Value(Emitter &)> alignedOf, RowPasses passes,
                  const GroupSpec &s) {
  int64_t rpw = s.rowsPerWarp;
  bool keepOne = rpw == 1 && s.rowInRegisters;
  Work w{{rowsIdx}, [=](Emitter &e, ValueRange idx) {
           rowTwoPasses(e, passes, idx[0], laneOf(idx), scratch, n, vec,
                        Value());
         }};
  w.gpuBlock = rowGroupBlock(rowsIdx, n, vec, alignedOf, passes, rpw, keepOne);
  return w;
}

Work rmsNormWork(Emitter &e, const GroupSpec &s, const Args &a) {
  Type st = e.storage(s.dtype);
  Value rows = a.get("rows"), dim = a.get("dim");
  Value x = e.memref2(a.get("x"), st, rows, dim, a.get("xStride"));
  Value y = e.memref2(a.get("y"), st, rows, dim, a.get("yStride"));
  Value w = e.memref1(a.get("w"), st, dim);
  Value rstd;
  if (s.writeRstd)
    rstd = e.memref1(a.get("rstd"), e.b.getF32Type(), rows);
  Value eps = a.get("eps");
  Value dimIdx = e.toIndex(dim);
  // A(dim): the int64 row length converted to f32 once, as the reference.
  Value dimF = arith::SIToFPOp::create(e.b, e.loc, e.b.getF32Type(), dim);
  Value scratch = rowScratch(e);
  bool zc = s.zeroCentered;
  int64_t vec = rowChunkOf(s.kind, s.dtype);
  auto load = [=](Emitter &in, Value r, Value j) { return in.load(x, {r, j}); };
  return rowGroupWork(e.toIndex(rows), dimIdx, vec, scratch,
                      chunksAlignedOf({x, y, w}, vec),
                      rmsNormPasses(dimF, eps, w, zc, rstd, x, y, load), s);
}

/// The residual add and the RMSNorm that reads its output, fused per row:
/// h = round(a + b) is stored and, widened back from its storage bits, is
/// the norm's input, so h, y and rstd are the bits of the residual add then
/// the generated RMSNorm on the stored h (fusion does not change
/// arithmetic). The second pass reads h back (the thread that wrote it).
Work addRmsNormWork(Emitter &e, const GroupSpec &s, const Args &a) {
  Type st = e.storage(s.dtype), f32 = e.b.getF32Type();
  Value rows = a.get("rows"), dim = a.get("dim");
  auto m2 = [&](const char *ptr) {
    return e.memref2(a.get(ptr), st, rows, dim, dim);
  };
  Value x = m2("a"), z = m2("b"), h = m2("h"), y = m2("y");
  Value w = e.memref1(a.get("w"), st, dim);
  Value rstd;
  if (s.writeRstd)
    rstd = e.memref1(a.get("rstd"), f32, rows);
  Value eps = a.get("eps"), dimIdx = e.toIndex(dim);
  Value dimF = arith::SIToFPOp::create(e.b, e.loc, f32, dim);
  Value scratch = rowScratch(e);
  bool zc = s.zeroCentered;
  int64_t vec = rowChunkOf(s.kind, s.dtype);
  // h = round(a + b), stored; the norm reads its storage bits.
  auto addThenLoad = [=](Emitter &in, Value r, Value j) {
    Value sum = in.add(in.load(x, {r, j}), in.load(z, {r, j}));
    in.store(sum, h, {r, j});
    return in.widen(in.narrow(sum, st));
  };
  return rowGroupWork(e.toIndex(rows), dimIdx, vec, scratch,
                      chunksAlignedOf({x, z, h, y, w}, vec),
                      rmsNormPasses(dimF, eps, w, zc, rstd, h, y, addThenLoad),
                      s);
}

/// The dw of a norm's backward, dw[j] += the column sum of term(r, j) over
/// rows, as two phases appended to `phases`: partial[p][j] over rows [p *
/// R, ...) (dwPartRows; kDwGroups row groups, then a halving tree), then
/// the parts of column j (kLanes groups of parts, then a halving tree). The
/// partials live in the workspace `dwPartial` [dwParts, dim] f32 on both
/// targets.
/// Where a column sum's partials live: `partial` [parts, dim] f32 (raw
/// pointer; dim and parts i64).
struct DwSum {
  Value dim, parts, partial;
};
/// A norm backward's dw partials: the dim, dwParts and dwPartial
/// parameters.
DwSum normDwSum(const Args &a) {
  return {a.get("dim"), a.get("dwParts"), a.get("dwPartial")};
}

/// The rows [lo, hi) of dw part p over `rowsIdx` rows (KernelAbi.h,
/// rmsNormDwRowsPerPart): R = kDwPartRows * max(1, ceil(rows / (kDwPartRows
/// * kMaxDwParts))), lo = p * R, hi = min(lo + R, rows).
std::pair<Value, Value> dwPartRows(Emitter &e, Value rowsIdx, Value p) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Value span = e.cIndex(kDwPartRows * kMaxDwParts);
  Value spans = arith::DivUIOp::create(
      b, loc,
      arith::AddIOp::create(b, loc, rowsIdx,
                            e.cIndex(kDwPartRows * kMaxDwParts - 1)),
      span);
  Value r =
      arith::MulIOp::create(b, loc, e.cIndex(kDwPartRows),
                            arith::MaxUIOp::create(b, loc, spans, e.cIndex(1)));
  Value lo = arith::MulIOp::create(b, loc, p, r);
  Value hi = arith::MinUIOp::create(
      b, loc, arith::AddIOp::create(b, loc, lo, r), rowsIdx);
  return {lo, hi};
}

void appendDwPhases(SmallVector<Work> &phases, Emitter &e, DwSum where,
                    Value rowsIdx, Value dimIdx, Value dw, Value scratch,
                    std::function<Value(Emitter &, Value, Value)> term) {
  Type f32 = e.b.getF32Type();
  Value dim = where.dim;
  Value parts = where.parts;
  Value partsIdx = e.toIndex(parts);
  Value partial = e.memref2(where.partial, f32, parts, dim, dim);
  // Group g's partial of part p, column j: rows p * R + g, + kDwGroups, ...
  // below min((p + 1) * R, rows).
  auto partSum = [=](Emitter &in, Value p, Value g, Value j) {
    OpBuilder &b = in.b;
    Location loc = in.loc;
    auto [lo, hi] = dwPartRows(in, rowsIdx, p);
    return stridedSum(
        in, arith::AddIOp::create(b, loc, lo, g), hi,
        [&](Emitter &t, Value r) { return term(t, r, j); }, kDwGroups);
  };
  // Group g's partial of column j's parts: p = g, g + kLanes, ...
  auto partsSum = [=](Emitter &in, Value g, Value j) {
    return stridedSum(in, g, partsIdx, [&](Emitter &t, Value p) {
      return memref::LoadOp::create(t.b, t.loc, partial, ValueRange{p, j})
          .getResult();
    });
  };
  auto hostHalve = [=](Emitter &e, int64_t groups) {
    return hostHalving(e, scratch, groups);
  };
  // The host runs the groups' loops one after the other into scratch.
  auto hostGroups = [=](Emitter &e, int64_t groups,
                        std::function<Value(Emitter &, Value)> sum) {
    scf::ForOp::create(
        e.b, e.loc, e.cIndex(0), e.cIndex(groups), e.cIndex(1), ValueRange{},
        [&](OpBuilder &nb, Location nl, Value g, ValueRange) {
          Emitter in(nb, nl, false);
          memref::StoreOp::create(nb, nl, sum(in, g), scratch, g);
          scf::YieldOp::create(nb, nl);
        });
  };
  ItemFn partItem = [=](Emitter &e, ValueRange idx) {
    Value p = idx[0], j = idx[1];
    hostGroups(e, kDwGroups,
               [&](Emitter &in, Value g) { return partSum(in, p, g, j); });
    memref::StoreOp::create(e.b, e.loc, hostHalve(e, kDwGroups), partial,
                            ValueRange{p, j});
  };
  ItemFn colItem = [=](Emitter &e, ValueRange idx) {
    Value j = idx[0];
    hostGroups(e, kLanes,
               [&](Emitter &in, Value g) { return partsSum(in, g, j); });
    Value sum = hostHalve(e, kLanes);
    Value old = memref::LoadOp::create(e.b, e.loc, dw, ValueRange{j});
    memref::StoreOp::create(e.b, e.loc, e.add(old, sum), dw, ValueRange{j});
  };
  // GPU: a block of kLanes x `groups` threads; thread t is lane t % kLanes
  // (an item: the block's items are consecutive) and group g = t / kLanes;
  // the partials meet in shared memory (g-major) and halve there; group 0
  // of each item in range finishes it.
  auto groupBlock = [](int64_t groups, Value items,
                       std::function<Value(Emitter &, Value, Value)> sum,
                       std::function<void(Emitter &, Value, Value)> finish) {
    return [=](Emitter &e, Value tid, Value bid, Value shared) {
      OpBuilder &b = e.b;
      Location loc = e.loc;
      Value lanes = e.cIndex(kLanes);
      Value lane = arith::RemUIOp::create(b, loc, tid, lanes);
      Value g = arith::DivUIOp::create(b, loc, tid, lanes);
      Value item = arith::AddIOp::create(
          b, loc, arith::MulIOp::create(b, loc, bid, lanes), lane);
      Value inItems =
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, item, items);
      Value mine = valueIf(
          e, inItems, [&](Emitter &in) { return sum(in, item, g); },
          [](Emitter &in) { return in.cF32(0.0f); });
      sharedHalve(e, shared, tid, mine, g, groups, kLanes);
      Value first = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, g,
                                          e.cIndex(0));
      Value writes = arith::AndIOp::create(b, loc, first, inItems);
      scf::IfOp::create(b, loc, writes, [&](OpBuilder &nb, Location nl) {
        Emitter in(nb, nl, true);
        finish(in, item, memref::LoadOp::create(nb, nl, shared, lane));
        scf::YieldOp::create(nb, nl);
      });
    };
  };
  // Part phase items: (p, j) flattened with j fastest.
  Value partItems = arith::MulIOp::create(e.b, e.loc, partsIdx, dimIdx);
  Work partPhase{{partsIdx, dimIdx}, partItem};
  partPhase.gpuBlock = groupBlock(
      kDwGroups, partItems,
      [=](Emitter &in, Value item, Value g) {
        Value p = arith::DivUIOp::create(in.b, in.loc, item, dimIdx);
        Value j = arith::RemUIOp::create(in.b, in.loc, item, dimIdx);
        return partSum(in, p, g, j);
      },
      [=](Emitter &in, Value item, Value v) {
        Value p = arith::DivUIOp::create(in.b, in.loc, item, dimIdx);
        Value j = arith::RemUIOp::create(in.b, in.loc, item, dimIdx);
        memref::StoreOp::create(in.b, in.loc, v, partial, ValueRange{p, j});
      });
  partPhase.sharedFloats = kLanes * kDwGroups;
  phases.push_back(partPhase);
  Work colPhase{{dimIdx}, colItem};
  colPhase.gpuBlock = groupBlock(
      kLanes, dimIdx,
      [=](Emitter &in, Value j, Value g) { return partsSum(in, g, j); },
      [=](Emitter &in, Value j, Value v) {
        Value old = memref::LoadOp::create(in.b, in.loc, dw, ValueRange{j});
        memref::StoreOp::create(in.b, in.loc, in.add(old, v), dw,
                                ValueRange{j});
      });
  colPhase.sharedFloats = kLanes * kLanes;
  phases.push_back(colPhase);
}

/// Adds a row element's dw term to the row group's partial of its column
/// (null: the row kernel leaves dw to the partial kernel).
using DwAccFn = std::function<void(Emitter &, Value j, Value term)>;
/// A norm backward's work on row r in lane `lane` (GPU) or the whole row
/// (host, lane null), with the dw terms handed to `acc` when set.
using NormRowFn =
    std::function<void(Emitter &, Value r, Value lane, const DwAccFn &acc)>;

/// A norm backward's row in its parts: `pre` the row's scalar (its saved
/// rstd), the row sum's term(r, j, pre), the row's value from that sum
/// (between(pre, sum); no stores), and the output pass body(r, j, pre, v),
/// which stores the row's outputs at j and returns the element's dw term
/// (null unless `wantDw`). `aligned`: the GPU condition for vector chunks
/// of every operand (chunksAligned).
struct NormPasses {
  std::function<Value(Emitter &, Value r)> pre;
  std::function<Value(Emitter &, Value r, Value j, Value pre)> term;
  std::function<Value(Emitter &, Value pre, Value sum)> between;
  std::function<Value(Emitter &, Value r, Value j, Value pre, Value v,
                      bool wantDw)>
      body;
  std::function<Value(Emitter &)> aligned;
};

/// Row r of `p` in two passes over memory: the row sum (rowSum), between,
/// then the output pass (forEachInRow) handing the dw terms to `acc`. The
/// host's form, and the GPU's where the register path does not apply.
NormRowFn normRowOf(NormPasses p, Value scratch, Value dimIdx, int64_t vec) {
  return [=](Emitter &e, Value r, Value lane, const DwAccFn &acc) {
    Value aligned = e.gpu ? p.aligned(e) : Value();
    Value pre = p.pre(e, r);
    Value sum =
        rowSum(e, lane, scratch, dimIdx, vec, aligned,
               [&](Emitter &in, Value j) { return p.term(in, r, j, pre); });
    Value v = p.between(e, pre, sum);
    forEachInRow(e, lane, dimIdx, vec, aligned, [&](Emitter &in, Value j) {
      Value t = p.body(in, r, j, pre, v, bool(acc));
      if (acc)
        acc(in, j, t);
    });
  };
}

/// Rows of a warp that the register path of a norm backward's row kernel
/// takes at once (its loads in flight together).
constexpr int64_t kDwRowsAtOnce = 2;

/// The GPU row kernel of a norm backward with dw (gpuEntries: a block of
/// kDwGroups warps per dw part): warp g runs `row` on the rows p * R + g,
/// + kDwGroups, ... of part p = the block. With at most kRowDwMaxDim
/// columns it also sums each column's dw terms per warp in shared memory
/// (row order, from 0: the part phase's group sum), halves the kDwGroups
/// sums as the part phase does and writes partial[p][j], so the rows are
/// read once for dx and dw and the part phase's launch has no items
/// (rmsNormDwPartItems). The same additions in the same order: the bits of
/// the separate phases, which the host runs.
///
/// With `inRegisters` (GroupSpec::rowInRegisters), where every operand is
/// aligned and a row is at most one whole chunk a lane (dim % vec = 0, dim
/// <= kLanes vec), a warp instead takes kDwRowsAtOnce of its rows at once
/// (r, r + kDwGroups), reads each row once into registers for both passes
/// (a lane without a chunk loads chunk 0, leaves it out of the sum and
/// stores nothing; a row past the part repeats r's loads and stores
/// nothing), and keeps its column partials in registers (one a column it
/// owns), adding each row's terms in row order from 0 as the shared-memory
/// sums do, then stores them where those would be: the same bits.
Work normRowDwPhase(Value rowsIdx, Value dimIdx, Value partial,
                    NormPasses passes, Value scratch, int64_t vec,
                    bool inRegisters, ItemFn hostItem) {
  NormRowFn row = normRowOf(passes, scratch, dimIdx, vec);
  Work w{{rowsIdx}, std::move(hostItem)};
  w.sharedFloats = kDwGroups * kRowDwMaxDim;
  w.gpuBlock = [=](Emitter &e, Value tid, Value bid, Value shared) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value lanes = e.cIndex(kLanes);
    Value lane = arith::RemUIOp::create(b, loc, tid, lanes);
    Value g = arith::DivUIOp::create(b, loc, tid, lanes);
    auto [lo, hi] = dwPartRows(e, rowsIdx, bid);
    Value first = arith::AddIOp::create(b, loc, lo, g);
    auto rows = [&](Emitter &in, const DwAccFn &acc) {
      scf::ForOp::create(in.b, in.loc, first, hi, in.cIndex(kDwGroups),
                         ValueRange{},
                         [&](OpBuilder &nb, Location nl, Value r, ValueRange) {
                           Emitter on(nb, nl, true);
                           row(on, r, lane, acc);
                           scf::YieldOp::create(nb, nl);
                         });
    };
    // Every thread's loop over [from, to) in steps of the block's size.
    auto blockLoop = [&](Emitter &in, Value to,
                         llvm::function_ref<void(Emitter &, Value)> body) {
      scf::ForOp::create(in.b, in.loc, tid, to, in.cIndex(kDwGroups * kLanes),
                         ValueRange{},
                         [&](OpBuilder &nb, Location nl, Value t, ValueRange) {
                           Emitter on(nb, nl, true);
                           body(on, t);
                           scf::YieldOp::create(nb, nl);
                         });
    };
    // One copy of the row loop (a second one for the wide rows made the f32
    // kernel with y spill around the division's slow path); the shared
    // work is under `fuse`, the same for every thread of the block.
    Value fuse = arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ule,
                                       dimIdx, e.cIndex(kRowDwMaxDim));
    auto ifFuse = [&](Emitter &in, llvm::function_ref<void(Emitter &)> body) {
      scf::IfOp::create(in.b, in.loc, fuse, [&](OpBuilder &nb, Location nl) {
        Emitter on(nb, nl, true);
        body(on);
        scf::YieldOp::create(nb, nl);
      });
    };
    Value sums = arith::MulIOp::create(b, loc, dimIdx, e.cIndex(kDwGroups));
    ifFuse(e, [&](Emitter &in) {
      blockLoop(in, sums, [&](Emitter &z, Value t) {
        memref::StoreOp::create(z.b, z.loc, z.cF32(0.0f), shared, t);
      });
    });
    gpu::BarrierOp::create(b, loc);
    Value base = arith::MulIOp::create(b, loc, g, dimIdx);
    auto sharedRows = [&](Emitter &on) {
      rows(on, [&](Emitter &q, Value j, Value term) {
        ifFuse(q, [&](Emitter &in) {
          Value at = arith::AddIOp::create(in.b, in.loc, base, j);
          Value v = memref::LoadOp::create(in.b, in.loc, shared, at);
          memref::StoreOp::create(in.b, in.loc, in.add(v, term), shared, at);
        });
      });
    };
    // The register path: the lane's chunk c0 of kDwRowsAtOnce rows an
    // iteration, its dw partials the loop's values.
    auto registerRows = [&](Emitter &q, Value full) {
      auto cmp = [&](Emitter &in, arith::CmpIPredicate p, Value x, Value y) {
        return arith::CmpIOp::create(in.b, in.loc, p, x, y).getResult();
      };
      Value has = cmp(q, arith::CmpIPredicate::ult, lane, full);
      Value c0 = arith::MulIOp::create(
          q.b, q.loc,
          arith::SelectOp::create(q.b, q.loc, has, lane, q.cIndex(0)),
          q.cIndex(vec));
      SmallVector<Value, 8> init(vec, q.cF32(0.0f));
      auto loop = scf::ForOp::create(
          q.b, q.loc, first, hi, q.cIndex(kDwRowsAtOnce * kDwGroups), init,
          [&](OpBuilder &nb, Location nl, Value r, ValueRange it) {
            Emitter in(nb, nl, true);
            SmallVector<Value, 8> acc(it.begin(), it.end());
            SmallVector<Value, kDwRowsAtOnce> rc, ok, pre, sum;
            SmallVector<std::unique_ptr<ChunkCtx>, kDwRowsAtOnce> ctx;
            for (int64_t t = 0; t < kDwRowsAtOnce; ++t) {
              Value rt =
                  arith::AddIOp::create(nb, nl, r, in.cIndex(t * kDwGroups));
              Value valid = cmp(in, arith::CmpIPredicate::ult, rt, hi);
              rc.push_back(arith::SelectOp::create(nb, nl, valid, rt, r));
              ok.push_back(arith::AndIOp::create(nb, nl, valid, has));
              ctx.push_back(std::make_unique<ChunkCtx>(in, c0, vec, true));
              pre.push_back(passes.pre(in, rc[t]));
            }
            // Every row's terms first (their loads issued together), then
            // each sum in the lane loop's order.
            for (int64_t t = 0; t < kDwRowsAtOnce; ++t) {
              in.chunk = ctx[t].get();
              SmallVector<Value, 8> terms;
              for (int64_t i = 0; i < vec; ++i)
                terms.push_back(passes.term(in, rc[t], ctx[t]->js[i], pre[t]));
              in.chunk = nullptr;
              Value s = in.cF32(0.0f);
              for (Value term : terms)
                s = in.add(s, term);
              sum.push_back(
                  arith::SelectOp::create(nb, nl, has, s, in.cF32(0.0f)));
            }
            for (int32_t k = int32_t(kLanes / 2); k >= 1; k /= 2)
              for (int64_t t = 0; t < kDwRowsAtOnce; ++t) {
                auto other = gpu::ShuffleOp::create(
                    nb, nl, sum[t], k, int32_t(kLanes), gpu::ShuffleMode::XOR);
                sum[t] = in.add(sum[t], other.getShuffleResult());
              }
            for (int64_t t = 0; t < kDwRowsAtOnce; ++t) {
              Value v = passes.between(in, pre[t], sum[t]);
              in.chunk = ctx[t].get();
              for (int64_t i = 0; i < vec; ++i) {
                Value d = passes.body(in, rc[t], ctx[t]->js[i], pre[t], v,
                                      /*wantDw=*/true);
                acc[i] = arith::SelectOp::create(nb, nl, ok[t],
                                                 in.add(acc[i], d), acc[i]);
              }
              in.chunk = nullptr;
              flushIf(in, *ctx[t], ok[t]);
            }
            scf::YieldOp::create(nb, nl, acc);
          });
      scf::IfOp::create(q.b, q.loc, has, [&](OpBuilder &nb, Location nl) {
        Emitter in(nb, nl, true);
        Value at = arith::AddIOp::create(nb, nl, base, c0);
        for (int64_t i = 0; i < vec; ++i)
          memref::StoreOp::create(
              nb, nl, loop.getResult(i), shared,
              ValueRange{arith::AddIOp::create(nb, nl, at, in.cIndex(i))});
        scf::YieldOp::create(nb, nl);
      });
    };
    if (!inRegisters) {
      sharedRows(e);
    } else {
      Value fits, full;
      std::tie(fits, full) =
          wholeAlignedChunks(e, passes.aligned(e), dimIdx, vec);
      Value regs = arith::AndIOp::create(
          b, loc, arith::AndIOp::create(b, loc, fuse, fits),
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ule, full,
                                e.cIndex(kLanes)));
      gpuIfElse(
          e, regs, [&](Emitter &on) { registerRows(on, full); },
          [&](Emitter &on) { sharedRows(on); });
    }
    gpu::BarrierOp::create(b, loc);
    ifFuse(e, [&](Emitter &in) {
      blockLoop(in, dimIdx, [&](Emitter &q, Value j) {
        SmallVector<Value, kDwGroups> p;
        for (int64_t k = 0; k < kDwGroups; ++k) {
          Value at = arith::AddIOp::create(
              q.b, q.loc, j,
              arith::MulIOp::create(q.b, q.loc, dimIdx, q.cIndex(k)));
          p.push_back(memref::LoadOp::create(q.b, q.loc, shared, at));
        }
        // p[t] = p[t] + p[t + k], as sharedHalve.
        for (int64_t k = kDwGroups / 2; k >= 1; k /= 2)
          for (int64_t t = 0; t < k; ++t)
            p[t] = q.add(p[t], p[t + k]);
        memref::StoreOp::create(q.b, q.loc, p[0], partial, ValueRange{bid, j});
      });
    });
  };
  return w;
}

/// A norm backward's phases: the row of `passes` per row (a warp each on
/// the GPU); with dw (null: none) the row kernel of normRowDwPhase, then
/// appendDwPhases over `term` (the same terms the row's body returns).
SmallVector<Work>
normBackwardPhases(Emitter &e, const GroupSpec &s, const Args &a, Value dw,
                   Value scratch, int64_t vec, NormPasses passes,
                   std::function<Value(Emitter &, Value, Value)> term) {
  Value dim = a.get("dim");
  Value rowsIdx = e.toIndex(a.get("rows")), dimIdx = e.toIndex(dim);
  NormRowFn row = normRowOf(passes, scratch, dimIdx, vec);
  ItemFn rowItem = [=](Emitter &e, ValueRange idx) {
    row(e, idx[0], laneOf(idx), DwAccFn());
  };
  if (!dw)
    return {Work{{rowsIdx}, rowItem}};
  DwSum where = normDwSum(a);
  Value partial =
      e.memref2(where.partial, e.b.getF32Type(), where.parts, dim, dim);
  SmallVector<Work> phases{normRowDwPhase(rowsIdx, dimIdx, partial, passes,
                                          scratch, vec, s.rowInRegisters,
                                          rowItem)};
  appendDwPhases(phases, e, where, rowsIdx, dimIdx, dw, scratch,
                 std::move(term));
  return phases;
}

/// RMSNorm backward with the reference's per-element code: per row, dot =
/// the row sum of (dy * w_eff) * x, c = ((dot * rs) * rs) * rs / dim, dx =
/// (rs * w_eff) * dy - c * x and the recomputed y; then per column j the
/// weight gradient, the column sum of (dy * x) * rs over rows, added once to
/// dw[j]. Both sums in kernelgen's order (KernelGen.h). The column phase is
/// separate so that each dw element has one owner (no atomics).
SmallVector<Work> rmsNormBackwardWork(Emitter &e, const GroupSpec &s,
                                      const Args &a) {
  Type st = e.storage(s.dtype), f32 = e.b.getF32Type();
  Value rows = a.get("rows"), dim = a.get("dim");
  Value x = e.memref2(a.get("x"), st, rows, dim, a.get("xStride"));
  Value dy = e.memref2(a.get("dy"), st, rows, dim, a.get("dyStride"));
  Value dx = e.memref2(a.get("dx"), st, rows, dim, a.get("dxStride"));
  Value w = e.memref1(a.get("w"), st, dim);
  Value rstd = e.memref1(a.get("rstd"), f32, rows);
  Value y, dw, res;
  if (s.recomputeY)
    y = e.memref2(a.get("y"), st, rows, dim, a.get("yStride"));
  if (s.accumulateDw)
    dw = e.memref1(a.get("dw"), f32, dim);
  if (s.addResidual)
    res = e.memref2(a.get("res"), st, rows, dim, a.get("dxStride"));
  // dy's further addends (GroupSpec::dyAddends), with dy's row stride.
  SmallVector<Value, kMaxDyAddends> dyMore;
  for (int k = 1; k < s.dyAddends; ++k)
    dyMore.push_back(e.memref2(a.get(("dy" + std::to_string(k)).c_str()), st,
                               rows, dim, a.get("dyStride")));
  // dy as the chain of adds would have stored it: each add the f32 sum of
  // its two widened operands, rounded to storage before the next reads it.
  auto dyAt = [=](Emitter &in, Value r, Value j) {
    Value g = in.load(dy, {r, j});
    for (Value more : dyMore)
      g = in.widen(in.narrow(in.add(g, in.load(more, {r, j})), st));
    return g;
  };
  Value rowsIdx = e.toIndex(rows), dimIdx = e.toIndex(dim);
  Value dimF = arith::SIToFPOp::create(e.b, e.loc, f32, dim);
  Value scratch = rowScratch(e);
  bool zc = s.zeroCentered;
  auto weffAt = [w, zc](Emitter &in, Value j) {
    Value wv = in.load(w, {j});
    return zc ? in.add(in.cF32(1.0f), wv) : wv;
  };
  int64_t vec = rowChunkOf(s.kind, s.dtype);
  NormPasses p;
  p.aligned = [=](Emitter &e) {
    SmallVector<Value, 9> views{x, dy, dx, w};
    views.append(dyMore.begin(), dyMore.end());
    if (y)
      views.push_back(y);
    if (res)
      views.push_back(res);
    return chunksAligned(e, views, vec);
  };
  p.pre = [=](Emitter &e, Value r) {
    return memref::LoadOp::create(e.b, e.loc, rstd, ValueRange{r}).getResult();
  };
  p.term = [=](Emitter &in, Value r, Value j, Value) {
    return in.mul(in.mul(dyAt(in, r, j), weffAt(in, j)), in.load(x, {r, j}));
  };
  p.between = [=](Emitter &e, Value rs, Value dot) {
    return e.div(e.mul(e.mul(e.mul(dot, rs), rs), rs), dimF);
  };
  p.body = [=](Emitter &in, Value r, Value j, Value rs, Value c,
               bool wantDw) -> Value {
    Value xv = in.load(x, {r, j}), g = dyAt(in, r, j);
    Value we = weffAt(in, j);
    Value grad = in.sub(in.mul(in.mul(rs, we), g), in.mul(c, xv));
    // Fused with the residual add that reads it: the gradient as stored
    // (rounded to storage), then the add's sum of the widened values.
    if (res)
      grad = in.add(in.load(res, {r, j}), in.widen(in.narrow(grad, st)));
    in.store(grad, dx, {r, j});
    if (y)
      in.store(in.mul(in.mul(xv, rs), we), y, {r, j});
    return wantDw ? in.mul(in.mul(g, xv), rs) : Value();
  };
  // dw[j] += the column sum of (dy * x) * rs over rows.
  return normBackwardPhases(
      e, s, a, dw, scratch, vec, p, [=](Emitter &in, Value r, Value j) {
        Value rs = memref::LoadOp::create(in.b, in.loc, rstd, ValueRange{r});
        return in.mul(in.mul(dyAt(in, r, j), in.load(x, {r, j})), rs);
      });
}

/// The L2 norm of each row (a token's head of GDN's q or k), the
/// reference's gdnref::l2NormForward / l2NormBackward per element with
/// kernelgen's row sums: forward ss = sum x^2, r = 1 / sqrt(ss + eps),
/// rstd[row] = r, y = x * r; backward dot = sum dy * y, dx = r * (dy - dot
/// * y). Rows are contiguous, a warp each on the GPU.
Work l2NormWork(Emitter &e, const GroupSpec &s, const Args &a, bool backward) {
  Type st = e.storage(s.dtype), f32 = e.b.getF32Type();
  Value rows = a.get("rows"), dim = a.get("dim");
  auto m2 = [&](const char *ptr) {
    return e.memref2(a.get(ptr), st, rows, dim, dim);
  };
  Value rstd = e.memref1(a.get("rstd"), f32, rows);
  Value dimIdx = e.toIndex(dim);
  Value scratch = rowScratch(e);
  int64_t vec = rowChunkOf(s.kind, s.dtype);
  Value rowsIdx = e.toIndex(rows);
  RowPasses p;
  if (!backward) {
    Value x = m2("x"), y = m2("y"), eps = a.get("eps");
    p.term = [=](Emitter &in, Value r, Value j) {
      Value v = in.load(x, {r, j});
      return in.mul(v, v);
    };
    p.between = [=](Emitter &e, Value r, Value lane, Value ss) {
      Value rs = e.div(e.cF32(1.0f), e.sqrt(e.add(ss, eps)));
      oncePerRow(e, lane, [&](Emitter &in) {
        memref::StoreOp::create(in.b, in.loc, rs, rstd, ValueRange{r});
      });
      return rs;
    };
    p.body = [=](Emitter &in, Value r, Value j, Value rs) {
      in.store(in.mul(in.load(x, {r, j}), rs), y, {r, j});
    };
    return rowGroupWork(rowsIdx, dimIdx, vec, scratch,
                        chunksAlignedOf({x, y}, vec), p, s);
  }
  Value y = m2("y"), dy = m2("dy"), dx = m2("dx");
  p.term = [=](Emitter &in, Value r, Value j) {
    return in.mul(in.load(dy, {r, j}), in.load(y, {r, j}));
  };
  p.between = [](Emitter &, Value, Value, Value dot) { return dot; };
  p.body = [=](Emitter &in, Value r, Value j, Value dot) {
    Value rs = memref::LoadOp::create(in.b, in.loc, rstd, ValueRange{r});
    Value g = in.load(dy, {r, j});
    in.store(in.mul(rs, in.sub(g, in.mul(dot, in.load(y, {r, j})))), dx,
             {r, j});
  };
  return rowGroupWork(rowsIdx, dimIdx, vec, scratch,
                      chunksAlignedOf({y, dy, dx}, vec), p, s);
}

/// GDN's gated RMSNorm of each row (a token's head), the reference's
/// gdnref::gatedNormForward / gatedNormBackward per element with kernelgen's
/// sums. Forward: ss = sum x^2, r = 1 / sqrt(ss / dim + eps), rstd[row] = r,
/// y = (((w * x) * r) * z) * s with s = sigmoid(z). Backward, with xh = x *
/// r and dyh = (dy * z) * s: dz = (((dy * w) * xh) * s) * (1 + z * (1 - s)),
/// mean = sum (w * dyh) * xh / dim, dx = r * (w * dyh - (x * r) * mean), the
/// recomputed y as the forward's, and dw += the column sum of dyh * xh.
/// Rows are contiguous, a warp each on the GPU.
SmallVector<Work> gatedNormWork(Emitter &e, const GroupSpec &s, const Args &a,
                                bool backward) {
  Type st = e.storage(s.dtype), f32 = e.b.getF32Type();
  Value rows = a.get("rows"), dim = a.get("dim");
  auto m2 = [&](const char *ptr) {
    return e.memref2(a.get(ptr), st, rows, dim, dim);
  };
  Value x = m2("x"), z = m2("z");
  Value w = e.memref1(a.get("w"), st, dim);
  Value rstd = e.memref1(a.get("rstd"), f32, rows);
  Value rowsIdx = e.toIndex(rows), dimIdx = e.toIndex(dim);
  Value dimF = arith::SIToFPOp::create(e.b, e.loc, f32, dim);
  Value scratch = rowScratch(e);
  int64_t vec = rowChunkOf(s.kind, s.dtype);
  // The forward's value, shared by the backward that rebuilds y.
  auto value = [](Emitter &in, Value wv, Value xv, Value r, Value zv,
                  Value sg) {
    return in.mul(in.mul(in.mul(in.mul(wv, xv), r), zv), sg);
  };
  if (!backward) {
    Value y = m2("y"), eps = a.get("eps");
    RowPasses p;
    p.term = [=](Emitter &in, Value r, Value j) {
      Value v = in.load(x, {r, j});
      return in.mul(v, v);
    };
    p.between = [=](Emitter &e, Value r, Value lane, Value ss) {
      Value rs = e.div(e.cF32(1.0f), e.sqrt(e.add(e.div(ss, dimF), eps)));
      oncePerRow(e, lane, [&](Emitter &in) {
        memref::StoreOp::create(in.b, in.loc, rs, rstd, ValueRange{r});
      });
      return rs;
    };
    p.body = [=](Emitter &in, Value r, Value j, Value rs) {
      Value zv = in.load(z, {r, j});
      in.store(value(in, in.load(w, {j}), in.load(x, {r, j}), rs, zv,
                     in.sigmoid(zv)),
               y, {r, j});
    };
    return {rowGroupWork(rowsIdx, dimIdx, vec, scratch,
                         chunksAlignedOf({x, z, w, y}, vec), p, s)};
  }
  Value dy = m2("dy"), dx = m2("dx"), dz = m2("dz");
  Value y, dw;
  if (s.recomputeY)
    y = m2("y");
  if (s.accumulateDw)
    dw = e.memref1(a.get("dw"), f32, dim);
  // dyh = (dy * z) * s at (r, j).
  auto dyhAt = [=](Emitter &in, Value r, Value j) {
    Value zv = in.load(z, {r, j});
    return in.mul(in.mul(in.load(dy, {r, j}), zv), in.sigmoid(zv));
  };
  NormPasses p;
  p.aligned = [=](Emitter &e) {
    SmallVector<Value, 8> views{x, z, w, dy, dx, dz};
    if (y)
      views.push_back(y);
    return chunksAligned(e, views, vec);
  };
  p.pre = [=](Emitter &e, Value r) {
    return memref::LoadOp::create(e.b, e.loc, rstd, ValueRange{r}).getResult();
  };
  p.term = [=](Emitter &in, Value r, Value j, Value rs) {
    Value xh = in.mul(in.load(x, {r, j}), rs);
    return in.mul(in.mul(in.load(w, {j}), dyhAt(in, r, j)), xh);
  };
  p.between = [=](Emitter &e, Value, Value sum) { return e.div(sum, dimF); };
  p.body = [=](Emitter &in, Value r, Value j, Value rs, Value mean,
               bool wantDw) -> Value {
    Value xv = in.load(x, {r, j}), wv = in.load(w, {j});
    Value zv = in.load(z, {r, j}), g = in.load(dy, {r, j});
    Value sg = in.sigmoid(zv);
    Value xh = in.mul(xv, rs);
    Value one = in.cF32(1.0f);
    if (y)
      in.store(value(in, wv, xv, rs, zv, sg), y, {r, j});
    in.store(in.mul(in.mul(in.mul(in.mul(g, wv), xh), sg),
                    in.add(one, in.mul(zv, in.sub(one, sg)))),
             dz, {r, j});
    Value dyh = in.mul(in.mul(g, zv), sg);
    Value wdy = in.mul(wv, dyh);
    in.store(in.mul(rs, in.sub(wdy, in.mul(in.mul(xv, rs), mean))), dx, {r, j});
    return wantDw ? in.mul(dyh, xh) : Value();
  };
  // dw[j] += the column sum of dyh * (x * rs) over rows.
  return normBackwardPhases(
      e, s, a, dw, scratch, vec, p, [=](Emitter &in, Value r, Value j) {
        Value rs = memref::LoadOp::create(in.b, in.loc, rstd, ValueRange{r});
        return in.mul(dyhAt(in, r, j), in.mul(in.load(x, {r, j}), rs));
      });
}

/// GDN's gates per (token, head), the reference's gdnref::gatesForward /
/// gatesBackward per element, left to right as written, with e = exp(A_log)
/// and x = a + dt_bias: forward g = -e * softplus(x) (softplus(x) = x for x
/// > 20, else log1p(exp(x))) and beta = sigmoid(b); backward da = (dg * -e)
/// * dsp (dsp = 1 for x > 20, else sigmoid(x)) and db = (dbeta * beta) * (1
/// - beta), then dA_log += the column sum over tokens of dg * (-e *
/// softplus(x)) and dt_bias's gradient += that of da (before rounding), in
/// a norm dw's order (appendDwPhases). A_log and dt_bias are read as
/// [rows, heads] operands of row stride 0.
SmallVector<Work> gdnGatesWork(Emitter &e, const GroupSpec &s, const Args &a,
                               bool backward) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type st = e.storage(s.dtype), f32 = b.getF32Type();
  Value rows = a.get("rows"), heads = a.get("heads");
  Value zero =
      LLVM::ConstantOp::create(b, loc, b.getI64Type(), b.getI64IntegerAttr(0));
  auto op = [&](const char *ptr, Type elem, bool perHead = false) {
    Value p = a.get(ptr), stride = perHead ? zero : heads;
    return Operand{p, stride, e.memref2(p, elem, rows, heads, stride), elem};
  };
  ElementWise ew;
  ew.rows = e.toIndex(rows);
  ew.cols = e.toIndex(heads);
  ew.vector = vectorOf(s);
  Operand aLog = op("aLog", f32, true), dtBias = op("dtBias", f32, true);
  auto over20 = [](Emitter &in, Value x) {
    return arith::CmpFOp::create(in.b, in.loc, arith::CmpFPredicate::OGT, x,
                                 in.cF32(20.0f));
  };
  auto softplus = [over20](Emitter &in, Value x) {
    return arith::SelectOp::create(
               in.b, in.loc, over20(in, x), x,
               in.log1p(math::ExpOp::create(in.b, in.loc, x)))
        .getResult();
  };
  auto negExp = [](Emitter &in, Value v) {
    return arith::NegFOp::create(in.b, in.loc,
                                 math::ExpOp::create(in.b, in.loc, v))
        .getResult();
  };
  if (!backward) {
    ew.ins = {op("a", st), op("b", st), aLog, dtBias};
    ew.outs = {op("g", f32), op("beta", st)};
    ew.fn = [=](Emitter &in, ArrayRef<Value> v) -> SmallVector<Value, 4> {
      return {in.mul(negExp(in, v[2]), softplus(in, in.add(v[0], v[3]))),
              in.sigmoid(v[1])};
    };
    return {elementWiseWork(e, ew)};
  }
  Operand av = op("a", st), dg = op("dg", f32);
  ew.ins = {av, aLog, dtBias, dg, op("beta", st), op("dbeta", st)};
  ew.outs = {op("da", st), op("db", st)};
  // da before rounding, at (r, h) from its loaded inputs.
  auto daOf = [=](Emitter &in, Value a0, Value al, Value dt, Value g) {
    Value x = in.add(a0, dt);
    Value dsp = arith::SelectOp::create(in.b, in.loc, over20(in, x),
                                        in.cF32(1.0f), in.sigmoid(x));
    return in.mul(in.mul(g, negExp(in, al)), dsp);
  };
  ew.fn = [=](Emitter &in, ArrayRef<Value> v) -> SmallVector<Value, 4> {
    Value bt = v[4];
    return {daOf(in, v[0], v[1], v[2], v[3]),
            in.mul(in.mul(v[5], bt), in.sub(in.cF32(1.0f), bt))};
  };
  SmallVector<Work> phases{elementWiseWork(e, ew)};
  Value rowsIdx = e.toIndex(rows), headsIdx = e.toIndex(heads);
  Value scratch = rowScratch(e);
  Value parts = a.get("parts");
  Value partial = a.get("partial");
  // dt_bias's partials follow dA_log's: parts x heads floats on.
  Value second = LLVM::GEPOp::create(
      b, loc, partial.getType(), f32, partial,
      ValueRange{LLVM::MulOp::create(b, loc, parts, heads)});
  Value dALog = e.memref1(a.get("dALog"), f32, heads);
  Value dDtBias = e.memref1(a.get("dDtBias"), f32, heads);
  auto loadAt = [](Emitter &in, const Operand &o, Value r, Value h) {
    return in.load(o.m, {r, h});
  };
  appendDwPhases(
      phases, e, {heads, parts, partial}, rowsIdx, headsIdx, dALog, scratch,
      [=](Emitter &in, Value r, Value h) {
        Value x = in.add(loadAt(in, av, r, h), loadAt(in, dtBias, r, h));
        Value sp = softplus(in, x);
        return in.mul(loadAt(in, dg, r, h),
                      in.mul(negExp(in, loadAt(in, aLog, r, h)), sp));
      });
  appendDwPhases(phases, e, {heads, parts, second}, rowsIdx, headsIdx, dDtBias,
                 scratch, [=](Emitter &in, Value r, Value h) {
                   return daOf(in, loadAt(in, av, r, h), loadAt(in, aLog, r, h),
                               loadAt(in, dtBias, r, h), loadAt(in, dg, r, h));
                 });
  return phases;
}

/// The prefetch of a RoPE block's first x chunks (KernelGen.cpp's ropeWork):
/// into L2, which the loads after the table then hit.
constexpr const char *kRopePrefetch = "llvm.nvvm.prefetch.global.L2";

/// Rotary position embedding, the reference's rope per element. Item (tok,
/// k) of a token (position pos = its index t = tok % seq in its batch row,
/// or t less its document's start when packed) is a column of every head:
/// with h = rotaryDim / 2, k below offset is column k and k from offset + h
/// on is column k + h, copied; k in [offset, offset + h) is the rotary pair
/// i = k - offset, whose c = cos(a) and s = sin(a) (-sin(a) backward) of a =
/// pos * theta^(-2 i / rotaryDim) in double rounded to f32 are computed once
/// and give x1 * c - x2 * s at column offset + i and x2 * c + x1 * s at
/// offset + i + h of every head (x1, x2 the head's two columns). Each output
/// element is the reference's arithmetic; only the angle is shared.
Work ropeWork(Emitter &e, const GroupSpec &s, const Args &a, bool backward) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type st = e.storage(s.dtype), f64 = b.getF64Type(), i64 = b.getI64Type();
  Value tokens = a.get("tokens"), heads = a.get("heads");
  Value headDim = a.get("headDim");
  Value rows = arith::MulIOp::create(b, loc, tokens, heads);
  Value x = e.memref2(a.get("x"), st, rows, headDim, headDim);
  Value y = e.memref2(a.get("y"), st, rows, headDim, headDim);
  Value docStart;
  if (s.packed)
    docStart = e.memref1(a.get("docStart"), b.getI32Type(), tokens);
  Value offset = e.toIndex(a.get("offset"));
  Value rd = a.get("rotaryDim");
  Value half = arith::DivUIOp::create(b, loc, e.toIndex(rd), e.cIndex(2));
  Value pairEnd = arith::AddIOp::create(b, loc, offset, half);
  Value theta = arith::BitcastOp::create(b, loc, f64, a.get("thetaBits"));
  Value rdF = arith::SIToFPOp::create(b, loc, f64, rd);
  Value headsIdx = e.toIndex(heads), seqIdx = e.toIndex(a.get("seq"));
  // body(row) for the rows of token `tok`'s heads, in head order.
  auto forHeads = [=](Emitter &in, Value tok,
                      std::function<void(Emitter &, Value)> body) {
    Value first = arith::MulIOp::create(in.b, in.loc, tok, headsIdx);
    scf::ForOp::create(in.b, in.loc, in.cIndex(0), headsIdx, in.cIndex(1),
                       ValueRange{},
                       [&](OpBuilder &nb, Location nl, Value hh, ValueRange) {
                         Emitter e(nb, nl, in.gpu);
                         body(e, arith::AddIOp::create(nb, nl, first, hh));
                         scf::YieldOp::create(nb, nl);
                       });
  };
  // cos and sin (-sin backward) of pair i's angle at token `tok`, in
  // double rounded to f32: the position t = tok % seq (less its document's
  // start when packed), a = pos * theta^((-2 i) / rotaryDim).
  auto angleOf = [=](Emitter &e, Value tok,
                     Value i) -> std::pair<Value, Value> {
    OpBuilder &nb = e.b;
    Location nl = e.loc;
    Value t = arith::RemUIOp::create(nb, nl, tok, seqIdx);
    Value pos = arith::IndexCastOp::create(nb, nl, i64, t);
    if (docStart) {
      Value ds = memref::LoadOp::create(nb, nl, docStart, ValueRange{tok});
      pos = arith::SubIOp::create(nb, nl, pos,
                                  arith::ExtSIOp::create(nb, nl, i64, ds));
    }
    Value iF = arith::SIToFPOp::create(
        nb, nl, f64, arith::IndexCastOp::create(nb, nl, i64, i));
    Value m2 = arith::ConstantOp::create(nb, nl, nb.getF64FloatAttr(-2.0));
    Value expo = arith::DivFOp::create(
        nb, nl, arith::MulFOp::create(nb, nl, m2, iF), rdF);
    Value inv = math::PowFOp::create(nb, nl, theta, expo);
    Value ang = arith::MulFOp::create(
        nb, nl, arith::SIToFPOp::create(nb, nl, f64, pos), inv);
    Type f32 = nb.getF32Type();
    Value c =
        arith::TruncFOp::create(nb, nl, f32, math::CosOp::create(nb, nl, ang));
    Value sd = math::SinOp::create(nb, nl, ang);
    if (backward)
      sd = arith::NegFOp::create(nb, nl, sd);
    return {c, arith::TruncFOp::create(nb, nl, f32, sd)};
  };
  ItemFn item = [=](Emitter &in, ValueRange idx) {
    OpBuilder &b = in.b;
    Location loc = in.loc;
    Value tok = idx[0], k = idx[1];
    Value isPair = arith::AndIOp::create(
        b, loc,
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::uge, k, offset),
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, k, pairEnd));
    scf::IfOp::create(
        b, loc, isPair,
        [&](OpBuilder &nb, Location nl) {
          Emitter e(nb, nl, in.gpu);
          Value i = arith::SubIOp::create(nb, nl, k, offset);
          Value c1 = k, c2 = arith::AddIOp::create(nb, nl, k, half);
          auto [c, sv] = angleOf(e, tok, i);
          forHeads(e, tok, [&](Emitter &h, Value r) {
            Value x1 = h.load(x, {r, c1}), x2 = h.load(x, {r, c2});
            h.store(h.sub(h.mul(x1, c), h.mul(x2, sv)), y, {r, c1});
            h.store(h.add(h.mul(x2, c), h.mul(x1, sv)), y, {r, c2});
          });
          scf::YieldOp::create(nb, nl);
        },
        [&](OpBuilder &nb, Location nl) {
          Emitter e(nb, nl, in.gpu);
          // Copied: column k below the pairs, k + h after them.
          Value below = arith::CmpIOp::create(nb, nl, arith::CmpIPredicate::ult,
                                              k, offset);
          Value col = arith::SelectOp::create(
              nb, nl, below, k, arith::AddIOp::create(nb, nl, k, half));
          forHeads(e, tok, [&](Emitter &h, Value r) {
            h.store(h.load(x, {r, col}), y, {r, col});
          });
          scf::YieldOp::create(nb, nl);
        });
  };
  Value colsIdx = e.toIndex(a.get("cols"));
  Work w{{e.toIndex(tokens), colsIdx}, item};
  // GPU: a block per kRopeTokensPerBlock tokens. Their pairs' cos and sin
  // go to a shared table once (the same values as angleOf per item: token
  // t's at [t kRopeMaxHalf, ...), sin kRopeTokensPerBlock kRopeMaxHalf
  // further); then, where x and y are 16-byte aligned and offset,
  // rotaryDim / 2 and headDim are multiples of 8 (and rotaryDim / 2 <=
  // kRopeMaxHalf), a thread takes 8 pairs of one head (two 16-byte loads
  // and stores) or 8 copied columns, over the tokens' heads, the chunks of
  // its first item prefetched into L2 before the table is computed;
  // otherwise the items above, a thread each in turn, token after token.
  // Several tokens a block: the table's latency (double pow, cos, sin) is
  // paid once for them, with fewer blocks one after the other on an SM.
  // Every element's arithmetic is the item's, so the bits are the host's.
  w.sharedFloats = 2 * kRopeTokensPerBlock * kRopeMaxHalf;
  w.gpuBlock = [=](Emitter &e, Value tid, Value bid, Value shared) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value tokensIdx = e.toIndex(tokens);
    Value tok0 =
        arith::MulIOp::create(b, loc, bid, e.cIndex(kRopeTokensPerBlock));
    // The block's tokens: min(kRopeTokensPerBlock, tokens - tok0).
    Value nTok =
        arith::MinUIOp::create(b, loc, e.cIndex(kRopeTokensPerBlock),
                               arith::SubIOp::create(b, loc, tokensIdx, tok0));
    Value threads = e.cIndex(kBlockSize);
    auto loopFrom = [&](Emitter &in, Value from, Value count,
                        llvm::function_ref<void(Emitter &, Value)> body) {
      scf::ForOp::create(in.b, in.loc, from, count, threads, ValueRange{},
                         [&](OpBuilder &nb, Location nl, Value t, ValueRange) {
                           Emitter on(nb, nl, true);
                           body(on, t);
                           scf::YieldOp::create(nb, nl);
                         });
    };
    auto blockLoop = [&](Emitter &in, Value count,
                         llvm::function_ref<void(Emitter &, Value)> body) {
      loopFrom(in, tid, count, body);
    };
    auto cmp = [](Emitter &in, arith::CmpIPredicate p, Value l, Value r) {
      return arith::CmpIOp::create(in.b, in.loc, p, l, r).getResult();
    };
    auto ifThen = [](Emitter &q, Value cond,
                     llvm::function_ref<void(Emitter &)> body) {
      scf::IfOp::create(q.b, q.loc, cond, [&](OpBuilder &nb, Location nl) {
        Emitter in(nb, nl, true);
        body(in);
        scf::YieldOp::create(nb, nl);
      });
    };
    auto rem8 = [&](Value v) {
      return cmp(e, arith::CmpIPredicate::eq,
                 arith::RemUIOp::create(b, loc, v, e.cIndex(8)), e.cIndex(0));
    };
    Value headDimIdx = e.toIndex(headDim);
    Value tabled =
        cmp(e, arith::CmpIPredicate::ule, half, e.cIndex(kRopeMaxHalf));
    Value vec = arith::AndIOp::create(
        b, loc, chunksAligned(e, {x, y}, 8),
        arith::AndIOp::create(
            b, loc, tabled,
            arith::AndIOp::create(
                b, loc, rem8(headDimIdx),
                arith::AndIOp::create(b, loc, rem8(offset), rem8(half)))));
    // The vector path's items of one token: per head, pairItems items of 8
    // pairs, then copyItems items of 8 copied columns; item `it` of the
    // block is item it % items of token tok0 + it / items. (Index
    // arithmetic only, read where `vec` holds; divisors of at least 1.)
    // (Computed where used, after the table, so that they do not live
    // across the angles' libdevice calls.)
    struct VecConsts {
      Value pairItems, rdIdx, perHead, items, blockItems;
    };
    auto constsOf = [&](Emitter &q) {
      OpBuilder &cb = q.b;
      Location cl = q.loc;
      Value eight = q.cIndex(8);
      VecConsts k;
      k.pairItems = arith::DivUIOp::create(cb, cl, half, eight);
      k.rdIdx = q.toIndex(rd);
      Value copyItems = arith::DivUIOp::create(
          cb, cl, arith::SubIOp::create(cb, cl, headDimIdx, k.rdIdx), eight);
      k.perHead = arith::MaxUIOp::create(
          cb, cl, arith::AddIOp::create(cb, cl, k.pairItems, copyItems),
          q.cIndex(1));
      k.items = arith::MulIOp::create(cb, cl, headsIdx, k.perHead);
      k.blockItems = arith::MulIOp::create(cb, cl, nTok, k.items);
      return k;
    };
    struct VecItem {
      Value r, k, isPair, table;
    };
    auto itemAt = [&](Emitter &q, const VecConsts &c, Value it) {
      Value t = arith::DivUIOp::create(q.b, q.loc, it, c.items);
      Value rest = arith::RemUIOp::create(q.b, q.loc, it, c.items);
      Value head = arith::DivUIOp::create(q.b, q.loc, rest, c.perHead);
      Value k = arith::RemUIOp::create(q.b, q.loc, rest, c.perHead);
      Value tok = arith::AddIOp::create(q.b, q.loc, tok0, t);
      Value r = arith::AddIOp::create(
          q.b, q.loc, arith::MulIOp::create(q.b, q.loc, tok, headsIdx), head);
      Value table =
          arith::MulIOp::create(q.b, q.loc, t, q.cIndex(kRopeMaxHalf));
      return VecItem{r, k, cmp(q, arith::CmpIPredicate::ult, k, c.pairItems),
                     table};
    };
    // A pair item's columns (x1 at offset + 8 k, x2 h further) and a copy
    // item's (8 columns below the pairs or past them).
    auto pairCol = [&](Emitter &p, Value k) {
      return arith::AddIOp::create(
                 p.b, p.loc, offset,
                 arith::MulIOp::create(p.b, p.loc, k, p.cIndex(8)))
          .getResult();
    };
    auto copyCol = [&](Emitter &p, const VecConsts &c, Value k) {
      Value j = arith::MulIOp::create(
          p.b, p.loc, arith::SubIOp::create(p.b, p.loc, k, c.pairItems),
          p.cIndex(8));
      return arith::SelectOp::create(
                 p.b, p.loc, cmp(p, arith::CmpIPredicate::ult, j, offset), j,
                 arith::AddIOp::create(p.b, p.loc, j, c.rdIdx))
          .getResult();
    };
    auto pairItem = [&](Emitter &p, const VecItem &v) {
      Value c1 = pairCol(p, v.k);
      Value c2 = arith::AddIOp::create(p.b, p.loc, c1, half);
      Value i0 = arith::MulIOp::create(p.b, p.loc, v.k, p.cIndex(8));
      ChunkCtx lo(p, c1, 8, /*vector=*/true), hi(p, c2, 8, /*vector=*/true);
      SmallVector<Value, 8> x1, x2;
      p.chunk = &lo;
      for (int64_t q8 = 0; q8 < 8; ++q8)
        x1.push_back(p.load(x, {v.r, lo.js[q8]}));
      p.chunk = &hi;
      for (int64_t q8 = 0; q8 < 8; ++q8)
        x2.push_back(p.load(x, {v.r, hi.js[q8]}));
      SmallVector<Value, 8> y1, y2;
      for (int64_t q8 = 0; q8 < 8; ++q8) {
        Value i = arith::AddIOp::create(
            p.b, p.loc, v.table,
            arith::AddIOp::create(p.b, p.loc, i0, p.cIndex(q8)));
        Value c = memref::LoadOp::create(p.b, p.loc, shared, i);
        Value at = arith::AddIOp::create(
            p.b, p.loc, i, p.cIndex(kRopeTokensPerBlock * kRopeMaxHalf));
        Value sv = memref::LoadOp::create(p.b, p.loc, shared, at);
        y1.push_back(p.sub(p.mul(x1[q8], c), p.mul(x2[q8], sv)));
        y2.push_back(p.add(p.mul(x2[q8], c), p.mul(x1[q8], sv)));
      }
      p.chunk = &lo;
      for (int64_t q8 = 0; q8 < 8; ++q8)
        p.store(y1[q8], y, {v.r, lo.js[q8]});
      lo.flush(p);
      p.chunk = &hi;
      for (int64_t q8 = 0; q8 < 8; ++q8)
        p.store(y2[q8], y, {v.r, hi.js[q8]});
      hi.flush(p);
      p.chunk = nullptr;
    };
    auto copyItem = [&](Emitter &p, const VecConsts &c, const VecItem &v) {
      ChunkCtx cx(p, copyCol(p, c, v.k), 8, /*vector=*/true);
      p.chunk = &cx;
      for (int64_t q8 = 0; q8 < 8; ++q8)
        p.store(p.load(x, {v.r, cx.js[q8]}), y, {v.r, cx.js[q8]});
      cx.flush(p);
      p.chunk = nullptr;
    };
    // The table (only the vector path reads it). Before it each thread
    // prefetches the x chunks of its first item, so that their trip from
    // memory overlaps the angles' computation instead of following the
    // barrier.
    ifThen(e, vec, [&](Emitter &in) {
      {
        VecConsts c = constsOf(in);
        ifThen(in, cmp(in, arith::CmpIPredicate::ult, tid, c.blockItems),
               [&](Emitter &p) {
                 VecItem v = itemAt(p, c, tid);
                 auto prefetch = [&](Emitter &q, Value col) {
                   ChunkCtx cx(q, col, 8, /*vector=*/true);
                   LLVM::CallIntrinsicOp::create(
                       q.b, q.loc, q.b.getStringAttr(kRopePrefetch),
                       ValueRange{cx.address(q, x, {v.r})});
                 };
                 Value c1 = pairCol(p, v.k);
                 prefetch(p, arith::SelectOp::create(p.b, p.loc, v.isPair, c1,
                                                     copyCol(p, c, v.k)));
                 ifThen(p, v.isPair, [&](Emitter &q) {
                   prefetch(q, arith::AddIOp::create(q.b, q.loc, c1, half));
                 });
               });
      }
      Value entries = arith::MulIOp::create(in.b, in.loc, nTok, half);
      blockLoop(in, entries, [&](Emitter &q, Value at) {
        Value t = arith::DivUIOp::create(q.b, q.loc, at, half);
        Value i = arith::RemUIOp::create(q.b, q.loc, at, half);
        auto [c, sv] =
            angleOf(q, arith::AddIOp::create(q.b, q.loc, tok0, t), i);
        Value ci = arith::AddIOp::create(
            q.b, q.loc,
            arith::MulIOp::create(q.b, q.loc, t, q.cIndex(kRopeMaxHalf)), i);
        memref::StoreOp::create(q.b, q.loc, c, shared, ci);
        Value si = arith::AddIOp::create(
            q.b, q.loc, ci, q.cIndex(kRopeTokensPerBlock * kRopeMaxHalf));
        memref::StoreOp::create(q.b, q.loc, sv, shared, si);
      });
    });
    gpu::BarrierOp::create(b, loc);
    scf::IfOp::create(
        b, loc, vec,
        [&](OpBuilder &nb, Location nl) {
          Emitter in(nb, nl, true);
          VecConsts c = constsOf(in);
          blockLoop(in, c.blockItems, [&](Emitter &q, Value it) {
            VecItem v = itemAt(q, c, it);
            scf::IfOp::create(
                q.b, q.loc, v.isPair,
                [&](OpBuilder &pb, Location pl) {
                  Emitter p(pb, pl, true);
                  pairItem(p, v);
                  scf::YieldOp::create(pb, pl);
                },
                [&](OpBuilder &pb, Location pl) {
                  Emitter p(pb, pl, true);
                  copyItem(p, c, v);
                  scf::YieldOp::create(pb, pl);
                });
          });
          scf::YieldOp::create(nb, nl);
        },
        [&](OpBuilder &nb, Location nl) {
          Emitter in(nb, nl, true);
          // The block's (token, column) items flattened, token-major.
          Value all = arith::MulIOp::create(nb, nl, nTok, colsIdx);
          blockLoop(in, all, [&](Emitter &p, Value it) {
            Value t = arith::DivUIOp::create(p.b, p.loc, it, colsIdx);
            Value k = arith::RemUIOp::create(p.b, p.loc, it, colsIdx);
            item(p, {arith::AddIOp::create(p.b, p.loc, tok0, t), k});
          });
          scf::YieldOp::create(nb, nl);
        });
  };
  return w;
}

Work adamWWork(Emitter &e, const GroupSpec &s, const Args &a) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type f32 = b.getF32Type();
  Value n = a.get("n");
  auto op = [&](const char *ptr, Type elem) {
    Value p = a.get(ptr);
    return Operand{p, Value(), e.memref1(p, elem, n), elem};
  };
  ElementWise ew;
  ew.cols = e.toIndex(n);
  ew.vector = vectorOf(s);
  Operand master = op("master", f32), expAvg = op("expAvg", f32),
          expAvgSq = op("expAvgSq", f32);
  ew.ins = {master, expAvg, expAvgSq, op("grad", e.storage(s.dtype))};
  ew.outs = {master, expAvg, expAvgSq};
  if (s.computeCopy)
    ew.outs.push_back(op("computeCopy", e.storage(*s.computeCopy)));
  // The clip coefficient: *clipCoef, or 1 when the pointer is null (read
  // once per invocation; it is a device scalar from the grad norm).
  Value clipPtr = a.get("clipCoef");
  Value nullPtr = LLVM::ZeroOp::create(b, loc, clipPtr.getType());
  Value hasClip =
      LLVM::ICmpOp::create(b, loc, LLVM::ICmpPredicate::ne, clipPtr, nullPtr);
  auto ccIf = scf::IfOp::create(
      b, loc, hasClip,
      [&](OpBuilder &nb, Location nl) {
        Value v = LLVM::LoadOp::create(nb, nl, f32, clipPtr);
        scf::YieldOp::create(nb, nl, v);
      },
      [&](OpBuilder &nb, Location nl) {
        Emitter in(nb, nl, e.gpu);
        scf::YieldOp::create(nb, nl, in.cF32(1.0f));
      });
  Value cc = ccIf.getResult(0);
  Value stepSize = a.get("stepSize"), bc2Sqrt = a.get("bc2Sqrt"),
        decay = a.get("decay"), b1 = a.get("beta1"), b2 = a.get("beta2"),
        eps = a.get("eps");
  bool copy = s.computeCopy.has_value();
  // The reference's statements in order.
  ew.fn = [=](Emitter &e, ArrayRef<Value> in) -> SmallVector<Value, 4> {
    Value one = e.cF32(1.0f);
    Value g = e.mul(in[3], cc);
    Value p = e.mul(in[0], decay);
    Value m = e.add(e.mul(b1, in[1]), e.mul(e.sub(one, b1), g));
    Value v = e.add(e.mul(b2, in[2]), e.mul(e.sub(one, b2), e.mul(g, g)));
    Value denom = e.add(e.div(e.sqrt(v), bc2Sqrt), eps);
    p = e.sub(p, e.mul(stepSize, e.div(m, denom)));
    SmallVector<Value, 4> out{p, m, v};
    if (copy)
      out.push_back(p);
    return out;
  };
  return elementWiseWork(e, ew);
}

/// Runs body on the GPU in thread 0 of block 0 only.
void inFirstThread(Emitter &e, Value tid, Value bid,
                   const std::function<void(Emitter &)> &body) {
  Value zero = e.cIndex(0);
  Value first = arith::AndIOp::create(
      e.b, e.loc,
      arith::CmpIOp::create(e.b, e.loc, arith::CmpIPredicate::eq, tid, zero),
      arith::CmpIOp::create(e.b, e.loc, arith::CmpIPredicate::eq, bid, zero));
  scf::IfOp::create(e.b, e.loc, first, [&](OpBuilder &nb, Location nl) {
    Emitter in(nb, nl, true);
    body(in);
    scf::YieldOp::create(nb, nl);
  });
}

/// A raw scalar pointer parameter compared with null (i1: not null).
Value notNull(Emitter &e, Value ptr) {
  Value null = LLVM::ZeroOp::create(e.b, e.loc, ptr.getType());
  return LLVM::ICmpOp::create(e.b, e.loc, LLVM::ICmpPredicate::ne, ptr, null);
}

/// The grad norm's sums of squares per block of kGradNormBlock elements in
/// the kernel library's order (KernelAbi.h): thread t of block b adds v * v
/// (v the element widened exactly to f64, so the product is exact and a
/// fused multiply-add would give the same bits) over the block's elements
/// t, t + kGradNormThreads, ... in increasing order; the threads' partials
/// halve in a tree into partial[b]. The host runs the threads one after the
/// other into a scratch array, then the same tree.
Work gradNormSquaresWork(Emitter &e, const GroupSpec &s, const Args &a) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type f64 = b.getF64Type();
  Value n = a.get("n");
  Value nIdx = e.toIndex(n);
  Value block = e.cIndex(kGradNormBlock);
  Value partsIdx = arith::DivUIOp::create(
      b, loc, arith::AddIOp::create(b, loc, nIdx, e.cIndex(kGradNormBlock - 1)),
      block);
  Value grad = e.memref1(a.get("grad"), e.storage(s.dtype), n);
  Value partial =
      e.memref1(a.get("partial"), f64,
                arith::IndexCastOp::create(b, loc, b.getI64Type(), partsIdx));
  auto threadSum = [=](Emitter &in, Value blk, Value t) -> Value {
    Value lo = arith::MulIOp::create(in.b, in.loc, blk, block);
    Value hi = arith::MinUIOp::create(
        in.b, in.loc, arith::AddIOp::create(in.b, in.loc, lo, block), nIdx);
    return stridedSum(
        in, arith::AddIOp::create(in.b, in.loc, lo, t), hi,
        [&](Emitter &q, Value i) {
          Value v = arith::ExtFOp::create(q.b, q.loc, q.b.getF64Type(),
                                          q.load(grad, {i}));
          return q.mul(v, v);
        },
        kGradNormThreads, in.cF64(0.0));
  };
  Value scratch;
  if (!e.gpu)
    scratch = memref::AllocaOp::create(
        b, loc, MemRefType::get({kGradNormThreads}, f64));
  ItemFn item = [=](Emitter &e, ValueRange idx) {
    Value blk = idx[0];
    scf::ForOp::create(
        e.b, e.loc, e.cIndex(0), e.cIndex(kGradNormThreads), e.cIndex(1),
        ValueRange{}, [&](OpBuilder &nb, Location nl, Value t, ValueRange) {
          Emitter in(nb, nl, false);
          memref::StoreOp::create(nb, nl, threadSum(in, blk, t), scratch, t);
          scf::YieldOp::create(nb, nl);
        });
    memref::StoreOp::create(e.b, e.loc,
                            hostHalving(e, scratch, kGradNormThreads), partial,
                            ValueRange{blk});
  };
  Work w{{partsIdx}, item};
  w.gpuBlock = [=](Emitter &e, Value tid, Value bid, Value shared) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    Value inRange =
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, bid, partsIdx);
    Value mine = valueIf(
        e, inRange, [&](Emitter &in) { return threadSum(in, bid, tid); },
        [](Emitter &in) { return in.cF64(0.0); });
    sharedHalve(e, shared, tid, mine, tid, kGradNormThreads, 1);
    Value first = arith::AndIOp::create(
        b, loc, inRange,
        arith::CmpIOp::create(b, loc, arith::CmpIPredicate::eq, tid,
                              e.cIndex(0)));
    scf::IfOp::create(b, loc, first, [&](OpBuilder &nb, Location nl) {
      Value v = memref::LoadOp::create(
          nb, nl, shared, ValueRange{Emitter(nb, nl, true).cIndex(0)});
      memref::StoreOp::create(nb, nl, v, partial, ValueRange{bid});
      scf::YieldOp::create(nb, nl);
    });
  };
  w.sharedFloats = kGradNormThreads;
  w.sharedElem = f64;
  return w;
}

/// The grad norm from its partials, the kernel library's finish: one
/// running f64 sum from *initial (0 when null) over partial[0, parts) in
/// order; *squares = the sum (when not null); *norm = f32(sqrt(sum));
/// *clipCoef (when not null) = f32(min(1, maxNorm / (f64(norm) + 1e-6)))
/// for maxNorm > 0, else 1 (std::min's rule: a NaN quotient gives 1). One
/// thread on the GPU.
Work gradNormFinishWork(Emitter &e, const GroupSpec &, const Args &a) {
  OpBuilder &b = e.b;
  Location loc = e.loc;
  Type f64 = b.getF64Type(), f32 = b.getF32Type();
  Value parts = a.get("parts");
  Value partsIdx = e.toIndex(parts);
  Value partial = e.memref1(a.get("partial"), f64, parts);
  Value initial = a.get("initial"), norm = a.get("norm"),
        clipCoef = a.get("clipCoef"), squares = a.get("squares");
  Value maxNorm = arith::BitcastOp::create(b, loc, f64, a.get("maxNormBits"));
  auto body = [=](Emitter &e) {
    OpBuilder &b = e.b;
    Location loc = e.loc;
    auto start = scf::IfOp::create(
        b, loc, notNull(e, initial),
        [&](OpBuilder &nb, Location nl) {
          scf::YieldOp::create(
              nb, nl, LLVM::LoadOp::create(nb, nl, f64, initial).getResult());
        },
        [&](OpBuilder &nb, Location nl) {
          scf::YieldOp::create(nb, nl, Emitter(nb, nl, e.gpu).cF64(0.0));
        });
    auto sum = scf::ForOp::create(
        b, loc, e.cIndex(0), partsIdx, e.cIndex(1),
        ValueRange{start.getResult(0)},
        [&](OpBuilder &nb, Location nl, Value i, ValueRange acc) {
          Emitter in(nb, nl, e.gpu);
          Value p = memref::LoadOp::create(nb, nl, partial, ValueRange{i});
          scf::YieldOp::create(nb, nl, in.add(acc[0], p));
        });
    Value total = sum.getResult(0);
    scf::IfOp::create(b, loc, notNull(e, squares),
                      [&](OpBuilder &nb, Location nl) {
                        LLVM::StoreOp::create(nb, nl, total, squares);
                        scf::YieldOp::create(nb, nl);
                      });
    Value nv = arith::TruncFOp::create(b, loc, f32, e.sqrt(total));
    LLVM::StoreOp::create(b, loc, nv, norm);
    scf::IfOp::create(
        b, loc, notNull(e, clipCoef), [&](OpBuilder &nb, Location nl) {
          Emitter in(nb, nl, e.gpu);
          Value q =
              in.div(maxNorm, in.add(arith::ExtFOp::create(nb, nl, f64, nv),
                                     in.cF64(1e-6)));
          Value one = in.cF64(1.0);
          Value below =
              arith::CmpFOp::create(nb, nl, arith::CmpFPredicate::OLT, q, one);
          Value m = arith::SelectOp::create(nb, nl, below, q, one);
          Value positive = arith::CmpFOp::create(
              nb, nl, arith::CmpFPredicate::OGT, maxNorm, in.cF64(0.0));
          Value c = arith::SelectOp::create(
              nb, nl, positive, arith::TruncFOp::create(nb, nl, f32, m),
              in.cF32(1.0f));
          LLVM::StoreOp::create(nb, nl, c, clipCoef);
          scf::YieldOp::create(nb, nl);
        });
  };
  Work w{{e.cIndex(1)}, [=](Emitter &e, ValueRange) { body(e); }};
  w.gpuBlock = [=](Emitter &e, Value tid, Value bid, Value) {
    inFirstThread(e, tid, bid, body);
  };
  return w;
}

/// The phases of a group, in the order they must run.
SmallVector<Work> workOf(Emitter &e, const GroupSpec &s, const Args &a) {
  switch (s.kind) {
  case GroupKind::SwiGluForward:
    return {swiGluWork(e, s, a, /*backward=*/false)};
  case GroupKind::SwiGluBackward:
    return {swiGluWork(e, s, a, /*backward=*/true)};
  case GroupKind::ResidualAdd:
    return {residualAddWork(e, s, a)};
  case GroupKind::RmsNormForward:
    return {rmsNormWork(e, s, a)};
  case GroupKind::RmsNormBackward:
    return rmsNormBackwardWork(e, s, a);
  case GroupKind::AddRmsNormForward:
    return {addRmsNormWork(e, s, a)};
  case GroupKind::AdamW:
    return {adamWWork(e, s, a)};
  case GroupKind::SigmoidGateForward:
    return {sigmoidGateWork(e, s, a, /*backward=*/false)};
  case GroupKind::SigmoidGateBackward:
    return {sigmoidGateWork(e, s, a, /*backward=*/true)};
  case GroupKind::L2NormForward:
    return {l2NormWork(e, s, a, /*backward=*/false)};
  case GroupKind::L2NormBackward:
    return {l2NormWork(e, s, a, /*backward=*/true)};
  case GroupKind::GatedNormForward:
    return gatedNormWork(e, s, a, /*backward=*/false);
  case GroupKind::GatedNormBackward:
    return gatedNormWork(e, s, a, /*backward=*/true);
  case GroupKind::GdnGatesForward:
    return gdnGatesWork(e, s, a, /*backward=*/false);
  case GroupKind::GdnGatesBackward:
    return gdnGatesWork(e, s, a, /*backward=*/true);
  case GroupKind::RopeForward:
    return {ropeWork(e, s, a, /*backward=*/false)};
  case GroupKind::RopeBackward:
    return {ropeWork(e, s, a, /*backward=*/true)};
  case GroupKind::GradNormSquares:
    return {gradNormSquaresWork(e, s, a)};
  case GroupKind::GradNormFinish:
    return {gradNormFinishWork(e, s, a)};
  }
  llvm_unreachable("unknown group kind");
}

SmallVector<Type> paramTypes(Emitter &e, const Params &p) {
  SmallVector<Type> types(p.ptrs.size(), e.ptrType());
  types.append(p.ints.size(), e.b.getI64Type());
  types.append(p.floats.size(), e.b.getF32Type());
  return types;
}

void loadDialects(MLIRContext &context) {
  context.loadDialect<arith::ArithDialect, func::FuncDialect, gpu::GPUDialect,
                      LLVM::LLVMDialect, math::MathDialect,
                      memref::MemRefDialect, scf::SCFDialect>();
}

} // namespace

OwningOpRef<ModuleOp> buildHostModule(MLIRContext &context,
                                      ArrayRef<GroupSpec> specs) {
  loadDialects(context);
  Location loc = UnknownLoc::get(&context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  OpBuilder b(&context);
  if (llvm::any_of(specs, [](const GroupSpec &s) {
        return s.kind == GroupKind::GdnGatesForward ||
               s.kind == GroupKind::GdnGatesBackward;
      })) {
    b.setInsertionPointToEnd(module->getBody());
    Type f32 = b.getF32Type();
    func::FuncOp::create(b, loc, kLog1pf, b.getFunctionType({f32}, {f32}))
        .setPrivate();
  }
  for (const GroupSpec &spec : specs) {
    b.setInsertionPointToEnd(module->getBody());
    Emitter e(b, loc, /*gpu=*/false);
    Params params = paramsOf(spec);
    auto fn = func::FuncOp::create(
        b, loc, kernelName(spec),
        b.getFunctionType(paramTypes(e, params), TypeRange{}));
    Block *entry = fn.addEntryBlock();
    b.setInsertionPointToStart(entry);
    // Phases in order; in each, items in increasing (row-major) order, one
    // after the other.
    for (Work &work : workOf(e, spec, Args{params, entry->getArguments()})) {
      SmallVector<Value> lbs(work.shape.size(), e.cIndex(0)),
          steps(work.shape.size(), e.cIndex(1));
      scf::buildLoopNest(b, loc, lbs, work.shape, steps,
                         [&](OpBuilder &nb, Location nl, ValueRange ivs) {
                           Emitter in(nb, nl, false);
                           work.item(in, ivs);
                         });
    }
    func::ReturnOp::create(b, loc);
  }
  return module;
}

OwningOpRef<ModuleOp> buildGpuModule(MLIRContext &context,
                                     ArrayRef<GroupSpec> specs) {
  loadDialects(context);
  Location loc = UnknownLoc::get(&context);
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  (*module)->setAttr(gpu::GPUDialect::getContainerModuleAttrName(),
                     UnitAttr::get(&context));
  OpBuilder b(&context);
  b.setInsertionPointToEnd(module->getBody());
  auto gpuModule = gpu::GPUModuleOp::create(b, loc, "ap_kg");
  for (const GroupSpec &spec : specs) {
    // One kernel per phase; each builds the whole group's setup and keeps
    // its own phase (the rest is dead code LLVM drops).
    std::vector<GpuEntry> entries = gpuEntries(spec);
    for (size_t phase = 0; phase < entries.size(); ++phase) {
      const GpuEntry &launch = entries[phase];
      b.setInsertionPointToEnd(gpuModule.getBody());
      Emitter e(b, loc, /*gpu=*/true);
      Params params = paramsOf(spec);
      auto fn = gpu::GPUFuncOp::create(
          b, loc, launch.name,
          b.getFunctionType(paramTypes(e, params), TypeRange{}));
      fn->setAttr(gpu::GPUDialect::getKernelFuncAttrName(), b.getUnitAttr());
      Block &entry = fn.getBody().front();
      b.setInsertionPointToStart(&entry);
      Work work =
          std::move(workOf(e, spec, Args{params, entry.getArguments()})[phase]);
      // The block size, known to the compiler (.maxntid in PTX: a launch
      // with larger blocks fails).
      fn.setKnownBlockSizeAttr(
          b.getDenseI32ArrayAttr({int32_t(launch.blockSize), 1, 1}));
      Value bid = gpu::BlockIdOp::create(b, loc, gpu::Dimension::x);
      Value tid = gpu::ThreadIdOp::create(b, loc, gpu::Dimension::x);
      if (work.gpuBlock) {
        Value shared;
        if (work.sharedFloats > 0) {
          auto space = gpu::AddressSpaceAttr::get(&context,
                                                  gpu::AddressSpace::Workgroup);
          shared = fn.addWorkgroupAttribution(
              MemRefType::get({work.sharedFloats},
                              work.sharedElem ? work.sharedElem
                                              : Type(b.getF32Type()),
                              MemRefLayoutAttrInterface(), space),
              loc);
        }
        work.gpuBlock(e, tid, bid, shared);
        gpu::ReturnOp::create(b, loc);
        continue;
      }
      // One item per threadsPerItem threads: t = blockIdx.x * blockDim.x +
      // threadIdx.x, item t / threadsPerItem (lane t % threadsPerItem) over
      // the flattened shape, split back into (row, col) for 2-d work.
      Value bdim = gpu::BlockDimOp::create(b, loc, gpu::Dimension::x);
      Value i = arith::AddIOp::create(
          b, loc, arith::MulIOp::create(b, loc, bid, bdim), tid);
      Value lane;
      if (launch.threadsPerItem > 1) {
        Value per = e.cIndex(launch.threadsPerItem);
        lane = arith::RemUIOp::create(b, loc, i, per);
        i = arith::DivUIOp::create(b, loc, i, per);
      }
      Value count = work.shape[0];
      for (Value extent : ArrayRef<Value>(work.shape).drop_front())
        count = arith::MulIOp::create(b, loc, count, extent);
      Value inRange =
          arith::CmpIOp::create(b, loc, arith::CmpIPredicate::ult, i, count);
      scf::IfOp::create(b, loc, inRange, [&](OpBuilder &nb, Location nl) {
        Emitter in(nb, nl, true);
        SmallVector<Value, 2> idx{i};
        if (work.shape.size() == 2)
          idx = {arith::DivUIOp::create(nb, nl, i, work.shape[1]),
                 arith::RemUIOp::create(nb, nl, i, work.shape[1])};
        if (lane)
          idx.push_back(lane);
        work.item(in, idx);
        scf::YieldOp::create(nb, nl);
      });
      gpu::ReturnOp::create(b, loc);
    }
  }
  return module;
}

} // namespace ap::kernelgen
