// Runs the native I/O engine's tests (test/io/io_entry.js) inside the real library's embedded
// Node: dlopens the plugin, inits it with TSNET_JS_ENTRY pointing at the test entry, then
// polls devices(): the entry answers ndev 0 while its tests run, 1 once they passed and a
// failing result code if one failed. Every log line of the plugin is printed to stdout.
//
//   io_harness [--lib PATH] [--entry PATH] [--timeout S]
// Exit status: 0 passed, 1 failed, 2 timed out, 3 could not load or init.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tsnet_abi.h"

static void logger(int level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags, (void)file, (void)line;
  char msg[4096];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  printf("[%d] %s\n", level, msg);
  fflush(stdout);
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void finish(int code, const char* why) {
  printf("io_harness: %s\n", why);
  fflush(stdout);
  _exit(code);  // the plugin and I/O threads run on; skip destructors that would race them
}

int main(int argc, char** argv) {
  const char* lib = "build/libnccl-net-tsnet.so";
  const char* entry = "test/io/io_entry.js";
  double timeout = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--lib")) lib = argv[i + 1];
    else if (!strcmp(argv[i], "--entry")) entry = argv[i + 1];
    else if (!strcmp(argv[i], "--timeout")) timeout = atof(argv[i + 1]);
    else finish(3, "usage: io_harness [--lib PATH] [--entry PATH] [--timeout S]");
  }
  char* real = realpath(entry, NULL);
  if (!real) finish(3, "the test entry was not found");
  setenv("TSNET_JS_ENTRY", real, 1);
  void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (!h) finish(3, dlerror());
  const tsn_net_v11_t* net = (const tsn_net_v11_t*)dlsym(h, "ncclNetPlugin_v11");
  if (!net) finish(3, "no ncclNetPlugin_v11 in the library");
  void* ctx = NULL;
  tsn_result_t rc = net->init(&ctx, 1, NULL, logger, NULL);
  if (rc != 0) finish(3, "init failed");
  double end = now() + timeout;
  while (now() < end) {
    int ndev = -1;
    rc = net->devices(&ndev);
    if (rc != 0) finish(1, "IO-TESTS FAILED (devices returned an error)");
    if (ndev > 0) finish(0, "IO-TESTS PASSED");
    usleep(50 * 1000);
  }
  finish(2, "timed out waiting for the tests");
  return 2;
}
