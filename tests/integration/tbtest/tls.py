"""tbtest/tls.py -- TLS fixtures: a test PKI made by openssl, TLS redis-servers.

`pki` (session scope) makes, with the openssl CLI, in a temp dir:
  ca.pem / ca.key            the test CA
  server.pem / server.key    signed by it, SAN IP:127.0.0.1, DNS:localhost
  client.pem / client.key    signed by it, for tls-auth-clients yes
  expired.pem / expired.key  like server.pem, valid only in January 2020
                             (signed with `openssl ca -startdate -enddate`)
  other-ca.pem / other-ca.key  a CA that signed none of the above
Keys are EC P-256 (fast to make) and mode 0600.

`TlsRedis` is a redis-server speaking only TLS (`port 0`, `tls-port P`);
`tls_redis` is a factory for them, stopped by PID at teardown.

conftest.py registers the two fixtures; test files use them by name.
"""
import os
import subprocess

from tbtest.env import Redis, require

OPENSSL = "/usr/bin/openssl"
SAN = "subjectAltName=IP:127.0.0.1,DNS:localhost\n"

CA_CNF = """[ ca ]
default_ca = tbca
[ tbca ]
database = {d}/index.txt
new_certs_dir = {d}/newcerts
serial = {d}/serial
default_md = sha256
policy = anything
unique_subject = no
[ anything ]
commonName = supplied
[ server ]
subjectAltName = IP:127.0.0.1,DNS:localhost
extendedKeyUsage = serverAuth
"""


class Pki:
    """Paths of the test PKI's files (see the module docstring)."""

    def __init__(self, d):
        self.dir = str(d)

    def __getattr__(self, name):
        # pki.server_pem -> <dir>/server.pem
        if name.startswith("_"):
            raise AttributeError(name)
        stem, _, ext = name.rpartition("_")
        return os.path.join(self.dir, stem.replace("_", "-") + "." + ext)


def _openssl(d, *args):
    r = subprocess.run([OPENSSL] + list(args), cwd=d, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=60)
    assert r.returncode == 0, "openssl %s: %s" % (
        " ".join(args), r.stdout.decode(errors="replace"))


def _key(d, name):
    _openssl(d, "genpkey", "-algorithm", "EC", "-pkeyopt",
             "ec_paramgen_curve:P-256", "-out", name + ".key")
    os.chmod(os.path.join(d, name + ".key"), 0o600)


def _ca(d, name, cn):
    _key(d, name)
    _openssl(d, "req", "-x509", "-new", "-key", name + ".key", "-sha256",
             "-days", "30", "-subj", "/CN=" + cn,
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             "-out", name + ".pem")


def _leaf(d, name, cn, ext):
    """A key and a certificate signed by ca.pem with extensions ext."""
    _key(d, name)
    _openssl(d, "req", "-new", "-key", name + ".key", "-subj", "/CN=" + cn,
             "-out", name + ".csr")
    with open(os.path.join(d, name + ".ext"), "w") as f:
        f.write(ext)
    _openssl(d, "x509", "-req", "-in", name + ".csr", "-CA", "ca.pem",
             "-CAkey", "ca.key", "-CAcreateserial", "-days", "30",
             "-sha256", "-extfile", name + ".ext", "-out", name + ".pem")


def _expired(d):
    """A server certificate whose validity ended in 2020: OpenSSL 3.0's
    x509 and req take no start date, `openssl ca` does."""
    _key(d, "expired")
    _openssl(d, "req", "-new", "-key", "expired.key", "-subj",
             "/CN=localhost", "-out", "expired.csr")
    os.makedirs(os.path.join(d, "newcerts"), exist_ok=True)
    open(os.path.join(d, "index.txt"), "w").close()
    with open(os.path.join(d, "serial"), "w") as f:
        f.write("1000\n")
    with open(os.path.join(d, "ca.cnf"), "w") as f:
        f.write(CA_CNF.format(d=d))
    _openssl(d, "ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem",
             "-keyfile", "ca.key", "-in", "expired.csr", "-out",
             "expired.pem", "-startdate", "20200101000000Z", "-enddate",
             "20200201000000Z", "-extensions", "server", "-notext")


def make_pki(d):
    require(OPENSSL, "openssl")
    d = str(d)
    os.makedirs(d, exist_ok=True)
    _ca(d, "ca", "tb test CA")
    _ca(d, "other-ca", "tb other CA")
    # Cluster nodes present their server certificate as clients of each
    # other's bus, which always asks for one: both usages.
    _leaf(d, "server", "localhost",
          SAN + "extendedKeyUsage=serverAuth,clientAuth\n")
    _leaf(d, "client", "tb client", "extendedKeyUsage=clientAuth\n")
    _expired(d)
    return Pki(d)


class TlsRedis(Redis):
    """A redis-server that speaks only TLS on a free loopback port (its
    `port`): the plaintext port is 0, which comes after Redis's own line.

    cert/key default to the PKI's server pair; auth_clients "yes" asks for
    a client certificate signed by the PKI's CA."""

    def __init__(self, tmpdir, pki, cert=None, key=None, auth_clients="no",
                 port=None, extra=None, password=None):
        self.pki = pki
        super().__init__(tmpdir, port=port, password=password)
        self.extra = [
            "port 0",
            "tls-port %d" % self.port,
            "tls-cert-file %s" % (cert or pki.server_pem),
            "tls-key-file %s" % (key or pki.server_key),
            "tls-ca-cert-file %s" % pki.ca_pem,
            "tls-auth-clients %s" % auth_clients,
        ] + self.extra + list(extra or [])

    @property
    def url(self):
        return "rediss://127.0.0.1:%d" % self.port

    @property
    def plain_url(self):
        """The plaintext scheme pointed at the TLS port."""
        return "redis://127.0.0.1:%d" % self.port

    def client(self, **kw):
        """The tests' own redis-py client. It checks no certificate: it
        must reach a server with an expired one too."""
        import redis
        kw.setdefault("socket_timeout", 5)
        if self.password:
            kw.setdefault("password", self.password)
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True,
                           ssl_cert_reqs="none",
                           ssl_certfile=self.pki.client_pem,
                           ssl_keyfile=self.pki.client_key, **kw)
