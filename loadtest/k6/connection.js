// k6 load test of Cube's per-connection auth model (docs/protocol.md "Per-connection handshake").
//
// Each VU owns one connection: on its first iteration it connects (plaintext, schemas by server
// reflection) and runs Auth.Challenge + Auth.Hello on it, checking server_mac; every later call
// on that connection carries no credentials. A call refused with UNAUTHENTICATED counts as an
// error and the next iteration handshakes again.
//
//   CUBE_CREDENTIALS=/abs/cube-data/dev-credentials.json k6 run loadtest/k6/connection.js
//   CUBE_ADDR=127.0.0.1:50051 CUBE_TENANT=demo CUBE_KEY_ID=k-… CUBE_SECRET=<64 hex> \
//     k6 run --vus 8 --duration 30s loadtest/k6/connection.js
//
// Environment: CUBE_CREDENTIALS, CUBE_ADDR, CUBE_TENANT, CUBE_KEY_ID, CUBE_SECRET (hex),
// CUBE_MIX, CUBE_CELLS, CUBE_Z (default 1), CUBE_TIMEOUT, CUBE_P99_MS; see lib.js.
// loadtest/k6/run.sh runs this against a cubed it starts itself.

import { config, makeOptions, CubeVU } from './lib.js';

const cfg = config(1);
export const options = makeOptions(cfg);
const vu = new CubeVU(cfg, 'connection');

export default function () {
  vu.iteration();
}
