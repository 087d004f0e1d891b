// The matching rule (plugin/protocol/matching.ts): a message goes to the earliest posted
// receive with an unused entry of its tag, equal tags keep their order. Every case checks
// the exact (receive, entry, message) triples in order; a seeded property test compares the
// Matcher with a plain reference implementation of the rule.
import { describe, expect, it } from 'vitest';
import { MAX_ENTRIES, Matcher, type RecvEntry, sizeError } from '../../plugin/protocol/matching';
import { prng, shuffle } from '../support/data';

/** A Matcher over named receives and messages that records its matches as "recv[index]=msg". */
function matcher() {
  const got: string[] = [];
  const m = new Matcher<string, string>((recv, index, msg) => got.push(`${recv}[${index}]=${msg}`));
  const post = (recv: string, ...tags: number[]) => m.post(recv, tags.map((tag) => ({ size: 100, tag })));
  /** Messages named by their tag and, for repeats, a letter: "1", "1b", "1c". */
  const arrive = (...tags: number[]) => {
    for (const tag of tags) {
      const n = (seen.get(tag) ?? 0) + 1;
      seen.set(tag, n);
      m.arrive(n === 1 ? `${tag}` : `${tag}${String.fromCharCode(96 + n)}`, tag);
    }
  };
  const seen = new Map<number, number>();
  /** The matches since the last call. */
  const take = () => got.splice(0);
  return { m, post, arrive, take };
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

function permutations<T>(xs: T[]): T[][] {
  if (xs.length <= 1) return [xs];
  return xs.flatMap((x, i) => permutations([...xs.slice(0, i), ...xs.slice(i + 1)]).map((p) => [x, ...p]));
}

describe('matching: single receives', () => {
  it('take messages in FIFO order, posts before sends', () => {
    const t = matcher();
    for (const r of ['A', 'B', 'C']) t.post(r, 5);
    t.arrive(5, 5, 5);
    expect(t.take()).toEqual(['A[0]=5', 'B[0]=5b', 'C[0]=5c']);
    expect(t.m.posted).toBe(0);
  });

  it('take messages in FIFO order, sends before posts', () => {
    const t = matcher();
    t.arrive(5, 5, 5);
    expect(t.take()).toEqual([]);
    expect(t.m.waiting).toBe(3);
    for (const r of ['A', 'B', 'C']) t.post(r, 5);
    expect(t.take()).toEqual(['A[0]=5', 'B[0]=5b', 'C[0]=5c']);
    expect(t.m.waiting).toBe(0);
    expect(t.m.posted).toBe(0);
  });

  it('with posts and sends interleaved, over many rounds (the ring buffers wrap and grow)', () => {
    const t = matcher();
    const want: string[] = [];
    for (let round = 0; round < 50; round++) {
      for (let k = 0; k < round % 7; k++) t.post(`R${round}.${k}`, 0);
      for (let k = 0; k < round % 5; k++) t.m.arrive(`m${round}.${k}`, 0);
    }
    // The same sequence through a plain FIFO.
    const recvs: string[] = [];
    const msgs: string[] = [];
    for (let round = 0; round < 50; round++) {
      for (let k = 0; k < round % 7; k++) recvs.push(`R${round}.${k}`);
      for (let k = 0; k < round % 5; k++) msgs.push(`m${round}.${k}`);
    }
    for (let i = 0; i < Math.min(recvs.length, msgs.length); i++) want.push(`${recvs[i]}[0]=${msgs[i]}`);
    expect(t.take()).toEqual(want);
    expect(t.m.posted).toBe(recvs.length - want.length);
    expect(t.m.waiting).toBe(Math.max(0, msgs.length - recvs.length));
  });

  it('a message matches as soon as it arrives, before arrive returns', () => {
    const t = matcher();
    t.post('A', 3);
    t.arrive(3);
    expect(t.take()).toEqual(['A[0]=3']);
  });
});

describe('matching: one group', () => {
  it.each(permutations([0, 1, 2, 3]).map((p) => [p.join(','), p]))('tags 0..3 sent in the order %s', (_, order) => {
    for (const postFirst of [true, false]) {
      const t = matcher();
      if (postFirst) t.post('G', 0, 1, 2, 3);
      t.arrive(...order);
      if (!postFirst) t.post('G', 0, 1, 2, 3);
      expect(t.take()).toEqual(order.map((tag) => `G[${tag}]=${tag}`));
      expect(t.m.posted).toBe(0);
    }
  });

  it('tags 0..7 sent in random orders', () => {
    const rnd = prng(8);
    for (let k = 0; k < 200; k++) {
      const order = shuffle(range(8), rnd);
      const t = matcher();
      t.post('G', ...range(8));
      t.arrive(...order);
      expect(t.take()).toEqual(order.map((tag) => `G[${tag}]=${tag}`));
    }
  });

  it('a group posted after its messages takes them reported in arrival order, not entry order', () => {
    const t = matcher();
    t.arrive(6, 2, 7, 0);
    t.post('G', 0, 2, 6, 7);
    expect(t.take()).toEqual(['G[2]=6', 'G[1]=2', 'G[3]=7', 'G[0]=0']);
  });

  it('equal tags fill their entries in entry order (AllToAll with PXN)', () => {
    const t = matcher();
    t.post('G', 4, 9, 4, 4);
    t.arrive(4, 4, 9, 4);
    expect(t.take()).toEqual(['G[0]=4', 'G[2]=4b', 'G[1]=9', 'G[3]=4c']);
  });

  it('a group partly matched by waiting messages takes the rest as they come', () => {
    const t = matcher();
    t.arrive(1);
    t.post('G', 0, 1, 2);
    expect(t.take()).toEqual(['G[1]=1']);
    expect(t.m.posted).toBe(1);
    t.arrive(2, 0);
    expect(t.take()).toEqual(['G[2]=2', 'G[0]=0']);
    expect(t.m.posted).toBe(0);
  });

  it('refuses a receive of no entries or more than 8', () => {
    const { m } = matcher();
    expect(() => m.post('X', [])).toThrow(/1 to 8 entries, not 0/);
    const nine: RecvEntry[] = range(MAX_ENTRIES + 1).map((tag) => ({ size: 1, tag }));
    expect(() => m.post('X', nine)).toThrow(/not 9/);
  });
});

describe("matching: the issue's failing cases", () => {
  it('a single receive (tag 8) before a group (tags 0..7); sends 0, 8, 1..7', () => {
    const t = matcher();
    t.post('A', 8);
    t.post('B', ...range(8));
    t.arrive(0, 8, 1, 2, 3, 4, 5, 6, 7);
    expect(t.take()).toEqual(['B[0]=0', 'A[0]=8', ...range(7).map((i) => `B[${i + 1}]=${i + 1}`)]);
    expect(t.m.posted).toBe(0);
  });

  it('the same with every send before the posts', () => {
    const t = matcher();
    t.arrive(0, 8, 1, 2, 3, 4, 5, 6, 7);
    t.post('A', 8);
    expect(t.take()).toEqual(['A[0]=8']);
    t.post('B', ...range(8));
    expect(t.take()).toEqual(['B[0]=0', ...range(7).map((i) => `B[${i + 1}]=${i + 1}`)]);
  });

  it('two groups with equal tags: a second tag-1 message before the first group is full goes to the next group', () => {
    const t = matcher();
    t.post('G1', 0, 1, 2, 3);
    t.post('G2', 0, 1, 2, 3);
    t.arrive(0, 1, 1, 2, 0, 3, 2, 3);
    expect(t.take()).toEqual(['G1[0]=0', 'G1[1]=1', 'G2[1]=1b', 'G1[2]=2', 'G2[0]=0b', 'G1[3]=3', 'G2[2]=2b', 'G2[3]=3b']);
  });

  it('three groups of 8 with equal tags and sends interleaved across them', () => {
    const rnd = prng(3);
    for (let round = 0; round < 50; round++) {
      const t = matcher();
      for (const g of ['G1', 'G2', 'G3']) t.post(g, ...range(8));
      // Each tag three times, in any order: the k-th message of a tag goes to group k.
      const mixed = shuffle([...range(8), ...range(8), ...range(8)], rnd);
      t.arrive(...mixed);
      const nth = new Map<number, number>();
      const want = mixed.map((tag) => {
        const k = nth.get(tag) ?? 0;
        nth.set(tag, k + 1);
        return `G${k + 1}[${tag}]=${tag}${k ? String.fromCharCode(97 + k) : ''}`;
      });
      expect(t.take()).toEqual(want);
      expect(t.m.posted).toBe(0);
    }
  });

  it('three groups with equal tags, a batch spanning them', () => {
    const t = matcher();
    for (const g of ['G1', 'G2', 'G3']) t.post(g, 0, 1);
    t.arrive(1, 1, 0, 1, 0, 0);
    expect(t.take()).toEqual(['G1[1]=1', 'G2[1]=1b', 'G1[0]=0', 'G3[1]=1c', 'G2[0]=0b', 'G3[0]=0c']);
  });

  it('single and grouped receives alternating', () => {
    const t = matcher();
    t.post('S1', 0);
    t.post('G1', 0, 1, 2, 3);
    t.post('S2', 0);
    t.post('G2', 0, 1, 2, 3);
    t.arrive(3, 0, 0, 1, 0, 2, 0, 1, 2, 3);
    expect(t.take()).toEqual([
      'G1[3]=3',
      'S1[0]=0',
      'G1[0]=0b',
      'G1[1]=1',
      'S2[0]=0c',
      'G1[2]=2',
      'G2[0]=0d',
      'G2[1]=1b',
      'G2[2]=2b',
      'G2[3]=3b',
    ]);
  });

  it('single and grouped receives alternating, posted after the sends', () => {
    const t = matcher();
    t.arrive(3, 0, 0, 1, 0, 2, 0, 1, 2, 3);
    t.post('S1', 0);
    t.post('G1', 0, 1, 2, 3);
    t.post('S2', 0);
    t.post('G2', 0, 1, 2, 3);
    expect(t.take()).toEqual(['S1[0]=0', 'G1[3]=3', 'G1[0]=0b', 'G1[1]=1', 'G1[2]=2', 'S2[0]=0c', 'G2[0]=0d', 'G2[1]=1b', 'G2[2]=2b', 'G2[3]=3b']);
  });
});

describe('matching: messages that match nothing', () => {
  it('a tag no posted receive has waits, and describeOpen names the tags that are open', () => {
    const t = matcher();
    t.post('A', 0, 1, 2);
    t.post('B', 3);
    t.arrive(42, 1);
    expect(t.take()).toEqual(['A[1]=1']);
    expect(t.m.waiting).toBe(1);
    expect(t.m.oldestWaiting()).toEqual({ msg: '42', tag: 42 });
    expect(t.m.describeOpen()).toBe('posted receives have unused tags 0, 2, 3 (2 receives)');
  });

  it('a tag whose entries are all used waits for the next receive', () => {
    const t = matcher();
    t.post('A', 7, 7);
    t.arrive(7, 7, 7);
    expect(t.take()).toEqual(['A[0]=7', 'A[1]=7b']);
    expect(t.m.waiting).toBe(1);
    expect(t.m.describeOpen()).toBe('no receive is posted');
    t.post('B', 7);
    expect(t.take()).toEqual(['B[0]=7c']);
  });

  it('a waiting message does not hold up a later one with another tag', () => {
    const t = matcher();
    t.post('A', 8);
    t.arrive(0, 8);
    expect(t.take()).toEqual(['A[0]=8']);
    expect(t.m.oldestWaiting()).toEqual({ msg: '0', tag: 0 });
  });

  it('describeOpen with one receive and one tag, and duplicates listed once', () => {
    const t = matcher();
    t.post('A', 5, 5);
    expect(t.m.describeOpen()).toBe('posted receives have unused tag 5 (1 receive)');
  });

  it('oldestWaiting is the earliest arrival across tags; forEachWaiting lists all in arrival order', () => {
    const t = matcher();
    t.arrive(3, 1, 3, 2);
    expect(t.m.oldestWaiting()).toEqual({ msg: '3', tag: 3 });
    t.post('A', 3);
    expect(t.m.oldestWaiting()).toEqual({ msg: '1', tag: 1 });
    const seen: string[] = [];
    t.m.forEachWaiting((msg, tag) => seen.push(`${msg}:${tag}`));
    expect(seen).toEqual(['1:1', '3b:3', '2:2']);
    // Listing does not disturb the order of matching.
    t.post('B', 3, 2, 1);
    expect(t.take()).toEqual(['A[0]=3', 'B[2]=1', 'B[0]=3b', 'B[1]=2']);
    expect(t.m.oldestWaiting()).toBeUndefined();
  });

  it('sizeError words an overflow and accepts what fits', () => {
    expect(sizeError(16384, 4096, 3)).toBe('a 16384-byte send does not fit the 4096-byte receive (tag 3)');
    expect(sizeError(4096, 4096, 3)).toBeUndefined();
    expect(sizeError(0, 0, 0)).toBeUndefined();
  });
});

describe('matching: removing and clearing', () => {
  it('removeRecv takes a posted receive out: its unused entries no longer match', () => {
    const t = matcher();
    t.post('A', 0, 1);
    t.post('B', 1, 2);
    t.arrive(0);
    expect(t.m.removeRecv('A')).toBe(true);
    expect(t.m.removeRecv('A')).toBe(false);
    expect(t.m.posted).toBe(1);
    t.arrive(1, 2);
    expect(t.take()).toEqual(['A[0]=0', 'B[0]=1', 'B[1]=2']);
    expect(t.m.removeRecv('B')).toBe(false); // full: already gone
  });

  it('removeRecv in the middle keeps the order of the others', () => {
    const t = matcher();
    for (const r of ['A', 'B', 'C', 'D']) t.post(r, 0, 0);
    t.m.removeRecv('B');
    t.m.removeRecv('C');
    t.post('E', 0);
    t.arrive(0, 0, 0, 0, 0, 0);
    expect(t.take()).toEqual(['A[0]=0', 'A[1]=0b', 'D[0]=0c', 'D[1]=0d', 'E[0]=0e']);
    expect(t.m.waiting).toBe(1);
  });

  it('a removed receive is not listed and its pooled record serves the next post', () => {
    const t = matcher();
    t.post('A', 1, 2);
    t.m.removeRecv('A');
    t.post('B', 2, 1);
    const seen: string[] = [];
    t.m.forEachRecv((r) => seen.push(r));
    expect(seen).toEqual(['B']);
    t.arrive(1, 2);
    expect(t.take()).toEqual(['B[1]=1', 'B[0]=2']);
  });

  it('forEachRecv lists posted receives in posting order and lets fn remove them', () => {
    const t = matcher();
    for (const r of ['A', 'B', 'C']) t.post(r, 1);
    const seen: string[] = [];
    t.m.forEachRecv((r) => {
      seen.push(r);
      t.m.removeRecv(r);
    });
    expect(seen).toEqual(['A', 'B', 'C']);
    expect(t.m.posted).toBe(0);
  });

  it('clear forgets receives and waiting messages; the matcher works on afterwards', () => {
    const t = matcher();
    t.post('A', 0, 1);
    t.arrive(0, 5);
    t.take();
    t.m.clear();
    expect([t.m.posted, t.m.waiting]).toEqual([0, 0]);
    t.post('B', 5);
    t.arrive(1, 5);
    expect(t.take()).toEqual(['B[0]=5b']);
    expect(t.m.oldestWaiting()).toEqual({ msg: '1', tag: 1 });
  });
});

describe('matching: calls made from inside onMatch', () => {
  it('are matched at once but reported after the current onMatch, in order', () => {
    const got: string[] = [];
    let depth = 0;
    const m: Matcher<string, string> = new Matcher((recv, index, msg) => {
      got.push(`${recv}[${index}]=${msg} depth ${depth}`);
      depth++;
      if (msg === 'x') {
        m.arrive('y', 1); // matches G[1] at once
        m.post('S', [{ size: 1, tag: 2 }]); // takes the waiting 'w'
      }
      depth--;
    });
    m.arrive('w', 2);
    m.arrive('v', 0);
    m.post('G', [
      { size: 1, tag: 0 },
      { size: 1, tag: 1 },
      { size: 1, tag: 3 },
    ]);
    m.arrive('x', 3);
    expect(got).toEqual(['G[0]=v depth 0', 'G[2]=x depth 0', 'G[1]=y depth 0', 'S[0]=w depth 0']);
    expect(m.posted).toBe(0);
  });

  it('a post whose batch triggers arrivals reports its whole batch first', () => {
    const got: string[] = [];
    const m: Matcher<string, string> = new Matcher((recv, index, msg) => {
      got.push(`${recv}[${index}]=${msg}`);
      if (msg === 'a') m.arrive('c', 2);
    });
    m.arrive('a', 0);
    m.arrive('b', 1);
    m.post('G', [0, 1, 2].map((tag) => ({ size: 1, tag })));
    expect(got).toEqual(['G[0]=a', 'G[1]=b', 'G[2]=c']);
  });

  it('removeRecv from inside onMatch drops the matches of that receive not yet reported', () => {
    const got: string[] = [];
    const m: Matcher<string, string> = new Matcher((recv, index, msg) => {
      got.push(`${recv}[${index}]=${msg}`);
      if (msg === 'a') expect(m.removeRecv('G')).toBe(true);
    });
    m.arrive('a', 0);
    m.arrive('b', 1);
    m.post('G', [0, 1, 2].map((tag) => ({ size: 1, tag })));
    m.arrive('c', 2);
    expect(got).toEqual(['G[0]=a']);
    expect(m.waiting).toBe(1);
  });

  it('a throwing onMatch leaves the rest of a batch for the next call', () => {
    const got: string[] = [];
    let boom = true;
    const m = new Matcher<string, string>((recv, index, msg) => {
      if (boom) {
        boom = false;
        throw new Error('boom');
      }
      got.push(`${recv}[${index}]=${msg}`);
    });
    m.arrive('a', 0);
    m.arrive('b', 1);
    expect(() => m.post('G', [0, 1, 2].map((tag) => ({ size: 1, tag })))).toThrow('boom');
    m.arrive('c', 2);
    expect(got).toEqual(['G[1]=b', 'G[2]=c']);
  });
});

// ---------------------------------------------------------------- against a reference

type Op = { post: string; tags: number[] } | { arrive: string; tag: number } | { remove: string };

/** The rule written plainly: after every event, each waiting message in arrival order takes the first unused entry of its tag in the earliest posted receive. */
class Reference {
  posted: { recv: string; tags: number[]; used: boolean[] }[] = [];
  waiting: { msg: string; tag: number }[] = [];
  out: string[] = [];

  apply(op: Op): void {
    if ('post' in op) this.posted.push({ recv: op.post, tags: op.tags, used: op.tags.map(() => false) });
    else if ('arrive' in op) this.waiting.push({ msg: op.arrive, tag: op.tag });
    else this.posted = this.posted.filter((r) => r.recv !== op.remove);
    const still: { msg: string; tag: number }[] = [];
    for (const w of this.waiting) {
      const r = this.posted.find((p) => p.tags.some((t, i) => t === w.tag && !p.used[i]));
      if (!r) {
        still.push(w);
        continue;
      }
      const i = r.tags.findIndex((t, k) => t === w.tag && !r.used[k]);
      r.used[i] = true;
      this.out.push(`${r.recv}[${i}]=${w.msg}`);
      if (r.used.every(Boolean)) this.posted.splice(this.posted.indexOf(r), 1);
    }
    this.waiting = still;
  }
}

describe('matching: random posts and arrivals against the reference', () => {
  it.each(range(40).map((s) => [s]))('seed %i', (seed) => {
    const rnd = prng(1000 + seed);
    const pick = (n: number) => Math.floor(rnd() * n);
    const ntags = 1 + pick(6); // few tags: many collisions
    const got: string[] = [];
    const m = new Matcher<string, string>((recv, index, msg) => got.push(`${recv}[${index}]=${msg}`));
    const ref = new Reference();
    let recvs = 0;
    let msgs = 0;
    const tagOf: number[] = [];
    for (let step = 0; step < 600; step++) {
      const roll = rnd();
      let op: Op;
      if (roll < 0.3) {
        const n = rnd() < 0.4 ? 1 : 1 + pick(8);
        op = { post: `R${recvs++}`, tags: range(n).map(() => pick(ntags)) };
        m.post(op.post, op.tags.map((tag) => ({ size: 0, tag })));
      } else if (roll < 0.33 && ref.posted.length > 0) {
        op = { remove: ref.posted[pick(ref.posted.length)].recv };
        expect(m.removeRecv(op.remove)).toBe(true);
      } else {
        op = { arrive: `m${msgs++}`, tag: pick(ntags) };
        tagOf.push(op.tag);
        m.arrive(op.arrive, op.tag);
      }
      ref.apply(op);
      expect(got).toEqual(ref.out);
      expect([m.posted, m.waiting]).toEqual([ref.posted.length, ref.waiting.length]);
    }
    const oldest = ref.waiting[0];
    expect(m.oldestWaiting()).toEqual(oldest && { msg: oldest.msg, tag: oldest.tag });
    const open = [...new Set(ref.posted.flatMap((r) => r.tags.filter((_, i) => !r.used[i])))].sort((a, b) => a - b);
    if (ref.posted.length) expect(m.describeOpen()).toContain(` ${open.join(', ')} (${ref.posted.length} receive`);
    // Equal tags kept their order: the messages of each tag were matched in arrival order.
    const lastOfTag = new Map<number, number>();
    for (const g of got) {
      const k = Number(g.split('=m')[1]);
      const tag = tagOf[k];
      expect(k).toBeGreaterThan(lastOfTag.get(tag) ?? -1);
      lastOfTag.set(tag, k);
    }
  });
});
