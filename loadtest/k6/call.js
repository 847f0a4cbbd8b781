// k6 load test of Cube's per-call auth model (docs/protocol.md "Per-call signing").
//
// Each VU keeps one connection (plaintext, schemas by server reflection) and never handshakes:
// every call carries x-cube-tenant, x-cube-key, x-cube-ts, x-cube-nonce and x-cube-sig, an
// HMAC-SHA256 (k6/crypto) over the CUBE1-CALL canonical string with a fresh nonce.
//
//   CUBE_CREDENTIALS=/abs/cube-data/dev-credentials.json k6 run loadtest/k6/call.js
//   CUBE_ADDR=127.0.0.1:50051 CUBE_TENANT=demo CUBE_KEY_ID=k-… CUBE_SECRET=<64 hex> \
//     k6 run --vus 8 --duration 30s loadtest/k6/call.js
//
// Environment: CUBE_CREDENTIALS, CUBE_ADDR, CUBE_TENANT, CUBE_KEY_ID, CUBE_SECRET (hex),
// CUBE_MIX, CUBE_CELLS, CUBE_Z (default 2), CUBE_TIMEOUT, CUBE_P99_MS; see lib.js.
// loadtest/k6/run.sh runs this against a cubed it starts itself.

import { config, makeOptions, CubeVU } from './lib.js';

const cfg = config(2);
export const options = makeOptions(cfg);
const vu = new CubeVU(cfg, 'call');

export default function () {
  vu.iteration();
}
