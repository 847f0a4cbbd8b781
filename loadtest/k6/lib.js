// Shared code of loadtest/k6/connection.js and loadtest/k6/call.js: configuration, the two
// authentication models of docs/protocol.md, the op mix, checks and thresholds.
//
// The canonical strings mirror loadtest/python/cube_client.py exactly; selfTest() below checks
// them against the published test vectors (docs/protocol.md "Test vectors") before any load.
//
// Environment (all optional except credentials):
//   CUBE_CREDENTIALS  absolute path of a credentials JSON ({"tenant","key_id","secret","endpoint"},
//                     e.g. <data-dir>/dev-credentials.json); the variables below override its fields
//   CUBE_ADDR         host:port of cubed, plaintext (default: the file's endpoint, else 127.0.0.1:50051)
//   CUBE_TENANT, CUBE_KEY_ID, CUBE_SECRET (64 hex characters)
//   CUBE_MIX          op weights, e.g. "write=45,read=45,stats=10" (the default)
//   CUBE_CELLS        cells per VU the ops cycle over (default 64)
//   CUBE_Z            z coordinate of this run's cells (default: 1 in connection.js, 2 in call.js),
//                     so that concurrent runs do not overwrite each other's read-back values
//   CUBE_TIMEOUT      per-call timeout (default 3s, the seed experiment's per-op timeout)
//   CUBE_P99_MS       p99 threshold of grpc_req_duration in ms (default 500)
//   CUBE_STATS_METHOD the method the stats op calls (default cube.v1.Tenant/Stats; run.sh names
//                     one the server lacks, to check that an op that throws fails the run)
// VUs and duration: k6's own --vus/--duration or K6_VUS/K6_DURATION (default 4 VUs, 5 s).
// Set K6_NO_USAGE_REPORT=true (run.sh does): k6 otherwise reports usage to its vendor at the end.

import grpc from 'k6/net/grpc';
import crypto from 'k6/crypto';
import encoding from 'k6/encoding';
import exec from 'k6/execution';
import { check, fail, sleep } from 'k6';
import { Counter, Rate } from 'k6/metrics';

// ---------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------

function loadConfig(defaultZ) {
  let file = {};
  if (__ENV.CUBE_CREDENTIALS) {
    // open() is allowed only in the init context, which is where this runs.
    file = JSON.parse(open(__ENV.CUBE_CREDENTIALS));
  }
  const endpoint = file.endpoint || '';
  if (endpoint.startsWith('https://')) {
    fail('the k6 scripts speak plaintext only; start cubed without TLS (see loadtest/ghz for mTLS)');
  }
  const cfg = {
    addr: __ENV.CUBE_ADDR || endpoint.replace(/^http:\/\//, '').replace(/\/$/, '') || '127.0.0.1:50051',
    tenant: __ENV.CUBE_TENANT || file.tenant,
    keyId: __ENV.CUBE_KEY_ID || file.key_id,
    secretHex: __ENV.CUBE_SECRET || file.secret,
    mix: parseMix(__ENV.CUBE_MIX || 'write=45,read=45,stats=10'),
    cells: parseInt(__ENV.CUBE_CELLS || '64', 10),
    z: parseInt(__ENV.CUBE_Z || String(defaultZ), 10),
    timeout: __ENV.CUBE_TIMEOUT || '3s',
    p99Ms: parseInt(__ENV.CUBE_P99_MS || '500', 10),
    statsMethod: __ENV.CUBE_STATS_METHOD || 'cube.v1.Tenant/Stats',
  };
  if (!cfg.tenant || !cfg.keyId || !cfg.secretHex) {
    fail('set CUBE_CREDENTIALS, or CUBE_TENANT, CUBE_KEY_ID and CUBE_SECRET');
  }
  if (!/^[0-9a-f]{64}$/.test(cfg.secretHex)) {
    fail('CUBE_SECRET must be 64 lowercase hex characters');
  }
  if (!(cfg.cells > 0)) fail('CUBE_CELLS must be a positive integer');
  // NaN would make the threshold `p(99)<NaN`, which every run crosses: a configuration error
  // reported as a latency failure.
  if (!(cfg.p99Ms > 0)) fail('CUBE_P99_MS must be a positive integer (milliseconds)');
  // The secret is the 32 decoded bytes, not the hex text (docs/protocol.md "Credentials").
  cfg.secret = hexToBytes(cfg.secretHex);
  return cfg;
}

function parseMix(s) {
  const known = { write: 1, read: 1, stats: 1 };
  const ops = [];
  let total = 0;
  for (const part of s.split(',')) {
    const [name, w] = part.split('=');
    const weight = parseInt(w, 10);
    if (!known[name] || !(weight >= 0)) fail(`CUBE_MIX: bad entry '${part}' (ops: write, read, stats)`);
    total += weight;
    ops.push({ name, upTo: total });
  }
  if (total === 0) fail('CUBE_MIX: all weights are 0');
  return { ops, total };
}

// ---------------------------------------------------------------------------------------------
// Bytes, hex, MACs
// ---------------------------------------------------------------------------------------------

const HEX = [];
for (let i = 0; i < 256; i++) HEX.push((i < 16 ? '0' : '') + i.toString(16));

export function bytesToHex(buf) {
  const b = new Uint8Array(buf);
  let s = '';
  for (let i = 0; i < b.length; i++) s += HEX[b[i]];
  return s;
}

export function hexToBytes(hex) {
  const b = new Uint8Array(hex.length / 2);
  for (let i = 0; i < b.length; i++) b[i] = parseInt(hex.substr(2 * i, 2), 16);
  return b.buffer;
}

// "CUBE1-CALL\n" + method_path + "\n" + tenant + "\n" + key_id + "\n" + ts + "\n" + nonce, lowercase hex.
export function callSignature(secret, methodPath, tenant, keyId, ts, nonce) {
  const canonical = ['CUBE1-CALL', methodPath, tenant, keyId, ts, nonce].join('\n');
  return crypto.hmac('sha256', secret, canonical, 'hex');
}

// HelloRequest.mac: over hex(nonce) and hex(client_nonce). Returned as base64 because k6 passes
// messages through the protobuf JSON mapping, where bytes fields are base64 strings.
export function helloMacB64(secret, tenant, keyId, nonceHex, clientNonceHex) {
  const canonical = ['CUBE1-HELLO', tenant, keyId, nonceHex, clientNonceHex].join('\n');
  return crypto.hmac('sha256', secret, canonical, 'base64');
}

export function serverMacB64(secret, nonceHex, clientNonceHex) {
  return crypto.hmac('sha256', secret, ['CUBE1-SERVER', nonceHex, clientNonceHex].join('\n'), 'base64');
}

// The five x-cube-* entries for one call; a fresh ts and nonce every time (a retry, too).
export function signCall(cfg, methodPath) {
  const ts = String(Date.now()); // integer ms: digits only, no sign, no leading zeros
  const nonce = bytesToHex(crypto.randomBytes(16));
  return {
    'x-cube-tenant': cfg.tenant,
    'x-cube-key': cfg.keyId,
    'x-cube-ts': ts,
    'x-cube-nonce': nonce,
    'x-cube-sig': callSignature(cfg.secret, methodPath, cfg.tenant, cfg.keyId, ts, nonce),
  };
}

// docs/protocol.md "Test vectors": a wrong canonical string would otherwise show up only as a
// run full of UNAUTHENTICATED, indistinguishable from a wrong secret.
function selfTest() {
  const secret = hexToBytes('000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f');
  const sig = callSignature(secret, '/cube.v1.Cells/Write', 'acme', 'k1', '1700000000000',
    '000102030405060708090a0b0c0d0e0f');
  const nonce = new Uint8Array(32).map((_, i) => 0x64 + i);
  const cnonce = new Uint8Array(16).map((_, i) => 0xc8 + i);
  const mac = bytesToHex(encoding.b64decode(
    helloMacB64(secret, 'acme', 'k1', bytesToHex(nonce.buffer), bytesToHex(cnonce.buffer)), 'std'));
  const smac = bytesToHex(encoding.b64decode(
    serverMacB64(secret, bytesToHex(nonce.buffer), bytesToHex(cnonce.buffer)), 'std'));
  const want = {
    sig: 'a5befc7529906f3b79aec5655c8d4ab40a30a1d6a13db8bf42672603dfa873d3',
    mac: '4e59e4f5651ca616f5fadb65366b4417ed8befee0abbc9aa9dbcac7a1f39919f',
    smac: '9bdd978c20c9c34e1f430029653caa565806164a01e6446b0e679e2c4e1153be',
  };
  if (sig !== want.sig) fail(`test vector: call signature ${sig} != ${want.sig}`);
  if (mac !== want.mac) fail(`test vector: hello mac ${mac} != ${want.mac}`);
  if (smac !== want.smac) fail(`test vector: server_mac ${smac} != ${want.smac}`);
}

// ---------------------------------------------------------------------------------------------
// Metrics, options
// ---------------------------------------------------------------------------------------------

// One sample per op: true when the op failed (any non-OK status or a wrong reply) or could not
// be tried because the handshake failed. Kept apart from `checks`, whose rate also counts the
// handshake's checks and the second check of each reply.
const opErrors = new Rate('cube_op_errors');
const handshakes = new Counter('cube_handshakes');
const handshakeFailures = new Counter('cube_handshake_failures');
// Reads that answered OK with something other than this VU's last acknowledged write to that
// cell: a lost or wrong acknowledged write, never load noise, so one fails the run.
const readbackMismatches = new Counter('cube_readback_mismatches');

export function makeOptions(cfg) {
  const p99 = `p(99)<${cfg.p99Ms}`;
  return {
    vus: 4,
    duration: '5s',
    // The seed experiment's verdict was blurred by counting timeouts with everything else; here
    // failed ops may be at most 0.1% (a short run against a loaded machine), a read that
    // contradicts an acknowledged write none at all, and latency is judged per op.
    thresholds: {
      checks: ['rate>0.999'],
      cube_op_errors: ['rate<0.001'],
      cube_readback_mismatches: ['count==0'],
      grpc_req_duration: [p99],
      'grpc_req_duration{op:write}': [p99],
      'grpc_req_duration{op:read}': [p99],
      'grpc_req_duration{op:stats}': [p99],
    },
    summaryTrendStats: ['avg', 'med', 'p(95)', 'p(99)', 'max'],
  };
}

// ---------------------------------------------------------------------------------------------
// One VU's client
// ---------------------------------------------------------------------------------------------

// model: 'connection' (handshake once per connection, unsigned calls) or 'call' (every call
// signed). One VU = one grpc.Client = one HTTP/2 connection (grpc-go, one address, one
// subchannel), so a session opened by Hello belongs to this VU alone.
export class CubeVU {
  constructor(cfg, model) {
    selfTest();
    this.cfg = cfg;
    this.model = model;
    this.client = new grpc.Client(); // must be created in the init context
    this.connected = false;
    this.authenticated = false;
    this.written = {}; // slot -> value (base64) this VU last wrote there, for read-back checks
    this.iter = 0;
  }

  connect() {
    // k6 registers the reflected types in one process-wide registry, and two VUs doing that at
    // once can panic ("message ... is already registered", grafana/k6#3961; seen once in
    // .ci/run with k6 1.1.0): the VUs' first connections are staggered by 500 ms each (a
    // connect with reflection can take a few hundred ms on a loaded machine), closer together
    // when there are more than 4 VUs so that the last one starts within 2 s (a longer wait
    // could outlast the run, and run.sh wants one handshake per VU).
    if (!this.staggered) {
      this.staggered = true;
      sleep(Math.min(0.5, 2 / exec.instance.vusInitialized) * (__VU - 1));
    }
    // reflect: the schemas come from the server's reflection service; no .proto files loaded.
    try {
      this.client.connect(this.cfg.addr, { plaintext: true, reflect: true, timeout: '10s' });
    } catch (e) {
      // Counted as a failed op (and a failed check), so that a run against no server fails its
      // thresholds instead of passing on zero samples; then a short pause, not a spin.
      check(null, { 'connect OK': () => false });
      opErrors.add(true);
      logFailure('connect', { status: 'none', error: { message: String(e) } });
      sleep(0.1);
      return false;
    }
    this.connected = true;
    this.authenticated = false;
    return true;
  }

  disconnect() {
    if (this.connected) this.client.close();
    this.connected = false;
    this.authenticated = false;
  }

  // Auth.Challenge + Auth.Hello on this connection, server_mac checked. Returns success.
  handshake() {
    const cfg = this.cfg;
    const params = { timeout: cfg.timeout };
    const ch = this.client.invoke('cube.v1.Auth/Challenge', { tenant: cfg.tenant, key_id: cfg.keyId },
      Object.assign({ tags: { op: 'challenge' } }, params));
    if (!check(ch, { 'challenge OK': (r) => r.status === grpc.StatusOK })) {
      return this.handshakeFailed('Challenge', ch);
    }
    const nonceB64 = ch.message.nonce || ''; // proto3 JSON may leave out empty bytes
    const nonce = encoding.b64decode(nonceB64, 'std');
    // A Cube server's challenge nonce is 32 bytes; anything else is refused, not signed, as by
    // cubec and cube_client.py (docs/protocol.md "Security notes").
    if (!check(nonce, { 'challenge nonce is 32 bytes': (n) => n.byteLength === 32 })) {
      const why = `the server's challenge nonce is ${nonce.byteLength} bytes, not 32: not a Cube server's challenge`;
      return this.handshakeFailed('Challenge', { status: ch.status, error: { message: why } });
    }
    const nonceHex = bytesToHex(nonce);
    const clientNonce = crypto.randomBytes(16);
    const clientNonceHex = bytesToHex(clientNonce);
    const hello = this.client.invoke('cube.v1.Auth/Hello', {
      tenant: cfg.tenant,
      key_id: cfg.keyId,
      nonce: nonceB64,
      client_nonce: encoding.b64encode(clientNonce, 'std'),
      mac: helloMacB64(cfg.secret, cfg.tenant, cfg.keyId, nonceHex, clientNonceHex),
    }, Object.assign({ tags: { op: 'hello' } }, params));
    const expected = serverMacB64(cfg.secret, nonceHex, clientNonceHex);
    // A plain compare is fine: the expected value changes with every handshake (fresh
    // client_nonce), so timing could not teach a fake server anything reusable.
    const ok = check(hello, {
      'hello OK': (r) => r.status === grpc.StatusOK,
      'hello server_mac proves the key': (r) => r.message && (r.message.serverMac || r.message.server_mac) === expected,
      'hello principal': (r) => r.message && r.message.principal === `${cfg.tenant}/${cfg.keyId}`,
    });
    if (!ok) return this.handshakeFailed('Hello', hello);
    handshakes.add(1);
    this.authenticated = true;
    return true;
  }

  handshakeFailed(what, res) {
    handshakeFailures.add(1);
    opErrors.add(true);
    logFailure(what, res);
    // A server that does not know the key: drop the connection (docs/protocol.md step 5), and
    // do not spin; the next iteration starts again from connect.
    this.disconnect();
    sleep(0.1);
    return false;
  }

  // A call's answer; a call k6 could not make (a method missing from the reflected descriptors,
  // a request it cannot marshal, no connection) throws, and is answered here as a failure, so
  // its op counts in the checks and op errors: an exception ends the iteration before them,
  // and k6 does not fail a run for it (the thresholds would pass on the other ops' samples).
  invoke(method, req, op) {
    const params = { timeout: this.cfg.timeout, tags: { op } };
    if (this.model === 'call') params.metadata = signCall(this.cfg, `/${method}`);
    try {
      return this.client.invoke(method, req, params);
    } catch (e) {
      return { status: 'threw', message: null, error: { message: String(e) } };
    }
  }

  // One iteration: (re)connect and authenticate if needed, then one op drawn from the mix.
  iteration() {
    if (!this.connected && !this.connect()) return;
    if (this.model === 'connection' && !this.authenticated && !this.handshake()) return;

    const cfg = this.cfg;
    const r = Math.random() * cfg.mix.total;
    const op = cfg.mix.ops.find((o) => r < o.upTo).name;
    const slot = this.iter++ % cfg.cells;
    const coord = { x: __VU, y: slot, z: cfg.z }; // sint32: plain JSON numbers
    let res;
    let ok;
    if (op === 'write') {
      const value = encoding.b64encode(`vu${__VU}-it${__ITER}-${Date.now()}`, 'std');
      res = this.invoke('cube.v1.Cells/Write', { coord, value }, op);
      ok = check(res, {
        'write OK': (x) => x.status === grpc.StatusOK,
        'write version > 0': (x) => x.status === grpc.StatusOK && Number(x.message.version) > 0,
      });
      // A failed write's outcome is unknown (docs/protocol.md "Retrying"): stop checking that cell.
      if (ok) this.written[slot] = value;
      else delete this.written[slot];
    } else if (op === 'read') {
      res = this.invoke('cube.v1.Cells/Read', { coord }, op);
      const want = this.written[slot];
      // Only this VU writes its cells (x = VU, z = run), so an acknowledged write must be what
      // the next read of that cell returns.
      const readBack = (x) =>
        want === undefined || (x.message.found === true && x.message.value === want);
      ok = check(res, {
        'read OK': (x) => x.status === grpc.StatusOK,
        'read returns the last acknowledged write': (x) => x.status === grpc.StatusOK && readBack(x),
      });
      if (res.status === grpc.StatusOK && !readBack(res)) {
        readbackMismatches.add(1);
        console.error(`read of (${coord.x},${coord.y},${coord.z}) did not return the last acknowledged write`);
      }
    } else {
      res = this.invoke(cfg.statsMethod, {}, op);
      ok = check(res, {
        'stats OK': (x) => x.status === grpc.StatusOK,
        'stats has totals': (x) => x.status === grpc.StatusOK && x.message.totals !== null && x.message.totals !== undefined,
      });
    }
    opErrors.add(!ok);
    if (res.status !== grpc.StatusOK) {
      logFailure(op, res);
      // The session may have ended (reconnect, revoked key): handshake again next iteration.
      if (res.status === grpc.StatusUnauthenticated) this.authenticated = false;
    }
  }
}

export function config(defaultZ) {
  return loadConfig(defaultZ);
}

// A few failures are printed; a run full of them needs no more than the first lines.
let logged = 0;
function logFailure(what, res) {
  if (logged++ < 3) {
    const msg = res.error ? res.error.message : '';
    console.warn(`VU ${__VU}: ${what} failed: status ${res.status} ${msg}`);
  }
}
