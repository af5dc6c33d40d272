"""test_core_auth.py -- AUTH, ACL users, SELECT and unix sockets.

Each test starts its own redis-server with the setting under test
(requirepass, ACL users, a unix socket) and checks that the client's URL
reaches it, and that wrong credentials are an `auth` error answered by the
failure policy, never a crash or a hang.
"""
import redis



# AUTH with a password (requirepass): the right password decides in Redis,
# a wrong or missing one is an auth error answered by the policy.
def test_core_004_01(make_redis, drivers):
    # Redis.start()'s readiness check pings without a password, so the
    # password is set once the server answers.
    srv = make_redis("pw")
    srv.client().config_set("requirepass", "s3cret")
    r = srv.client(password="s3cret")
    good = drivers("redis://:s3cret@127.0.0.1:%d" % srv.port)
    res = good.take("pw", 10, 1, 1)
    assert res["source"] == "redis" and res["remaining"] == 9, res
    assert float(r.hget("tb:{pw}", "tokens")) == 9
    bad = drivers("redis://:wrong@127.0.0.1:%d" % srv.port)
    res = bad.take("pw", 10, 1, 1)
    assert res["source"] == "open" and res["err"] == "auth", res
    none = drivers("redis://127.0.0.1:%d" % srv.port, policy="closed")
    res = none.take("pw", 10, 1, 1)
    assert res["source"] == "closed" and res["err"] in ("auth", "reply")
    assert float(r.hget("tb:{pw}", "tokens")) == 9


# AUTH as an ACL user with a %-escaped password and a key pattern: the
# user decides on its own keys; with the default user disabled, wrong
# credentials are an auth error; a prefix outside the user's key pattern
# is refused by Redis (an error reply), not silently allowed.
def test_core_004_02(make_redis, drivers):
    srv = make_redis("acl")
    admin = srv.client()
    admin.execute_command("ACL", "SETUSER", "bob", "on", ">p@ss:w/rd%",
                          "~tb:*", "+@all")
    admin.execute_command("ACL", "SETUSER", "default", "off")
    port = srv.port
    bob = redis.Redis(host="127.0.0.1", port=port, username="bob",
                      password="p@ss:w/rd%", socket_timeout=5)
    d = drivers("redis://bob:p%40ss%3Aw%2Frd%25@127.0.0.1:" + str(port))
    res = d.take("acl", 10, 1, 1)
    assert res["source"] == "redis" and res["remaining"] == 9, res
    assert float(bob.hget("tb:{acl}", "tokens")) == 9
    wrong = drivers("redis://bob:nope@127.0.0.1:%d" % port)
    res = wrong.take("acl", 10, 1, 1)
    assert res["err"] == "auth" and res["source"] == "open", res
    nobody = drivers("redis://carol:x@127.0.0.1:%d" % port)
    assert nobody.take("acl", 10, 1, 1)["err"] == "auth"
    other = drivers("redis://bob:p%40ss%3Aw%2Frd%25@127.0.0.1:" + str(port),
                    prefix="other:", policy="closed")
    res = other.take("acl", 10, 1, 1)
    assert res["source"] == "closed" and res["err"] == "reply", res
    assert bob.exists("tb:{acl}") == 1


# /db selects the database: the bucket lands in db 3, not in db 0.
def test_core_004_03(redis_server, drivers):
    d = drivers(redis_server.url + "/3")
    assert d.take("db", 10, 1, 1)["source"] == "redis"
    assert redis_server.client(db=3).exists("tb:{db}") == 1
    assert redis_server.client(db=0).exists("tb:{db}") == 0
    bad = drivers(redis_server.url + "/999", policy="closed")
    res = bad.take("db", 10, 1, 1)
    assert res["source"] == "closed" and res["err"] in ("auth", "reply")


# A unix socket address (unix:/path?db=N) reaches Redis.
def test_core_004_04(make_redis, drivers, tmp_path):
    sock = str(tmp_path / "r.sock")
    srv = make_redis("unix", extra=["unixsocket %s" % sock,
                                    "unixsocketperm 700"])
    d = drivers("unix:%s?db=2" % sock)
    res = d.take("ux", 10, 1, 1)
    assert res["source"] == "redis" and res["remaining"] == 9, res
    assert srv.client(db=2).exists("tb:{ux}") == 1
