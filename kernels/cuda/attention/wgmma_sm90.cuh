//===- wgmma_sm90.cuh - Hopper warpgroup MMA wrappers for attention -*- C++
//-*-//
//
// Thin PTX wrappers for the sm_90a path of attention.cu: wgmma.mma_async
// m64nNk16 (bf16 in, fp32 accumulate) with N in {64, 128, 192}, shared-memory
// matrix descriptors for tiles stored in 128-byte-swizzled panels, and the
// fences and waits of the asynchronous warpgroup MMA.
//
// Panel layout (what the descriptors describe): a tile of R rows x D bf16 is
// stored as D/64 panels of R rows x 128 bytes, panel p holding columns
// 64p..64p+63; 16-byte chunk c of row r sits at chunk c ^ (r & 7), which is
// the hardware's 128-byte swizzle when every panel starts 1024-byte aligned.
// The same layout serves a K-major operand (rows = M or N, columns = K) and
// an MN-major one (rows = K, columns = N, instruction's transpose flag set).
//
// Only the sm_90a device pass emits these instructions; other targets see
// empty bodies, and the host only selects the kernels that use them when the
// loaded binary is sm_90 (see attention.cu).
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_KERNELS_CUDA_ATTENTION_WGMMA_SM90_CUH
#define ACTPLACE_KERNELS_CUDA_ATTENTION_WGMMA_SM90_CUH

#include <cstdint>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define AP_WGMMA_ENABLED 1
#else
#define AP_WGMMA_ENABLED 0
#endif

namespace ap::kernels::cuda::sm90 {

/// Byte offset of element (r, c) in a panel-laid-out tile of R rows.
template <int R> __device__ __forceinline__ uint32_t pan(int r, int c) {
  return (c >> 6) * (R * 128) + r * 128 + ((((c >> 3) & 7) ^ (r & 7)) << 4) +
         (c & 7) * 2;
}

/// Shared-memory matrix descriptor with the 128-byte swizzle. K-major
/// operands: sbo = 1024 (8 rows of 128 bytes), lbo unused (16). MN-major:
/// lbo = the byte stride between 64-column panels, sbo = 1024.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo,
                                         uint32_t sbo) {
  return uint64_t((addr & 0x3FFFF) >> 4) |
         (uint64_t((lbo >> 4) & 0x3FFF) << 16) |
         (uint64_t((sbo >> 4) & 0x3FFF) << 32) | (uint64_t(1) << 62);
}

__device__ __forceinline__ void fence() {
#if AP_WGMMA_ENABLED
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void commit() {
#if AP_WGMMA_ENABLED
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N> __device__ __forceinline__ void wait() {
#if AP_WGMMA_ENABLED
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
/// Orders this thread's generic-proxy shared-memory writes (cp.async, st)
/// before later async-proxy reads (wgmma operands).
__device__ __forceinline__ void fenceProxyAsync() {
#if AP_WGMMA_ENABLED
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}
/// Keeps the compiler from moving accesses to accumulators across a wait.
template <int N> __device__ __forceinline__ void pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    asm volatile("" : "+f"(d[i])::"memory");
}

// Accumulator operand lists: SS forms have 3 leading operands (descA, descB,
// scale-d), RS forms 6 (four A registers, descB, scale-d).
#define AP_WGMMA_SS32                                                          \
  "{"                                                                          \
  "%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,"                  \
  "%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34"            \
  "}"
#define AP_WGMMA_SS64                                                          \
  "{"                                                                          \
  "%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,"                  \
  "%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,"           \
  "%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,"           \
  "%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66"            \
  "}"
#define AP_WGMMA_SS96                                                          \
  "{"                                                                          \
  "%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,"                  \
  "%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,"           \
  "%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,"           \
  "%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,"           \
  "%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,"           \
  "%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98"            \
  "}"
#define AP_WGMMA_RS32                                                          \
  "{"                                                                          \
  "%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"               \
  "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37"            \
  "}"
#define AP_WGMMA_RS64                                                          \
  "{"                                                                          \
  "%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"               \
  "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,"           \
  "%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,"           \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69"            \
  "}"
#define AP_WGMMA_RS96                                                          \
  "{"                                                                          \
  "%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,"               \
  "%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,"           \
  "%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,"           \
  "%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,"           \
  "%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,"           \
  "%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101"          \
  "}"

#define AP_F4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define AP_F16(d, i)                                                           \
  AP_F4(d, i), AP_F4(d, i + 4), AP_F4(d, i + 8), AP_F4(d, i + 12)
#define AP_F32(d) AP_F16(d, 0), AP_F16(d, 16)
#define AP_F64(d) AP_F32(d), AP_F16(d, 32), AP_F16(d, 48)
#define AP_F96(d) AP_F64(d), AP_F16(d, 64), AP_F16(d, 80)

#define AP_WGMMA_SS(n, list, ta, tb)                                           \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n"                                  \
  "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 " list             \
  ", %0, %1, p, 1, 1, " #ta ", " #tb ";\n}\n"
#define AP_WGMMA_RS(n, list, tb)                                               \
  "{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n"                                  \
  "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.bf16.bf16 " list             \
  ", {%0, %1, %2, %3}, %4, p, 1, 1, " #tb ";\n}\n"

#define AP_WGMMA_SS_CASES(ta, tb)                                              \
  if constexpr (N == 64)                                                       \
    asm volatile(AP_WGMMA_SS(64, AP_WGMMA_SS32, ta, tb)                        \
                 : "+l"(a), "+l"(b), "+r"(accumulate), AP_F32(d));             \
  else if constexpr (N == 128)                                                 \
    asm volatile(AP_WGMMA_SS(128, AP_WGMMA_SS64, ta, tb)                       \
                 : "+l"(a), "+l"(b), "+r"(accumulate), AP_F64(d));             \
  else if constexpr (N == 192)                                                 \
    asm volatile(AP_WGMMA_SS(192, AP_WGMMA_SS96, ta, tb)                       \
                 : "+l"(a), "+l"(b), "+r"(accumulate), AP_F96(d));             \
  else                                                                         \
    static_assert(N == 64 || N == 128 || N == 192, "unsupported wgmma N");

/// d (+)= A B, A and B from shared memory, both K-major; d is the m64nN
/// accumulator fragment (N/2 floats per thread). accumulate = 0 overwrites.
template <int N>
__device__ __forceinline__ void mmaSS(float (&d)[N / 2], uint64_t a, uint64_t b,
                                      int accumulate) {
#if AP_WGMMA_ENABLED
  AP_WGMMA_SS_CASES(0, 0)
#endif
}

/// d (+)= A B, both from shared memory and both MN-major (transposed): A
/// stored [K][M], B stored [K][N].
template <int N>
__device__ __forceinline__ void mmaSStt(float (&d)[N / 2], uint64_t a,
                                        uint64_t b, int accumulate) {
#if AP_WGMMA_ENABLED
  AP_WGMMA_SS_CASES(1, 1)
#endif
}

/// d (+)= A B, A from registers (the m64k16 fragment, laid out like
/// mma.sync's A), B from shared memory, MN-major (transposed).
template <int N>
__device__ __forceinline__ void
mmaRSt(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t b, int accumulate) {
#if AP_WGMMA_ENABLED
  uint32_t a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3];
  if constexpr (N == 64)
    asm volatile(AP_WGMMA_RS(64, AP_WGMMA_RS32, 1)
                 : "+r"(a0), "+r"(a1), "+r"(a2), "+r"(a3), "+l"(b),
                   "+r"(accumulate), AP_F32(d));
  else if constexpr (N == 128)
    asm volatile(AP_WGMMA_RS(128, AP_WGMMA_RS64, 1)
                 : "+r"(a0), "+r"(a1), "+r"(a2), "+r"(a3), "+l"(b),
                   "+r"(accumulate), AP_F64(d));
  else if constexpr (N == 192)
    asm volatile(AP_WGMMA_RS(192, AP_WGMMA_RS96, 1)
                 : "+r"(a0), "+r"(a1), "+r"(a2), "+r"(a3), "+l"(b),
                   "+r"(accumulate), AP_F96(d));
  else
    static_assert(N == 64 || N == 128 || N == 192, "unsupported wgmma N");
#endif
}

#undef AP_WGMMA_SS
#undef AP_WGMMA_SS_CASES
#undef AP_WGMMA_SS32
#undef AP_WGMMA_SS64
#undef AP_WGMMA_SS96
#undef AP_WGMMA_RS32
#undef AP_WGMMA_RS64
#undef AP_WGMMA_RS96
#undef AP_WGMMA_RS
#undef AP_F96
#undef AP_F64
#undef AP_F32
#undef AP_F16
#undef AP_F4

} // namespace ap::kernels::cuda::sm90

#endif // ACTPLACE_KERNELS_CUDA_ATTENTION_WGMMA_SM90_CUH
