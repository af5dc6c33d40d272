"""test_directive_fuzz.py -- a bounded, seeded fuzz of every directive's
arguments through the real `apache2 -t`.

The module's directive handlers need cmd_parms and httpd's pools, so they
cannot be linked into a libFuzzer target; the core parsers they call are
(tests/fuzz/). This drives the handlers themselves: hostile and mutated
values for each directive, in server and <Location> scope, each checked by
`apache2 -t`. Every run must end with "Syntax OK" or a refusal that names
the directive, never a signal, a hang or a message without the directive.
TB_DIRECTIVE_FUZZ sets the number of configs (default 150; `make fuzz`
style runs can raise it); TB_DIRECTIVE_FUZZ_SEED the seed.
"""
import os
import random


COUNT = int(os.environ.get("TB_DIRECTIVE_FUZZ", "150"))
SEED = int(os.environ.get("TB_DIRECTIVE_FUZZ_SEED", "20261202"))

# (directive, argument count, good values to mutate, server scope only)
DIRECTIVES = [
    ("TBucketRedis", 1, ["redis://127.0.0.1:6379 timeout=50 pool=2",
                         "unix:/run/redis.sock?db=2 connect_timeout=20",
                         "redis://u:p@[::1]:7000/3"], True),
    ("TBucketFailurePolicy", 1, ["open", "closed", "local"], True),
    ("TBucketReplicas", 1, ["3", "1"], True),
    ("TBucketBreaker", 1, ["threshold=5 cooldown=10s",
                           "cooldown=250ms threshold=1"], True),
    ("TBucketPrefix", 1, ["rl:", "api-v2:"], True),
    ("TBucketEnable", 1, ["On", "Off"], False),
    ("TBucketKey", 1, ['"%{HTTP:X-API-Key}"', '"%{REMOTE_ADDR}"'], False),
    ("TBucketLimit", 2, ["100 10/s", "5 0.5/m", "1 1/h"], False),
    ("TBucketCost", 1, ["1", "10"], False),
    ("TBucketTenant", 3, ["key-1 1000 100/s"], False),
    ("TBucketRouteLimit", 3, ["export 5 1/m"], False),
    ("TBucketAlgorithm", 1, ["gcra", "sliding-log"], False),
    ("TBucketMode", 1, ["enforce", "shadow"], False),
    ("TBucketHeaders", 1, ["legacy", "both"], False),
]

ATOMS = ["", "0", "-1", "1e309", "nan", "inf", "0x10", "1/", "/s", "1//s",
         "9" * 40, "=", "timeout=", "pool=0", "pool=99999", "threshold=",
         "cooldown=-1s", "redis://", "redis://:@", "redis://[", "unix:",
         "unix:relative", "%{", "%{HTTP:}", "\"", "''", "{", "}", "\\",
         "\t", "a" * 300, "\u00e9\u00e8", "\u2028", "1.5", "1e3/s",
         "0.000000001/s", "1000000001", "redis://h:0", "redis://h:65536"]


def mutate(rng, value):
    """One hostile variant of a good value."""
    words = value.split(" ")
    op = rng.randrange(5)
    if op == 0:
        words[rng.randrange(len(words))] = rng.choice(ATOMS)
    elif op == 1:
        words.append(rng.choice(ATOMS))
    elif op == 2 and len(words) > 1:
        del words[rng.randrange(len(words))]
    elif op == 3:
        w = rng.randrange(len(words))
        s = words[w]
        i = rng.randrange(len(s) + 1)
        words[w] = s[:i] + rng.choice(ATOMS) + s[i:]
    else:
        words = [rng.choice(ATOMS) for _ in range(rng.randrange(1, 4))]
    return " ".join(words)


def config_for(directive, server_only, value):
    line = "%s %s" % (directive, value)
    if server_only:
        return line + "\n"
    return "<Location /f>\n%s\n</Location>\n" % line


# test_module_009_01: hostile directive arguments are refused with the
# directive named, or accepted; apache2 -t never crashes or hangs.
def test_module_009_01(apache_factory):
    rng = random.Random(SEED)
    a = apache_factory()
    refused = 0
    for _ in range(COUNT):
        directive, _, goods, server_only = rng.choice(DIRECTIVES)
        value = mutate(rng, rng.choice(goods))
        if value.endswith("\\"):
            # A trailing backslash continues the line: httpd's reader.
            value += "x"
        rc, out = a.configtest(config_for(directive, server_only, value))
        where = "%s %r" % (directive, value)
        assert rc in (0, 1), "%s: exit %d\n%s" % (where, rc, out)
        assert "Segmentation" not in out and "AddressSanitizer" not in out, (
            where, out)
        if rc == 0:
            assert "Syntax OK" in out, (where, out)
        else:
            refused += 1
            # httpd's own argument-count errors name the directive too.
            assert directive in out, (where, out)
    # The mutations must mostly be refusals, or the generator is broken.
    assert refused > COUNT // 3, refused
