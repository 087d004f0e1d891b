// close-race.ts in a process of its own (close-race.test.ts runs it under AddressSanitizer with
// TSNET_TEST_ENGINE=build/asan/tsnet_engine.node): prints the result as JSON, exits 0, or 1 with why.
import { closeRace } from './close-race';
import { engine, portOf } from './helpers';

const [cycles, seed] = process.argv.slice(2).map(Number);
const IO_THREADS = 2;
closeRace(engine(IO_THREADS, 50), portOf(0), IO_THREADS, cycles || 1000, seed || 1).then(
  (r) => {
    console.log(JSON.stringify(r));
    process.exit(0);
  },
  (e) => {
    console.error(`close race: ${(e as Error).message}`);
    process.exit(1);
  },
);
