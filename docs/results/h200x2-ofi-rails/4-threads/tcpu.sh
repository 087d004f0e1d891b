# per-thread CPU % of the running nccl-tests processes over $1 seconds
d=${1:-2}; declare -A a
for p in $(pgrep -f "_perf -b"); do for t in /proc/$p/task/*; do a[$t]=$(awk '{print $14+$15}' $t/stat 2>/dev/null); done; done
sleep $d
for t in "${!a[@]}"; do b=$(awk '{print $14+$15}' $t/stat 2>/dev/null) || continue; [ -n "$b" ] || continue
  echo "$(echo $t | cut -d/ -f3) $(cat $t/comm) $(( (b - a[$t]) * 100 / (100 * d) ))%"; done | sort -k1,1 -k3,3nr | awk '$3+0 >= 3'
