// Shared by the TypeScript suites: deterministic byte patterns and their comparison, a small
// seeded generator. No vitest here: programs the suites run in child processes use it too
// (test/engine/close-race-main.ts); the log capture is in log-capture.ts.

export const KiB = 1024;
export const MiB = 1024 * KiB;

/** A deterministic byte pattern, different for each seed. */
export function fill(view: Uint8Array, seed: number): Uint8Array {
  let x = (seed * 2654435761 + 12345) >>> 0;
  for (let i = 0; i < view.length; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    view[i] = x >>> 24;
  }
  return view;
}

/** Index of the first byte where a and b differ, -1 when equal. */
export function firstDiff(a: Uint8Array, b: Uint8Array): number {
  if (a.length !== b.length) return Math.min(a.length, b.length);
  if (Buffer.from(a.buffer, a.byteOffset, a.length).equals(Buffer.from(b.buffer, b.byteOffset, b.length))) return -1;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return i;
  return -1;
}

/** True when every byte of v is value. */
export function allBytes(v: Uint8Array, value: number): boolean {
  for (let i = 0; i < v.length; i++) if (v[i] !== value) return false;
  return true;
}

/** mulberry32: a small seeded PRNG, floats in [0, 1). */
export function prng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/** xs in the random order rnd gives (Fisher-Yates). */
export function shuffle<T>(xs: readonly T[], rnd: () => number): T[] {
  const out = [...xs];
  for (let i = out.length - 1; i > 0; i--) {
    const j = Math.floor(rnd() * (i + 1));
    [out[i], out[j]] = [out[j], out[i]];
  }
  return out;
}
