"""test_wordpress.py -- the WordPress rig (tbtest/wordpress.py) works
without any rate limit: Debian's WordPress 6.1 on a MariaDB of the
test's own, behind two prefork Apache replicas with mod_php, logs a user
in with the right password (302 and a login cookie good on both
replicas) and refuses a wrong one (200 and the login error), from two
source addresses, and the login form's body reaches PHP byte for byte.
Last, the rig's hook puts a caller's lines into the virtual hosts (a
plain TBucketLimit on /wp-login.php): the rate-limit rules tests build
on the same rig."""
import pytest

from tbtest.wordpress import (LOGIN_ERROR, TEST_COOKIE, login_body,
                              started_rig)

# Client source addresses (the whole of 127/8 is this host's).
SOURCES = ("127.0.0.2", "127.0.0.3")


# A rig of this file's own, not conftest.py's shared one: these tests
# check a fresh rig (no limit yet, logs clean from its start).
@pytest.fixture(scope="module")
def wp():
    yield from started_rig()


def logged_in_cookie(cookies):
    return [k for k in cookies if k.startswith("wordpress_logged_in_")]


def check_logs_clean(wp):
    """No warning in Apache's error logs, no PHP error or warning."""
    for a in wp.replicas:
        a.assert_log_clean()
    php = wp.php_log()
    assert "PHP Fatal" not in php and "PHP Warning" not in php, php[-3000:]


# Both replicas serve the login page, each under its own host:port (the
# form posts back to the replica asked) and set the test cookie that
# login() sends back; the rig came up in under a minute (figures in the
# message).
def test_module_190_01(wp):
    assert wp.timings["total"] < 60, wp.timings
    for i, host in enumerate(wp.hosts()):
        r = wp.get(i, "/wp-login.php")
        assert r.status == 200, r.text[-1000:]
        assert 'id="loginform"' in r.text
        assert 'action="http://%s/wp-login.php"' % host in r.text
        assert r.cookies.get(TEST_COOKIE[0]) == TEST_COOKIE[1], r.cookies
    check_logs_clean(wp)


# The ordinary user's right password, from two source addresses on two
# replicas: 302 to that replica's wp-admin with a login cookie; the
# cookies got from replica 0 open the profile on replica 1, and no
# cookie gets the login page instead.
def test_module_190_02(wp):
    name, password = wp.user
    got = []
    for i, src in enumerate(SOURCES):
        r = wp.post_login(i, name, password, source_ip=src)
        assert r.status == 302, r.text[-1000:]
        assert r.location == "http://%s/wp-admin/profile.php" % wp.hosts()[i]
        assert len(logged_in_cookie(r.cookies)) == 1, r.cookies
        got.append(r)
    assert wp.login(1, wp.admin[0], wp.admin[1], SOURCES[0]) == 302
    p = wp.get(1, "/wp-admin/profile.php", cookies=got[0].cookies,
               source_ip=SOURCES[1])
    assert p.status == 200, (p.status, p.location)
    assert 'name="user_login" id="user_login" value="%s"' % name in p.text
    p = wp.get(1, "/wp-admin/profile.php", source_ip=SOURCES[1])
    assert p.status == 302 and "/wp-login.php" in p.location
    check_logs_clean(wp)


# A wrong password (and an unknown user), from both source addresses on
# both replicas: 200, the form again with the login error, no cookie.
def test_module_190_03(wp):
    name, password = wp.user
    for i, src in enumerate(SOURCES):
        for user, pw, words in (
                (name, password + "x",
                 "The password you entered for the username"),
                ("nobody", password, "is not registered on this site")):
            r = wp.post_login(i, user, pw, source_ip=src)
            assert r.status == 200, (r.status, r.location)
            assert LOGIN_ERROR in r.text and words in r.text, r.text[-2000:]
            assert 'id="loginform"' in r.text
            assert not logged_in_cookie(r.cookies), r.cookies
    check_logs_clean(wp)


# What PHP received of each login post is the body the client sent, byte
# for byte (a password with & = + % / and a UTF-8 letter in it), from the
# client's source address, on the replica it was sent to, with the status
# the client saw; $_POST holds the password as typed.
def test_module_190_04(wp):
    name, password = wp.user
    before = len(wp.post_log())
    sent = []
    for i, src in enumerate(SOURCES):
        for pw in (password, password[::-1]):
            status = wp.login(i, name, pw, source_ip=src)
            sent.append((login_body(name, pw), src, wp.hosts()[i], status,
                         pw))
    assert [s[3] for s in sent] == [302, 200, 302, 200]
    got = wp.post_log()[before:]
    assert len(got) == len(sent), got
    for e, (body, src, host, status, pw) in zip(got, sent):
        assert e["body"] == body
        assert e["remote_addr"] == src
        assert e["host"] == host
        assert e["status"] == status
        assert e["content_type"] == "application/x-www-form-urlencoded"
        assert e["post"]["log"] == name and e["post"]["pwd"] == pw
    assert b"%26" in sent[0][0] and b"%C3%A9" in sent[0][0]
    check_logs_clean(wp)


# The caller's lines reach the virtual host: a plain TBucketLimit of 2
# per client address on /wp-login.php, shared by both replicas through
# one Redis, refuses a client's third login post (429, and PHP never sees
# it) while the other address still logs in; without the lines again
# (graceful restart, WordPress untouched) the first client logs in.
def test_module_190_05(wp, redis_server):
    name, password = wp.user
    wp.configure(server="TBucketRedis %s timeout=500\nTBucketPrefix wp5"
                 % redis_server.url,
                 vhost='<Location "/wp-login.php">\n'
                       '    TBucketEnable On\n'
                       '    TBucketLimit 2 1/m\n'
                       '</Location>')
    try:
        before = len(wp.post_log())
        assert wp.login(0, name, password, SOURCES[0]) == 302
        assert wp.login(1, name, password + "x", SOURCES[0]) == 200
        r = wp.post_login(0, name, password, source_ip=SOURCES[0])
        assert r.status == 429, (r.status, r.text[-500:])
        assert not logged_in_cookie(r.cookies)
        assert wp.login(1, name, password, SOURCES[1]) == 302
        got = wp.post_log()[before:]
        assert [(e["remote_addr"], e["status"]) for e in got] == [
            (SOURCES[0], 302), (SOURCES[0], 200), (SOURCES[1], 302)]
    finally:
        wp.configure()
    assert wp.login(0, name, password, SOURCES[0]) == 302
    check_logs_clean(wp)
