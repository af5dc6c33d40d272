/* fuzz_url.c -- tb_url_parse() and tb_url_redact() on arbitrary bytes.
 *
 * Invariants: no memory error; every field NUL-terminated within its
 * array; port 1..65535, db >= 0; exactly one of host/path set on success;
 * the redacted form is the password-free form with "***" in place of the
 * password (so the password never shows); parsing the
 * redacted URL of a password-free address gives the same address back.
 */
#include "fuzz_common.h"
#include "tb.h"

static int terminated(const char *s, size_t n)
{
    return memchr(s, '\0', n) != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *url = fuzz_cstr(data, size);
    tb_redis_addr_t a, b;
    char err[128], red[1024], red2[1024];
    int rc;

    memset(err, 'x', sizeof(err));
    rc = tb_url_parse(url, &a, err, sizeof(err));
    FUZZ_CHECK(rc == TB_OK || rc == TB_ERR, "rc %d", rc);
    if (rc != TB_OK) {
        FUZZ_CHECK(terminated(err, sizeof(err)), "err not terminated");
        /* The message must never echo the URL (it may hold a password). */
        if (strlen(url) >= 12) {
            FUZZ_CHECK(strstr(err, url) == NULL, "err echoes url");
        }
        free(url);
        return 0;
    }
    FUZZ_CHECK(terminated(a.host, sizeof(a.host)), "host");
    FUZZ_CHECK(terminated(a.path, sizeof(a.path)), "path");
    FUZZ_CHECK(terminated(a.user, sizeof(a.user)), "user");
    FUZZ_CHECK(terminated(a.password, sizeof(a.password)), "password");
    FUZZ_CHECK(a.port >= 1 && a.port <= 65535, "port %d", a.port);
    FUZZ_CHECK(a.db >= 0, "db %d", a.db);
    FUZZ_CHECK((a.host[0] != '\0') != (a.path[0] != '\0'),
               "host '%s' path '%s'", a.host, a.path);

    tb_url_redact(&a, red, sizeof(red));
    FUZZ_CHECK(terminated(red, sizeof(red)), "redacted not terminated");
    if (a.password[0]) {
        /* The redacted form is exactly the password-free form with
         * "***" (after "user:" if there is a user) in the userinfo: so
         * the password can only show where the rest already holds it. */
        char want[1024];
        const char *rest;

        b = a;
        b.password[0] = '\0';
        tb_url_redact(&b, red2, sizeof(red2));
        if (b.path[0]) {
            FUZZ_CHECK(strcmp(red, red2) == 0, "unix '%s' vs '%s'", red,
                       red2);
        }
        else {
            FUZZ_CHECK(strncmp(red2, "redis://", 8) == 0, "scheme");
            rest = red2 + 8;
            if (a.user[0]) {
                size_t ul = strlen(a.user);

                FUZZ_CHECK(strncmp(rest, a.user, ul) == 0 && rest[ul] == '@',
                           "user in '%s'", red2);
                snprintf(want, sizeof(want), "redis://%s:***%s", a.user,
                         rest + ul);
            }
            else {
                snprintf(want, sizeof(want), "redis://***@%s", rest);
            }
            FUZZ_CHECK(strcmp(red, want) == 0,
                       "redacted '%s', expected '%s'", red, want);
        }
    }
    else if (!a.user[0] && a.host[0]) {
        /* Round trip: redact(parse(x)) parses to the same address. */
        FUZZ_CHECK(tb_url_parse(red, &b, err, sizeof(err)) == TB_OK,
                   "redacted '%s' does not parse: %s", red, err);
        FUZZ_CHECK(strcmp(a.host, b.host) == 0 && a.port == b.port
                       && a.db == b.db,
                   "round trip '%s': host '%s'/'%s' port %d/%d db %d/%d",
                   red, a.host, b.host, a.port, b.port, a.db, b.db);
    }
    free(url);
    return 0;
}
