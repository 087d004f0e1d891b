// The few CUDA driver calls the libfabric transport needs, opened at run time (dlopen of
// libcuda.so.1) and only when GPU memory is asked for. Builds without CUDA headers: the
// prototypes are declared in native/ofi/cuda.cc. docs/ofi-facts.md explains when it is used.
#pragma once
#include <string>

namespace tsn {

// Loads libcuda.so.1 and calls cuInit(0), once per process. False with the reason (no driver,
// no device, a driver too old for a symbol) when GPU memory cannot be registered.
bool cudaLoad(std::string* why);

// Where a pointer lives. Sets *device to the ordinal of the GPU that owns p and returns true
// for CUDA device memory; returns true with *device = -1 for host memory (including memory
// CUDA does not know); false with the reason when the driver could not be asked.
bool cudaDeviceOf(const void* p, int* device, std::string* why);

// Whether p lies in an allocation that legacy CUDA IPC (cudaIpcGetMemHandle) can export:
// 1 for cudaMalloc / cuMemAlloc memory, 0 for other memory (cuMem* virtual memory ranges,
// which NCCL allocates by default since 2.19), -1 with the reason when the driver could not say.
int cudaLegacyIpcCapable(const void* p, std::string* why);

// Number of CUDA devices, 0 when there is no driver.
int cudaDeviceCount();

// Whether every GPU can export its memory as a DMA-BUF (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED,
// which NCCL also asks before it passes DMA-BUF file descriptors). False with the reason.
bool cudaDmaBufSupported(std::string* why);

// Makes GPU `device`'s primary context (the one the CUDA runtime and NCCL use) current on the
// calling thread, retaining it once per process. A thread of tsnet's own has no current
// context, and libfabric's CUDA calls made on it then fail (cuMemGetAddressRange:
// CUDA_ERROR_INVALID_CONTEXT) or land on GPU 0. False with the reason when it cannot.
bool cudaMakeCurrent(int device, std::string* why);

// cuFlushGPUDirectRDMAWrites for the current context, scope "owner": makes remote writes
// into GPU memory visible to the GPU (the OFI_NCCL_CUDA_FLUSH_ENABLE flush). False with the
// reason when the driver lacks it (CUDA < 11.3) or it fails.
bool cudaFlushRdmaWrites(std::string* why);

}  // namespace tsn
