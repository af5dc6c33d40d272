/* fuzz_key.c -- tb_key_sanitize() / tb_key_build() on hostile keys.
 *
 * Input layout: byte 0 picks the prefix and route from small tables (and
 * whether to split the rest into two keys); the rest is the client key
 * (NULs allowed). Invariants:
 *  - the built key is "<prefix>{<k>}" (+ ":route:<name>"), length
 *    < TB_KEY_BUF, and holds exactly one '{' and one '}' (the delimiters);
 *  - k is either the raw key (1..128 bytes of 0x21..0x7e, no brace, not
 *    starting with '#') or '#' + 32 lowercase hex digits;
 *  - the raw form is used exactly when the key qualifies;
 *  - two different inputs that are both stored raw give different keys,
 *    and a raw key never equals a hashed one.
 */
#include "fuzz_common.h"
#include "tb.h"

static const char *const prefixes[] = {
    "rl:", "x", "tb:shim:in:web:",
    "0123456789012345678901234567890123456789012345678901234567890123",
};
static const char *const routes[] = {
    NULL, "export", "a",
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.",
};

static int qualifies(const uint8_t *k, size_t n)
{
    size_t i;

    if (n > TB_KEY_RAW_MAX || (n > 0 && k[0] == '#')) {
        return 0;
    }
    for (i = 0; i < n; i++) {
        if (k[i] < 0x21 || k[i] > 0x7e || k[i] == '{' || k[i] == '}') {
            return 0;
        }
    }
    return 1;
}

static void check_one(const uint8_t *k, size_t n, const char *prefix,
                      const char *route, char *san, size_t *sanlen)
{
    char out[TB_KEY_BUF + 64];
    size_t len, i, plen = strlen(prefix), opens = 0, closes = 0;
    const char *body;

    memset(out, 0x5a, sizeof(out));
    len = tb_key_build(prefix, (const char *)k, n, route, out);
    FUZZ_CHECK(len > 0, "build failed for a valid prefix/route");
    FUZZ_CHECK(len < TB_KEY_BUF, "len %zu >= TB_KEY_BUF", len);
    FUZZ_CHECK(out[len] == '\0' && strlen(out) == len, "termination");
    FUZZ_CHECK(memcmp(out, prefix, plen) == 0 && out[plen] == '{',
               "prefix");
    for (i = 0; i < len; i++) {
        opens += out[i] == '{';
        closes += out[i] == '}';
        FUZZ_CHECK((unsigned char)out[i] >= 0x21
                       && (unsigned char)out[i] <= 0x7e,
                   "byte 0x%02x at %zu", (unsigned char)out[i], i);
    }
    FUZZ_CHECK(opens == 1 && closes == 1, "braces %zu/%zu in %s", opens,
               closes, out);
    body = out + plen + 1;
    *sanlen = (size_t)(strchr(body, '}') - body);
    memcpy(san, body, *sanlen);
    san[*sanlen] = '\0';
    if (route) {
        FUZZ_CHECK(strncmp(body + *sanlen + 1, ":route:", 7) == 0
                       && strcmp(body + *sanlen + 8, route) == 0,
                   "route suffix in %s", out);
    }
    else {
        FUZZ_CHECK(body[*sanlen + 1] == '\0', "trailing bytes in %s", out);
    }
    if (qualifies(k, n)) {
        FUZZ_CHECK(*sanlen == n && memcmp(san, k, n) == 0,
                   "qualifying key not stored raw: %s", out);
    }
    else {
        FUZZ_CHECK(*sanlen == 33 && san[0] == '#', "hashed form: %s", out);
        for (i = 1; i < 33; i++) {
            FUZZ_CHECK((san[i] >= '0' && san[i] <= '9')
                           || (san[i] >= 'a' && san[i] <= 'f'),
                       "hex digit in %s", out);
        }
    }
    /* tb_key_sanitize alone agrees with the built key. */
    {
        char s2[TB_KEY_RAW_MAX + 1 + 16];
        size_t l2;

        memset(s2, 0x5a, sizeof(s2));
        l2 = tb_key_sanitize((const char *)k, n, s2);
        FUZZ_CHECK(l2 <= TB_KEY_RAW_MAX && l2 == *sanlen
                       && memcmp(s2, san, l2) == 0 && s2[l2] == '\0',
                   "sanitize disagrees with build");
        FUZZ_CHECK(s2[TB_KEY_RAW_MAX + 1] == 0x5a, "sanitize wrote past "
                   "TB_KEY_RAW_MAX + 1");
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *prefix, *route;
    char s1[TB_KEY_RAW_MAX + 1], s2[TB_KEY_RAW_MAX + 1];
    size_t l1, l2;
    uint8_t *copy;

    if (size < 1) {
        return 0;
    }
    prefix = prefixes[data[0] & 3];
    route = routes[(data[0] >> 2) & 3];
    data++;
    size--;
    /* Exact-size heap copy so ASan sees reads past the key. */
    copy = malloc(size ? size : 1);
    if (size) {
        memcpy(copy, data, size);
    }
    check_one(copy, size, prefix, route, s1, &l1);
    if (size >= 2) {
        /* Two keys: split at a byte-chosen point; distinct raw inputs
         * must give distinct keys, a raw key never equals a hashed one. */
        size_t cut = 1 + data[0] % (size - 1);
        int q1 = qualifies(copy, cut), q2 = qualifies(copy + cut,
                                                      size - cut);

        check_one(copy, cut, prefix, route, s1, &l1);
        check_one(copy + cut, size - cut, prefix, route, s2, &l2);
        if (q1 && q2 && (cut != size - cut
                         || memcmp(copy, copy + cut, cut) != 0)) {
            FUZZ_CHECK(l1 != l2 || memcmp(s1, s2, l1) != 0,
                       "distinct raw keys collide: %s", s1);
        }
        if (q1 != q2) {
            FUZZ_CHECK(l1 != l2 || memcmp(s1, s2, l1) != 0,
                       "raw key equals a hashed key: %s", s1);
        }
        if (!q1 && !q2 && (cut != size - cut
                           || memcmp(copy, copy + cut, cut) != 0)) {
            /* Hashed: equal only on a SHA-256 prefix collision. */
            FUZZ_CHECK(memcmp(s1, s2, 33) != 0, "hash collision");
        }
    }
    /* Invalid prefixes and routes are refused, never half-written. */
    {
        char out[TB_KEY_BUF];
        char bad[TB_PREFIX_MAX + 2];
        size_t n = size < sizeof(bad) - 1 ? size : sizeof(bad) - 1;

        memcpy(bad, copy, n);
        bad[n] = '\0';
        if (!tb_prefix_valid(bad)) {
            FUZZ_CHECK(tb_key_build(bad, "k", 1, NULL, out) == 0,
                       "bad prefix accepted");
        }
        else {
            FUZZ_CHECK(strlen(bad) <= TB_PREFIX_MAX
                           && !strchr(bad, '{') && !strchr(bad, '}')
                           && !strchr(bad, ' '), "prefix_valid");
        }
        if (n > TB_NAME_MAX + 1) {
            bad[TB_NAME_MAX + 1] = '\0';
        }
        if (!tb_name_valid(bad)) {
            FUZZ_CHECK(tb_key_build("rl:", "k", 1, bad, out) == 0,
                       "bad route accepted");
        }
    }
    free(copy);
    return 0;
}
