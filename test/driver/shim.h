// The per-version shim: one uniform set of calls that reach any version's table (v6..v12)
// with that version's argument types, the way NCCL's own per-version adapters do.
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "tsnet_abi.h"

#define SHIM_MIN_VERSION 6
#define SHIM_MAX_VERSION 12

// One loaded library and the table of one version.
typedef struct Net {
  int version;        // 6..12
  void* lib;          // dlopen handle
  const void* table;  // tsn_net_vN_t*
  const char* name;   // table->name
} Net;

// Loads `path` (RTLD_NOW|RTLD_LOCAL) and looks up ncclNetPlugin_v<version>.
// Returns 0 on success; on failure writes a reason into err.
int shim_open(Net* n, const char* path, int version, char* err, size_t errlen);
// dlclose (the library is -z nodelete, so its state survives, as under NCCL).
void shim_close(Net* n);

// sizeof(tsn_props_vN_t) and sizeof(tsn_net_vN_t) of the version.
size_t shim_props_size(int version);
size_t shim_table_size(int version);
// Whether the version has a member / slot.
static inline int shim_has_ctx(int v) { return v >= 11; }
static inline int shim_has_devcomm(int v) { return v >= 7; }

// The slots, by name, as generic function pointers (NULL when absent in this version).
typedef void (*shim_fn_t)(void);
typedef struct ShimSlots {
  shim_fn_t init;
  shim_fn_t devices;
  shim_fn_t getProperties;
  shim_fn_t listen;
  shim_fn_t connect;
  shim_fn_t accept;
  shim_fn_t regMr;
  shim_fn_t regMrDmaBuf;
  shim_fn_t deregMr;
  shim_fn_t isend;
  shim_fn_t irecv;
  shim_fn_t iflush;
  shim_fn_t test;
  shim_fn_t closeSend;
  shim_fn_t closeRecv;
  shim_fn_t closeListen;
  shim_fn_t getDeviceMr;    // v7+
  shim_fn_t irecvConsumed;  // v7+
  shim_fn_t makeVDevice;    // v9+
  shim_fn_t finalize;       // v11+
  shim_fn_t setNetAttr;     // v11+
} ShimSlots;
void shim_slots(const Net* n, ShimSlots* s);

// Calls. ctx is ignored (and *ctx set to NULL) below v11.
tsn_result_t shim_init(const Net* n, void** ctx, uint64_t commId, tsn_logger_t logger);
tsn_result_t shim_devices(const Net* n, int* ndev);
// Fills the version's props struct at `raw` (shim_props_size bytes) ...
tsn_result_t shim_get_properties_raw(const Net* n, int dev, void* raw);
// ... and converts such a struct into the neutral one (absent members: 0, or -1 for railId/planeId).
void shim_props_to_neutral(int version, const void* raw, tsn_props_t* out);
tsn_result_t shim_listen(const Net* n, void* ctx, int dev, void* handle, void** listenComm);
tsn_result_t shim_connect(const Net* n, void* ctx, int dev, void* handle, void** sendComm);
tsn_result_t shim_accept(const Net* n, void* listenComm, void** recvComm);
// size must fit in an int below v8 (the shim refuses, returning -1, rather than truncate).
tsn_result_t shim_reg_mr(const Net* n, void* comm, void* data, size_t size, int type, void** mhandle);
// regMrDmaBuf, the same signature in every version; -1 when the table's slot is NULL.
tsn_result_t shim_reg_mr_dma_buf(const Net* n, void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                 void** mhandle);
tsn_result_t shim_dereg_mr(const Net* n, void* comm, void* mhandle);
tsn_result_t shim_isend(const Net* n, void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
tsn_result_t shim_irecv(const Net* n, void* recvComm, int n_, void** data, const size_t* sizes, int* tags,
                        void** mhandles, void** request);
// sizes are the received sizes (NCCL passes ints in every version).
tsn_result_t shim_iflush(const Net* n, void* recvComm, int n_, void** data, const int* sizes, void** mhandles,
                         void** request);
tsn_result_t shim_test(const Net* n, void* request, int* done, int* sizes);
tsn_result_t shim_close_send(const Net* n, void* sendComm);
tsn_result_t shim_close_recv(const Net* n, void* recvComm);
tsn_result_t shim_close_listen(const Net* n, void* listenComm);
// v11+ only; returns 0 below.
tsn_result_t shim_finalize(const Net* n, void* ctx);
// v11+: setNetAttr (older versions: success, nothing called).
tsn_result_t shim_set_net_attr(const Net* n, void* ctx, tsn_net_attr_t* attr);

// The CUDA driver, opened at run time (dlopen of libcuda.so.1) with GPU 0's primary context
// current, for the GPU scenarios of the driver and the bench. shim_cuda_open returns 0, or -1
// with why.
typedef int ShimCuRes;
typedef unsigned long long ShimCuPtr;
typedef struct ShimCuda {
  ShimCuRes (*memAlloc)(ShimCuPtr* p, size_t size);
  ShimCuRes (*memsetD8)(ShimCuPtr p, unsigned char value, size_t size);
  ShimCuRes (*htod)(ShimCuPtr dst, const void* src, size_t size);
  ShimCuRes (*dtoh)(void* dst, ShimCuPtr src, size_t size);
} ShimCuda;
int shim_cuda_open(ShimCuda* c, char* why, size_t len);

// libfabric's shm provider keeps a 16 MiB region per endpoint in /dev/shm named after the
// process ("<pid>:..."); a process that ends without closing its endpoints (killed, _exit
// before finalize) leaves them behind, and a later process with the same pid cannot enable
// an endpoint. Calls each (if not NULL) with the path of every region of pid, after removing
// it when remove is set; returns how many there were.
int shim_shm_regions(int pid, int remove, void (*each)(const char* path, void* arg), void* arg);

// Regions named for this process's pid may be there before it loaded the library: an earlier
// process with the same pid left them, and pids come round again within one test run (pid_max
// is 32768 on small machines). shm refuses such a name only when an endpoint takes it
// (native/ofi/ofi_endpoint.cc then takes the next index), so a process that opened no endpoint
// still finds it at its exit: it is not this process's. shim_stale_note notes them (call it
// before loading the library, and again in a forked child); shim_stale_has says whether path is
// one of them, untouched since (same inode and change time: a file shm took over and rewrote
// counts as this process's again).
#define SHIM_STALE_MAX 8
typedef struct {
  int n;
  struct {
    char path[300];
    unsigned long long dev, ino;
    long long ctime_s, ctime_ns;
  } r[SHIM_STALE_MAX];
} ShimStale;
void shim_stale_note(ShimStale* s);
int shim_stale_has(const ShimStale* s, const char* path);

// Calls each(name, dir, arg) (unless each is NULL: counting only) for every thread of this process whose name (comm) starts with
// prefix; dir is its /proc/self/task/<tid> folder. Returns how many there were.
int shim_threads(const char* prefix, void (*each)(const char* name, const char* dir, void* arg), void* arg);
