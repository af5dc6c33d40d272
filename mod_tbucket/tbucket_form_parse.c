/* tbucket_form_parse.c -- a field of an urlencoded form body, read as PHP
 * reads it, and a login name made canonical.
 *
 * The key of a rule on %{FORM:log} must be the user the application
 * sees, or a client could spread its tries over spellings that name one
 * user, or show the rule one field and PHP another. So this follows PHP
 * 8.2's POST reader (main/php_variables.c): the pairs it reads, how it
 * decodes, cuts and renames a name, and which name makes an array. When
 * the answer is not one plain value -- the field given twice in any
 * spellings PHP merges, given as an array, or a body of more pairs than
 * PHP reads -- it says so, and the caller uses the shared key. For
 * %{FORMLOGIN:log}, names the application folds in ways we do not
 * follow (markup, entities, accents, collations) are shared too
 * (tbucket_form_login). Pure and bounded (one pass over the body): the
 * module calls it on a body it has read (tbucket_form.c), the fuzzer on
 * any bytes.
 */
#include <string.h>

#include "tbucket_form_parse.h"

/* How a pair's name names the field in $_POST. */
#define NAME_NO 0
#define NAME_PLAIN 1
#define NAME_ARRAY 2

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

/* What the pair's name (enc, n bytes, encoded) makes of $_POST[name]:
 * NAME_PLAIN when it sets it to the pair's value, NAME_ARRAY when it
 * makes it an array, NAME_NO when it leaves it alone. PHP decodes the
 * name, cuts it at a NUL, drops its leading spaces and skips it if that
 * leaves nothing before a '['; ' ' and '.' become '_'. At the first '['
 * the part before it is the name of an array if a ']' follows anywhere;
 * else that '[' and every ' ', '.' and '[' after it become '_'. */
static int name_kind(const char *enc, size_t n, const char *name)
{
    size_t i = 0, k = 0, want = strlen(name);
    int lead = 1, same = 1;
    int base = -1;  /* at the first '[': 1 if what came before is name */

    while (i < n) {
        int c = next_byte(enc, n, &i);
        if (c == '\0') {
            break;
        }
        if (lead && c == ' ') {
            continue;
        }
        lead = 0;
        if (base >= 0 && c == ']') {
            return base ? NAME_ARRAY : NAME_NO;
        }
        if (c == '[' && base < 0) {
            if (k == 0) {
                return NAME_NO;
            }
            base = same && k == want;
        }
        if (c == ' ' || c == '.' || c == '[') {
            c = '_';
        }
        if (same && (k >= want || c != (unsigned char)name[k])) {
            same = 0;
        }
        k++;
        /* Only a ']' still to come can matter, and only to a match. */
        if (!same && base <= 0) {
            return NAME_NO;
        }
    }
    return same && k == want && k > 0 ? NAME_PLAIN : NAME_NO;
}

int tbucket_form_field(const char *body, size_t len, const char *name,
                       char *out, size_t *vlen)
{
    const char *p = body, *end = body + len, *val = NULL;
    size_t vn = 0, i = 0, pairs = 0;

    *vlen = 0;
    out[0] = '\0';
    while (p < end) {
        const char *amp = memchr(p, '&', (size_t)(end - p));
        const char *stop = amp ? amp : end;
        const char *eq = memchr(p, '=', (size_t)(stop - p));
        int kind;

        /* PHP counts every pair, empty ones too, and stops reading
         * after max_input_vars: what it misses we cannot know. */
        if (++pairs > TBUCKET_FORM_MAX_PAIRS) {
            return TBUCKET_FORM_SHARED;
        }
        kind = name_kind(p, (size_t)((eq ? eq : stop) - p), name);
        if (kind == NAME_ARRAY || (kind == NAME_PLAIN && val)) {
            return TBUCKET_FORM_SHARED;
        }
        if (kind == NAME_PLAIN) {
            val = eq ? eq + 1 : stop;
            vn = (size_t)(stop - val);
        }
        p = amp ? amp + 1 : end;
    }
    while (val && i < vn) {
        out[(*vlen)++] = (char)next_byte(val, vn, &i);
    }
    out[*vlen] = '\0';
    return val ? TBUCKET_FORM_FOUND : TBUCKET_FORM_ABSENT;
}

int tbucket_form_login(char *s, size_t len, size_t *olen)
{
    size_t i, o = 0;
    int space = 0;

    /* WordPress's sanitize_user() strips markup, entities and %XX and
     * folds accents, and the database's collation folds width, case and
     * ignorable code points: rather than follow each, such a name is
     * not told apart from the others. */
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c >= 0x80 || c < 0x20 || c == 0x7f || c == '&' || c == '<'
            || c == '%') {
            return TBUCKET_FORM_SHARED;
        }
    }
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c == ' ') {
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
    *olen = o;
    return TBUCKET_FORM_FOUND;
}
