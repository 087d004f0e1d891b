// CUDA driver calls opened at run time (native/ofi/cuda.h). The prototypes and the enum values
// below are the driver API's (cuda.h); declaring them here keeps CUDA's headers out of the build.
#include "ofi/cuda.h"

#include <dlfcn.h>

#include <cstdint>
#include <mutex>

namespace tsn {
namespace {

using CUresult = int;
using CUdeviceptr = unsigned long long;
using CUdevice = int;
using CUcontext = void*;
constexpr CUresult kCudaSuccess = 0;
constexpr CUresult kCudaErrorInvalidValue = 1;   // cuPointerGetAttribute on memory CUDA does not know
constexpr int kAttrMemoryType = 2;               // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kAttrDeviceOrdinal = 9;            // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kAttrLegacyIpcCapable = 10;        // CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE
constexpr unsigned kMemoryTypeDevice = 2;        // CU_MEMORYTYPE_DEVICE
constexpr int kFlushTargetCurrentCtx = 0;        // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TARGET_CURRENT_CTX
constexpr int kFlushToOwner = 100;               // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_TO_OWNER
constexpr int kDevAttrDmaBufSupported = 124;     // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED (CUDA 11.7)

struct Driver {
  CUresult (*init)(unsigned flags) = nullptr;
  CUresult (*deviceGetCount)(int* count) = nullptr;
  CUresult (*pointerGetAttribute)(void* data, int attribute, CUdeviceptr ptr) = nullptr;
  CUresult (*getErrorString)(CUresult error, const char** str) = nullptr;
  CUresult (*flushGPUDirectRDMAWrites)(int target, int scope) = nullptr;  // CUDA 11.3+, may be absent
  CUresult (*deviceGet)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*primaryCtxRetain)(CUcontext* ctx, CUdevice device) = nullptr;
  CUresult (*ctxSetCurrent)(CUcontext ctx) = nullptr;
  CUresult (*deviceGetAttribute)(int* value, int attribute, CUdevice device) = nullptr;
  std::mutex ctxMu;
  CUcontext ctx[64] = {};  // retained primary contexts by ordinal
  int devices = 0;
  bool ok = false;
  std::string why;  // why not ok
};

Driver& driver() {
  static Driver d;
  return d;
}

std::string errorText(CUresult r) {
  const char* s = nullptr;
  if (driver().getErrorString && driver().getErrorString(r, &s) == kCudaSuccess && s) return s;
  return "CUDA error " + std::to_string(r);
}

void load() {
  Driver& d = driver();
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    d.why = std::string("no CUDA driver: GPU memory cannot be registered (") + (e ? e : "dlopen failed") + ")";
    return;
  }
  d.init = reinterpret_cast<decltype(d.init)>(dlsym(h, "cuInit"));
  d.deviceGetCount = reinterpret_cast<decltype(d.deviceGetCount)>(dlsym(h, "cuDeviceGetCount"));
  d.pointerGetAttribute = reinterpret_cast<decltype(d.pointerGetAttribute)>(dlsym(h, "cuPointerGetAttribute"));
  d.getErrorString = reinterpret_cast<decltype(d.getErrorString)>(dlsym(h, "cuGetErrorString"));
  d.flushGPUDirectRDMAWrites = reinterpret_cast<decltype(d.flushGPUDirectRDMAWrites)>(dlsym(h, "cuFlushGPUDirectRDMAWrites"));
  d.deviceGet = reinterpret_cast<decltype(d.deviceGet)>(dlsym(h, "cuDeviceGet"));
  d.primaryCtxRetain = reinterpret_cast<decltype(d.primaryCtxRetain)>(dlsym(h, "cuDevicePrimaryCtxRetain"));
  d.ctxSetCurrent = reinterpret_cast<decltype(d.ctxSetCurrent)>(dlsym(h, "cuCtxSetCurrent"));
  d.deviceGetAttribute = reinterpret_cast<decltype(d.deviceGetAttribute)>(dlsym(h, "cuDeviceGetAttribute"));
  if (!d.init || !d.deviceGetCount || !d.pointerGetAttribute) {
    d.why = "the CUDA driver lacks cuInit, cuDeviceGetCount or cuPointerGetAttribute: GPU memory cannot be registered";
    return;  // the handle stays open: harmless, and a driver is never unloaded under a process
  }
  CUresult r = d.init(0);
  if (r != kCudaSuccess) {
    d.why = "cuInit failed (" + errorText(r) + "): GPU memory cannot be registered";
    return;
  }
  r = d.deviceGetCount(&d.devices);
  if (r != kCudaSuccess || d.devices <= 0) {
    d.why = r != kCudaSuccess ? "cuDeviceGetCount failed (" + errorText(r) + ")" : "the CUDA driver sees no GPU";
    d.devices = 0;
    return;
  }
  d.ok = true;
}

}  // namespace

bool cudaLoad(std::string* why) {
  static std::once_flag once;
  std::call_once(once, load);
  if (!driver().ok && why) *why = driver().why;
  return driver().ok;
}

int cudaDeviceCount() { return cudaLoad(nullptr) ? driver().devices : 0; }

bool cudaDmaBufSupported(std::string* why) {
  if (!cudaLoad(why)) return false;
  Driver& d = driver();
  if (!d.deviceGet || !d.deviceGetAttribute) {
    *why = "the CUDA driver lacks cuDeviceGet or cuDeviceGetAttribute";
    return false;
  }
  if (d.devices <= 0) {
    *why = "no CUDA device";
    return false;
  }
  for (int i = 0; i < d.devices; i++) {
    CUdevice dev = 0;
    int v = 0;
    CUresult r = d.deviceGet(&dev, i);
    if (r == kCudaSuccess) r = d.deviceGetAttribute(&v, kDevAttrDmaBufSupported, dev);
    if (r != kCudaSuccess) {
      // A driver older than CUDA 11.7 does not know the attribute (CUDA_ERROR_INVALID_VALUE).
      *why = "GPU " + std::to_string(i) + ": cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED): " + errorText(r);
      return false;
    }
    if (!v) {
      *why = "GPU " + std::to_string(i) +
             " cannot export DMA-BUF (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 0: needs NVIDIA's open kernel modules)";
      return false;
    }
  }
  return true;
}

bool cudaDeviceOf(const void* p, int* device, std::string* why) {
  *device = -1;
  if (!cudaLoad(why)) return false;
  Driver& d = driver();
  CUdeviceptr ptr = reinterpret_cast<uintptr_t>(p);
  unsigned type = 0;
  CUresult r = d.pointerGetAttribute(&type, kAttrMemoryType, ptr);
  if (r == kCudaErrorInvalidValue) return true;  // memory CUDA never saw: plain host memory
  if (r != kCudaSuccess) {
    if (why) *why = "cuPointerGetAttribute(MEMORY_TYPE) failed: " + errorText(r);
    return false;
  }
  if (type != kMemoryTypeDevice) return true;  // pinned or registered host memory
  int ordinal = -1;
  r = d.pointerGetAttribute(&ordinal, kAttrDeviceOrdinal, ptr);
  if (r != kCudaSuccess) {
    if (why) *why = "cuPointerGetAttribute(DEVICE_ORDINAL) failed: " + errorText(r);
    return false;
  }
  *device = ordinal;
  return true;
}

int cudaLegacyIpcCapable(const void* p, std::string* why) {
  if (!cudaLoad(why)) return -1;
  int capable = 0;
  CUresult r = driver().pointerGetAttribute(&capable, kAttrLegacyIpcCapable, reinterpret_cast<uintptr_t>(p));
  if (r != kCudaSuccess) {
    if (why) *why = "cuPointerGetAttribute(IS_LEGACY_CUDA_IPC_CAPABLE) failed: " + errorText(r);
    return -1;
  }
  return capable ? 1 : 0;
}

bool cudaMakeCurrent(int device, std::string* why) {
  if (!cudaLoad(why)) return false;
  Driver& d = driver();
  if (device < 0 || device >= d.devices || device >= 64) {
    if (why) *why = "no GPU " + std::to_string(device);
    return false;
  }
  if (!d.deviceGet || !d.primaryCtxRetain || !d.ctxSetCurrent) {
    if (why) *why = "the CUDA driver lacks cuDeviceGet, cuDevicePrimaryCtxRetain or cuCtxSetCurrent";
    return false;
  }
  CUcontext ctx;
  {
    std::lock_guard<std::mutex> g(d.ctxMu);
    if (!d.ctx[device]) {
      CUdevice dev = 0;
      CUresult r = d.deviceGet(&dev, device);
      if (r == kCudaSuccess) r = d.primaryCtxRetain(&d.ctx[device], dev);  // kept for the process's life
      if (r != kCudaSuccess) {
        d.ctx[device] = nullptr;
        if (why) *why = "cuDevicePrimaryCtxRetain(" + std::to_string(device) + ") failed: " + errorText(r);
        return false;
      }
    }
    ctx = d.ctx[device];
  }
  CUresult r = d.ctxSetCurrent(ctx);
  if (r != kCudaSuccess) {
    if (why) *why = "cuCtxSetCurrent failed: " + errorText(r);
    return false;
  }
  return true;
}

bool cudaFlushRdmaWrites(std::string* why) {
  if (!cudaLoad(why)) return false;
  Driver& d = driver();
  if (!d.flushGPUDirectRDMAWrites) {
    if (why) *why = "the CUDA driver has no cuFlushGPUDirectRDMAWrites (CUDA 11.3 or newer is needed)";
    return false;
  }
  CUresult r = d.flushGPUDirectRDMAWrites(kFlushTargetCurrentCtx, kFlushToOwner);
  if (r != kCudaSuccess) {
    if (why) *why = "cuFlushGPUDirectRDMAWrites failed: " + errorText(r);
    return false;
  }
  return true;
}

}  // namespace tsn
