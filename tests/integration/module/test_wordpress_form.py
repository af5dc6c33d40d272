"""test_wordpress_form.py -- the login rule against a client who has read
how the module reads a form: Debian's WordPress 6.1 on MariaDB behind two
prefork Apache replicas (tbtest/wordpress.py), protected by

    <Location "/wp-login.php">
        TBucketEnable On
        TBucketRule user "%{FORMLOGIN:log}" 3 1/m count=200
    </Location>

Each attack posts ten wrong passwords for the admin, each from another
address (so only the user rule can stop them), in a shape where the
module and PHP could read different fields: a name PHP cuts at a NUL, a
decoy beside it, a decoy past the 1,000 pairs PHP reads, a name PHP
renames ('.' for '_'), or a user name WordPress folds into the admin's
(entities, markup, accents, full-width letters, invisible characters).
At most capacity + rate x T of them may reach PHP, and then the admin's
real password, in the same shape, is refused rather than let in.
"""
import os
import time

import pytest

from tbtest.wordpress import TEST_COOKIE, bound, protect, request

RULES = """<Location "/wp-login.php">
    TBucketEnable On
    TBucketRule user "%{FORMLOGIN:log}" 3 1/m count=200
</Location>"""

# A rule on the lost-password form's user_login: each request charged.
RESET_RULES = """<Location "/wp-login.php">
    TBucketEnable On
    TBucketRule reset "%{FORMLOGIN:user_login}" 3 1/m
</Location>"""

TAIL = b"&wp-submit=Log+In&testcookie=1"

# docs/guide.md's mu-plugin: logins by e-mail address off.
NO_EMAIL_LOGIN = """<?php
remove_filter('authenticate', 'wp_authenticate_email_password', 20);
"""


def post(wp, replica, body, source_ip, path="/wp-login.php"):
    """POST a raw form body, with the test cookie a browser holds; the
    status."""
    return request(wp.replica(replica), "POST", path, body=body,
                   source_ip=source_ip,
                   headers={"Content-Type":
                            "application/x-www-form-urlencoded",
                            "Cookie": "%s=%s" % TEST_COOKIE}).status


def attack(wp, shape, net):
    """Ten wrong passwords in shape (a function of the attempt's number
    and the password, giving the body), each from its own address of
    127.0.net.x, over both replicas; then the admin's real password in
    the same shape. (statuses, PHP's view of the posts that reached it,
    the real password's status, t0)."""
    t0 = time.monotonic()
    before = len(wp.post_log())
    statuses = [post(wp, i % 2, shape(i, b"guess%d" % i),
                     "127.0.%d.%d" % (net, i + 1)) for i in range(10)]
    reached = [e for e in wp.post_log()[before:]
               if e["remote_addr"].startswith("127.0.%d." % net)]
    real = post(wp, 0, shape(10, wp.admin[1].encode()),
                "127.0.%d.99" % net)
    return statuses, reached, real, t0


def admin():
    return b"tbadmin"


# A login field PHP reads and the rule must read the same: "log%00x" (PHP
# cuts the name at the NUL: log), a decoy beside it ("log=decoy&log%00="),
# and a decoy after 1,001 empty pairs (PHP stops reading at 1,000). At
# most capacity + rate x T of ten attempts on the admin reach WordPress,
# and the real password in the same shape is then refused.
@pytest.mark.parametrize("shape", [
    lambda i, pw: b"log%00x=" + admin() + b"&pwd=" + pw + TAIL,
    lambda i, pw: b"log=decoy%d&log%%00=" % i + admin() + b"&pwd=" + pw +
    TAIL,
    lambda i, pw: b"log=" + admin() + b"&pwd=" + pw + TAIL + b"&" * 1001 +
    b"log=decoy%d" % i,
], ids=["nul-name", "nul-decoy", "max-input-vars"])
def test_module_195_01(wp, redis_server, shape):
    assert wp.admin[0] == admin().decode()
    protect(wp, redis_server, "wf1:", RULES)
    statuses, reached, real, t0 = attack(wp, shape, 30)
    # WordPress read the admin's name in every post that reached it.
    assert all(e["post"].get("log") == wp.admin[0] for e in reached), \
        [e["post"].get("log") for e in reached]
    assert len(reached) <= bound(3, 1, t0), (len(reached), statuses)
    assert statuses.count(429) == 10 - len(reached), statuses
    assert real == 429, real


# A rule on a field whose name holds '_' (the lost-password form's
# user_login): "user.login" and "user[login" are user_login to PHP, so
# they are charged to the same user; at most capacity + rate x T of ten
# reset requests for the admin reach WordPress.
def test_module_195_02(wp, redis_server):
    protect(wp, redis_server, "wf2:", RESET_RULES)
    t0 = time.monotonic()
    path = "/wp-login.php?action=lostpassword"
    before = len(wp.post_log(path))
    names = (b"user.login", b"user+login", b"user[login")
    statuses = [post(wp, i % 2, names[i % 3] + b"=" + admin() +
                     b"&redirect_to=&wp-submit=Get+New+Password",
                     "127.0.31.%d" % (i + 1), path=path)
                for i in range(10)]
    reached = [e for e in wp.post_log(path)[before:]
               if e["remote_addr"].startswith("127.0.31.")]
    assert all(e["post"].get("user_login") == wp.admin[0]
               for e in reached), [e["post"] for e in reached]
    assert len(reached) <= bound(3, 1, t0), (len(reached), statuses)
    assert statuses.count(429) == 10 - len(reached), statuses


# User names WordPress's sanitize_user() and the database's collation
# make the admin: "tbadmin&x;", markup, an accent, full-width letters, a
# zero-width space, a trailing no-break space. They cannot spread over
# buckets: at most capacity + rate x T of ten attempts reach WordPress,
# and then the real password under each spelling is refused.
def test_module_195_03(wp, redis_server):
    protect(wp, redis_server, "wf3:", RULES)
    variants = [b"tbadmin%26x%3B", b"tbadmin%3Cscript%3E1%3C%2Fscript%3E",
                b"tb%C3%A1dmin", b"%EF%BD%94%EF%BD%82admin",
                b"tb%E2%80%8Badmin", b"tbadmin%C2%A0"]

    def shape(i, pw):
        return b"log=" + variants[i % len(variants)] + b"&pwd=" + pw + TAIL

    statuses, reached, real, t0 = attack(wp, shape, 32)
    assert len(reached) <= bound(3, 1, t0), (len(reached), statuses)
    assert statuses.count(429) == 10 - len(reached), statuses
    assert real == 429, real
    for k, v in enumerate(variants):
        st = post(wp, k % 2, b"log=" + v + b"&pwd=" +
                  wp.admin[1].encode() + TAIL, "127.0.32.%d" % (100 + k))
        assert st == 429, (v, st)


# What the guide says of e-mail addresses: WordPress takes the admin's
# address in `log` as a second name, so the account has two buckets (at
# most twice capacity + rate x T reach PHP, and the real password is then
# refused under both names); the guide's one-line mu-plugin takes the
# second name away (the address no longer logs in; the name still does).
def test_module_195_04(wp, redis_server):
    protect(wp, redis_server, "wf4:", RULES)
    email = b"admin%40example.org"
    statuses, reached, real, t0 = attack(
        wp, lambda i, pw: b"log=" + (email if i % 2 else admin()) +
        b"&pwd=" + pw + TAIL, 33)
    assert 2 * 3 <= len(reached) <= 2 * bound(3, 1, t0), \
        (len(reached), statuses)
    right = b"&pwd=" + wp.admin[1].encode() + TAIL
    assert real == 429, real
    assert post(wp, 1, b"log=" + email + right, "127.0.33.98") == 429
    protect(wp, redis_server, "wf5:", RULES)
    assert post(wp, 0, b"log=" + email + right, "127.0.34.1") == 302
    plugin = os.path.join(wp.docroot, "wp-content", "mu-plugins",
                          "no-email-login.php")
    with open(plugin, "w") as f:
        f.write(NO_EMAIL_LOGIN)
    os.chmod(plugin, 0o644)
    try:
        assert post(wp, 1, b"log=" + email + right, "127.0.34.2") == 200
        assert post(wp, 1, b"log=" + admin() + right, "127.0.34.3") == 302
    finally:
        os.unlink(plugin)


# After every shape above: no sanitizer report and no module warning in
# either replica's log (PHP's own warning for the pairs past
# max_input_vars aside).
def test_module_195_05(wp):
    for a in wp.replicas:
        a.assert_log_clean(allowed=("TB00160", "Input variables exceeded"))
