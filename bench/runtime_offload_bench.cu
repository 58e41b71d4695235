//===- runtime_offload_bench.cu - Offload bench ----------------*- CUDA -*-===//
//
// Measures, on the cuda backend:
//   1. bandwidth of the offload engine (offload = D2H, reload = H2D, both at
//      once in the pipelined pattern of a training step) against raw
//      cudaMemcpyAsync on the same buffers and streams, for 1..256 MiB;
//   2. the slowdown of a compute kernel (a bf16 cuBLASLt GEMM and a
//      memory-bound triad) while offload/reload copies run beside it.
// Prints one JSON object per line; bench/runtime_bench.py turns them into
// tables. Times are GPU times between CUDA events, medians of repeats.
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/cuda_check.h"
#include "runtime/runtime.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

using namespace ap::rt;

namespace {

constexpr uint64_t MiB = 1ull << 20;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

cudaStream_t native(Device &dev, Stream s) {
  return static_cast<cudaStream_t>(dev.backend().nativeStream(s));
}

/// GPU milliseconds between two native events recorded around `body`, which
/// may use several streams: all of them join `Compute` before the end.
template <typename Body> double timed(Device &dev, Body body) {
  cudaEvent_t start, stop;
  AP_CUDA_CHECK(cudaEventCreate(&start));
  AP_CUDA_CHECK(cudaEventCreate(&stop));
  cudaStream_t c = native(dev, Stream::Compute);
  AP_CUDA_CHECK(cudaEventRecord(start, c));
  for (Stream s : {Stream::D2H, Stream::H2D})
    AP_CUDA_CHECK(cudaStreamWaitEvent(native(dev, s), start, 0));
  body();
  for (Stream s : {Stream::D2H, Stream::H2D}) {
    cudaEvent_t joined;
    AP_CUDA_CHECK(cudaEventCreateWithFlags(&joined, cudaEventDisableTiming));
    AP_CUDA_CHECK(cudaEventRecord(joined, native(dev, s)));
    AP_CUDA_CHECK(cudaStreamWaitEvent(c, joined, 0));
    AP_CUDA_CHECK(cudaEventDestroy(joined));
  }
  AP_CUDA_CHECK(cudaEventRecord(stop, c));
  AP_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  AP_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  AP_CUDA_CHECK(cudaEventDestroy(start));
  AP_CUDA_CHECK(cudaEventDestroy(stop));
  dev.synchronize(); // keep the Device's ordering clocks in step
  return ms;
}

/// 2k values of `bytes` in the arena, 2k pinned slots: group 0 = values and
/// slots [0,k), group 1 = [k,2k). Events per slot.
struct Rig {
  Device &dev;
  uint64_t bytes;
  int k;
  char *arena;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<OffloadEngine> engine;
  OffloadEngine::ScopeId scope;
  EventId produced;
  std::vector<EventId> d2h, h2d;

  Rig(Device &d, uint64_t b, int kk, char *base)
      : dev(d), bytes(b), k(kk), arena(base) {
    PinnedLayout layout;
    layout.totalBytes = 2 * k * bytes;
    for (int i = 0; i < 2 * k; ++i)
      layout.slots.push_back({i * bytes, bytes});
    pool = std::make_unique<PinnedPool>(dev, layout);
    engine = std::make_unique<OffloadEngine>(dev, *pool);
    scope = engine->scope("bench");
    produced = dev.createEvent();
    for (int i = 0; i < 2 * k; ++i) {
      d2h.push_back(dev.createEvent());
      h2d.push_back(dev.createEvent());
    }
    dev.record(produced, Stream::Compute);
  }
  char *value(int i) { return arena + i * bytes; }
  void *pinned(int i) {
    // The slot region is contiguous: slot 0's pointer + offset. Taking the
    // pointer through acquire/release keeps the raw path on the same memory.
    PinnedSlot s = pool->acquire(i, Stream::D2H);
    pool->release(s);
    return s.data;
  }
  void offload(int i) {
    // A slot is reused only after its previous reload (checked by the pool).
    if (dev.generation(h2d[i]))
      dev.wait(Stream::D2H, h2d[i]);
    engine->offload(scope, i, value(i), bytes, produced, d2h[i]);
  }
  void reload(int i) {
    engine->reload(scope, i, value(i), bytes, d2h[i], h2d[i]);
  }
};

void printBw(const char *path, const char *dir, uint64_t bytes, double gbps) {
  std::printf("{\"kind\":\"bw\",\"path\":\"%s\",\"dir\":\"%s\",\"bytes\":%llu,"
              "\"gbps\":%.2f}\n",
              path, dir, static_cast<unsigned long long>(bytes), gbps);
  std::fflush(stdout);
}

void bandwidth(Device &dev, char *arena, uint64_t bytes, int repeats) {
  int k = static_cast<int>(std::clamp<uint64_t>(512 * MiB / bytes, 2, 8));
  Rig rig(dev, bytes, k, arena);
  std::vector<void *> host;
  for (int i = 0; i < 2 * k; ++i)
    host.push_back(rig.pinned(i));
  cudaStream_t d2hS = native(dev, Stream::D2H), h2dS = native(dev, Stream::H2D);
  double gb = double(bytes) / 1e9;
  std::vector<double> eD2H, eH2D, eBoth, rD2H, rH2D, rBoth;
  for (int rep = 0; rep < repeats; ++rep) {
    // Engine, one direction at a time.
    eD2H.push_back(k * gb / (1e-3 * timed(dev, [&] {
                               for (int i = 0; i < k; ++i)
                                 rig.offload(i);
                             })));
    eH2D.push_back(k * gb / (1e-3 * timed(dev, [&] {
                               for (int i = 0; i < k; ++i)
                                 rig.reload(i);
                             })));
    // Both at once: group 1 goes out while group 0 comes back.
    for (int i = 0; i < k; ++i)
      rig.offload(i);
    dev.synchronize();
    eBoth.push_back(2 * k * gb / (1e-3 * timed(dev, [&] {
                                    for (int i = 0; i < k; ++i) {
                                      rig.offload(k + i);
                                      rig.reload(i);
                                    }
                                  })));
    for (int i = 0; i < k; ++i)
      rig.reload(k + i);
    dev.synchronize();
    rig.pool->assertNoneInUse("bandwidth repeat");

    // Raw cudaMemcpyAsync on the same memory and streams.
    rD2H.push_back(k * gb / (1e-3 * timed(dev, [&] {
                               for (int i = 0; i < k; ++i)
                                 AP_CUDA_CHECK(cudaMemcpyAsync(
                                     host[i], rig.value(i), bytes,
                                     cudaMemcpyDeviceToHost, d2hS));
                             })));
    rH2D.push_back(k * gb / (1e-3 * timed(dev, [&] {
                               for (int i = 0; i < k; ++i)
                                 AP_CUDA_CHECK(cudaMemcpyAsync(
                                     rig.value(i), host[i], bytes,
                                     cudaMemcpyHostToDevice, h2dS));
                             })));
    rBoth.push_back(
        2 * k * gb /
        (1e-3 * timed(dev, [&] {
           for (int i = 0; i < k; ++i) {
             AP_CUDA_CHECK(cudaMemcpyAsync(host[k + i], rig.value(k + i), bytes,
                                           cudaMemcpyDeviceToHost, d2hS));
             AP_CUDA_CHECK(cudaMemcpyAsync(rig.value(i), host[i], bytes,
                                           cudaMemcpyHostToDevice, h2dS));
           }
         })));
  }
  printBw("engine", "d2h", bytes, median(eD2H));
  printBw("engine", "h2d", bytes, median(eH2D));
  printBw("engine", "both", bytes, median(eBoth));
  printBw("raw", "d2h", bytes, median(rD2H));
  printBw("raw", "h2d", bytes, median(rH2D));
  printBw("raw", "both", bytes, median(rBoth));
}

__global__ void triad(float *a, const float *b, const float *c, float s,
                      size_t n) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride)
    a[i] = b[i] + s * c[i];
}

struct Gemm {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void *a, *b, *c, *ws;
  uint64_t wsBytes;
  int n;
  Gemm(cublasLtHandle_t handle, int size, void *A, void *B, void *C, void *W,
       uint64_t wb)
      : lt(handle), a(A), b(B), c(C), ws(W), wsBytes(wb), n(size) {
    AP_CUBLAS_CHECK(
        cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    AP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, n, n, n));
    AP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, n, n, n));
    AP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, n, n, n));
    cublasLtMatmulPreference_t pref;
    AP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    AP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes,
        sizeof(wsBytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    AP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref,
                                                   1, &result, &found));
    if (!found)
      fail("bench: no cuBLASLt algorithm for the GEMM");
    algo = result.algo;
    AP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  }
  void run(cudaStream_t s) {
    float alpha = 1, beta = 0;
    AP_CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, c, lc,
                                   c, lc, &algo, ws, wsBytes, s));
  }
};

/// Fills bf16 values in [-1, 1) from a hash of the index: GEMM power (and
/// hence clocks) depends on the data, so constant inputs would flatter it.
__global__ void fillRandomBf16(__nv_bfloat16 *p, size_t n, uint32_t seed) {
  size_t stride = size_t(gridDim.x) * blockDim.x;
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += stride) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    p[i] = __float2bfloat16(float(h >> 8) * (2.0f / 16777216.0f) - 1.0f);
  }
}

/// Copy traffic beside the kernel: the engine's training-step pattern in
/// both directions, or raw copies in one direction.
enum class Traffic { None, EngineBoth, RawD2H, RawH2D };
const char *trafficName(Traffic t) {
  switch (t) {
  case Traffic::None:
    return "none";
  case Traffic::EngineBoth:
    return "engine_both";
  case Traffic::RawD2H:
    return "raw_d2h";
  case Traffic::RawH2D:
    return "raw_h2d";
  }
  return "?";
}

/// Median GPU time of one of 30 back-to-back launches of `kernel`, with the
/// given traffic enqueued first (long enough to outlast all launches; the
/// bench reports whether it did). Alone and with-traffic runs alternate so
/// clock and temperature drift shows up in the alone runs.
template <typename Kernel>
void slowdown(Device &dev, char *copyArena, const char *name, Kernel kernel,
              double work, const char *unit) {
  constexpr int kLaunches = 30;
  cudaStream_t c = native(dev, Stream::Compute);
  std::vector<cudaEvent_t> ev(kLaunches + 1);
  for (auto &e : ev)
    AP_CUDA_CHECK(cudaEventCreate(&e));
  Rig rig(dev, 256 * MiB, 2, copyArena);
  std::vector<void *> host;
  for (int i = 0; i < 2 * rig.k; ++i)
    host.push_back(rig.pinned(i));
  auto measure = [&](Traffic traffic) {
    for (int w = 0; w < 3; ++w)
      kernel(c);
    AP_CUDA_CHECK(cudaStreamSynchronize(c));
    int holding = 0; // the slot group whose values wait for their reload
    if (traffic == Traffic::EngineBoth) {
      for (int i = 0; i < rig.k; ++i)
        rig.offload(i);
      for (int round = 0; round < 12; ++round) {
        int back = holding, out = rig.k - holding;
        for (int i = 0; i < rig.k; ++i) {
          rig.offload(out + i);
          rig.reload(back + i);
        }
        holding = out;
      }
    } else if (traffic != Traffic::None) {
      bool d2h = traffic == Traffic::RawD2H;
      cudaStream_t s = native(dev, d2h ? Stream::D2H : Stream::H2D);
      for (int r = 0; r < 24; ++r) {
        int i = r % (2 * rig.k);
        AP_CUDA_CHECK(cudaMemcpyAsync(
            d2h ? host[i] : static_cast<void *>(rig.value(i)),
            d2h ? static_cast<void *>(rig.value(i)) : host[i], rig.bytes,
            d2h ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, s));
      }
    }
    AP_CUDA_CHECK(cudaEventRecord(ev[0], c));
    for (int i = 0; i < kLaunches; ++i) {
      kernel(c);
      AP_CUDA_CHECK(cudaEventRecord(ev[i + 1], c));
    }
    AP_CUDA_CHECK(cudaEventSynchronize(ev[kLaunches]));
    // Were the copies still running when the last kernel ended?
    bool covered =
        traffic == Traffic::None ||
        cudaStreamQuery(native(dev, Stream::H2D)) == cudaErrorNotReady ||
        cudaStreamQuery(native(dev, Stream::D2H)) == cudaErrorNotReady;
    (void)cudaGetLastError();
    std::vector<double> ms;
    for (int i = 0; i < kLaunches; ++i) {
      float t = 0;
      AP_CUDA_CHECK(cudaEventElapsedTime(&t, ev[i], ev[i + 1]));
      ms.push_back(t);
    }
    dev.synchronize();
    if (traffic == Traffic::EngineBoth) {
      for (int i = 0; i < rig.k; ++i)
        rig.reload(holding + i);
      dev.synchronize();
      rig.pool->assertNoneInUse("slowdown");
    }
    std::printf("{\"kind\":\"kernel_run\",\"kernel\":\"%s\",\"traffic\":\"%s\","
                "\"median_ms\":%.4f,"
                "\"covered\":%s}\n",
                name, trafficName(traffic), median(ms),
                covered ? "true" : "false");
    return std::make_pair(median(ms), covered);
  };
  std::vector<double> alone;
  std::vector<std::pair<Traffic, std::pair<double, bool>>> with;
  alone.push_back(measure(Traffic::None).first);
  for (Traffic t : {Traffic::EngineBoth, Traffic::RawD2H, Traffic::RawH2D}) {
    with.emplace_back(t, measure(t));
    alone.push_back(measure(Traffic::None).first);
  }
  double base = median(alone);
  for (auto &w : with)
    std::printf("{\"kind\":\"slowdown\",\"kernel\":\"%s\",\"traffic\":\"%s\","
                "\"alone_ms\":%.4f,"
                "\"with_copies_ms\":%.4f,\"slowdown_pct\":%.2f,\"rate_alone\":%"
                ".1f,\"unit\":\"%s\","
                "\"copies_covered\":%s}\n",
                name, trafficName(w.first), base, w.second.first,
                100.0 * (w.second.first / base - 1.0),
                work / (base * 1e-3) / 1e12, unit,
                w.second.second ? "true" : "false");
  std::fflush(stdout);
  for (auto &e : ev)
    AP_CUDA_CHECK(cudaEventDestroy(e));
}

} // namespace

int main(int argc, char **argv) {
  int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  bool bandwidthToo = !(argc > 2 && std::string(argv[2]) == "slowdown-only");
  DeviceOptions options;
  options.device = DeviceKind::Cuda;
  Device dev(options);
  if (dev.kind() != DeviceKind::Cuda) {
    std::fprintf(stderr, "runtime_offload_bench: needs a GPU\n");
    return 2;
  }
  // Arena: 1 GiB for the bandwidth values (2k * size <= 1 GiB), then the
  // compute operands: three 8192^2 bf16 matrices, three 512 Mi-float triad
  // vectors, a 64 MiB cuBLASLt workspace.
  const int n = 8192;
  const uint64_t gemmBytes = uint64_t(n) * n * 2, triadN = 512ull << 20;
  const uint64_t copyBytes = 1024 * MiB;
  uint64_t plan = copyBytes + 3 * gemmBytes + 3 * triadN * 4;
  dev.allocateArena(plan, 64 * MiB);
  std::fprintf(stderr, "%s\n", dev.description().c_str());
  std::printf("{\"kind\":\"device\",\"description\":\"%s\"}\n",
              dev.description().c_str());
  char *base = dev.arenaBase();
  AP_CUDA_CHECK(cudaMemset(base, 0x3c, plan)); // finite bf16/f32 values

  for (uint64_t size = 1 * MiB; bandwidthToo && size <= 256 * MiB; size *= 2)
    bandwidth(dev, base, size, repeats);

  char *g = base + copyBytes;
  fillRandomBf16<<<1024, 256, 0, native(dev, Stream::Compute)>>>(
      reinterpret_cast<__nv_bfloat16 *>(g), 3 * gemmBytes / 2, 12345u);
  AP_CUDA_CHECK(cudaGetLastError());
  Gemm gemm(static_cast<cublasLtHandle_t>(dev.backend().cublasLtHandle()), n, g,
            g + gemmBytes, g + 2 * gemmBytes, dev.workspace(),
            dev.workspaceBytes());
  slowdown(
      dev, base, "gemm_bf16_8192", [&](cudaStream_t s) { gemm.run(s); },
      2.0 * n * n * double(n), "TFLOP/s");
  auto *t = reinterpret_cast<float *>(g + 3 * gemmBytes);
  int sms = dev.kernelContext(Stream::Compute).smCount;
  slowdown(
      dev, base, "triad_f32_512Mi",
      [&](cudaStream_t s) {
        triad<<<sms * 8, 512, 0, s>>>(t, t + triadN, t + 2 * triadN, 0.5f,
                                      triadN);
        AP_CUDA_CHECK(cudaGetLastError());
      },
      3.0 * 4 * double(triadN), "TB/s");
  dev.sampleMemory();
  std::printf("{\"kind\":\"memory\",\"device_peak_bytes\":%llu,\"planned_"
              "bytes\":%llu}\n",
              static_cast<unsigned long long>(dev.devicePeakBytes()),
              static_cast<unsigned long long>(plan + 64 * MiB));
  return 0;
}
