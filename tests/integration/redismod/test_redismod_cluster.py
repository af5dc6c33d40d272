"""test_redismod_cluster.py -- tbucket_redis.so in a Redis Cluster of three
primaries (each loads the module).

The commands declare their keys through the getkeys API from numkeys, as
EVAL's are found: COMMAND GETKEYS names them, a cluster-aware client
(redis-py's RedisCluster, which asks COMMAND GETKEYS for commands with
movable keys) routes each call to the key's node, a node refuses keys of
two slots with CROSSSLOT exactly as for EVAL, answers MOVED for a slot it
does not own, and ASK for a key of a slot being migrated, which the client
follows.
"""
import pytest
import redis as redis_py
from redis.cluster import RedisCluster

from tbtest.core import keyslot
from tbtest.redismod import (module_cluster, module_path, sanitizer_reports,
                             script_text)


@pytest.fixture
def rig(tmp_path):
    c = module_cluster(tmp_path, module_path()).start()
    yield c
    c.stop()
    for n in c.nodes:
        assert sanitizer_reports(n.dir) == []


def cluster_client(rig):
    n = rig.nodes[0]
    return RedisCluster(host="127.0.0.1", port=n.port, socket_timeout=5)


# COMMAND GETKEYS names the keys numkeys counts (and none for a bad
# numkeys); the cluster-aware client routes 120 keys over all three
# nodes, each call deciding on the key's own node like EVAL.
def test_redismod_006_01(rig):
    node = rig.nodes[0].client()
    got = node.command_getkeys("tbucket.bucket", "2", "a", "{a}b", "", "1",
                               "1", "1", "1", "1", "1")
    assert [x.decode() if isinstance(x, bytes) else x for x in got] == \
        ["a", "{a}b"]
    with pytest.raises(redis_py.ResponseError):
        node.command_getkeys("tbucket.bucket", "x", "a", "")
    rc = cluster_client(rig)
    owners = set()
    for i in range(120):
        key = "user%d" % i
        got = rc.execute_command("tbucket.bucket", 1, key, "", "5", "1", "2")
        assert got == [1, 3, 0, 0], key
        port = rig.owner(keyslot(key))
        owners.add(port)
        assert rig.by_port(port).client().hget(key, "tokens") == b"3"
        lua = rc.eval(script_text("token_bucket"), 1, key, "", "5", "1", "2")
        assert lua[0] == 1 and lua[1] in (1, 2)
    assert len(owners) == 3
    rc.close()


# Keys of two slots: CROSSSLOT from the node, for EVAL and for every
# tbucket.* command alike; keys sharing a hash tag are one slot and pass.
def test_redismod_006_02(rig):
    a, b = "{tenant-a}:k", "{tenant-b}:k"
    assert keyslot(a) != keyslot(b)
    node = rig.by_port(rig.owner(keyslot(a))).client()
    msgs = []
    for cmd in ("EVAL", "tbucket.bucket", "tbucket.gcra", "tbucket.swindow",
                "tbucket.fwindow", "tbucket.slog"):
        args = [script_text("token_bucket")] if cmd == "EVAL" else []
        with pytest.raises(redis_py.ResponseError) as e:
            node.execute_command(cmd, *args, 2, a, b, "", "5", "1", "1", "5",
                                 "1", "1")
        msgs.append(str(e.value))
    assert all(m.startswith("CROSSSLOT") for m in msgs), msgs
    assert len(set(msgs)) == 1
    got = node.execute_command("tbucket.bucket", 3, a, a + ":route:x",
                               a + ":conc", "", "5", "1", "1", "5", "1", "1",
                               "conc", "2", "1000", "id")
    assert got == [1, 4, 0, 0, 0, 1]


# A node that does not own the key's slot answers MOVED with the slot
# and its owner, as for EVAL.
def test_redismod_006_03(rig):
    key = "moved-key"
    slot = keyslot(key)
    owner = rig.owner(slot)
    other = next(n for n in rig.nodes if n.port != owner).client()
    for cmd in ("EVAL", "tbucket.bucket"):
        args = [script_text("token_bucket")] if cmd == "EVAL" else []
        with pytest.raises(redis_py.ResponseError) as e:
            other.execute_command(cmd, *args, 1, key, "", "5", "1", "1")
        assert str(e.value) == "MOVED %d 127.0.0.1:%d" % (slot, owner)


# A slot being migrated: its old owner answers ASK for a key it does not
# hold; RedisCluster follows it (ASKING, then the call on the importing
# node), where the bucket is made; a key still held is decided where it
# is.
def test_redismod_006_04(rig):
    key = "ask-key"
    slot = keyslot(key)
    src = rig.by_port(rig.owner(slot))
    dst = next(n for n in rig.nodes if n.port != src.port)
    dst.cluster("SETSLOT", slot, "IMPORTING", rig.node_id(src))
    src.cluster("SETSLOT", slot, "MIGRATING", rig.node_id(dst))
    with pytest.raises(redis_py.ResponseError) as e:
        src.client().execute_command("tbucket.gcra", 1, key, "", "5", "1",
                                     "1")
    assert str(e.value) == "ASK %d 127.0.0.1:%d" % (slot, dst.port)
    rc = cluster_client(rig)
    assert rc.execute_command("tbucket.gcra", 1, key, "", "5", "1", "1") \
        == [1, 4, 0, 0]
    p = dst.client().pipeline(transaction=False)
    p.execute_command("ASKING")
    p.exists(key)
    assert p.execute()[1] == 1
    # Not on the old owner, which sends a reader there too.
    with pytest.raises(redis_py.ResponseError, match="^ASK "):
        src.client().exists(key)
    rc.close()
