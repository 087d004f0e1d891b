// fork; the child reads 1 MiB of the parent's memory with process_vm_readv; argv[1]=="ptracer": the parent allows any ptracer first
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <sys/uio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
int main(int argc, char **argv) {
  static char buf[1 << 20], dst[1 << 20];
  memset(buf, 7, sizeof buf);
  if (argc > 1 && !strcmp(argv[1], "ptracer")) printf("prctl: %d\n", prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0));
  pid_t parent = getpid(); int p[2]; pipe(p);
  pid_t c = fork();
  if (c == 0) {
    struct iovec l = {dst, sizeof dst}, r = {buf, sizeof buf};
    ssize_t n = process_vm_readv(parent, &l, 1, &r, 1, 0);
    printf("child reads parent: %zd (%s) ok=%d\n", n, n < 0 ? strerror(errno) : "-", n > 0 && dst[100] == 7);
    fflush(stdout); _exit(0);
  }
  waitpid(c, 0, 0); return 0;
}
