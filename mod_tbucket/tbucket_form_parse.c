/* tbucket_form_parse.c -- a field of an urlencoded form body, read as PHP
 * reads it, and a login name made canonical.
 *
 * The key of a rule on %{FORM:log} must be the user the application
 * sees, or a client could spread its tries over spellings that name one
 * user: PHP decodes names as well as values ("l%6fg=admin" is log), drops
 * leading spaces of a name and keeps the last of repeated fields, so this
 * does too. %{FORMLOGIN:log} goes further, for names the application
 * itself folds (tbucket_form_login). Pure and bounded: the module calls
 * it on a body it has read (tbucket_form.c), the fuzzer on any bytes.
 */
#include <string.h>

#include "tbucket_form_parse.h"

static int hexval(int c)
{
    if (c >= '0' && c <= '9') {
        return c - '0';
    }
    if (c >= 'a' && c <= 'f') {
        return c - 'a' + 10;
    }
    if (c >= 'A' && c <= 'F') {
        return c - 'A' + 10;
    }
    return -1;
}

/* The byte at s[*i] (of n) decoded as PHP's url decoder does, *i moved
 * past what it read. */
static int next_byte(const char *s, size_t n, size_t *i)
{
    int hi, lo, c = (unsigned char)s[*i];

    if (c == '+') {
        c = ' ';
    }
    else if (c == '%' && *i + 2 < n
             && (hi = hexval((unsigned char)s[*i + 1])) >= 0
             && (lo = hexval((unsigned char)s[*i + 2])) >= 0) {
        c = hi * 16 + lo;
        *i += 2;
    }
    (*i)++;
    return c;
}

/* 1 when the pair's name (enc, n bytes, encoded) decodes to name, its
 * leading spaces dropped. */
static int name_is(const char *enc, size_t n, const char *name)
{
    size_t i = 0, k = 0, want = strlen(name);
    int c, lead = 1;

    while (i < n) {
        c = next_byte(enc, n, &i);
        if (lead && c == ' ') {
            continue;
        }
        lead = 0;
        if (k >= want || c != (unsigned char)name[k++]) {
            return 0;
        }
    }
    return k == want;
}

int tbucket_form_field(const char *body, size_t len, const char *name,
                       char *out, size_t *vlen)
{
    const char *p = body, *end = body + len, *val = NULL;
    size_t vn = 0, i = 0;

    *vlen = 0;
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *stop = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        size_t nlen = (size_t)((eq ? eq : stop) - p);

        if (nlen && name_is(p, nlen, name)) {
            /* The last pair of the name wins, as in PHP. */
            val = eq ? eq + 1 : stop;
            vn = (size_t)(stop - val);
        }
        p = stop + 1;
    }
    while (val && i < vn) {
        out[(*vlen)++] = (char)next_byte(val, vn, &i);
    }
    out[*vlen] = '\0';
    return val ? TBUCKET_FORM_FOUND : TBUCKET_FORM_ABSENT;
}

size_t tbucket_form_login(char *s, size_t len)
{
    size_t i, o = 0;
    int space = 0, tag = 0;

    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (tag || c == '<') {
            tag = c != '>';
            continue;
        }
        if (c == '%' && i + 2 < len && hexval((unsigned char)s[i + 1]) >= 0
            && hexval((unsigned char)s[i + 2]) >= 0) {
            i += 2;
            continue;
        }
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'
            || c == '\v') {
            space = o > 0;
            continue;
        }
        if (space) {
            s[o++] = ' ';
            space = 0;
        }
        s[o++] = (char)(c >= 'A' && c <= 'Z' ? c + ('a' - 'A') : c);
    }
    s[o] = '\0';
    return o;
}
