//===- bench_timing.h - status checks and CUDA-event timing -----*- C++ -*-===//
//
// Shared by the CUDA benches (dense_bench.cpp, elem_bench.cu, gdn_bench.cu),
// each built by its script as one translation unit: CK and KS stop a bench at
// the first failed CUDA call or kernel entry, naming the call; EventTimer
// times one stretch of stream work with a CUDA-event pair; median picks the
// middle sample. Each bench keeps its own sampling scheme.
//
//===----------------------------------------------------------------------===//
#ifndef ACTPLACE_BENCH_BENCH_TIMING_H
#define ACTPLACE_BENCH_BENCH_TIMING_H

#include "kernels/kernels.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(call)                                                               \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      std::fprintf(stderr, "%s failed: %s\n", #call, cudaGetErrorString(e_));  \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
#define KS(call)                                                               \
  do {                                                                         \
    ::ap::kernels::Status s_ = (call);                                         \
    if (s_ != ::ap::kernels::Status::Ok) {                                     \
      std::fprintf(stderr, "%s returned %d\n", #call, int(s_));                \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

namespace ap::bench {

/// The middle sample (the upper middle one of an even count).
inline float median(std::vector<float> samples) {
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

/// Milliseconds of the stream work that fn() enqueues: an event before and
/// after it, waited for. Errors of the timed launches surface here.
class EventTimer {
public:
  explicit EventTimer(cudaStream_t s) : stream(s) {
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&stop));
  }
  ~EventTimer() {
    CK(cudaEventDestroy(start));
    CK(cudaEventDestroy(stop));
  }
  EventTimer(const EventTimer &) = delete;
  EventTimer &operator=(const EventTimer &) = delete;

  template <class F> float ms(F &&fn) {
    CK(cudaEventRecord(start, stream));
    fn();
    CK(cudaEventRecord(stop, stream));
    CK(cudaEventSynchronize(stop));
    CK(cudaGetLastError());
    float t = 0;
    CK(cudaEventElapsedTime(&t, start, stop));
    return t;
  }

private:
  cudaStream_t stream;
  cudaEvent_t start = nullptr, stop = nullptr;
};

/// Median ms per call of fn(i % sets) over `samples` samples of `calls`
/// back-to-back calls each, after two warm-up samples.
template <class F>
double medianMsPerCall(cudaStream_t stream, int samples, int calls, int sets,
                       F &&fn) {
  EventTimer timer(stream);
  std::vector<float> perCall;
  for (int s = 0; s < samples + 2; ++s) {
    float ms = timer.ms([&] {
      for (int i = 0; i < calls; ++i)
        fn(i % sets);
    });
    if (s >= 2)
      perCall.push_back(ms / calls);
  }
  return median(perCall);
}

} // namespace ap::bench

#endif // ACTPLACE_BENCH_BENCH_TIMING_H
