#!/usr/bin/env python3
"""A Cube client in Python, written from docs/protocol.md alone.

It exists to show that the protocol document is enough to implement both of Cube's
authentication models in another language:

- per call: every call carries x-cube-tenant, x-cube-key, x-cube-ts, x-cube-nonce and
  x-cube-sig (HMAC-SHA256 over the "CUBE1-CALL" canonical string, bound to the method path);
- per connection: Auth.Challenge + Auth.Hello on one HTTP/2 connection, the server's proof
  (server_mac) checked, then later calls on that connection carry no credentials at all.

The gRPC stubs are generated at run time from the repository's proto/ directory with
grpc_tools.protoc into a temporary directory (nothing generated is written to the repository).

Library use::

    creds = Credentials.from_file("cube-data/dev-credentials.json")
    with CubeClient(creds, auth="connection") as c:
        c.write(1, -2, 3, b"hello")
        print(c.read(1, -2, 3))

CLI (JSON on stdout, "cube_client: error: CODE: message" on stderr and exit status 1)::

    cube_client.py selfcheck
    cube_client.py [--credentials F] [--endpoint URL] [--ca FILE] [--auth call|connection] write X Y Z VALUE
    cube_client.py ... read X Y Z
    cube_client.py ... delete X Y Z
    cube_client.py ... handshake        # Challenge + Hello only; prints the principal
    cube_client.py ... conncheck        # checks that the session is bound to one channel
    cube_client.py ... replaycheck      # the same signed call twice: the second is refused

As for cubec, an option left out of the command line is read from its variable: --credentials
from CUBE_CREDENTIALS, --endpoint from CUBE_ENDPOINT, --ca from CUBE_CA, --auth from CUBE_AUTH,
--timeout from CUBE_TIMEOUT_SECS; then --endpoint from the credentials file; then the default.

Requires grpcio and grpcio-tools (pip install grpcio grpcio-tools).
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import hashlib
import hmac
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Optional, Sequence

import grpc

# ---------------------------------------------------------------------------------------------
# Wire constants (docs/protocol.md)
# ---------------------------------------------------------------------------------------------

MD_TENANT = "x-cube-tenant"
MD_KEY = "x-cube-key"
MD_TS = "x-cube-ts"
MD_NONCE = "x-cube-nonce"
MD_SIG = "x-cube-sig"

CALL_PREFIX = "CUBE1-CALL"
HELLO_PREFIX = "CUBE1-HELLO"
SERVER_PREFIX = "CUBE1-SERVER"

DEFAULT_ENDPOINT = "http://127.0.0.1:50051"
DEFAULT_CREDENTIALS = "cube-data/dev-credentials.json"
DEFAULT_TIMEOUT_SECS = 10.0
AUTH_MODELS = ("call", "connection")

# The options every channel gets. A grpcio channel normally draws its subchannels (and so its
# HTTP/2 connections) from a process-wide pool, so two channels to the same target with the same
# arguments can end up on ONE connection; a session opened by Auth.Hello on one channel would then
# also authenticate the other. A local subchannel pool gives each channel its own connection.
# Transparent retries are off: a retry may go out on another connection.
CHANNEL_OPTIONS: tuple = (
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.enable_retries", 0),
)

_TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
_HEX64_RE = re.compile(r"^[0-9a-f]{64}$")


# ---------------------------------------------------------------------------------------------
# Credentials
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Credentials:
    tenant: str
    key_id: str
    secret: bytes  # the 32 raw bytes, decoded from the 64 hex characters
    endpoint: Optional[str] = None

    @classmethod
    def from_dict(cls, d: dict) -> "Credentials":
        for field in ("tenant", "key_id", "secret"):
            if not isinstance(d.get(field), str):
                raise ValueError(f"credentials: '{field}' is missing or not a string")
        if not _TENANT_RE.match(d["tenant"]):
            raise ValueError(f"credentials: bad tenant name {d['tenant']!r}")
        if not _HEX64_RE.match(d["secret"]):
            raise ValueError("credentials: 'secret' must be 64 lowercase hex characters")
        endpoint = d.get("endpoint")
        if endpoint is not None and not isinstance(endpoint, str):
            raise ValueError("credentials: 'endpoint' must be a string")
        return cls(d["tenant"], d["key_id"], bytes.fromhex(d["secret"]), endpoint)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Credentials":
        with open(path, encoding="utf-8") as f:
            return cls.from_dict(json.load(f))

    def __repr__(self) -> str:  # never print the secret
        return f"Credentials(tenant={self.tenant!r}, key_id={self.key_id!r}, endpoint={self.endpoint!r})"


# ---------------------------------------------------------------------------------------------
# MACs and canonical strings
# ---------------------------------------------------------------------------------------------


def _hmac(secret: bytes, message: str) -> bytes:
    return hmac.new(secret, message.encode("utf-8"), hashlib.sha256).digest()


def call_canonical(method_path: str, tenant: str, key_id: str, ts: str, nonce: str) -> str:
    return "\n".join([CALL_PREFIX, method_path, tenant, key_id, ts, nonce])


def call_signature(secret: bytes, method_path: str, tenant: str, key_id: str, ts: str, nonce: str) -> str:
    """x-cube-sig: lowercase hex HMAC-SHA256 of the CUBE1-CALL canonical string."""
    return _hmac(secret, call_canonical(method_path, tenant, key_id, ts, nonce)).hex()


def hello_mac(secret: bytes, tenant: str, key_id: str, nonce: bytes, client_nonce: bytes) -> bytes:
    """HelloRequest.mac: raw 32 bytes."""
    return _hmac(secret, "\n".join([HELLO_PREFIX, tenant, key_id, nonce.hex(), client_nonce.hex()]))


def server_mac(secret: bytes, nonce: bytes, client_nonce: bytes) -> bytes:
    """HelloResponse.server_mac as the server must compute it: raw 32 bytes."""
    return _hmac(secret, "\n".join([SERVER_PREFIX, nonce.hex(), client_nonce.hex()]))


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def sign_call(
    creds: Credentials, method_path: str, ts_ms: Optional[int] = None, nonce: Optional[str] = None
) -> list[tuple[str, str]]:
    """The five x-cube-* metadata entries for one call of `method_path` (e.g. /cube.v1.Cells/Write).

    A fresh timestamp and nonce unless given (give them only for tests)."""
    ts = str(now_ms() if ts_ms is None else ts_ms)  # str(int): digits, no sign, no leading zeros
    nonce = os.urandom(16).hex() if nonce is None else nonce
    sig = call_signature(creds.secret, method_path, creds.tenant, creds.key_id, ts, nonce)
    return [
        (MD_TENANT, creds.tenant),
        (MD_KEY, creds.key_id),
        (MD_TS, ts),
        (MD_NONCE, nonce),
        (MD_SIG, sig),
    ]


# ---------------------------------------------------------------------------------------------
# Published test vectors (ARCHITECTURE.md "Authentication", docs/protocol.md "Test vectors")
# ---------------------------------------------------------------------------------------------

VECTOR_SECRET = bytes(range(0x00, 0x20))
VECTOR_TENANT = "acme"
VECTOR_KEY_ID = "k1"
VECTOR_CALL = {
    "method_path": "/cube.v1.Cells/Write",
    "ts": "1700000000000",
    "nonce": "000102030405060708090a0b0c0d0e0f",
    "canonical": "CUBE1-CALL\n/cube.v1.Cells/Write\nacme\nk1\n1700000000000\n000102030405060708090a0b0c0d0e0f",
    "sig": "a5befc7529906f3b79aec5655c8d4ab40a30a1d6a13db8bf42672603dfa873d3",
}
VECTOR_HELLO = {
    "nonce": bytes(range(0x64, 0x84)),  # 32 bytes
    "client_nonce": bytes(range(0xC8, 0xD8)),  # 16 bytes
    "mac": "4e59e4f5651ca616f5fadb65366b4417ed8befee0abbc9aa9dbcac7a1f39919f",
    "server_mac": "9bdd978c20c9c34e1f430029653caa565806164a01e6446b0e679e2c4e1153be",
}


def _require(ok: bool, why: str) -> None:
    # Not `assert`: `python3 -O` strips asserts, and the check would then pass whatever it found.
    if not ok:
        raise AssertionError(why)


def check_test_vectors() -> dict:
    """Check the published vectors; raises AssertionError on a mismatch, returns what was checked."""
    v = VECTOR_CALL
    canonical = call_canonical(v["method_path"], VECTOR_TENANT, VECTOR_KEY_ID, v["ts"], v["nonce"])
    _require(canonical == v["canonical"], f"call canonical string differs: {canonical!r}")
    sig = call_signature(VECTOR_SECRET, v["method_path"], VECTOR_TENANT, VECTOR_KEY_ID, v["ts"], v["nonce"])
    _require(sig == v["sig"], f"call signature {sig} != published {v['sig']}")
    creds = Credentials(VECTOR_TENANT, VECTOR_KEY_ID, VECTOR_SECRET)
    md = dict(sign_call(creds, v["method_path"], ts_ms=int(v["ts"]), nonce=v["nonce"]))
    _require(md[MD_SIG] == v["sig"], "sign_call() does not reproduce the published signature")

    h = VECTOR_HELLO
    _require(len(h["nonce"]) == 32 and len(h["client_nonce"]) == 16, "vector nonce lengths")
    mac = hello_mac(VECTOR_SECRET, VECTOR_TENANT, VECTOR_KEY_ID, h["nonce"], h["client_nonce"]).hex()
    _require(mac == h["mac"], f"hello mac {mac} != published {h['mac']}")
    smac = server_mac(VECTOR_SECRET, h["nonce"], h["client_nonce"]).hex()
    _require(smac == h["server_mac"], f"server_mac {smac} != published {h['server_mac']}")
    return {"call_sig": sig, "hello_mac": mac, "server_mac": smac}


# ---------------------------------------------------------------------------------------------
# Stubs generated at run time
# ---------------------------------------------------------------------------------------------

_STUBS: Optional[SimpleNamespace] = None


def default_proto_dir() -> Path:
    env = os.environ.get("CUBE_PROTO_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "proto"  # <repo>/loadtest/python/ -> <repo>/proto


def load_stubs(proto_dir: Optional[str | os.PathLike] = None) -> SimpleNamespace:
    """Compile proto/cube/v1/*.proto with grpc_tools.protoc into a temp dir and import the result.

    Returns a namespace with types_pb2, cells_pb2, cells_pb2_grpc, auth_pb2, auth_pb2_grpc."""
    global _STUBS
    if _STUBS is not None:
        return _STUBS
    from grpc_tools import protoc  # grpcio-tools
    import grpc_tools

    proto_dir = Path(proto_dir) if proto_dir else default_proto_dir()
    files = sorted(str(p.relative_to(proto_dir)) for p in (proto_dir / "cube" / "v1").glob("*.proto"))
    if not files:
        raise FileNotFoundError(f"no .proto files under {proto_dir / 'cube' / 'v1'}")
    out = tempfile.mkdtemp(prefix="cube-pystubs-")
    atexit.register(shutil.rmtree, out, True)
    well_known = Path(grpc_tools.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{proto_dir}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--grpc_python_out={out}",
        *files,
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {proto_dir}")
    sys.path.insert(0, out)
    try:
        mods = {
            name: importlib.import_module(f"cube.v1.{name}")
            for name in ("types_pb2", "cells_pb2", "cells_pb2_grpc", "auth_pb2", "auth_pb2_grpc")
        }
    finally:
        sys.path.remove(out)
    _STUBS = SimpleNamespace(**mods)
    return _STUBS


# ---------------------------------------------------------------------------------------------
# Channels
# ---------------------------------------------------------------------------------------------


def target_of(endpoint: str) -> tuple[str, bool]:
    """'http://127.0.0.1:50051' -> ('127.0.0.1:50051', False); https -> TLS.

    An endpoint without a scheme is refused (as cubec does): taking it for plaintext would send
    signed calls unencrypted to a server the user meant to reach over TLS."""
    if endpoint.startswith("http://"):
        return endpoint[len("http://"):].rstrip("/"), False
    if endpoint.startswith("https://"):
        return endpoint[len("https://"):].rstrip("/"), True
    raise ValueError(
        f"--endpoint must start with http:// (plaintext) or https:// (TLS), got {endpoint!r}"
    )


def open_channel(
    endpoint: str, extra_options: Sequence[tuple] = (), ca: Optional[str] = None, global_pool: bool = False
) -> grpc.Channel:
    """One channel with its own subchannel pool: one HTTP/2 connection at a time.

    ca: PEM file of the roots to trust for https (a --tls-dev server's <data-dir>/tls/ca.pem);
    None trusts the system's roots. global_pool: grpcio's default instead, where channels to one
    target with the same options may share a connection (only for showing that they do)."""
    target, tls = target_of(endpoint)
    if ca and not tls:
        # The user asked for the server's certificate to be checked: going on in plaintext
        # would drop that without a word.
        raise ValueError(
            f"--ca names the roots to check an https:// server against, but {endpoint!r} is "
            "plaintext (http://): use the server's https:// endpoint, or leave out --ca"
        )
    base = [o for o in CHANNEL_OPTIONS if not global_pool or o[0] != "grpc.use_local_subchannel_pool"]
    options = base + list(extra_options)
    if tls:
        roots = Path(ca).read_bytes() if ca else None
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=roots), options=options)
    return grpc.insecure_channel(target, options=options)


class _SigningInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Signs every call for the method path it actually goes out on (the HTTP/2 :path)."""

    def __init__(self, creds: Credentials):
        self._creds = creds

    def _sign(self, details):
        method = details.method
        if isinstance(method, bytes):
            method = method.decode("ascii")
        metadata = [(k, v) for (k, v) in (details.metadata or ()) if not k.startswith("x-cube-")]
        metadata += sign_call(self._creds, method)
        return _CallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            getattr(details, "wait_for_ready", None),
            getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._sign(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._sign(details), request)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression


class HandshakeError(Exception):
    """The server's server_mac did not prove knowledge of the key."""


# ---------------------------------------------------------------------------------------------
# Client
# ---------------------------------------------------------------------------------------------


class CubeClient:
    """Cells client over one channel, authenticated per call or per connection.

    auth="call": an interceptor signs every call (fresh ts and nonce, so retries re-sign).
    auth="connection": handshake() runs Challenge + Hello on the channel, checks server_mac, and
    later calls carry no credentials. If the channel had to reconnect (a new connection has no
    session), a call refused with UNAUTHENTICATED is retried once after a new handshake; the auth
    layer refuses before any handler runs, so that retry cannot apply a write twice.
    """

    def __init__(
        self,
        creds: Credentials,
        endpoint: Optional[str] = None,
        auth: str = "call",
        stubs: Optional[SimpleNamespace] = None,
        timeout: float = 10.0,
        ca: Optional[str] = None,
    ):
        if auth not in ("call", "connection"):
            raise ValueError("auth must be 'call' or 'connection'")
        self.creds = creds
        self.endpoint = endpoint or creds.endpoint or DEFAULT_ENDPOINT
        self.auth = auth
        self.timeout = timeout
        self.pb = stubs or load_stubs()
        self.channel = open_channel(self.endpoint, ca=ca)
        calls = self.channel
        if auth == "call":
            calls = grpc.intercept_channel(self.channel, _SigningInterceptor(creds))
        self.cells = self.pb.cells_pb2_grpc.CellsStub(calls)
        self.auth_stub = self.pb.auth_pb2_grpc.AuthStub(self.channel)  # never signed
        self.principal: Optional[str] = None

    # -- per-connection handshake --------------------------------------------------------------

    def handshake(self) -> str:
        """Auth.Challenge + Auth.Hello on this channel; returns the principal "<tenant>/<key_id>"."""
        pb = self.pb.auth_pb2
        c = self.creds
        challenge = self.auth_stub.Challenge(
            pb.ChallengeRequest(tenant=c.tenant, key_id=c.key_id), timeout=self.timeout, wait_for_ready=True
        )
        if len(challenge.nonce) != 32:
            raise HandshakeError(f"challenge nonce is {len(challenge.nonce)} bytes, expected 32")
        client_nonce = os.urandom(16)
        mac = hello_mac(c.secret, c.tenant, c.key_id, challenge.nonce, client_nonce)
        hello = self.auth_stub.Hello(
            pb.HelloRequest(
                tenant=c.tenant, key_id=c.key_id, nonce=challenge.nonce, client_nonce=client_nonce, mac=mac
            ),
            timeout=self.timeout,
        )
        expected = server_mac(c.secret, challenge.nonce, client_nonce)
        if not hmac.compare_digest(hello.server_mac, expected):
            self.close()
            raise HandshakeError("server_mac does not match: the server does not know this key")
        if hello.principal != f"{c.tenant}/{c.key_id}":
            self.close()
            raise HandshakeError(f"unexpected principal {hello.principal!r}")
        self.principal = hello.principal
        return hello.principal

    # -- calls -----------------------------------------------------------------------------------

    def _invoke(self, method: Callable, request):
        if self.auth == "connection" and self.principal is None:
            self.handshake()
        try:
            return method(request, timeout=self.timeout)
        except grpc.RpcError as e:
            if self.auth == "connection" and e.code() == grpc.StatusCode.UNAUTHENTICATED:
                self.principal = None
                self.handshake()
                return method(request, timeout=self.timeout)
            raise

    def coord(self, x: int, y: int, z: int):
        return self.pb.types_pb2.Coord(x=x, y=y, z=z)

    def write(self, x: int, y: int, z: int, value: bytes, expected_version: Optional[int] = None) -> dict:
        req = self.pb.cells_pb2.WriteRequest(coord=self.coord(x, y, z), value=value)
        if expected_version is not None:
            req.expected_version = expected_version
        r = self._invoke(self.cells.Write, req)
        return {"version": r.version, "seq": r.seq}

    def read(self, x: int, y: int, z: int) -> dict:
        r = self._invoke(self.cells.Read, self.pb.cells_pb2.ReadRequest(coord=self.coord(x, y, z)))
        return {"found": r.found, "value": r.value, "version": r.version, "sealed": r.sealed}

    def delete(self, x: int, y: int, z: int, expected_version: Optional[int] = None) -> dict:
        req = self.pb.cells_pb2.DeleteRequest(coord=self.coord(x, y, z))
        if expected_version is not None:
            req.expected_version = expected_version
        r = self._invoke(self.cells.Delete, req)
        return {"existed": r.existed, "seq": r.seq}

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> "CubeClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------------------------------------
# Checks used by the CLI (and by loadtest/python/test_python_client.sh)
# ---------------------------------------------------------------------------------------------


def _read_request(pb, x=0, y=0, z=0):
    return pb.cells_pb2.ReadRequest(coord=pb.types_pb2.Coord(x=x, y=y, z=z))


def _code_of(fn) -> tuple[str, str]:
    try:
        fn()
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


def connection_check(creds: Credentials, endpoint: str, concurrency: int = 64, ca: Optional[str] = None) -> dict:
    """The session opened by Hello is bound to one channel (one connection):

    1. channel A: handshake, then `concurrency` concurrent unsigned reads all succeed;
    2. channel B (same target, same options, its own subchannel pool), no handshake: an unsigned
       read is refused with UNAUTHENTICATED, so B did not share A's connection;
    3. a Hello on channel B answering channel A's challenge is refused (a challenge is valid only
       on the connection that asked for it).
    Also reports (informational, not a check) whether two channels on grpcio's default, global
    subchannel pool share one authenticated connection."""
    pb = load_stubs()
    result: dict = {}
    with CubeClient(creds, endpoint, auth="connection", stubs=pb, ca=ca) as a:
        result["principal"] = a.handshake()
        stub = pb.cells_pb2_grpc.CellsStub(a.channel)  # the raw channel: nothing can sign
        futures = [stub.Read.future(_read_request(pb, i, 0, 0), timeout=10) for i in range(concurrency)]
        ok = 0
        for f in futures:
            try:
                f.result()
                ok += 1
            except grpc.RpcError:
                pass
        result["concurrent_unsigned_ok"] = ok
        result["concurrent_unsigned_total"] = concurrency

        b_channel = open_channel(endpoint, ca=ca)
        try:
            b_stub = pb.cells_pb2_grpc.CellsStub(b_channel)
            code, _ = _code_of(lambda: b_stub.Read(_read_request(pb), timeout=10, wait_for_ready=True))
            result["other_channel_unsigned"] = code

            # A's challenge, answered on B.
            apb = pb.auth_pb2
            ch = a.auth_stub.Challenge(apb.ChallengeRequest(tenant=creds.tenant, key_id=creds.key_id), timeout=10)
            cn = os.urandom(16)
            mac = hello_mac(creds.secret, creds.tenant, creds.key_id, ch.nonce, cn)
            b_auth = pb.auth_pb2_grpc.AuthStub(b_channel)
            code, details = _code_of(
                lambda: b_auth.Hello(
                    apb.HelloRequest(tenant=creds.tenant, key_id=creds.key_id, nonce=ch.nonce, client_nonce=cn, mac=mac),
                    timeout=10,
                )
            )
            result["hello_on_other_channel"] = code
            result["hello_on_other_channel_details"] = details
        finally:
            b_channel.close()
        # A is still authenticated after all that.
        code, _ = _code_of(lambda: stub.Read(_read_request(pb), timeout=10))
        result["first_channel_still_ok"] = code

    # Informational (never decides "ok"): the global subchannel pool (grpcio's default).
    g1 = open_channel(endpoint, ca=ca, global_pool=True)
    g2 = open_channel(endpoint, ca=ca, global_pool=True)
    try:
        a1 = pb.auth_pb2_grpc.AuthStub(g1)
        ch = a1.Challenge(pb.auth_pb2.ChallengeRequest(tenant=creds.tenant, key_id=creds.key_id), timeout=10, wait_for_ready=True)
        cn = os.urandom(16)
        a1.Hello(
            pb.auth_pb2.HelloRequest(
                tenant=creds.tenant,
                key_id=creds.key_id,
                nonce=ch.nonce,
                client_nonce=cn,
                mac=hello_mac(creds.secret, creds.tenant, creds.key_id, ch.nonce, cn),
            ),
            timeout=10,
        )
        code, _ = _code_of(
            lambda: pb.cells_pb2_grpc.CellsStub(g2).Read(_read_request(pb), timeout=10, wait_for_ready=True)
        )
        result["global_pool_second_channel_unsigned"] = code
    except grpc.RpcError as e:
        result["global_pool_second_channel_unsigned"] = f"not measured: {e.code().name}"
    finally:
        g1.close()
        g2.close()

    result["ok"] = (
        result["principal"] == f"{creds.tenant}/{creds.key_id}"
        and ok == concurrency
        and result["other_channel_unsigned"] == "UNAUTHENTICATED"
        and result["hello_on_other_channel"] == "UNAUTHENTICATED"
        and result["first_channel_still_ok"] == "OK"
    )
    return result


def replay_check(creds: Credentials, endpoint: str, ca: Optional[str] = None) -> dict:
    """Send one signed Read twice with identical metadata: the first passes, the second must be
    refused with UNAUTHENTICATED (nonce already used)."""
    pb = load_stubs()
    channel = open_channel(endpoint, ca=ca)
    try:
        stub = pb.cells_pb2_grpc.CellsStub(channel)
        md = sign_call(creds, "/cube.v1.Cells/Read")
        first = _code_of(lambda: stub.Read(_read_request(pb), metadata=md, timeout=10, wait_for_ready=True))
        second = _code_of(lambda: stub.Read(_read_request(pb), metadata=md, timeout=10))
        # Signed for another method: refused.
        md2 = sign_call(creds, "/cube.v1.Cells/Write")
        wrong = _code_of(lambda: stub.Read(_read_request(pb), metadata=md2, timeout=10))
    finally:
        channel.close()
    return {
        "first": first[0],
        "replay": second[0],
        "replay_details": second[1],
        "wrong_method": wrong[0],
        "wrong_method_details": wrong[1],
        "ok": first[0] == "OK"
        and second[0] == "UNAUTHENTICATED"
        and "already used" in second[1]
        and wrong[0] == "UNAUTHENTICATED"
        and "does not match" in wrong[1],
    }


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _dump(obj: dict) -> None:
    print(json.dumps(obj, sort_keys=True, separators=(",", ":")))


def _show_read(r: dict) -> dict:
    out = dict(r)
    try:
        out["value"] = r["value"].decode("utf-8")
    except UnicodeDecodeError:
        del out["value"]
        out["value_hex"] = r["value"].hex()
    return out


def _env_value(name: str) -> Optional[str]:
    """The variable `name`, None when unset. Set but empty is refused, as cubec refuses it."""
    value = os.environ.get(name)
    if value == "":
        raise ValueError(f"{name} set but empty: give a value, or unset it")
    return value


def _options_from_env(args) -> None:
    """cubec's precedence for the options it shares with this client: the command line, then the
    variable (CUBE_ENDPOINT, CUBE_CA, CUBE_AUTH, CUBE_TIMEOUT_SECS), then the default; for
    --endpoint the credentials file's endpoint comes before the default (in main). Sets
    args.ca_from_env. (--credentials and CUBE_CREDENTIALS: _load_creds.)"""
    if args.endpoint is None:
        args.endpoint = _env_value("CUBE_ENDPOINT")
    args.ca_from_env = False
    if args.ca is None:
        args.ca = _env_value("CUBE_CA")
        args.ca_from_env = args.ca is not None
    if args.auth is None:
        auth = _env_value("CUBE_AUTH")
        if auth is not None and auth not in AUTH_MODELS:
            raise ValueError(f"CUBE_AUTH must be {' or '.join(AUTH_MODELS)}, not {auth!r}")
        args.auth = auth or "call"
    if args.timeout is None:
        secs = _env_value("CUBE_TIMEOUT_SECS")
        if secs is not None and not re.fullmatch(r"[0-9]+", secs):
            # cubec's --timeout-secs: whole seconds.
            raise ValueError(f"CUBE_TIMEOUT_SECS must be a whole number of seconds (0: no limit), not {secs!r}")
        args.timeout = DEFAULT_TIMEOUT_SECS if secs is None else float(secs)


def _load_creds(args) -> Credentials:
    # cubec's rule (docs/protocol.md): the three variables all or none, and never beside
    # --credentials; a partial or doubled source is an error, not a silent fallback.
    names = (("tenant", "CUBE_TENANT"), ("key_id", "CUBE_KEY_ID"), ("secret", "CUBE_SECRET"))
    env = {k: os.environ.get(v) for k, v in names}
    empty = [v for k, v in names if env[k] == ""]
    if empty:
        raise ValueError(f"{', '.join(empty)} set but empty: give a value, or unset it")
    given = [v for k, v in names if env[k] is not None]
    # CUBE_CREDENTIALS stands for --credentials, as for cubec.
    if not args.credentials:
        args.credentials = _env_value("CUBE_CREDENTIALS")
    if given and args.credentials:
        raise ValueError(f"--credentials (or CUBE_CREDENTIALS) and {', '.join(given)} both given: use one of them")
    if given and len(given) < len(names):
        missing = [v for k, v in names if not env[k]]
        raise ValueError(f"{', '.join(given)} set without {', '.join(missing)}: set all three, or none")
    if args.credentials:
        return Credentials.from_file(args.credentials)
    if given:
        return Credentials.from_dict(env)
    return Credentials.from_file(DEFAULT_CREDENTIALS)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="cube_client.py",
        description="Cube client (docs/protocol.md) in Python",
        epilog="As for cubec, an option left out of the command line is read from its variable: "
        "--credentials from CUBE_CREDENTIALS, --endpoint from CUBE_ENDPOINT, --ca from CUBE_CA, "
        "--auth from CUBE_AUTH, --timeout from CUBE_TIMEOUT_SECS (whole seconds); then --endpoint "
        "from the credentials file; then the default. A variable set but empty is refused.",
    )
    p.add_argument(
        "--credentials",
        help=f"credentials JSON (default: $CUBE_CREDENTIALS, else $CUBE_TENANT/KEY_ID/SECRET, else {DEFAULT_CREDENTIALS})",
    )
    p.add_argument(
        "--endpoint",
        help="e.g. http://127.0.0.1:50051 (default: $CUBE_ENDPOINT, else the credentials' endpoint, "
        f"else {DEFAULT_ENDPOINT})",
    )
    p.add_argument(
        "--ca",
        metavar="FILE",
        help="CA certificate (PEM) to trust for an https:// endpoint (default: $CUBE_CA, not used, with a note, "
        "for an http:// endpoint; else the system's roots)",
    )
    p.add_argument("--auth", choices=AUTH_MODELS, help="authentication model (default: $CUBE_AUTH, else call)")
    p.add_argument("--proto-dir", help="directory holding cube/v1/*.proto (default: <repo>/proto)")
    p.add_argument(
        "--timeout",
        type=float,
        metavar="SECS",
        help="seconds each call may take, 0 for no limit "
        f"(default: $CUBE_TIMEOUT_SECS, else {DEFAULT_TIMEOUT_SECS:g})",
    )
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("selfcheck", help="check the published test vectors (no server needed)")
    w = sub.add_parser("write")
    for a in ("x", "y", "z"):
        w.add_argument(a, type=int)
    w.add_argument("value")
    w.add_argument("--expected-version", type=int)
    r = sub.add_parser("read")
    for a in ("x", "y", "z"):
        r.add_argument(a, type=int)
    d = sub.add_parser("delete")
    for a in ("x", "y", "z"):
        d.add_argument(a, type=int)
    d.add_argument("--expected-version", type=int)
    sub.add_parser("handshake", help="Challenge + Hello; prints the principal")
    cc = sub.add_parser("conncheck", help="check that a handshake session is bound to one channel")
    cc.add_argument("--concurrency", type=int, default=64)
    sub.add_parser("replaycheck", help="a replayed signed call is refused")
    args = p.parse_args(argv)

    try:
        if args.cmd == "selfcheck":
            _dump({"test_vectors": "ok", **check_test_vectors()})
            return 0
        if args.proto_dir:
            os.environ["CUBE_PROTO_DIR"] = args.proto_dir
        _options_from_env(args)
        creds = _load_creds(args)
        endpoint = args.endpoint or creds.endpoint or DEFAULT_ENDPOINT
        if args.ca_from_env and endpoint.startswith("http://"):
            # As cubec: not refused (CUBE_CA may be set for other endpoints), but said, so that
            # nobody takes these calls for encrypted. An explicit --ca is refused (open_channel).
            print(
                f"cube_client: note: CUBE_CA is not used: {endpoint} is plaintext; use https:// for TLS",
                file=sys.stderr,
            )
            args.ca = None
        timeout = None if args.timeout == 0 else args.timeout
        if args.cmd == "conncheck":
            res = connection_check(creds, endpoint, args.concurrency, ca=args.ca)
            _dump(res)
            return 0 if res["ok"] else 1
        if args.cmd == "replaycheck":
            res = replay_check(creds, endpoint, ca=args.ca)
            _dump(res)
            return 0 if res["ok"] else 1
        with CubeClient(creds, endpoint, auth=args.auth, timeout=timeout, ca=args.ca) as c:
            if args.cmd == "handshake":
                _dump({"principal": c.handshake()})
            elif args.cmd == "write":
                _dump(c.write(args.x, args.y, args.z, args.value.encode("utf-8"), args.expected_version))
            elif args.cmd == "read":
                _dump(_show_read(c.read(args.x, args.y, args.z)))
            elif args.cmd == "delete":
                _dump(c.delete(args.x, args.y, args.z, args.expected_version))
        return 0
    except grpc.RpcError as e:
        print(f"cube_client: error: {e.code().name}: {e.details()}", file=sys.stderr)
        return 1
    except (HandshakeError, AssertionError, ValueError, OSError) as e:
        print(f"cube_client: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
