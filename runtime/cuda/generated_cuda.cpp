//===- generated_cuda.cpp - generated kernels through the driver API ------===//
//
// The program's PTX is loaded with cuModuleLoadDataEx (the driver
// JIT-compiles it for the GPU present) once per process, device and PTX
// text, into the context the CUDA runtime made current (the primary
// context); functions are looked up once per entry. libcuda is opened with
// dlopen on first use, so a binary linked to this runtime still starts on a
// machine without a driver (the host backend never comes here).
//
//===----------------------------------------------------------------------===//
#include "runtime/cuda/cuda_check.h"
#include "runtime/error.h"
#include "runtime/generated.h"

#include <cuda.h>
#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>

namespace ap::rt {
namespace {

// cuda.h maps some names to versioned symbols (cuModuleGetFunction stays,
// cuLaunchKernel stays); the two-level stringizing looks up the mapped name.
#define AP_GEN_CU_FUNCS(X)                                                     \
  X(cuModuleLoadDataEx)                                                        \
  X(cuModuleGetFunction)                                                       \
  X(cuLaunchKernel)                                                            \
  X(cuFuncSetAttribute)                                                        \
  X(cuGetErrorString)
#define AP_GEN_STR(x) #x
#define AP_GEN_XSTR(x) AP_GEN_STR(x)

struct Driver {
#define AP_GEN_DECLARE(f) decltype(&::f) f = nullptr;
  AP_GEN_CU_FUNCS(AP_GEN_DECLARE)
#undef AP_GEN_DECLARE
  std::string missing;
  Driver() {
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      missing = "libcuda.so.1 cannot be opened";
      return;
    }
#define AP_GEN_LOAD(f)                                                         \
  f = reinterpret_cast<decltype(&::f)>(dlsym(h, AP_GEN_XSTR(f)));              \
  if (!f && missing.empty())                                                   \
    missing = std::string("libcuda.so.1 has no ") + AP_GEN_XSTR(f);
    AP_GEN_CU_FUNCS(AP_GEN_LOAD)
#undef AP_GEN_LOAD
  }
  std::string errorOf(CUresult r) const {
    const char *s = nullptr;
    if (cuGetErrorString)
      cuGetErrorString(r, &s);
    return s ? s : "CUresult " + std::to_string(int(r));
  }
};

Driver &driver() {
  static Driver *d = new Driver; // lives until exit, as the driver does
  return *d;
}

struct Cache {
  std::mutex mu;
  std::map<std::pair<int, const char *>, CUmodule> modules;
  std::map<std::pair<CUmodule, std::string>, CUfunction> functions;
};

Cache &cache() {
  static Cache *c = new Cache;
  return *c;
}

CUfunction functionOf(const GeneratedLaunch &launch,
                      const ap_generated_entry &entry) {
  Driver &d = driver();
  const char *kernel = launch.kernel->name;
  if (!d.missing.empty())
    fail("generated kernel '", kernel, "': ", d.missing);
  const char *ptx = launch.kernel->ptx ? launch.kernel->ptx : launch.ptx;
  if (!ptx)
    fail("generated kernel '", kernel,
         "': the program holds no PTX (actplace-compile found no CUDA "
         "toolkit with libdevice); compile with one, or run on the host "
         "backend");
  int device = 0;
  AP_CUDA_CHECK(cudaGetDevice(&device));
  Cache &c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  auto key = std::make_pair(device, ptx);
  auto it = c.modules.find(key);
  if (it == c.modules.end()) {
    // cudart makes the device's primary context current on first use; make
    // sure it exists before the driver API loads into it (once: the call
    // may synchronise).
    AP_CUDA_CHECK(cudaFree(nullptr));
    // PTX for a newer GPU than this one fails to JIT with a vague error:
    // name both.
    int major = 0, minor = 0;
    AP_CUDA_CHECK(cudaDeviceGetAttribute(
        &major, cudaDevAttrComputeCapabilityMajor, device));
    AP_CUDA_CHECK(cudaDeviceGetAttribute(
        &minor, cudaDevAttrComputeCapabilityMinor, device));
    if (const char *t = std::strstr(ptx, ".target sm_")) {
      int arch = std::atoi(t + 11);
      if (arch > major * 10 + minor)
        fail("generated kernel '", kernel, "': its PTX targets sm_", arch,
             ", newer than device ", device, " (sm_", major * 10 + minor, ")");
    }
    char log[4096] = {};
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER,
                           CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {log, reinterpret_cast<void *>(uintptr_t(sizeof log))};
    CUmodule module = nullptr;
    CUresult r = d.cuModuleLoadDataEx(&module, ptx, 2, opts, vals);
    if (r != CUDA_SUCCESS)
      fail("generated kernel '", kernel,
           "': cuModuleLoadDataEx of the program's PTX failed on device ",
           device, ": ", d.errorOf(r), log[0] ? ": " : "", log);
    it = c.modules.emplace(key, module).first;
  }
  auto fkey = std::make_pair(it->second, std::string(entry.name));
  auto f = c.functions.find(fkey);
  if (f == c.functions.end()) {
    CUfunction fn = nullptr;
    CUresult r = d.cuModuleGetFunction(&fn, it->second, entry.name);
    if (r != CUDA_SUCCESS)
      fail("generated kernel '", kernel, "': the PTX has no entry '",
           entry.name, "': ", d.errorOf(r));
    f = c.functions.emplace(fkey, fn).first;
  }
  return f->second;
}

} // namespace

void launchGeneratedCuda(void *stream, const GeneratedLaunch &launch,
                         void **params) {
  const ap_generated_kernel &k = *launch.kernel;
  if (k.triton) {
    // Triton's launch: the grid the compiler computed (after the
    // parameters' slots), 32 x num_warps threads, its shared memory.
    size_t n = std::strlen(k.params);
    uint64_t grid[3];
    for (int d = 0; d < 3; ++d) {
      grid[d] = launch.slots[n + size_t(d)];
      if (grid[d] < 1 || grid[d] > 0x7fffffffull)
        fail("Triton kernel '", k.name, "': grid dimension ", d, " is ",
             grid[d]);
    }
    CUfunction fn = functionOf(launch, k.entries[0]);
    if (k.shared_bytes > 48 * 1024) {
      CUresult r = driver().cuFuncSetAttribute(
          fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k.shared_bytes);
      if (r != CUDA_SUCCESS)
        fail("Triton kernel '", k.name, "': ", k.shared_bytes,
             " bytes of shared memory refused: ", driver().errorOf(r));
    }
    CUresult r = driver().cuLaunchKernel(
        fn, unsigned(grid[0]), unsigned(grid[1]), unsigned(grid[2]),
        unsigned(32 * k.num_warps), 1, 1, unsigned(k.shared_bytes),
        static_cast<CUstream>(stream), params, nullptr);
    if (r != CUDA_SUCCESS)
      fail("Triton kernel '", k.name,
           "': cuLaunchKernel failed: ", driver().errorOf(r));
    return;
  }
  for (uint32_t e = 0; e < k.num_entries; ++e) {
    const ap_generated_entry &entry = k.entries[e];
    uint64_t work = generatedWork(launch, entry);
    if (work == 0)
      continue;
    uint64_t threads = work * uint64_t(entry.threads_per_item);
    uint64_t block = uint64_t(entry.block_size);
    uint64_t blocks = (threads + block - 1) / block;
    if (blocks > 0x7fffffffull ||
        threads / uint64_t(entry.threads_per_item) != work)
      fail("generated kernel '", k.name, "' entry '", entry.name, "': ", work,
           " threads exceed one grid dimension");
    CUfunction fn = functionOf(launch, entry);
    CUresult r = driver().cuLaunchKernel(
        fn, unsigned(blocks), 1, 1, unsigned(block), 1, 1, 0,
        static_cast<CUstream>(stream), params, nullptr);
    if (r != CUDA_SUCCESS)
      fail("generated kernel '", k.name, "' entry '", entry.name,
           "': cuLaunchKernel failed: ", driver().errorOf(r));
  }
}

} // namespace ap::rt
