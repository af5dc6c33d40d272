/* fuzz_form.c -- the module's form reader (mod_tbucket/tbucket_form_parse.c)
 * on hostile bodies: the key a TBucketRule on %{FORM:field} or
 * %{FORMLOGIN:field} gets.
 *
 * Input layout: byte 0 picks the field name from a small table; the rest
 * is the body (NULs allowed). Invariants:
 *  - the value fits the body's length and is NUL-terminated there;
 *  - a field is found only when the body holds its name, in some
 *    spelling: '=' or the end follows a pair that decodes to it;
 *  - the value is what a naive PHP-like reference finds (the last pair
 *    of the name, %XX and '+' decoded), byte for byte;
 *  - FORMLOGIN's canonical name is no longer than the value and holds no
 *    upper-case ASCII, no '<', no leading, trailing or doubled space.
 *    (It is not a fixed point, nor is WordPress's sanitize_user(): both
 *    drop %XX sequences in one pass, so "%%4141" leaves "%41".)
 */
#include "fuzz_common.h"
#include "tbucket_form_parse.h"

static const char *const names[] = { "log", "pwd", "a", "user name" };

static int hex(int c)
{
    return c >= '0' && c <= '9' ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* PHP's url decoding of s[0..n) into out; the length. */
static size_t ref_decode(const uint8_t *s, size_t n, char *out)
{
    size_t i, o = 0;

    for (i = 0; i < n; i++) {
        if (s[i] == '+') {
            out[o++] = ' ';
        }
        else if (s[i] == '%' && i + 2 < n && hex(s[i + 1]) >= 0
                 && hex(s[i + 2]) >= 0) {
            out[o++] = (char)(hex(s[i + 1]) * 16 + hex(s[i + 2]));
            i += 2;
        }
        else {
            out[o++] = (char)s[i];
        }
    }
    return o;
}

/* The reference reader: split, decode whole names, compare. */
static int ref_field(const uint8_t *b, size_t n, const char *name,
                     char *out, size_t *vlen)
{
    size_t i = 0, want = strlen(name);
    char *tmp = malloc(n + 1);
    int found = 0;

    while (i < n) {
        size_t j = i, eq = (size_t)-1, dl, skip = 0;

        while (j < n && b[j] != '&') {
            if (eq == (size_t)-1 && b[j] == '=') {
                eq = j;
            }
            j++;
        }
        dl = ref_decode(b + i, (eq == (size_t)-1 ? j : eq) - i, tmp);
        while (skip < dl && tmp[skip] == ' ') {
            skip++;
        }
        if ((eq == (size_t)-1 ? j : eq) > i && dl - skip == want
            && memcmp(tmp + skip, name, want) == 0) {
            found = 1;
            *vlen = eq == (size_t)-1 ? 0
                                     : ref_decode(b + eq + 1, j - eq - 1,
                                                  out);
        }
        i = j + 1;
    }
    free(tmp);
    return found;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *name;
    char *got, *want;
    size_t glen = 0, wlen = 0, clen, i;
    int found, rfound;

    if (size < 1) {
        return 0;
    }
    name = names[data[0] % 4];
    data++;
    size--;
    got = malloc(size + 1);
    want = malloc(size + 1);
    found = tbucket_form_field((const char *)data, size, name, got, &glen);
    rfound = ref_field(data, size, name, want, &wlen);
    FUZZ_CHECK(glen <= size && got[glen] == '\0', "value overruns");
    FUZZ_CHECK(found == rfound, "found %d, reference %d", found, rfound);
    FUZZ_CHECK(!found || (glen == wlen && !memcmp(got, want, glen)),
               "value differs from the reference (%zu, %zu bytes)", glen,
               wlen);
    clen = tbucket_form_login(got, glen);
    FUZZ_CHECK(clen <= glen && got[clen] == '\0', "login name grew");
    for (i = 0; i < clen; i++) {
        FUZZ_CHECK(!(got[i] >= 'A' && got[i] <= 'Z') && got[i] != '<',
                   "login name keeps '%c'", got[i]);
        FUZZ_CHECK(got[i] != ' ' || (i > 0 && i + 1 < clen
                                     && got[i + 1] != ' '),
                   "stray space at %zu", i);
    }
    free(got);
    free(want);
    return 0;
}
