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
#include "bench/gdn_operands.h"
#include "kernels/kernels.h"
#include "runtime/cuda/cuda_check.h"
#include "runtime/runtime.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <thread>
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

/// One cuBLASLt bf16 GEMM C = A * B (column-major, m x k times k x n, fp32
/// accumulation) with the heuristic's first algorithm.
struct Gemm {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo{};
  void *a, *b, *c, *ws;
  uint64_t wsBytes;
  int m, n, k;
  /// smTarget > 0 asks cuBLASLt to plan for that many SMs (left to other
  /// streams' kernels otherwise).
  /// `algoOf`: run that GEMM's algorithm (chosen without a target) instead
  /// of asking the heuristic, as the runtime's side stream does.
  Gemm(cublasLtHandle_t handle, int M, int N, int K, void *A, void *B, void *C,
       void *W, uint64_t wb, int32_t smTarget = 0, const Gemm *algoOf = nullptr)
      : lt(handle), a(A), b(B), c(C), ws(W), wsBytes(wb), m(M), n(N), k(K) {
    AP_CUBLAS_CHECK(
        cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (smTarget > 0)
      AP_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(
          op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &smTarget,
          sizeof(smTarget)));
    AP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, m, k, m));
    AP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, k, n, k));
    AP_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, m, n, m));
    cublasLtMatmulPreference_t pref;
    AP_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    AP_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &wsBytes,
        sizeof(wsBytes)));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (algoOf) {
      algo = algoOf->algo;
    } else {
      AP_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc,
                                                     pref, 1, &result, &found));
      if (!found)
        fail("bench: no cuBLASLt algorithm for the GEMM");
      algo = result.algo;
    }
    AP_CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
  }
  void run(cudaStream_t s) {
    float alpha = 1, beta = 0;
    AP_CUBLAS_CHECK(cublasLtMatmul(lt, op, &alpha, a, la, b, lb, &beta, c, lc,
                                   c, lc, &algo, ws, wsBytes, s));
  }
  double flops() const { return 2.0 * m * n * double(k); }
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
/// Caveat (the clock experiment in bench/notes/runtime.md): 30 GEMM
/// launches (~45 ms) fall inside the ~60 ms after an idle gap in which a
/// power-capped GEMM still runs at boost clock, and the alone runs follow
/// the longer idle gap (the copies draining), so for the GEMM this compares
/// clock transients, not copies; `clocks` mode measures the steady state.
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

//===----------------------------------------------------------------------===//
// Clock experiment (`runtime_offload_bench <rounds> clocks|clocks-model`): why
// does a GEMM slow down beside PCIe copies? Every GEMM launch (or group of
// launches for a small shape) is timed between CUDA events and followed by a
// one-thread probe that reads the SM clock (clock64 cycles over %globaltimer
// ns), so each launch's time comes with the clock it ran at: time * clock =
// cycles. Constant cycles with a lower clock = the copies cost clock (power);
// more cycles = contention (memory, L2, scheduling). Traffic modes alternate
// with runs alone; copies come from a host thread that paces them (chunk size,
// GB/s per direction) so throttled and chunked copies can be compared.
//===----------------------------------------------------------------------===//

/// Spins one thread for `cycles` SM cycles and stores the %globaltimer
/// nanoseconds it took and the cycles counted: cycles / ns = the SM clock.
__global__ void clockProbe(unsigned long long *out, long long cycles) {
  unsigned long long t0, t1;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  long long c0 = clock64(), c1;
  do {
    c1 = clock64();
  } while (c1 - c0 < cycles);
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t1));
  out[0] = t0;
  out[1] = t1;
  out[2] = static_cast<unsigned long long>(c1 - c0);
}

/// Keeps the GPU idle but for one warp for `ns` (copy-only phases).
/// One warp that spins for `ns` nanoseconds in steps of about 1 us.
__global__ void spinFor(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

__global__ void idleFor(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    __nanosleep(100000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

/// Copy traffic beside the kernel. Raw copies go [0, 512 MiB) of the copy
/// region -> pinned [0, 512 MiB) (D2H) and pinned [512 MiB, 1 GiB) -> copy
/// region [512 MiB, 1 GiB) (H2D), in `chunk`-byte cudaMemcpyAsync calls.
struct TrafficSpec {
  const char *name = "";
  bool d2h = false, h2d = false;
  uint64_t chunk = 256 * MiB;
  double gbps = 0;       ///< per direction; 0 = as fast as the link goes
  bool engine = false;   ///< OffloadEngine both-directions pattern instead
  bool priority = false; ///< GEMM on a high-, copies on low-priority streams
};

/// Issues the traffic of a TrafficSpec from its own thread until stopped.
/// Only this thread drives the Device (engine mode) while it runs; the
/// measuring thread uses native streams and events only.
class CopyTraffic {
public:
  CopyTraffic(const TrafficSpec &spec, Rig &rig, cudaStream_t d2h,
              cudaStream_t h2d)
      : spec_(spec), rig_(rig), host_(static_cast<char *>(rig.pinned(0))),
        d2h_(d2h), h2d_(h2d) {
    thread_ = std::thread([this] { spec_.engine ? engineLoop() : rawLoop(); });
  }
  uint64_t bytes() const { return bytes_.load(); }
  void stop() {
    stop_ = true;
    thread_.join();
    AP_CUDA_CHECK(cudaStreamSynchronize(d2h_));
    AP_CUDA_CHECK(cudaStreamSynchronize(h2d_));
    rig_.dev.synchronize();
  }

private:
  void rawLoop() {
    char *dev = rig_.value(0);
    char *host = host_;
    const uint64_t half = 2 * rig_.bytes, chunk = spec_.chunk;
    // Bounded queue: at most `depth` chunks in flight per direction.
    const int depth =
        static_cast<int>(std::clamp<uint64_t>(64 * MiB / chunk, 2, 16));
    std::vector<cudaEvent_t> ring(2 * depth);
    for (auto &e : ring)
      AP_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    auto t0 = std::chrono::steady_clock::now();
    for (uint64_t i = 0; !stop_; ++i) {
      if (spec_.gbps > 0) {
        auto due = t0 + std::chrono::nanoseconds(
                            static_cast<int64_t>(i * chunk / spec_.gbps));
        while (!stop_ && std::chrono::steady_clock::now() < due) {
        }
      }
      uint64_t off = (i * chunk) % half;
      for (int dir = 0; dir < 2; ++dir) {
        if (!(dir == 0 ? spec_.d2h : spec_.h2d))
          continue;
        cudaEvent_t &e = ring[dir * depth + i % depth];
        if (i >= uint64_t(depth))
          AP_CUDA_CHECK(cudaEventSynchronize(e));
        if (dir == 0)
          AP_CUDA_CHECK(cudaMemcpyAsync(host + off, dev + off, chunk,
                                        cudaMemcpyDeviceToHost, d2h_));
        else
          AP_CUDA_CHECK(cudaMemcpyAsync(dev + half + off, host + half + off,
                                        chunk, cudaMemcpyHostToDevice, h2d_));
        AP_CUDA_CHECK(cudaEventRecord(e, dir == 0 ? d2h_ : h2d_));
        bytes_ += chunk;
      }
    }
    AP_CUDA_CHECK(cudaStreamSynchronize(d2h_));
    AP_CUDA_CHECK(cudaStreamSynchronize(h2d_));
    for (auto &e : ring)
      AP_CUDA_CHECK(cudaEventDestroy(e));
  }
  /// The training-step pattern of the slowdown bench: one group of values
  /// goes out while the other comes back; at most two rounds queued.
  void engineLoop() {
    const int k = rig_.k;
    for (int i = 0; i < k; ++i)
      rig_.offload(i);
    int holding = 0;
    for (int round = 0; !stop_; ++round) {
      int back = holding, out = k - holding;
      if (round >= 2)
        rig_.dev.synchronize(rig_.h2d[out]);
      for (int i = 0; i < k; ++i) {
        rig_.offload(out + i);
        rig_.reload(back + i);
      }
      bytes_ += 2 * k * rig_.bytes;
      holding = out;
    }
    for (int i = 0; i < k; ++i)
      rig_.reload(holding + i);
    rig_.dev.synchronize();
    rig_.pool->assertNoneInUse("clock experiment");
  }

  TrafficSpec spec_;
  Rig &rig_;
  char *host_;
  cudaStream_t d2h_, h2d_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> bytes_{0};
  std::thread thread_;
};

/// Local wall time "YYYY/MM/DD HH:MM:SS.mmm", the format of nvidia-smi's
/// timestamp column, so its samples can be matched to phases.
std::string wallNow() {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[40];
  std::strftime(buf, sizeof buf, "%Y/%m/%d %H:%M:%S", &tm);
  int ms =
      static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                           now.time_since_epoch())
                           .count() %
                       1000);
  char out[48];
  std::snprintf(out, sizeof out, "%s.%03d", buf, ms);
  return out;
}

struct ClockRig {
  Device &dev;
  Rig &copies;
  unsigned long long *probe; ///< 3 words per probe, in the arena
  cudaStream_t hiCompute, loD2H, loH2D;
  std::vector<cudaEvent_t> ev;
  static constexpr int kMaxSamples = 400;
  static constexpr long long kProbeCycles = 100000; // ~55 us at 1.8 GHz
};

/// One phase: `samples` samples of `perSample` launches of `kernel`, each
/// sample timed by events and followed by a clock probe, with `traffic`
/// (null = alone) running from before the first sample to after the last.
/// Prints one "clock_phase" line with per-sample times and clocks.
template <typename Kernel>
void clockPhase(ClockRig &r, const char *gemmName, double flopsPerSample,
                Kernel kernel, int samples, const TrafficSpec *traffic,
                int round) {
  bool prio = traffic && traffic->priority;
  cudaStream_t c = prio ? r.hiCompute : native(r.dev, Stream::Compute);
  cudaStream_t d2h = prio ? r.loD2H : native(r.dev, Stream::D2H);
  cudaStream_t h2d = prio ? r.loH2D : native(r.dev, Stream::H2D);
  for (int w = 0; w < 3; ++w)
    kernel(c);
  AP_CUDA_CHECK(cudaStreamSynchronize(c));
  std::unique_ptr<CopyTraffic> gen;
  if (traffic) {
    gen = std::make_unique<CopyTraffic>(*traffic, r.copies, d2h, h2d);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::string start = wallNow();
  auto h0 = std::chrono::steady_clock::now();
  uint64_t b0 = gen ? gen->bytes() : 0;
  clockProbe<<<1, 1, 0, c>>>(r.probe, ClockRig::kProbeCycles);
  AP_CUDA_CHECK(cudaGetLastError());
  constexpr int kAhead = 24; // bounded queue keeps the copy thread unblocked
  for (int i = 0; i < samples; ++i) {
    if (i >= kAhead)
      AP_CUDA_CHECK(cudaEventSynchronize(r.ev[2 * (i - kAhead) + 1]));
    AP_CUDA_CHECK(cudaEventRecord(r.ev[2 * i], c));
    kernel(c);
    AP_CUDA_CHECK(cudaEventRecord(r.ev[2 * i + 1], c));
    clockProbe<<<1, 1, 0, c>>>(r.probe + 3 * (i + 1), ClockRig::kProbeCycles);
    AP_CUDA_CHECK(cudaGetLastError());
  }
  AP_CUDA_CHECK(cudaStreamSynchronize(c));
  auto h1 = std::chrono::steady_clock::now();
  uint64_t b1 = gen ? gen->bytes() : 0;
  std::string end = wallNow();
  bool covered = true;
  if (gen) {
    covered = cudaStreamQuery(d2h) == cudaErrorNotReady ||
              cudaStreamQuery(h2d) == cudaErrorNotReady;
    (void)cudaGetLastError();
    gen->stop();
  }
  std::vector<unsigned long long> p(3 * (samples + 1));
  AP_CUDA_CHECK(
      cudaMemcpy(p.data(), r.probe, p.size() * 8, cudaMemcpyDeviceToHost));
  auto mhz = [&](int j) {
    double ns = double(p[3 * j + 1] - p[3 * j]);
    return ns > 0 ? 1e3 * double(p[3 * j + 2]) / ns : 0.0;
  };
  std::string ms = "[", clk = "[";
  for (int i = 0; i < samples; ++i) {
    float t = 0;
    AP_CUDA_CHECK(cudaEventElapsedTime(&t, r.ev[2 * i], r.ev[2 * i + 1]));
    char buf[64];
    std::snprintf(buf, sizeof buf, "%s%.4f", i ? "," : "", t);
    ms += buf;
    // The clock a sample ran at: mean of the probes before and after it.
    std::snprintf(buf, sizeof buf, "%s%.0f", i ? "," : "",
                  0.5 * (mhz(i) + mhz(i + 1)));
    clk += buf;
  }
  double secs = std::chrono::duration<double>(h1 - h0).count();
  std::printf("{\"kind\":\"clock_phase\",\"gemm\":\"%s\",\"traffic\":\"%s\","
              "\"round\":%d,\"flops_per_sample\":%.6g,\"copy_gbps\":%.2f,"
              "\"covered\":%s,\"start\":\"%s\",\"end\":\"%s\",\"ms\":%s],"
              "\"mhz\":%s]}\n",
              gemmName, traffic ? traffic->name : "none", round, flopsPerSample,
              double(b1 - b0) / 1e9 / secs, covered ? "true" : "false",
              start.c_str(), end.c_str(), ms.c_str(), clk.c_str());
  std::fflush(stdout);
}

/// Alternates alone and traffic phases, `rounds` times over `modes`.
template <typename Kernel>
void clockSeries(ClockRig &r, const char *gemmName, double flopsPerSample,
                 Kernel kernel, int samples,
                 const std::vector<TrafficSpec> &modes, int rounds) {
  for (int round = 0; round < rounds; ++round)
    for (const TrafficSpec &m : modes) {
      clockPhase(r, gemmName, flopsPerSample, kernel, samples, nullptr, round);
      clockPhase(r, gemmName, flopsPerSample, kernel, samples, &m, round);
    }
  clockPhase(r, gemmName, flopsPerSample, kernel, samples, nullptr, rounds);
}

/// The model-shape GEMM's series (20 launches a sample, 300 samples), the
/// same in every experiment that uses it, so their rows compare.
void modelGemmSeries(ClockRig &r, Gemm &model,
                     const std::vector<TrafficSpec> &modes, int rounds) {
  clockSeries(
      r, "gemm_bf16_4096x1024x3584", 20 * model.flops(),
      [&](cudaStream_t s) {
        for (int j = 0; j < 20; ++j)
          model.run(s);
      },
      300, modes, rounds);
}

void clockExperiment(Device &dev, char *copyArena, char *g, char *constAB,
                     unsigned long long *probe, uint64_t gemmBytes, int rounds,
                     bool modelOnly) {
  Rig copies(dev, 256 * MiB, 2, copyArena);
  for (int i = 1; i < 2 * copies.k; ++i)
    if (copies.pinned(i) !=
        static_cast<char *>(copies.pinned(0)) + i * 256 * MiB)
      fail("bench: the pinned slots are not contiguous");
  ClockRig r{dev, copies, probe, nullptr, nullptr, nullptr, {}};
  int least = 0, greatest = 0;
  AP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  AP_CUDA_CHECK(cudaStreamCreateWithPriority(&r.hiCompute,
                                             cudaStreamNonBlocking, greatest));
  AP_CUDA_CHECK(
      cudaStreamCreateWithPriority(&r.loD2H, cudaStreamNonBlocking, least));
  AP_CUDA_CHECK(
      cudaStreamCreateWithPriority(&r.loH2D, cudaStreamNonBlocking, least));
  r.ev.resize(2 * ClockRig::kMaxSamples);
  for (auto &e : r.ev)
    AP_CUDA_CHECK(cudaEventCreate(&e));

  auto lt = static_cast<cublasLtHandle_t>(dev.backend().cublasLtHandle());
  const int n = 8192;
  Gemm big(lt, n, n, n, g, g + gemmBytes, g + 2 * gemmBytes, dev.workspace(),
           dev.workspaceBytes());
  // The model's shape (tokens x hidden x intermediate): ~40 us a launch, so
  // one sample = 20 launches.
  Gemm model(lt, 4096, 1024, 3584, g, g + gemmBytes, g + 2 * gemmBytes,
             dev.workspace(), dev.workspaceBytes());
  Gemm constant(lt, n, n, n, constAB, constAB + gemmBytes, g + 2 * gemmBytes,
                dev.workspace(), dev.workspaceBytes());

  TrafficSpec engineBoth{"engine_both", false, false, 256 * MiB, 0, true};
  TrafficSpec prio{"raw_d2h_prio", true, false, 256 * MiB, 0, false, true};
  std::vector<TrafficSpec> full = {
      TrafficSpec{"raw_d2h", true, false, 256 * MiB},
      TrafficSpec{"raw_h2d", false, true, 256 * MiB},
      TrafficSpec{"raw_both", true, true, 256 * MiB},
      engineBoth,
      TrafficSpec{"raw_d2h_4m", true, false, 4 * MiB},
      TrafficSpec{"raw_d2h_16m_27", true, false, 16 * MiB, 27},
      TrafficSpec{"raw_d2h_4m_27", true, false, 4 * MiB, 27},
      TrafficSpec{"raw_d2h_4m_14", true, false, 4 * MiB, 14},
      TrafficSpec{"raw_h2d_4m_27", false, true, 4 * MiB, 27},
      prio};
  std::vector<TrafficSpec> core = {
      TrafficSpec{"raw_d2h", true, false, 256 * MiB},
      TrafficSpec{"raw_h2d", false, true, 256 * MiB},
      TrafficSpec{"raw_both", true, true, 256 * MiB}, engineBoth};

  if (modelOnly) {
    // The model's shape again: does H2D chunking or pacing reduce its loss,
    // and is the loss an artefact of operands that stay in the 50 MB L2
    // across back-to-back launches? `rotating` cycles through four operand
    // sets (~180 MB), as a training step's GEMMs do not reuse one.
    std::vector<std::unique_ptr<Gemm>> sets;
    for (uint64_t j = 0; j < 4; ++j)
      sets.push_back(std::make_unique<Gemm>(
          lt, 4096, 1024, 3584, g + j * 32 * MiB, g + gemmBytes + j * 8 * MiB,
          g + 2 * gemmBytes + j * 16 * MiB, dev.workspace(),
          dev.workspaceBytes()));
    clockSeries(
        r, "gemm_bf16_4096x1024x3584_rotating", 20 * model.flops(),
        [&](cudaStream_t s) {
          for (int j = 0; j < 20; ++j)
            sets[j % 4]->run(s);
        },
        300,
        {core[0], core[1], core[2], engineBoth,
         TrafficSpec{"raw_h2d_4m", false, true, 4 * MiB},
         TrafficSpec{"raw_h2d_4m_27", false, true, 4 * MiB, 27}},
        rounds);
    modelGemmSeries(r, model,
                    {core[1], TrafficSpec{"raw_h2d_4m", false, true, 4 * MiB},
                     TrafficSpec{"raw_h2d_4m_27", false, true, 4 * MiB, 27},
                     TrafficSpec{"raw_h2d_16m_27", false, true, 16 * MiB, 27},
                     TrafficSpec{"raw_both_4m_27", true, true, 4 * MiB, 27}},
                    rounds);
  } else {
    // Copies beside an idle GPU: what they draw (nvidia-smi) and the clock.
    clockSeries(
        r, "idle", 0,
        [&](cudaStream_t s) { idleFor<<<1, 32, 0, s>>>(5'000'000ull); }, 60,
        core, 1);
    clockSeries(
        r, "gemm_bf16_8192", big.flops(), [&](cudaStream_t s) { big.run(s); },
        200, full, rounds);
    modelGemmSeries(r, model, core, rounds);
    clockSeries(
        r, "gemm_bf16_8192_const", constant.flops(),
        [&](cudaStream_t s) { constant.run(s); }, 200, core, rounds);
  }

  for (auto &e : r.ev)
    AP_CUDA_CHECK(cudaEventDestroy(e));
  for (cudaStream_t s : {r.hiCompute, r.loD2H, r.loH2D})
    AP_CUDA_CHECK(cudaStreamDestroy(s));
}

/// Zeroed device memory outside the arena (the GDN and conv operands).
void *devAlloc(size_t n) {
  void *p = nullptr;
  AP_CUDA_CHECK(cudaMalloc(&p, n));
  AP_CUDA_CHECK(cudaMemset(p, 0, n));
  return p;
}
/// A device copy of `n` host bytes.
void *upload(const void *h, size_t n) {
  void *p = devAlloc(n);
  AP_CUDA_CHECK(cudaMemcpy(p, h, n, cudaMemcpyHostToDevice));
  return p;
}

/// The GDN conv of one Qwen3.5-0.8B layer and microbatch (4096 tokens x
/// 6144 channels, kernel 4), its x and w from the random GEMM operands.
ap::kernels::GdnConvArgs modelConvArgs(char *g, uint64_t gemmBytes) {
  ap::kernels::GdnConvArgs c;
  c.batch = 1;
  c.seqLen = 4096;
  c.channels = 6144;
  c.kernelSize = 4;
  c.x = g;
  c.w = g + gemmBytes;
  return c;
}

/// Copies beside the step's other long kernels (`clocks-kernels`): the GDN
/// chunk forward and backward (B = 1, T = 4096, 16 heads of 128, as a
/// Qwen3.5-0.8B layer and microbatch), the GDN conv backward (4096 x 6144)
/// and the model-shape GEMM as the control, each alone and beside one-way
/// and two-way 256 MiB copies. Which kernels lose least beside H2D is where
/// a schedule would put the reloads (bench/notes/runtime.md).
void kernelsExperiment(Device &dev, char *copyArena, char *g,
                       unsigned long long *probe, uint64_t gemmBytes,
                       int rounds) {
  using namespace ap::kernels;
  Rig copies(dev, 256 * MiB, 2, copyArena);
  ClockRig r{dev, copies, probe, nullptr, nullptr, nullptr, {}};
  r.ev.resize(2 * ClockRig::kMaxSamples);
  for (auto &e : r.ev)
    AP_CUDA_CHECK(cudaEventCreate(&e));
  // GDN operands as gdn_bench.cu makes them (bench/gdn_operands.h).
  const int T = 4096;
  GdnChunkArgs a =
      ap::bench::gdnChunkOperands(1, T, 16, 128, 128, 1u, upload, devAlloc);
  GdnConvArgs c = modelConvArgs(g, gemmBytes);
  c.dy = g + 2 * gemmBytes;
  c.dx = devAlloc(size_t(T) * 6144 * 2);
  c.dw = devAlloc(size_t(6144) * 4 * 4);
  size_t ws = std::max({gdnChunkForwardWorkspaceBytes(a),
                        gdnChunkBackwardWorkspaceBytes(a),
                        gdnConvBackwardWorkspaceBytes(c)});
  KernelContext ctx = dev.kernelContext(Stream::Compute);
  ctx.workspace = devAlloc(ws);
  ctx.workspaceBytes = ws;
  auto on = [&](cudaStream_t s) {
    KernelContext k2 = ctx;
    k2.stream = s;
    return k2;
  };
  auto check = [](Status st, const char *what) {
    if (st != Status::Ok)
      fail(std::string("bench: ") + what + " failed");
  };
  auto fwd = [&](cudaStream_t s) {
    check(gdnChunkForward(on(s), a), "gdnChunkForward");
  };
  fwd(native(dev, Stream::Compute)); // the backward reads o and gCum
  AP_CUDA_CHECK(cudaStreamSynchronize(native(dev, Stream::Compute)));
  auto lt = static_cast<cublasLtHandle_t>(dev.backend().cublasLtHandle());
  Gemm model(lt, 4096, 1024, 3584, g, g + gemmBytes, g + 2 * gemmBytes,
             dev.workspace(), dev.workspaceBytes());
  std::vector<TrafficSpec> modes = {
      TrafficSpec{"raw_d2h", true, false, 256 * MiB},
      TrafficSpec{"raw_h2d", false, true, 256 * MiB},
      TrafficSpec{"raw_both", true, true, 256 * MiB}};
  clockSeries(
      r, "gdn_chunk_bwd_b1", 0,
      [&](cudaStream_t s) {
        check(gdnChunkBackward(on(s), a), "gdnChunkBackward");
      },
      250, modes, rounds);
  clockSeries(r, "gdn_chunk_fwd_b1", 0, fwd, 300, modes, rounds);
  clockSeries(
      r, "gdn_conv_bwd_4096x6144", 0,
      [&](cudaStream_t s) {
        for (int j = 0; j < 4; ++j)
          check(gdnConvBackward(on(s), c), "gdnConvBackward");
      },
      300, modes, rounds);
  modelGemmSeries(r, model, modes, rounds);
  for (auto &e : r.ev)
    AP_CUDA_CHECK(cudaEventDestroy(e));
}

/// Side-stream work beside the GDN chunk backward (`overlap`): the
/// backward's state passes keep one warp per SM scheduler busy at B = 1
/// (bench/notes/gdn.md), so work that does not depend on it, such as the
/// next layer's recompute, could run on the idle SMs. Times, per side
/// bundle and priority: the backward alone, the bundle alone, both on one
/// stream (the serial step), and both on two streams (makespan, and the
/// backward's own time within it). Medians of `samples`.
void overlapExperiment(Device &dev, char *g, uint64_t gemmBytes, int rounds) {
  using namespace ap::kernels;
  const int T = 4096;
  GdnChunkArgs a =
      ap::bench::gdnChunkOperands(1, T, 16, 128, 128, 1u, upload, devAlloc);
  // gdn_prep's recompute: the conv over the 6144 q/k/v channels, then the
  // q and k L2 norms (2 x 16 heads of 128) reading the conv output.
  GdnConvArgs conv = modelConvArgs(g, gemmBytes);
  conv.y = devAlloc(size_t(T) * 6144 * 2);
  GdnL2NormArgs l2;
  l2.tokens = T;
  l2.heads = 32;
  l2.dim = 128;
  l2.xStride = 6144;
  l2.yStride = 4096;
  l2.x = conv.y;
  l2.y = devAlloc(size_t(T) * 4096 * 2);
  l2.rstd = devAlloc(size_t(T) * 32 * 4);
  size_t ws = std::max(gdnChunkForwardWorkspaceBytes(a),
                       gdnChunkBackwardWorkspaceBytes(a));
  KernelContext ctx = dev.kernelContext(Stream::Compute);
  ctx.workspace = devAlloc(ws);
  ctx.workspaceBytes = ws;
  KernelContext sideCtx = ctx; // the side stream's kernels need no workspace
  sideCtx.workspace = nullptr;
  sideCtx.workspaceBytes = 0;
  auto check = [](Status st, const char *what) {
    if (st != Status::Ok)
      fail(std::string("bench: ") + what + " failed");
  };
  int least = 0, greatest = 0;
  AP_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t mainHi, mainNormal, sideLo, sideNormal;
  AP_CUDA_CHECK(
      cudaStreamCreateWithPriority(&mainHi, cudaStreamNonBlocking, greatest));
  AP_CUDA_CHECK(
      cudaStreamCreateWithPriority(&mainNormal, cudaStreamNonBlocking, least));
  AP_CUDA_CHECK(
      cudaStreamCreateWithPriority(&sideLo, cudaStreamNonBlocking, least));
  AP_CUDA_CHECK(
      cudaStreamCreateWithPriority(&sideNormal, cudaStreamNonBlocking, least));
  auto bwd = [&](cudaStream_t s) {
    KernelContext k = ctx;
    k.stream = s;
    check(gdnChunkBackward(k, a), "gdnChunkBackward");
  };
  {
    KernelContext k = ctx;
    k.stream = mainNormal;
    check(gdnChunkForward(k, a), "gdnChunkForward");
  }
  // mlp_fc1's recompute: tokens x hidden -> 2 x intermediate, as two GEMMs
  // (gate and up), with a workspace of their own (dev.workspace()).
  auto lt = static_cast<cublasLtHandle_t>(dev.backend().cublasLtHandle());
  Gemm fc1(lt, 3584, 4096, 1024, g, g + gemmBytes, g + 2 * gemmBytes,
           dev.workspace(), dev.workspaceBytes());
  Gemm fc1Sm100(lt, 3584, 4096, 1024, g, g + gemmBytes, g + 2 * gemmBytes,
                dev.workspace(), dev.workspaceBytes(), 100);
  Gemm fc1Sm64(lt, 3584, 4096, 1024, g, g + gemmBytes, g + 2 * gemmBytes,
               dev.workspace(), dev.workspaceBytes(), 64);
  // The runtime's side stream: the default algorithm, asked for 99 SMs.
  // Its output must equal the default's bit for bit (recompute on the side
  // stream may not change a bit); checked here on random operands.
  void *c2 = devAlloc(size_t(3584) * 4096 * 2);
  Gemm fc1Side(lt, 3584, 4096, 1024, g, g + gemmBytes, c2, dev.workspace(),
               dev.workspaceBytes(), 99, &fc1);
  {
    cudaStream_t s0 = mainNormal;
    fc1.run(s0);
    fc1Side.run(s0);
    AP_CUDA_CHECK(cudaStreamSynchronize(s0));
    std::vector<uint16_t> x(size_t(3584) * 4096), y(x.size());
    AP_CUDA_CHECK(cudaMemcpy(x.data(), g + 2 * gemmBytes, x.size() * 2,
                             cudaMemcpyDeviceToHost));
    AP_CUDA_CHECK(
        cudaMemcpy(y.data(), c2, y.size() * 2, cudaMemcpyDeviceToHost));
    size_t differ = 0;
    for (size_t i = 0; i < x.size(); ++i)
      differ += x[i] != y[i];
    std::printf("{\"kind\":\"side_gemm_bits\",\"elements\":%zu,"
                "\"differ\":%zu}\n",
                x.size(), differ);
  }
  auto prep = [&](cudaStream_t s) {
    KernelContext k = sideCtx;
    k.stream = s;
    check(gdnConvForward(k, conv), "gdnConvForward");
    check(gdnL2NormForward(k, l2), "gdnL2NormForward");
  };
  struct Bundle {
    const char *name;
    std::function<void(cudaStream_t)> run;
  };
  std::vector<Bundle> bundles = {
      {"fc1_x2", [&](cudaStream_t s) { fc1.run(s), fc1.run(s); }},
      {"prep", prep},
      {"fc1_x2+prep",
       [&](cudaStream_t s) {
         fc1.run(s);
         fc1.run(s);
         prep(s);
       }},
      {"fc1_x4",
       [&](cudaStream_t s) {
         for (int j = 0; j < 4; ++j)
           fc1.run(s);
       }},
      {"fc1_sm100_x2",
       [&](cudaStream_t s) { fc1Sm100.run(s), fc1Sm100.run(s); }},
      {"fc1_sm64_x2", [&](cudaStream_t s) { fc1Sm64.run(s), fc1Sm64.run(s); }},
      {"fc1_sm100_x4",
       [&](cudaStream_t s) {
         for (int j = 0; j < 4; ++j)
           fc1Sm100.run(s);
       }},
      {"fc1_side_x4",
       [&](cudaStream_t s) {
         for (int j = 0; j < 4; ++j)
           fc1Side.run(s);
       }},
      {"fc1_side_x8",
       [&](cudaStream_t s) {
         for (int j = 0; j < 8; ++j)
           fc1Side.run(s);
       }},
      {"fc1_side_x12",
       [&](cudaStream_t s) {
         for (int j = 0; j < 12; ++j)
           fc1Side.run(s);
       }},
  };
  constexpr int kSamples = 40;
  cudaEvent_t e0, eMain, eSide, eEnd;
  for (cudaEvent_t *e : {&e0, &eMain, &eSide, &eEnd})
    AP_CUDA_CHECK(cudaEventCreate(e));
  auto ms = [](cudaEvent_t x, cudaEvent_t y) {
    float t = 0;
    AP_CUDA_CHECK(cudaEventElapsedTime(&t, x, y));
    return double(t);
  };
  // One sample: `main` then (on `side`, or on main when side is null) the
  // bundle, both issued at once; returns {makespan, main's own time}.
  // `delayNs` > 0 holds the side stream back that long (one spinning warp),
  // so the bundle meets the backward's sequential passes, not its first
  // (parallel) kernel, as a schedule would arrange with an event.
  auto sample = [&](cudaStream_t m, cudaStream_t side, bool withMain,
                    const Bundle *b, unsigned long long delayNs) {
    AP_CUDA_CHECK(cudaEventRecord(e0, m));
    if (side)
      AP_CUDA_CHECK(cudaStreamWaitEvent(side, e0, 0));
    if (side && delayNs) {
      spinFor<<<1, 32, 0, side>>>(delayNs);
      AP_CUDA_CHECK(cudaGetLastError());
    }
    if (withMain)
      bwd(m);
    AP_CUDA_CHECK(cudaEventRecord(eMain, m));
    if (b) {
      b->run(side ? side : m);
      if (side) {
        AP_CUDA_CHECK(cudaEventRecord(eSide, side));
        AP_CUDA_CHECK(cudaStreamWaitEvent(m, eSide, 0));
      }
    }
    AP_CUDA_CHECK(cudaEventRecord(eEnd, m));
    AP_CUDA_CHECK(cudaEventSynchronize(eEnd));
    return std::pair<double, double>(ms(e0, eEnd), ms(e0, eMain));
  };
  auto series = [&](const char *arm, cudaStream_t m, cudaStream_t side,
                    bool withMain, const Bundle *b, int round,
                    unsigned long long delayNs = 0) {
    for (int w = 0; w < 3; ++w)
      sample(m, side, withMain, b, delayNs);
    std::vector<double> span, own;
    for (int i = 0; i < kSamples; ++i) {
      auto [x, y] = sample(m, side, withMain, b, delayNs);
      span.push_back(x);
      own.push_back(y);
    }
    std::printf("{\"kind\":\"overlap\",\"bundle\":\"%s\",\"arm\":\"%s\","
                "\"round\":%d,\"makespan_ms\":%.4f,\"main_ms\":%.4f,"
                "\"min_makespan_ms\":%.4f}\n",
                b ? b->name : "none", arm, round, median(span), median(own),
                *std::min_element(span.begin(), span.end()));
    std::fflush(stdout);
  };
  for (int round = 0; round < rounds; ++round) {
    series("main_alone", mainNormal, nullptr, true, nullptr, round);
    for (const Bundle &b : bundles) {
      series("side_alone", mainNormal, nullptr, false, &b, round);
      series("serial", mainNormal, nullptr, true, &b, round);
      series("concurrent_same_prio", mainNormal, sideNormal, true, &b, round);
      series("concurrent_main_hi", mainHi, sideLo, true, &b, round);
      series("delayed70_main_hi", mainHi, sideLo, true, &b, round, 70'000);
    }
  }
  for (cudaEvent_t e : {e0, eMain, eSide, eEnd})
    AP_CUDA_CHECK(cudaEventDestroy(e));
  for (cudaStream_t s : {mainHi, mainNormal, sideLo, sideNormal})
    AP_CUDA_CHECK(cudaStreamDestroy(s));
}

} // namespace

int main(int argc, char **argv) {
  // runtime_offload_bench [repeats] [slowdown-only | clocks | clocks-model |
  //                                  clocks-kernels | overlap]
  int repeats = argc > 1 ? std::atoi(argv[1]) : 5;
  std::string what = argc > 2 ? argv[2] : "";
  bool bandwidthToo = what.empty();
  DeviceOptions options;
  options.device = DeviceKind::Cuda;
  Device dev(options);
  if (dev.kind() != DeviceKind::Cuda) {
    std::fprintf(stderr, "runtime_offload_bench: needs a GPU\n");
    return 2;
  }
  // Arena: 1 GiB for the bandwidth values (2k * size <= 1 GiB), then the
  // compute operands: three 8192^2 bf16 matrices, three 512 Mi-float triad
  // vectors, two constant 8192^2 bf16 matrices, 1 MiB of clock probes, and
  // a 64 MiB cuBLASLt workspace.
  const int n = 8192;
  const uint64_t gemmBytes = uint64_t(n) * n * 2, triadN = 512ull << 20;
  const uint64_t copyBytes = 1024 * MiB;
  uint64_t plan =
      copyBytes + 3 * gemmBytes + 3 * triadN * 4 + 2 * gemmBytes + MiB;
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
  auto *t = reinterpret_cast<float *>(g + 3 * gemmBytes);
  char *constAB = g + 3 * gemmBytes + 3 * triadN * 4;
  if (what == "overlap") {
    dev.synchronize();
    overlapExperiment(dev, g, gemmBytes, repeats);
  } else if (what == "clocks-kernels") {
    dev.synchronize();
    kernelsExperiment(
        dev, base, g,
        reinterpret_cast<unsigned long long *>(constAB + 2 * gemmBytes),
        gemmBytes, repeats);
  } else if (what == "clocks" || what == "clocks-model") {
    dev.synchronize();
    clockExperiment(
        dev, base, g, constAB,
        reinterpret_cast<unsigned long long *>(constAB + 2 * gemmBytes),
        gemmBytes, repeats, what == "clocks-model");
  } else {
    Gemm gemm(static_cast<cublasLtHandle_t>(dev.backend().cublasLtHandle()), n,
              n, n, g, g + gemmBytes, g + 2 * gemmBytes, dev.workspace(),
              dev.workspaceBytes());
    slowdown(
        dev, base, "gemm_bf16_8192", [&](cudaStream_t s) { gemm.run(s); },
        gemm.flops(), "TFLOP/s");
    int sms = dev.kernelContext(Stream::Compute).smCount;
    slowdown(
        dev, base, "triad_f32_512Mi",
        [&](cudaStream_t s) {
          triad<<<sms * 8, 512, 0, s>>>(t, t + triadN, t + 2 * triadN, 0.5f,
                                        triadN);
          AP_CUDA_CHECK(cudaGetLastError());
        },
        3.0 * 4 * double(triadN), "TB/s");
  }
  dev.sampleMemory();
  std::printf("{\"kind\":\"memory\",\"device_peak_bytes\":%llu,\"planned_"
              "bytes\":%llu}\n",
              static_cast<unsigned long long>(dev.devicePeakBytes()),
              static_cast<unsigned long long>(plan + 64 * MiB));
  return 0;
}
