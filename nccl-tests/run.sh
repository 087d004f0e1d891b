#!/usr/bin/env bash
# Runs nccl-tests (an existing build: pass its build folder) through tsnet and through NCCL's
# built-in Socket transport, in one go, forcing NCCL onto the network between the GPUs of
# one host. Writes one raw log per run into OUT, plus runs.tsv (name, exit status, seconds).
#
#   nccl-tests/run.sh NCCL_TESTS_BUILD TSNET_SO OUT
#
# Environment (all optional):
#   TESTS     which binaries            (default: all_reduce_perf alltoall_perf)
#   MODES     g2   = 2 GPUs in one process (-g 2); g3 .. g8 likewise
#             mpi  = NP processes under mpirun, one GPU each
#             mpi1 = NP processes under mpirun all on GPU 0, each its own NCCL host
#                    (NCCL_HOSTID), with a CUDA MPS daemon of its own (default: g2 mpi)
#   NP        processes of the mpi modes (default: 2)
#   VARIANTS  any of nccl-tests/variants.sh's (default: tsnet socket socket-tuned); the ofi
#             variants take the provider and library from EXTRA_ENV (FI_PROVIDER=shm,
#             TSNET_LIBFABRIC=/path/libfabric.so.1)
#   ARGS      nccl-tests arguments      (default: -b 8 -e 1G -f 2 -c 1 -n 10 -w 3)
#   RUN_TIMEOUT  seconds per run        (default: 240)
#   EXTRA_ENV "K=V K=V" added to every run (e.g. NCCL_PROTO=LL)
#
# mpi1 needs nvidia-cuda-mps-control: without MPS the ranks' kernels time-slice the GPU and
# every collective takes milliseconds. The daemon runs with its pipe and log folders under
# OUT/mps only while a test's mpi1 runs go, and only those runs are pointed at it; its log
# ends up in OUT/mps-control.txt. Without the program the mpi1 runs are skipped (status 2).
set -uo pipefail
build=${1:?nccl-tests build folder}
so=${2:?path of libnccl-net-tsnet.so}
out=${3:?output folder}
mkdir -p "$out"
out=$(cd "$out" && pwd)
TESTS=${TESTS:-all_reduce_perf alltoall_perf}
MODES=${MODES:-g2 mpi}
NP=${NP:-2}
VARIANTS=${VARIANTS:-tsnet socket socket-tuned}
ARGS=${ARGS:--b 8 -e 1G -f 2 -c 1 -n 10 -w 3}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}

. "$(dirname "${BASH_SOURCE[0]}")/variants.sh"
for v in $VARIANTS; do variant_env "$v" > /dev/null; done
for mode in $MODES; do
  case $mode in g[2-8]|mpi|mpi1) ;; *) echo "unknown mode $mode" >&2; exit 2 ;; esac
done

# The MPS daemon of the mpi1 runs: private pipe and log folders (a unix socket's path must
# stay short, so the pipe goes under /tmp when OUT's path is long).
mps_log=$out/mps/log
mps_pipe=$out/mps/pipe
mps_tmp=
if [ ${#mps_pipe} -gt 80 ]; then mps_tmp=$(mktemp -d /tmp/tsnet-mps.XXXXXX) && mps_pipe=$mps_tmp; fi
mps_up=0
mps() { CUDA_MPS_PIPE_DIRECTORY=$mps_pipe CUDA_MPS_LOG_DIRECTORY=$mps_log "$@"; }
mps_start() {
  if ! command -v nvidia-cuda-mps-control > /dev/null; then
    echo "nccl-tests: nvidia-cuda-mps-control not found: skipping the mpi1 runs (without MPS the ranks time-slice the GPU)" >&2
    return 1
  fi
  mkdir -p "$mps_pipe" "$mps_log"
  if ! mps nvidia-cuda-mps-control -d; then
    echo "nccl-tests: nvidia-cuda-mps-control -d failed (see $mps_log/control.log): skipping these mpi1 runs" >&2
    return 1
  fi
  mps_up=1
}
mps_stop() {
  [ "$mps_up" = 1 ] || return 0
  echo quit | mps timeout 60 nvidia-cuda-mps-control
  mps_up=0
}
finish() {
  mps_stop
  for f in control server; do [ -f "$mps_log/$f.log" ] && cp "$mps_log/$f.log" "$out/mps-$f.txt"; done
  [ -n "$mps_tmp" ] && rm -rf "$mps_tmp"
  return 0
}
trap finish EXIT
trap 'exit 130' INT TERM

printf 'name\tstatus\tseconds\n' > "$out/runs.tsv"
for test in $TESTS; do
  for mode in $MODES; do
    skip=
    if [ "$mode" = mpi1 ]; then mps_start || skip="MPS daemon not running: mpi1 run skipped"; fi
    for v in $VARIANTS; do
      name="$test.$mode.$v"
      env=("${common[@]}" $(variant_env "$v") ${EXTRA_ENV:-})
      case $mode in
        g[2-8]) ranks=${mode#g}; what="$ranks GPUs in one process (-g $ranks)" ;;
        mpi) ranks=$NP; what="$NP processes under mpirun, one GPU each" ;;
        mpi1) ranks=$NP; what="$NP processes under mpirun on GPU 0, each its own NCCL host, MPS"
              env+=(NCCL_TESTS_DEVICE=0 CUDA_MPS_PIPE_DIRECTORY=$mps_pipe) ;;
      esac
      start=$(date +%s.%N)
      (
        echo "# tsnet nccl-tests run: $name"
        echo "# mode: $mode ($what)"
        echo "# ranks: $ranks"
        echo "# env: ${env[*]}"
        echo "# args: $ARGS"
        if [ -n "$skip" ]; then
          echo "nccl-tests: $skip"
          exit 2
        elif [ "${mode#g}" != "$mode" ]; then
          timeout "$RUN_TIMEOUT" env "${env[@]}" "$build/$test" $ARGS -g "$ranks"
        else
          xs=(); for kv in "${env[@]}"; do xs+=(-x "$kv"); done
          run=("$build/$test")
          # mpi1: NCCL refuses two ranks on one GPU of one host, so each rank names its own host.
          [ "$mode" = mpi1 ] && run=(sh -c 'export NCCL_HOSTID=tsnet-rank-${OMPI_COMM_WORLD_RANK:-$$}; exec "$0" "$@"' "${run[@]}")
          timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe -np "$NP" --bind-to none \
            -x LD_LIBRARY_PATH -x PATH "${xs[@]}" "${run[@]}" $ARGS -g 1
        fi
      ) > "$out/$name.log" 2>&1
      status=$?
      end=$(date +%s.%N)
      printf "%s\t%s\t%s\n" "$name" "$status" "$(awk -v a="$start" -v b="$end" "BEGIN{printf \"%.1f\", b-a}")" >> "$out/runs.tsv"
      echo "nccl-tests: $name exit $status" >&2
    done
    [ "$mode" = mpi1 ] && mps_stop
  done
done
exit 0
