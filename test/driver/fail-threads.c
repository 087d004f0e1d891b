// Preloaded into the C driver by test/driver/threads.test.ts: pthread_create fails with EAGAIN
// from the Nth call of the process on (TSNET_TEST_FAIL_THREADS_FROM=N), as in a process that
// reached its thread limit (a container's pids.max, RLIMIT_NPROC); with
// TSNET_TEST_THREADS_COUNT set, it prints the number of each call to stderr instead.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

int pthread_create(pthread_t* t, const pthread_attr_t* a, void* (*f)(void*), void* arg) {
  static int (*real)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static int calls;
  if (!real) *(void**)&real = dlsym(RTLD_NEXT, "pthread_create");
  int n = __atomic_add_fetch(&calls, 1, __ATOMIC_SEQ_CST);
  if (getenv("TSNET_TEST_THREADS_COUNT")) fprintf(stderr, "fail-threads: pthread_create #%d\n", n);
  const char* from = getenv("TSNET_TEST_FAIL_THREADS_FROM");
  if (from && n >= atoi(from)) return EAGAIN;
  return real(t, a, f, arg);
}
