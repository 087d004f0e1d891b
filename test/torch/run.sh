#!/usr/bin/env bash
# Runs test/torch/guest.py under torchrun, one process per GPU, through tsnet and through
# NCCL's Socket transport, forced onto the network between the GPUs of one host (the
# variables of nccl-tests/variants.sh). By hand on a GPU machine with PyTorch; not part of
# npm test. Writes one raw log per run into OUT (MODE.VARIANT.log, rank 0's figures in
# MODE.VARIANT.json), runs.tsv (name, exit status, seconds) and summary.txt.
#
#   test/torch/run.sh PYTHON TSNET_SO OUT
#
# PYTHON is an interpreter with PyTorch built with CUDA (its NCCL is the one that loads tsnet).
# Environment (all optional):
#   MODES        check, killpeer, exitlive, many (default: check killpeer; guest.py says what each does)
#   VARIANTS     any of nccl-tests/variants.sh's (default: tsnet tsnet-ofi-host socket)
#   NPROC        processes, one GPU each (default: 2)
#   GUEST_ARGS   more arguments of guest.py (e.g. --steps 200)
#   RUN_TIMEOUT  seconds per run (default: 420)
#   EXTRA_ENV    "K=V K=V" added to every run (the ofi variants' FI_PROVIDER, TSNET_LIBFABRIC)
#
# A check run passes when torchrun exits 0: every rank's checks passed, the process groups
# were destroyed and the interpreters ended normally. A killpeer run passes when the ranks
# left behind end with an error from NCCL (guest.py's exit 3, which torchrun reports as a
# failure) well before the process group's timeout; summary.txt says which happened. An
# exitlive run passes when torchrun exits 0 though no process group was destroyed.
set -uo pipefail
py=${1:?python with PyTorch}
so=${2:?path of libnccl-net-tsnet.so}
out=${3:?output folder}
mkdir -p "$out"
out=$(cd "$out" && pwd)
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODES=${MODES:-check killpeer}
VARIANTS=${VARIANTS:-tsnet tsnet-ofi-host socket}
NPROC=${NPROC:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-420}
. "$here/../../nccl-tests/variants.sh"
for v in $VARIANTS; do variant_env "$v" > /dev/null; done
for m in $MODES; do case $m in check|killpeer|exitlive|many) ;; *) echo "unknown mode $m" >&2; exit 2 ;; esac; done

printf 'name\tstatus\tseconds\n' > "$out/runs.tsv"
: > "$out/summary.txt"
for mode in $MODES; do
  for v in $VARIANTS; do
    name="$mode.$v"
    env=("${common[@]}" $(variant_env "$v") ${EXTRA_ENV:-})
    # killpeer: no flight-recorder dump of PyTorch's (the survivors stamp the failure and exit themselves).
    [ "$mode" = killpeer ] && env+=(TORCH_NCCL_DUMP_ON_TIMEOUT=0)
    start=$(date +%s.%N)
    (
      echo "# tsnet torch guest run: $name"
      echo "# ranks: $NPROC"
      echo "# env: ${env[*]}"
      timeout "$RUN_TIMEOUT" env "${env[@]}" "$py" -m torch.distributed.run --standalone --nproc_per_node "$NPROC" \
        "$here/guest.py" --mode "$mode" --json "$out/$name.json" ${GUEST_ARGS:-}
    ) > "$out/$name.log" 2>&1
    status=$?
    end=$(date +%s.%N)
    secs=$(awk -v a="$start" -v b="$end" 'BEGIN{printf "%.1f", b-a}')
    printf "%s\t%s\t%s\n" "$name" "$status" "$secs" >> "$out/runs.tsv"
    log=$out/$name.log
    {
      printf '%s: exit %s in %s s, %s WARN line(s)\n' "$name" "$status" "$secs" "$(grep -c ' NCCL WARN ' "$log")"
      grep -E '^guest r[0-9]+: (torch |FAIL|phase |ddp:|fork:|timing:|done:|many:|the all_reduce failed|no error in|exits now|exits with|process group up)' "$log" | sed 's/^/  /'
      # NCCL's INFO line for each connection a rank made over the network (send and receive sides apart).
      printf '  network connections made, all ranks: %s\n' "$(grep -cE '\[(send|receive)\] via NET/' "$log")"
      if [ "$mode" = killpeer ]; then
        killed=$(sed -n 's/^guest r[0-9]*: exits now .* at \([0-9.]*\)$/\1/p' "$log" | head -1)
        seen=$(sed -n 's/^guest r[0-9]*: the all_reduce failed, seen at \([0-9.]*\),.*/\1/p' "$log" | sort -n | head -1)
        if [ -n "$killed" ]; then
          awk -v a="$killed" -v b="$end" 'BEGIN{printf "  the run ended %.1f s after the rank exited\n", b-a}'
          [ -n "$seen" ] && awk -v a="$killed" -v b="$seen" 'BEGIN{printf "  the first survivor saw the failure %.2f s after the rank exited\n", b-a}'
        fi
        if grep -q '^guest r[0-9]*: the all_reduce failed' "$log"; then echo "  verdict: the ranks left behind got an error"
        elif grep -q '^guest r[0-9]*: no error in' "$log"; then echo "  verdict: FAILED: the dead peer went unnoticed"
        elif grep -q 'Watchdog caught collective operation timeout' "$log"; then echo "  verdict: FAILED: only the process group's timeout ended them"
        elif grep -qiE 'ncclRemoteError|ncclSystemError|NCCL error|remote process exited' "$log"; then echo "  verdict: torch ended the ranks left behind on NCCL's error"
        else echo "  verdict: unknown: no error and no timeout in the log"; fi
      else
        [ "$status" = 0 ] && echo "  verdict: passed" || echo "  verdict: FAILED"
      fi
    } >> "$out/summary.txt"
    echo "torch guest: $name exit $status ($secs s)" >&2
  done
done
cat "$out/summary.txt"
exit 0
