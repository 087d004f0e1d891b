# Splits the one-way path of a traced tsnet-lat run: two trace files (one per process).
import json, sys, bisect
def load(f):
    reqs = {}
    for line in open(f):
        line = line.strip().rstrip(',')
        if not line.startswith('{'): continue
        try: e = json.loads(line)
        except Exception: continue
        if e.get('ph') not in ('b', 'n', 'e'): continue
        r = reqs.setdefault((e['cat'], e['id']), {})
        if e['ph'] == 'b': r['post'] = e['ts']; r['name'] = e['name']
        elif e['ph'] == 'n': r['sent' if e['name'] == 'written' else e['name']] = e['ts']
        else: r['end'] = e['ts']
    return [r for r in reqs.values() if 'post' in r and 'end' in r]
def med(x):
    x = sorted(x); n = len(x)
    return f"{x[n//2]:7.2f} (p10 {x[n//10]:6.2f}, p90 {x[9*n//10]:6.2f}, n={n})" if n else "-"
A, B = load(sys.argv[1]), load(sys.argv[2])
for name, S, R in (('A->B', A, B), ('B->A', B, A)):
    sends = sorted([r for r in S if r['name'].startswith('isend') and 'sent' in r], key=lambda r: r['post'])
    recvs = sorted([r for r in R if r['name'].startswith('irecv') and 'landed' in r], key=lambda r: r['landed'])
    sends = sends[len(sends)//5:]
    posts = [r['post'] for r in sends]
    pairs = []
    for r in recvs:
        i = bisect.bisect_right(posts, r['landed']) - 1
        if i >= 0: pairs.append((sends[i], r))
    print(f"{name}: isend posted -> picked up by the protocol thread {med([s['picked up'] - s['post'] for s, _ in pairs])}")
    print(f"{name}: picked up -> the receiver's I/O thread reads the message {med([r['landed'] - s['picked up'] for s, r in pairs])}")
    print(f"{name}: picked up -> the sender's I/O thread reads the send completion {med([s['sent'] - s['picked up'] for s, _ in pairs])}")
    print(f"{name}: message read -> the receiving protocol thread completes the irecv {med([r['end'] - r['landed'] for _, r in pairs])}")
    print(f"{name}: isend posted -> irecv complete {med([r['end'] - s['post'] for s, r in pairs])}")
