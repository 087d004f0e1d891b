// Signal mask of every thread tsnet starts. tsnet is a guest in someone else's process: the
// host's asynchronous signals (SIGINT, SIGTERM, SIGCHLD, SIGUSR1, SIGALRM, ...) must go to the
// host's own threads, so tsnet's threads block them. Faults are different: a SIGSEGV, SIGBUS,
// SIGFPE, SIGILL, SIGTRAP or SIGSYS raised by a tsnet thread is delivered to that thread
// whatever its mask (the kernel unblocks it and resets it to the default action when it is
// blocked), so blocking them only kept the host's crash handlers (a training job's stack
// dumper, a test's crash report) from running. They stay unblocked. With TSNET_STALL_STACKS
// set, so does the signal of native/stacks.h, so that these threads' stacks can be dumped.
#pragma once
#include <signal.h>
#include <pthread.h>

#include "stacks.h"

namespace tsn {

inline void blockHostSignals() {
  sigset_t set;
  sigfillset(&set);
  static const int kFaults[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS};
  for (int s : kFaults) sigdelset(&set, s);
  if (stackDumpsOn()) sigdelset(&set, stackSignal());
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

}  // namespace tsn
