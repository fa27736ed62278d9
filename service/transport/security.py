"""CURVE encryption with authentication: key pairs, socket setup, and the broker's ZAP handler.

The broker accepts only peers whose public keys sit in its `curve_clients` directory
(certificates made by `zfab keys`). A certificate made with `--worker NAME` binds that
worker name to its key: a peer may register as worker NAME only with that key, and
nobody else may connect under that identity.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import zmq
import zmq.auth
from zmq.utils import z85

from ..core.access import ALL, AccessFile, Grant, GrantBox
from ..core.names import check_path_name
from ..errors import SecurityError
from .waker import Waker

log = logging.getLogger(__name__)

ZAP_ENDPOINT = "inproc://zeromq.zap.01"
EVENTS_DOMAIN = b"zfab-events"  # the ZAP domain of the broker's event publisher (broker/eventsocket.py)


def create_keys(key_dir: Path, name: str, worker: str | None = None) -> tuple[Path, Path]:
    """Write NAME.key (public) and NAME.key_secret; with `worker`, bind that worker name (or a prefix
    ending in `*`) to the key. NAME is a file name in key_dir, and a worker name must be one too
    (core/names.py): BadNameError before anything is written."""
    check_path_name(name, "key name")
    if worker and worker != "*":
        # Written into the key file as a quoted value: the rule also keeps quotes and newlines out.
        check_path_name(worker.removesuffix("*"), "worker name")
    key_dir.mkdir(parents=True, exist_ok=True)
    meta = {"worker": worker} if worker else None
    public, secret = zmq.auth.create_certificates(key_dir, name, metadata=meta)
    Path(secret).chmod(0o600)
    if worker:
        # pyzmq writes metadata into the secret file only; the broker reads public files.
        pub = Path(public)
        pub.write_text(pub.read_text().replace("metadata\n", f'metadata\n    worker = "{worker}"\n', 1))
    return Path(public), Path(secret)


def load_secret(path: str) -> tuple[bytes, bytes]:
    public, secret = zmq.auth.load_certificate(path)
    if secret is None:
        raise SecurityError(f"{path} holds no secret key: give the .key_secret file")
    return public, secret


def load_public(path: str) -> bytes:
    public, _ = zmq.auth.load_certificate(path)
    return public


def is_loopback(endpoint: str) -> bool:
    """True for tcp endpoints on 127.0.0.0/8, ::1 or localhost, and for ipc/inproc."""
    if not endpoint.startswith("tcp://"):
        return True
    host = urlsplit(endpoint).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name or a wildcard such as *: reachable from elsewhere


def curve_client(sock: zmq.Socket[bytes], secret_file: str, server_key_file: str) -> None:
    """Configure a client or worker socket to talk CURVE to the broker."""
    public, secret = load_secret(secret_file)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_serverkey = load_public(server_key_file)


def curve_server(sock: zmq.Socket[bytes], secret_file: str) -> None:
    public, secret = load_secret(secret_file)
    sock.curve_secretkey = secret
    sock.curve_publickey = public
    sock.curve_server = True


@dataclass(slots=True)
class Peer:
    name: str
    worker: str | None


class ZapHandler:
    """Answers ZAP requests for the broker's context on a thread that owns the ZAP socket.

    A key must be in the clients directory. The user id of an accepted connection is its
    certificate's name, which the broker reads from a worker's READY to check that the
    worker name was issued to that key. The directory is read again when it changes (checked
    when a connection with an unknown key arrives, at most once a second), so a key is added
    or rotated without restarting the broker; a removed key admits no new connection.
    """

    RESCAN = 1.0  # seconds between looks at the clients directory

    def __init__(
        self,
        ctx: zmq.Context[zmq.Socket[bytes]],
        clients_dir: str,
        access: AccessFile | None = None,
        box: GrantBox | None = None,
    ) -> None:
        self.ctx = ctx
        self.clients_dir = Path(clients_dir)
        self.access = access
        self.keys: dict[bytes, Peer] = {}
        self.by_name: dict[bytes, Peer] = {}
        self.grants: dict[bytes, Grant] = {}  # ZAP user id (certificate name) -> what its key may do
        self._table: object = None  # the access table the grants were made from
        self.box = box if box is not None else GrantBox()  # where others read the grants (the event publisher)
        self._stamp: tuple[object, ...] = ()
        self._scanned_at = 0.0
        self.reloads = 0
        self._load()
        if not self.keys:
            raise SecurityError(f"no public keys (*.key) in {clients_dir}: nobody could connect")
        self.refused = 0
        self._sock = ctx.socket(zmq.REP)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(ZAP_ENDPOINT)
        self._stop = threading.Event()
        self._waker = Waker()
        self._thread = threading.Thread(target=self._run, name="zfab-zap", daemon=True)

    def _load(self) -> None:
        keys: dict[bytes, Peer] = {}
        certs = sorted(self.clients_dir.glob("*.key"))
        for cert in certs:
            try:
                public, _ = zmq.auth.load_certificate(cert)
            except (OSError, ValueError) as exc:
                log.warning("CURVE: skipping unreadable certificate %s: %s", cert, exc)
                continue
            # Certificates hold Z85 text; ZAP hands over the raw 32-byte key.
            keys[z85.decode(public)] = Peer(cert.stem, _metadata(cert).get("worker"))
        # Whole dicts replaced at once: the broker's thread reads by_name while this one reloads.
        self.keys, self.by_name = keys, {p.name.encode(): p for p in keys.values()}
        self._stamp = self._fingerprint(certs)
        self._grant_all()

    def _grant_all(self) -> None:
        """Each key's grant: its entry in the access file, else what its certificate says (a key issued
        for a worker registers and does nothing else; any other key may do everything, as before roles)."""
        table = self.access.table if self.access is not None else None
        grants: dict[bytes, Grant] = {}
        for name, peer in self.by_name.items():
            entry = table.keys.get(peer.name) if table is not None else None
            if entry is None:
                entry = (
                    Grant.of(peer.name, "viewer", register=ALL, client=False)
                    if peer.worker is not None
                    else Grant.of(peer.name, "admin")
                )
            grants[name] = entry
        self.grants = grants
        self._table = table
        self.box.table = grants

    def grant_of(self, user_id: bytes | None) -> Grant | None:
        return self.grants.get(user_id or b"")

    def _fingerprint(self, certs: list[Path]) -> tuple[object, ...]:
        out: list[object] = []
        for c in certs:
            try:
                st = c.stat()
            except OSError:
                continue
            out.append((c.name, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def rescan(self, now: float) -> bool:
        """Read the directory again if it changed (rate-limited). True when the keys changed."""
        if now - self._scanned_at < self.RESCAN:
            return False
        self._scanned_at = now
        if self.access is not None and self.access.current(now) is not self._table:
            self._grant_all()  # the access file changed: the keys' grants follow at once
        if self._fingerprint(sorted(self.clients_dir.glob("*.key"))) == self._stamp:
            return False
        self._load()
        self.reloads += 1
        log.info("CURVE: %d accepted keys after a change in %s", len(self.keys), self.clients_dir)
        return True

    def start(self) -> None:
        # The socket was made and bound on this thread before the thread starts; from
        # here on only the ZAP thread touches it.
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._waker.wake()
        self._thread.join(2)

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._waker.fd, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                try:
                    events = dict(poller.poll())
                except zmq.ContextTerminated:
                    return
                if self._sock not in events:
                    continue
                try:
                    self._sock.send_multipart(self.decide(self._sock.recv_multipart()))
                except zmq.ZMQError as exc:
                    log.warning("ZAP handler: %s", exc)
        finally:
            self._sock.close(0)
            self._waker.close()

    def may_register(self, name: bytes, user_id: bytes | None, service: bytes | None = None) -> bool:
        """True when the key a worker's READY came with was issued for this worker name: exactly,
        or by a prefix ending in `*` (one key for a Deployment's replicas, e.g. `zfab-worker-*`), and its
        entry in the access file lets it register `service`."""
        peer = self.by_name.get(user_id or b"")
        if peer is None or peer.worker is None:
            return False
        grant = self.grants.get(user_id or b"")
        if service is not None and (grant is None or not grant.may_register(service.decode(errors="replace"))):
            return False
        issued = peer.worker.encode()
        return name.startswith(issued[:-1]) if issued.endswith(b"*") else name == issued

    def decide(self, req: list[bytes]) -> list[bytes]:
        """One ZAP request (RFC 27) → its reply frames."""
        if len(req) < 6:
            return [b"1.0", b"", b"500", b"malformed ZAP request", b"", b""]
        version, request_id, _domain, address, _identity, mechanism = req[:6]
        creds = req[6:]

        def reply(code: bytes, text: str, user: bytes = b"") -> list[bytes]:
            if code != b"200":
                self.refused += 1
                log.warning("refused %s from %s: %s", mechanism.decode(errors="replace"), address.decode(), text)
            return [version, request_id, code, text.encode(), user, b""]

        if mechanism != b"CURVE" or not creds:
            return reply(b"400", "CURVE required")
        # Every handshake looks for changes (at most once a second), not only an unknown key's:
        # a key added since is accepted, and a key removed since admits no new connection.
        self.rescan(time.monotonic())
        peer = self.keys.get(creds[0])
        if peer is None:
            return reply(b"400", "unknown public key")
        grant = self.grants.get(peer.name.encode())
        if _domain == EVENTS_DOMAIN and (grant is None or not grant.allows("read")):
            return reply(b"400", f"key {peer.name} may not subscribe to the broker's events (its access entry)")
        # ZAP does not see the peer's identity: the broker checks worker names per frame
        # against the user id returned here (see may_register).
        return reply(b"200", "OK", peer.name.encode())


def _metadata(cert: Path) -> dict[str, str]:
    """The metadata section of a ZeroMQ certificate file (zmq.auth does not return it)."""
    out: dict[str, str] = {}
    section = ""
    for raw in cert.read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line.strip():
            continue
        if not line.startswith((" ", "\t")):
            section = line.strip()
            continue
        if section == "metadata" and "=" in line:
            key, value = line.split("=", 1)
            out[key.strip()] = value.strip().strip('"')
    return out
