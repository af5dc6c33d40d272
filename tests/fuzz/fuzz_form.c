/* fuzz_form.c -- the module's form reader (mod_tbucket/tbucket_form_parse.c)
 * on hostile bodies: the key a TBucketRule on %{FORM:field} or
 * %{FORMLOGIN:field} gets.
 *
 * Input layout: byte 0 picks the field name from a small table; the rest
 * is the body (NULs allowed). Invariants:
 *  - the value fits the body's length and is NUL-terminated there;
 *  - the answer is what a reference model of PHP's POST reader gives,
 *    written the long way (each name decoded whole, cut, renamed, then
 *    compared; tests/integration/hostile/test_hostile_form.py sets the
 *    reader beside PHP itself on this corpus): FOUND with the same bytes when
 *    one pair sets the field, ABSENT when none does, SHARED when two do,
 *    one makes it an array or the body has over 1000 pairs;
 *  - FORMLOGIN's name is either SHARED (the value holds a byte >= 0x80,
 *    '&', '<', '%' or a control byte) or a fixed point: no upper-case
 *    ASCII, no leading, trailing or doubled space, no longer than the
 *    value, and folding it again changes nothing.
 */
#include "fuzz_common.h"
#include "tbucket_form_parse.h"

static const char *const names[] = { "log", "pwd", "a", "user_name" };

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
    out[o] = '\0';
    return o;
}

/* The top-level key PHP gives the decoded name tmp (a C string, changed
 * in place), or NULL when it skips the pair; *array set when the key is
 * an array. */
static char *ref_key(char *tmp, int *array)
{
    char *k = tmp, *p, *open;

    while (*k == ' ') {
        k++;
    }
    open = strchr(k, '[');
    *array = open && strchr(open, ']') != NULL;
    if (open == k) {
        return NULL;
    }
    for (p = k; *p; p++) {
        if (*p == ' ' || *p == '.' || (*p == '[' && !*array)) {
            *p = '_';
        }
    }
    if (*array) {
        *open = '\0';
    }
    return *k ? k : NULL;
}

/* The reference reader: split, decode whole names, key, compare. */
static int ref_field(const uint8_t *b, size_t n, const char *name,
                     char *out, size_t *vlen)
{
    size_t i = 0, pairs = 0;
    char *tmp = malloc(n + 1);
    int hits = 0, array = 0;

    while (i < n) {
        size_t j = i, eq = (size_t)-1;
        char *key;
        int arr;

        while (j < n && b[j] != '&') {
            if (eq == (size_t)-1 && b[j] == '=') {
                eq = j;
            }
            j++;
        }
        pairs++;
        ref_decode(b + i, (eq == (size_t)-1 ? j : eq) - i, tmp);
        key = ref_key(tmp, &arr);
        if (key && strcmp(key, name) == 0) {
            hits++;
            array |= arr;
            *vlen = eq == (size_t)-1 ? 0
                                     : ref_decode(b + eq + 1, j - eq - 1,
                                                  out);
        }
        i = j + 1;
    }
    free(tmp);
    if (pairs > TBUCKET_FORM_MAX_PAIRS || hits > 1 || array) {
        return TBUCKET_FORM_SHARED;
    }
    return hits ? TBUCKET_FORM_FOUND : TBUCKET_FORM_ABSENT;
}

static void check_login(char *got, size_t glen)
{
    size_t clen = 0, again = 0, i;
    int shared = 0;

    for (i = 0; i < glen; i++) {
        unsigned char c = (unsigned char)got[i];

        shared |= c >= 0x80 || c < 0x20 || c == 0x7f || c == '&'
                  || c == '<' || c == '%';
    }
    if (tbucket_form_login(got, glen, &clen) == TBUCKET_FORM_SHARED) {
        FUZZ_CHECK(shared, "login name shared without a reason");
        return;
    }
    FUZZ_CHECK(!shared, "login name kept a byte it must share");
    FUZZ_CHECK(clen <= glen && got[clen] == '\0', "login name grew");
    for (i = 0; i < clen; i++) {
        FUZZ_CHECK(!(got[i] >= 'A' && got[i] <= 'Z'),
                   "login name keeps '%c'", got[i]);
        FUZZ_CHECK(got[i] != ' ' || (i > 0 && i + 1 < clen
                                     && got[i + 1] != ' '),
                   "stray space at %zu", i);
    }
    FUZZ_CHECK(tbucket_form_login(got, clen, &again) == TBUCKET_FORM_FOUND
               && again == clen, "login name is not a fixed point");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *name;
    char *got, *want;
    size_t glen = 0, wlen = 0;
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
    FUZZ_CHECK(found == rfound, "answer %d, reference %d", found, rfound);
    FUZZ_CHECK(found == TBUCKET_FORM_FOUND || glen == 0,
               "a value without a field");
    FUZZ_CHECK(found != TBUCKET_FORM_FOUND
               || (glen == wlen && !memcmp(got, want, glen)),
               "value differs from the reference (%zu, %zu bytes)", glen,
               wlen);
    if (found == TBUCKET_FORM_FOUND) {
        check_login(got, glen);
    }
    free(got);
    free(want);
    return 0;
}
