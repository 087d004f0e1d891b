#!/usr/bin/env bash
# Runs nccl-tests (an existing build: pass its build folder) through tsnet and through NCCL's
# built-in Socket transport, in one go, forcing NCCL onto the network between the GPUs of
# one host. Writes one raw log per run into OUT, plus runs.tsv (name, exit status, seconds).
#
#   nccl-tests/run.sh NCCL_TESTS_BUILD TSNET_SO OUT
#
# Environment (all optional):
#   TESTS     which binaries            (default: all_reduce_perf alltoall_perf)
#   MODES     g2 = 2 GPUs in one process, mpi = 2 processes under mpirun (default: g2 mpi)
#   VARIANTS  tsnet socket socket-tuned (default: all three)
#   ARGS      nccl-tests arguments      (default: -b 8 -e 1G -f 2 -c 1 -n 10 -w 3)
#   RUN_TIMEOUT  seconds per run        (default: 240)
#   EXTRA_ENV "K=V K=V" added to every run (e.g. NCCL_PROTO=LL)
set -uo pipefail
build=${1:?nccl-tests build folder}
so=${2:?path of libnccl-net-tsnet.so}
out=${3:?output folder}
mkdir -p "$out"
TESTS=${TESTS:-all_reduce_perf alltoall_perf}
MODES=${MODES:-g2 mpi}
VARIANTS=${VARIANTS:-tsnet socket socket-tuned}
ARGS=${ARGS:--b 8 -e 1G -f 2 -c 1 -n 10 -w 3}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}

common=(NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET
        NCCL_SOCKET_IFNAME=lo)
variant_env() {
  case $1 in
    tsnet) echo "NCCL_NET=tsnet NCCL_NET_PLUGIN=$so" ;;
    socket) echo "NCCL_NET=Socket NCCL_NET_PLUGIN=none" ;;
    socket-tuned) echo "NCCL_NET=Socket NCCL_NET_PLUGIN=none NCCL_SOCKET_NTHREADS=4 NCCL_NSOCKS_PERTHREAD=4" ;;
    *) echo "unknown variant $1" >&2; exit 2 ;;
  esac
}

printf 'name\tstatus\tseconds\n' > "$out/runs.tsv"
for test in $TESTS; do
  for mode in $MODES; do
    for v in $VARIANTS; do
      name="$test.$mode.$v"
      env=("${common[@]}" $(variant_env "$v") ${EXTRA_ENV:-})
      start=$(date +%s.%N)
      {
        echo "# tsnet nccl-tests run: $name"
        echo "# env: ${env[*]}"
        echo "# args: $ARGS"
        if [ "$mode" = g2 ]; then
          timeout "$RUN_TIMEOUT" env "${env[@]}" "$build/$test" $ARGS -g 2
        else
          xs=(); for kv in "${env[@]}"; do xs+=(-x "$kv"); done
          timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe -np 2 --bind-to none \
            -x LD_LIBRARY_PATH -x PATH "${xs[@]}" "$build/$test" $ARGS -g 1
        fi
      } > "$out/$name.log" 2>&1
      status=$?
      end=$(date +%s.%N)
      printf "%s\t%s\t%s\n" "$name" "$status" "$(awk -v a="$start" -v b="$end" "BEGIN{printf \"%.1f\", b-a}")" >> "$out/runs.tsv"
      echo "nccl-tests: $name exit $status" >&2
    done
  done
done
