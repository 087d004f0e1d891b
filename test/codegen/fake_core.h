/* A fake version-neutral core for the adapter test: records the last call's arguments. */
#pragma once
#include "tsnet_abi.h"

/* The arguments of the last core call (fields the call lacks keep their previous values). */
typedef struct {
  const char* fn; /* name of the core function called last */
  int calls; /* number of core calls so far */
  void** ctxOut;
  void* ctx;
  uint64_t commId;
  const tsn_comm_config_t* config;
  tsn_logger_t logger;
  tsn_profiler_t prof;
  int dev;
  int* ndev;
  void* handle;
  void** commOut;
  tsn_dev_handle_t** devComm;
  void* comm;
  void* data;
  size_t size;
  int type;
  uint64_t offset;
  int fd;
  void** mhandleOut;
  void* mhandle;
  int tag;
  void* phandle;
  void** request;
  int n;
  void** datas;
  const size_t* sizesIn; /* the pointer irecv got */
  size_t sizes[TSN_MAX_RECVS]; /* a copy of what it pointed to */
  int* tags;
  void** mhandles;
  void** phandles;
  int* intSizes;
  int* done;
  const tsn_net_attr_t* attr;
} fake_call_t;

extern fake_call_t fake;
/* What tsn_get_properties writes, and what every fake returns. */
extern tsn_props_t fake_props;
extern tsn_result_t fake_rc;
