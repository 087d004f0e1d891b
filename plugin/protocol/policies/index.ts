// The protocol's policies, one job per module (eager.ts, stripes.ts, lanes.ts), chosen by
// configuration (TSNET_EAGER_POLICY, TSNET_STRIPE_POLICY, TSNET_LANE_POLICY) by name. The
// sender's choice travels in its greeting by id, so both ends of a link cut and place every
// message alike. An experiment adds a module and a line here.
import { type EagerPolicy, threshold } from './eager';
import { type LanePolicy, byTag, roundRobin } from './lanes';
import { type StripePolicy, even, fixed } from './stripes';

export type { EagerPolicy, LanePolicy, StripePolicy };
export { stripeCount } from './stripes';

export const EAGER_POLICIES: readonly EagerPolicy[] = [threshold];
export const STRIPE_POLICIES: readonly StripePolicy[] = [even, fixed];
export const LANE_POLICIES: readonly LanePolicy[] = [roundRobin, byTag];

/** What both ends of a link agree on (the sender's settings). */
export interface SchedulePolicy {
  eagerMax: number;
  minStripe: number;
  lanes: number;
  eager: EagerPolicy;
  stripes: StripePolicy;
  laneChoice: LanePolicy;
}

export function byName<P extends { name: string }>(list: readonly P[], name: string): P | undefined {
  return list.find((p) => p.name === name);
}

export function byId<P extends { id: number }>(list: readonly P[], id: number): P | undefined {
  return list.find((p) => p.id === id);
}

export const DEFAULT_POLICIES = { eager: threshold, stripes: even, laneChoice: roundRobin };

/** The schedule this side's configuration asks for (a sender's; a receiver takes its peer's). */
export function configuredPolicy(c: { eagerMax: number; minStripe: number; nsocks: number; eagerPolicy: EagerPolicy; stripePolicy: StripePolicy; lanePolicy: LanePolicy }): SchedulePolicy {
  return { eagerMax: c.eagerMax, minStripe: c.minStripe, lanes: c.nsocks, eager: c.eagerPolicy, stripes: c.stripePolicy, laneChoice: c.lanePolicy };
}
