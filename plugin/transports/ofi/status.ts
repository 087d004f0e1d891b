// The one table that turns a provider's error completion into a NetError: a peer that went
// away is a remote error, anything else the network or the OS failed at is a system error.
// The message names the operation, the rail and the provider's own words.
import { type NetError, remoteError, systemError } from '../../errors';
import type { Completion } from './fabric';

const NAMES: Record<number, string> = {
  1: 'EPERM',
  5: 'EIO',
  11: 'EAGAIN',
  12: 'ENOMEM',
  13: 'EACCES',
  22: 'EINVAL',
  32: 'EPIPE',
  61: 'ENODATA',
  101: 'ENETUNREACH',
  103: 'ECONNABORTED',
  104: 'ECONNRESET',
  107: 'ENOTCONN',
  110: 'ETIMEDOUT',
  111: 'ECONNREFUSED',
  113: 'EHOSTUNREACH',
  125: 'ECANCELED',
  260: 'FI_EOTHER',
  265: 'FI_ETRUNC',
  274: 'FI_ENORX',
};

/** Statuses that mean the peer is gone or unreachable. */
const PEER_GONE = new Set([32, 101, 103, 104, 107, 110, 111, 113, 274]);

export const ECANCELED = 125;

export function statusName(status: number): string {
  const e = -status;
  return NAMES[e] ?? `errno ${e}`;
}

/** The error for a failed completion of `what` on rail `rail`. */
export function completionError(who: string, what: string, rail: number, c: Completion): NetError {
  const msg = `${who}: ${what} on rail ${rail} failed: ${c.error || 'no details from the provider'} (${statusName(c.status)})`;
  return PEER_GONE.has(-c.status) ? remoteError(msg) : systemError(msg);
}
