"""flask_peer.py -- the design's reference limiter: Flask + redis-py.

The same Lua script as the module (build/lua/tb_bucket.lua, the text libtb
embeds, or $TB_PEER_SCRIPT; read from disk and run with EVALSHA through redis-py's Script object, which reloads it on
NOSCRIPT), the same key shape (<prefix>{<key>}), the same limit and the
same tiny response, so that bench/run.py can put its req/s next to
mod_tbucket's under the same wrk settings. Served by gunicorn:

    TB_PEER_REDIS=redis://127.0.0.1:6379 TB_PEER_LIMIT="1000000000 1000000000" \
        gunicorn -w 5 -b 127.0.0.1:8081 --chdir bench/peers flask_peer:app

The key is the X-API-Key header, else the client address. Keys are not
sanitised as the core does (no hashing of long or hostile keys): this is a
yardstick, not a product.
"""
import os

import redis
from flask import Flask, Response, request

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.environ.get(
    "TB_PEER_SCRIPT",
    os.path.join(HERE, "..", "..", "build", "lua", "tb_bucket.lua"))
PREFIX = os.environ.get("TB_PEER_PREFIX", "peer:")
CAPACITY, RATE = os.environ.get("TB_PEER_LIMIT", "100 10").split()

app = Flask(__name__)
pool = redis.ConnectionPool.from_url(
    os.environ.get("TB_PEER_REDIS", "redis://127.0.0.1:6379"))
client = redis.Redis(connection_pool=pool)
with open(SCRIPT, "rb") as f:
    bucket = client.register_script(f.read())


@app.route("/", defaults={"path": ""})
@app.route("/<path:path>")
def limited(path):
    key = request.headers.get("X-API-Key") or request.remote_addr
    allowed, remaining, retry_ms, _ = bucket(
        keys=["%s{%s}" % (PREFIX, key)], args=["", CAPACITY, RATE, 1])
    headers = {"X-RateLimit-Limit": CAPACITY,
               "X-RateLimit-Remaining": str(remaining)}
    if allowed != 1:
        headers["Retry-After"] = str(max(1, -(-retry_ms // 1000)))
        return Response('{"error":"rate limited"}\n', 429, headers,
                        mimetype="application/json")
    return Response("ok\n", 200, headers, mimetype="text/plain")
