// Test code passes addresses as the data path takes them (plugin/addr.ts).
import { hiOf, loOf } from '../../plugin/addr';

/** [hiOf(a), loOf(a)], to spread into a call's arguments. */
export function split(a: number): [number, number] {
  return [hiOf(a), loOf(a)];
}
