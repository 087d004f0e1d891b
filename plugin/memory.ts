// Registered regions: external views of NCCL's memory (no copy). An operation resolves its
// buffer as (region, offset, size); the native core has checked the range already.
import { internalError } from './errors';

export interface Region {
  readonly id: number;
  readonly comm: number;
  readonly buffer: ArrayBuffer;
  /** Operations in flight that may still touch this memory. */
  inflight: number;
}

export class Regions {
  private readonly byId = new Map<number, Region>();

  add(id: number, comm: number, buffer: ArrayBuffer): Region {
    const r: Region = { id, comm, buffer, inflight: 0 };
    this.byId.set(id, r);
    return r;
  }

  get(id: number): Region {
    const r = this.byId.get(id);
    if (!r) throw internalError(`no registered region ${id}`);
    return r;
  }

  delete(id: number): Region | undefined {
    const r = this.byId.get(id);
    this.byId.delete(id);
    return r;
  }

  /** The bytes [offset, offset+size) of region id; an empty view for size 0 without a region. */
  view(id: number, offset: number, size: number): Uint8Array {
    if (id === 0) {
      if (size !== 0) throw internalError('a non-empty buffer without a region');
      return new Uint8Array(0);
    }
    return new Uint8Array(this.get(id).buffer, offset, size);
  }
}
