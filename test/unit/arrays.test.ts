// objectArray (plugin/arrays.ts): the pools hot code pushes objects into start as arrays of
// objects, so that code V8 compiled for one comm's pool is not thrown away on the next comm's
// (performance.md, item 16). V8's own test functions tell the kinds apart.
import v8 from 'node:v8';
import { describe, expect, it } from 'vitest';
import { COPY_LOOP_BELOW, copyBytes, objectArray } from '../../plugin/arrays';
import { Matcher } from '../../plugin/protocol/matching';

v8.setFlagsFromString('--allow-natives-syntax');
const hasSmiElements = new Function('a', 'return %HasSmiElements(a)') as (a: unknown[]) => boolean;
const hasObjectElements = new Function('a', 'return %HasObjectElements(a)') as (a: unknown[]) => boolean;

describe('objectArray', () => {
  it('is empty and holds objects from the start, where a [] literal holds small integers', () => {
    const literal: object[] = [];
    expect(hasSmiElements(literal)).toBe(true);
    const a = objectArray<{ x: number }>();
    expect(a).toEqual([]);
    expect(hasSmiElements(a)).toBe(false);
    expect(hasObjectElements(a)).toBe(true);
    a.push({ x: 1 }, { x: 2 });
    expect(a.pop()).toEqual({ x: 2 });
    expect(a).toEqual([{ x: 1 }]);
  });

  it('a new Matcher\'s pool of receives holds objects before its first receive', () => {
    const m = new Matcher<number, number>(() => {});
    const pool = (m as unknown as { pool: unknown[] }).pool;
    expect(pool).toEqual([]);
    expect(hasObjectElements(pool)).toBe(true);
  });
});

describe('copyBytes', () => {
  it('copies exactly len bytes between offsets, by loop below COPY_LOOP_BELOW and by view above', () => {
    for (const len of [0, 1, 8, COPY_LOOP_BELOW - 1, COPY_LOOP_BELOW, 3 * COPY_LOOP_BELOW + 5]) {
      const src = Uint8Array.from({ length: len + 20 }, (_, i) => (i * 7 + 3) & 0xff);
      const dst = new Uint8Array(len + 40).fill(0xee);
      copyBytes(dst, 11, src, 5, len);
      expect(Array.from(dst.subarray(11, 11 + len))).toEqual(Array.from(src.subarray(5, 5 + len)));
      expect(dst.subarray(0, 11).every((b) => b === 0xee)).toBe(true);
      expect(dst.subarray(11 + len).every((b) => b === 0xee)).toBe(true);
    }
  });
});
