// The per-version shim (see shim.h). Every call casts the table to its own version's type
// and passes that version's argument types: int sizes up to v8 (regMr: up to v7), no ctx up
// to v10, a comm config at v10's connect, device-comm out-pointers from v7, profiler handles
// from v10.
#define _GNU_SOURCE
#include "shim.h"

#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define T(v) ((const tsn_net_v##v##_t*)n->table)

int shim_open(Net* n, const char* path, int version, char* err, size_t errlen) {
  memset(n, 0, sizeof *n);
  if (version < SHIM_MIN_VERSION || version > SHIM_MAX_VERSION) {
    snprintf(err, errlen, "version %d is outside %d..%d", version, SHIM_MIN_VERSION, SHIM_MAX_VERSION);
    return -1;
  }
  n->version = version;
  n->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!n->lib) {
    snprintf(err, errlen, "dlopen %s: %s", path, dlerror());
    return -1;
  }
  char sym[32];
  snprintf(sym, sizeof sym, "ncclNetPlugin_v%d", version);
  n->table = dlsym(n->lib, sym);
  if (!n->table) {
    snprintf(err, errlen, "dlsym %s: %s", sym, dlerror());
    dlclose(n->lib);
    n->lib = NULL;
    return -1;
  }
  n->name = *(const char* const*)n->table;  // slot 0 of every version
  return 0;
}

void shim_close(Net* n) {
  if (n->lib) dlclose(n->lib);
  n->lib = NULL;
  n->table = NULL;
}

size_t shim_props_size(int v) {
  switch (v) {
    case 6: return sizeof(tsn_props_v6_t);
    case 7: return sizeof(tsn_props_v7_t);
    case 8: return sizeof(tsn_props_v8_t);
    case 9: return sizeof(tsn_props_v9_t);
    case 10: return sizeof(tsn_props_v10_t);
    case 11: return sizeof(tsn_props_v11_t);
    case 12: return sizeof(tsn_props_v12_t);
  }
  return 0;
}

size_t shim_table_size(int v) {
  switch (v) {
    case 6: return sizeof(tsn_net_v6_t);
    case 7: return sizeof(tsn_net_v7_t);
    case 8: return sizeof(tsn_net_v8_t);
    case 9: return sizeof(tsn_net_v9_t);
    case 10: return sizeof(tsn_net_v10_t);
    case 11: return sizeof(tsn_net_v11_t);
    case 12: return sizeof(tsn_net_v12_t);
  }
  return 0;
}

#define COMMON_SLOTS(t)                                   \
  do {                                                    \
    s->init = (shim_fn_t)(t)->init;                     \
    s->devices = (shim_fn_t)(t)->devices;               \
    s->getProperties = (shim_fn_t)(t)->getProperties;   \
    s->listen = (shim_fn_t)(t)->listen;                 \
    s->connect = (shim_fn_t)(t)->connect;               \
    s->accept = (shim_fn_t)(t)->accept;                 \
    s->regMr = (shim_fn_t)(t)->regMr;                   \
    s->regMrDmaBuf = (shim_fn_t)(t)->regMrDmaBuf;       \
    s->deregMr = (shim_fn_t)(t)->deregMr;               \
    s->isend = (shim_fn_t)(t)->isend;                   \
    s->irecv = (shim_fn_t)(t)->irecv;                   \
    s->iflush = (shim_fn_t)(t)->iflush;                 \
    s->test = (shim_fn_t)(t)->test;                     \
    s->closeSend = (shim_fn_t)(t)->closeSend;           \
    s->closeRecv = (shim_fn_t)(t)->closeRecv;           \
    s->closeListen = (shim_fn_t)(t)->closeListen;       \
  } while (0)
#define V7_SLOTS(t)                                       \
  do {                                                    \
    s->getDeviceMr = (shim_fn_t)(t)->getDeviceMr;       \
    s->irecvConsumed = (shim_fn_t)(t)->irecvConsumed;   \
  } while (0)
#define V9_SLOTS(t) (s->makeVDevice = (shim_fn_t)(t)->makeVDevice)
#define V11_SLOTS(t)                                      \
  do {                                                    \
    s->finalize = (shim_fn_t)(t)->finalize;             \
    s->setNetAttr = (shim_fn_t)(t)->setNetAttr;         \
  } while (0)

void shim_slots(const Net* n, ShimSlots* s) {
  memset(s, 0, sizeof *s);
  switch (n->version) {
    case 6: COMMON_SLOTS(T(6)); break;
    case 7: COMMON_SLOTS(T(7)); V7_SLOTS(T(7)); break;
    case 8: COMMON_SLOTS(T(8)); V7_SLOTS(T(8)); break;
    case 9: COMMON_SLOTS(T(9)); V7_SLOTS(T(9)); V9_SLOTS(T(9)); break;
    case 10: COMMON_SLOTS(T(10)); V7_SLOTS(T(10)); V9_SLOTS(T(10)); break;
    case 11: COMMON_SLOTS(T(11)); V7_SLOTS(T(11)); V9_SLOTS(T(11)); V11_SLOTS(T(11)); break;
    case 12: COMMON_SLOTS(T(12)); V7_SLOTS(T(12)); V9_SLOTS(T(12)); V11_SLOTS(T(12)); break;
  }
}

tsn_result_t shim_init(const Net* n, void** ctx, uint64_t commId, tsn_logger_t logger) {
  if (ctx && !shim_has_ctx(n->version)) *ctx = NULL;
  switch (n->version) {
    case 6: return T(6)->init(logger);
    case 7: return T(7)->init(logger);
    case 8: return T(8)->init(logger);
    case 9: return T(9)->init(logger);
    case 10: return T(10)->init(logger, NULL);
    case 11: return T(11)->init(ctx, commId, NULL, logger, NULL);
    case 12: return T(12)->init(ctx, commId, NULL, logger, NULL);
  }
  return -1;
}

tsn_result_t shim_devices(const Net* n, int* ndev) {
  switch (n->version) {
    case 6: return T(6)->devices(ndev);
    case 7: return T(7)->devices(ndev);
    case 8: return T(8)->devices(ndev);
    case 9: return T(9)->devices(ndev);
    case 10: return T(10)->devices(ndev);
    case 11: return T(11)->devices(ndev);
    case 12: return T(12)->devices(ndev);
  }
  return -1;
}

tsn_result_t shim_get_properties_raw(const Net* n, int dev, void* raw) {
  switch (n->version) {
    case 6: return T(6)->getProperties(dev, (tsn_props_v6_t*)raw);
    case 7: return T(7)->getProperties(dev, (tsn_props_v7_t*)raw);
    case 8: return T(8)->getProperties(dev, (tsn_props_v8_t*)raw);
    case 9: return T(9)->getProperties(dev, (tsn_props_v9_t*)raw);
    case 10: return T(10)->getProperties(dev, (tsn_props_v10_t*)raw);
    case 11: return T(11)->getProperties(dev, (tsn_props_v11_t*)raw);
    case 12: return T(12)->getProperties(dev, (tsn_props_v12_t*)raw);
  }
  return -1;
}

#define BASE_FIELDS(p)                 \
  do {                                 \
    out->name = (p)->name;             \
    out->pciPath = (p)->pciPath;       \
    out->guid = (p)->guid;             \
    out->ptrSupport = (p)->ptrSupport; \
    out->speed = (p)->speed;           \
    out->port = (p)->port;             \
    out->latency = (p)->latency;       \
    out->maxComms = (p)->maxComms;     \
    out->maxRecvs = (p)->maxRecvs;     \
  } while (0)
#define V7_FIELDS(p)                               \
  do {                                             \
    out->netDeviceType = (p)->netDeviceType;       \
    out->netDeviceVersion = (p)->netDeviceVersion; \
  } while (0)
#define V8_FIELDS(p) (out->regIsGlobal = (p)->regIsGlobal)
#define V9_FIELDS(p)                                                  \
  do {                                                                \
    out->forceFlush = (p)->forceFlush;                                \
    out->vProps.ndevs = (p)->vProps.ndevs;                            \
    for (size_t i = 0; i < sizeof (p)->vProps.devs / sizeof(int); i++) \
      out->vProps.devs[i] = (p)->vProps.devs[i];                      \
    out->maxP2pBytes = (p)->maxP2pBytes;                              \
    out->maxCollBytes = (p)->maxCollBytes;                            \
  } while (0)
#define V11_FIELDS(p) (out->maxMultiRequestSize = (p)->maxMultiRequestSize)

void shim_props_to_neutral(int v, const void* raw, tsn_props_t* out) {
  memset(out, 0, sizeof *out);
  out->railId = -1;
  out->planeId = -1;
  switch (v) {
    case 6: { const tsn_props_v6_t* p = raw; BASE_FIELDS(p); break; }
    case 7: { const tsn_props_v7_t* p = raw; BASE_FIELDS(p); V7_FIELDS(p); break; }
    case 8: { const tsn_props_v8_t* p = raw; BASE_FIELDS(p); V7_FIELDS(p); V8_FIELDS(p); break; }
    case 9: { const tsn_props_v9_t* p = raw; BASE_FIELDS(p); V7_FIELDS(p); V8_FIELDS(p); V9_FIELDS(p); break; }
    case 10: { const tsn_props_v10_t* p = raw; BASE_FIELDS(p); V7_FIELDS(p); V8_FIELDS(p); V9_FIELDS(p); break; }
    case 11: {
      const tsn_props_v11_t* p = raw;
      BASE_FIELDS(p); V7_FIELDS(p); V8_FIELDS(p); V9_FIELDS(p); V11_FIELDS(p);
      break;
    }
    case 12: {
      const tsn_props_v12_t* p = raw;
      BASE_FIELDS(p); V7_FIELDS(p); V8_FIELDS(p); V9_FIELDS(p); V11_FIELDS(p);
      out->railId = p->railId;
      out->planeId = p->planeId;
      break;
    }
  }
}

tsn_result_t shim_listen(const Net* n, void* ctx, int dev, void* handle, void** listenComm) {
  switch (n->version) {
    case 6: return T(6)->listen(dev, handle, listenComm);
    case 7: return T(7)->listen(dev, handle, listenComm);
    case 8: return T(8)->listen(dev, handle, listenComm);
    case 9: return T(9)->listen(dev, handle, listenComm);
    case 10: return T(10)->listen(dev, handle, listenComm);
    case 11: return T(11)->listen(ctx, dev, handle, listenComm);
    case 12: return T(12)->listen(ctx, dev, handle, listenComm);
  }
  return -1;
}

tsn_result_t shim_connect(const Net* n, void* ctx, int dev, void* handle, void** sendComm) {
  // NCCL passes a pointer to its own device-handle pointer; a host plugin must leave it alone.
  tsn_dev_handle_t* devComm = NULL;
  tsn_comm_config_t config = {TSN_UNSET};
  switch (n->version) {
    case 6: return T(6)->connect(dev, handle, sendComm);
    case 7: return T(7)->connect(dev, handle, sendComm, &devComm);
    case 8: return T(8)->connect(dev, handle, sendComm, &devComm);
    case 9: return T(9)->connect(dev, handle, sendComm, &devComm);
    case 10: return T(10)->connect(dev, &config, handle, sendComm, &devComm);
    case 11: return T(11)->connect(ctx, dev, handle, sendComm, &devComm);
    case 12: return T(12)->connect(ctx, dev, handle, sendComm, &devComm);
  }
  return -1;
}

tsn_result_t shim_accept(const Net* n, void* listenComm, void** recvComm) {
  tsn_dev_handle_t* devComm = NULL;
  switch (n->version) {
    case 6: return T(6)->accept(listenComm, recvComm);
    case 7: return T(7)->accept(listenComm, recvComm, &devComm);
    case 8: return T(8)->accept(listenComm, recvComm, &devComm);
    case 9: return T(9)->accept(listenComm, recvComm, &devComm);
    case 10: return T(10)->accept(listenComm, recvComm, &devComm);
    case 11: return T(11)->accept(listenComm, recvComm, &devComm);
    case 12: return T(12)->accept(listenComm, recvComm, &devComm);
  }
  return -1;
}

tsn_result_t shim_reg_mr(const Net* n, void* comm, void* data, size_t size, int type, void** mhandle) {
  if (n->version <= 7 && size > (size_t)INT_MAX) return -1;
  switch (n->version) {
    case 6: return T(6)->regMr(comm, data, (int)size, type, mhandle);
    case 7: return T(7)->regMr(comm, data, (int)size, type, mhandle);
    case 8: return T(8)->regMr(comm, data, size, type, mhandle);
    case 9: return T(9)->regMr(comm, data, size, type, mhandle);
    case 10: return T(10)->regMr(comm, data, size, type, mhandle);
    case 11: return T(11)->regMr(comm, data, size, type, mhandle);
    case 12: return T(12)->regMr(comm, data, size, type, mhandle);
  }
  return -1;
}

tsn_result_t shim_reg_mr_dma_buf(const Net* n, void* comm, void* data, size_t size, int type, uint64_t offset, int fd,
                                 void** mhandle) {
  switch (n->version) {
#define DMABUF_CASE(v) \
  case v: return T(v)->regMrDmaBuf ? T(v)->regMrDmaBuf(comm, data, size, type, offset, fd, mhandle) : -1;
    DMABUF_CASE(6) DMABUF_CASE(7) DMABUF_CASE(8) DMABUF_CASE(9) DMABUF_CASE(10) DMABUF_CASE(11) DMABUF_CASE(12)
#undef DMABUF_CASE
  }
  return -1;
}

tsn_result_t shim_dereg_mr(const Net* n, void* comm, void* mhandle) {
  switch (n->version) {
    case 6: return T(6)->deregMr(comm, mhandle);
    case 7: return T(7)->deregMr(comm, mhandle);
    case 8: return T(8)->deregMr(comm, mhandle);
    case 9: return T(9)->deregMr(comm, mhandle);
    case 10: return T(10)->deregMr(comm, mhandle);
    case 11: return T(11)->deregMr(comm, mhandle);
    case 12: return T(12)->deregMr(comm, mhandle);
  }
  return -1;
}

tsn_result_t shim_isend(const Net* n, void* sc, void* data, size_t size, int tag, void* mh, void** request) {
  if (n->version <= 8 && size > (size_t)INT_MAX) return -1;
  switch (n->version) {
    case 6: return T(6)->isend(sc, data, (int)size, tag, mh, request);
    case 7: return T(7)->isend(sc, data, (int)size, tag, mh, request);
    case 8: return T(8)->isend(sc, data, (int)size, tag, mh, request);
    case 9: return T(9)->isend(sc, data, size, tag, mh, request);
    case 10: return T(10)->isend(sc, data, size, tag, mh, NULL, request);
    case 11: return T(11)->isend(sc, data, size, tag, mh, NULL, request);
    case 12: return T(12)->isend(sc, data, size, tag, mh, NULL, request);
  }
  return -1;
}

#define SHIM_MAX_N 64

tsn_result_t shim_irecv(const Net* n, void* rc, int nb, void** data, const size_t* sizes, int* tags, void** mhs,
                        void** request) {
  // NCCL keeps the sizes in its own arrays of the version's type; copy into one here.
  int isz[SHIM_MAX_N];
  size_t zsz[SHIM_MAX_N];
  void* ph[SHIM_MAX_N] = {0};
  int k = nb < 0 ? 0 : nb > SHIM_MAX_N ? SHIM_MAX_N : nb;
  for (int i = 0; i < k; i++) {
    if (n->version <= 8 && sizes[i] > (size_t)INT_MAX) return -1;
    isz[i] = (int)sizes[i];
    zsz[i] = sizes[i];
  }
  switch (n->version) {
    case 6: return T(6)->irecv(rc, nb, data, isz, tags, mhs, request);
    case 7: return T(7)->irecv(rc, nb, data, isz, tags, mhs, request);
    case 8: return T(8)->irecv(rc, nb, data, isz, tags, mhs, request);
    case 9: return T(9)->irecv(rc, nb, data, zsz, tags, mhs, request);
    case 10: return T(10)->irecv(rc, nb, data, zsz, tags, mhs, ph, request);
    case 11: return T(11)->irecv(rc, nb, data, zsz, tags, mhs, ph, request);
    case 12: return T(12)->irecv(rc, nb, data, zsz, tags, mhs, ph, request);
  }
  return -1;
}

tsn_result_t shim_iflush(const Net* n, void* rc, int nb, void** data, const int* sizes, void** mhs, void** request) {
  int isz[SHIM_MAX_N];
  int k = nb < 0 ? 0 : nb > SHIM_MAX_N ? SHIM_MAX_N : nb;
  for (int i = 0; i < k; i++) isz[i] = sizes[i];
  switch (n->version) {
    case 6: return T(6)->iflush(rc, nb, data, isz, mhs, request);
    case 7: return T(7)->iflush(rc, nb, data, isz, mhs, request);
    case 8: return T(8)->iflush(rc, nb, data, isz, mhs, request);
    case 9: return T(9)->iflush(rc, nb, data, isz, mhs, request);
    case 10: return T(10)->iflush(rc, nb, data, isz, mhs, request);
    case 11: return T(11)->iflush(rc, nb, data, isz, mhs, request);
    case 12: return T(12)->iflush(rc, nb, data, isz, mhs, request);
  }
  return -1;
}

tsn_result_t shim_test(const Net* n, void* request, int* done, int* sizes) {
  switch (n->version) {
    case 6: return T(6)->test(request, done, sizes);
    case 7: return T(7)->test(request, done, sizes);
    case 8: return T(8)->test(request, done, sizes);
    case 9: return T(9)->test(request, done, sizes);
    case 10: return T(10)->test(request, done, sizes);
    case 11: return T(11)->test(request, done, sizes);
    case 12: return T(12)->test(request, done, sizes);
  }
  return -1;
}

#define CLOSE_FN(fn, slot)                     \
  tsn_result_t fn(const Net* n, void* comm) {  \
    switch (n->version) {                      \
      case 6: return T(6)->slot(comm);         \
      case 7: return T(7)->slot(comm);         \
      case 8: return T(8)->slot(comm);         \
      case 9: return T(9)->slot(comm);         \
      case 10: return T(10)->slot(comm);       \
      case 11: return T(11)->slot(comm);       \
      case 12: return T(12)->slot(comm);       \
    }                                          \
    return -1;                                 \
  }
CLOSE_FN(shim_close_send, closeSend)
CLOSE_FN(shim_close_recv, closeRecv)
CLOSE_FN(shim_close_listen, closeListen)

tsn_result_t shim_finalize(const Net* n, void* ctx) {
  switch (n->version) {
    case 11: return T(11)->finalize(ctx);
    case 12: return T(12)->finalize(ctx);
  }
  return TSN_SUCCESS;
}

tsn_result_t shim_set_net_attr(const Net* n, void* ctx, tsn_net_attr_t* attr) {
  switch (n->version) {
    case 11: return T(11)->setNetAttr(ctx, attr);
    case 12: return T(12)->setNetAttr(ctx, attr);
  }
  return TSN_SUCCESS;
}

int shim_shm_regions(int pid, int remove, void (*each)(const char* path, void* arg), void* arg) {
  DIR* d = opendir("/dev/shm");
  if (!d) return 0;
  char prefix[32], path[300];
  int plen = snprintf(prefix, sizeof prefix, "%d:", pid);
  int n = 0;
  for (struct dirent* e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, (size_t)plen) != 0) continue;
    snprintf(path, sizeof path, "/dev/shm/%s", e->d_name);
    if (remove && unlink(path) != 0) continue;
    n++;
    if (each) each(path, arg);
  }
  closedir(d);
  return n;
}

static void stale_add(const char* path, void* arg) {
  ShimStale* s = arg;
  struct stat st;
  if (s->n == SHIM_STALE_MAX || stat(path, &st) != 0) return;
  snprintf(s->r[s->n].path, sizeof s->r[s->n].path, "%s", path);
  s->r[s->n].dev = st.st_dev, s->r[s->n].ino = st.st_ino;
  s->r[s->n].ctime_s = st.st_ctim.tv_sec, s->r[s->n].ctime_ns = st.st_ctim.tv_nsec;
  s->n++;
}

void shim_stale_note(ShimStale* s) {
  s->n = 0;
  shim_shm_regions((int)getpid(), 0, stale_add, s);
}

int shim_stale_has(const ShimStale* s, const char* path) {
  struct stat st;
  if (stat(path, &st) != 0) return 0;
  for (int i = 0; i < s->n; i++)
    if (!strcmp(s->r[i].path, path) && s->r[i].dev == st.st_dev && s->r[i].ino == st.st_ino &&
        s->r[i].ctime_s == st.st_ctim.tv_sec && s->r[i].ctime_ns == st.st_ctim.tv_nsec)
      return 1;
  return 0;
}

int shim_threads(const char* prefix, void (*each)(const char* name, const char* dir, void* arg), void* arg) {
  DIR* d = opendir("/proc/self/task");
  if (!d) return 0;
  int n = 0;
  for (struct dirent* e; (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    char dir[300], path[320], name[32] = "";
    snprintf(dir, sizeof dir, "/proc/self/task/%s", e->d_name);
    snprintf(path, sizeof path, "%s/comm", dir);
    FILE* f = fopen(path, "r");
    if (!f) continue;
    if (!fgets(name, sizeof name, f)) name[0] = 0;
    fclose(f);
    name[strcspn(name, "\n")] = 0;
    if (strncmp(name, prefix, strlen(prefix)) != 0) continue;
    n++;
    if (each) each(name, dir, arg);
  }
  closedir(d);
  return n;
}

int shim_cuda_open(ShimCuda* c, char* why, size_t len) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return snprintf(why, len, "no CUDA driver (%s)", dlerror()), -1;
  ShimCuRes (*init)(unsigned) = NULL;
  ShimCuRes (*primaryCtxRetain)(void**, int) = NULL;
  ShimCuRes (*ctxSetCurrent)(void*) = NULL;
  struct {
    void** fn;
    const char* name;
  } syms[] = {{(void**)&init, "cuInit"},
              {(void**)&primaryCtxRetain, "cuDevicePrimaryCtxRetain"},
              {(void**)&ctxSetCurrent, "cuCtxSetCurrent"},
              {(void**)&c->memAlloc, "cuMemAlloc_v2"},
              {(void**)&c->memsetD8, "cuMemsetD8_v2"},
              {(void**)&c->htod, "cuMemcpyHtoD_v2"},
              {(void**)&c->dtoh, "cuMemcpyDtoH_v2"}};
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
    if (!(*syms[i].fn = dlsym(h, syms[i].name))) return snprintf(why, len, "the CUDA driver lacks %s", syms[i].name), -1;
  void* ctx = NULL;
  ShimCuRes rc = init(0);
  if (rc == 0) rc = primaryCtxRetain(&ctx, 0);
  if (rc == 0) rc = ctxSetCurrent(ctx);
  if (rc) return snprintf(why, len, "CUDA init or GPU 0's context failed (CUresult %d)", rc), -1;
  return 0;
}
