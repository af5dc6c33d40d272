/* form_read.c -- the module's form reader (mod_tbucket/tbucket_form_parse.c)
 * on bodies a test gives it, to set beside what PHP makes of them
 * (hostile/test_hostile_form.py).
 *
 *   form_read < CASES
 *
 * Each line of stdin is "FIELD BODY", both in hex (BODY may be empty).
 * Each line of stdout is "FORM LOGIN", the keys %{FORM:field} and
 * %{FORMLOGIN:field} get, as tbucket_form.c's form_func makes them: "A"
 * (absent: the rule does not apply), "S" (the shared key), or "F:" and
 * the key in hex. A value holding a NUL is shared there, so here too.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tbucket_form_parse.h"

/* s (n hex digits) into out; its length in *len. -1 on a bad digit. */
static int unhex(const char *s, size_t n, char *out, size_t *len)
{
    size_t i;

    for (i = 0; i + 1 < n; i += 2) {
        unsigned int b;

        if (sscanf(s + i, "%2x", &b) != 1) {
            return -1;
        }
        out[i / 2] = (char)b;
    }
    *len = n / 2;
    return 0;
}

static void put_key(const char *v, size_t n)
{
    size_t i;

    if (memchr(v, '\0', n)) {
        fputs("S", stdout);
        return;
    }
    fputs("F:", stdout);
    for (i = 0; i < n; i++) {
        printf("%02x", (unsigned char)v[i]);
    }
}

static void one(const char *field, const char *body, size_t len)
{
    char *out = malloc(len + 1);
    size_t n = 0;
    int got = tbucket_form_field(body, len, field, out, &n);

    if (got == TBUCKET_FORM_ABSENT) {
        fputs("A -", stdout);
    }
    else if (got == TBUCKET_FORM_SHARED) {
        fputs("S S", stdout);
    }
    else {
        put_key(out, n);
        fputc(' ', stdout);
        if (tbucket_form_login(out, n, &n) == TBUCKET_FORM_SHARED) {
            fputs("S", stdout);
        }
        else {
            put_key(out, n);
        }
    }
    fputc('\n', stdout);
    free(out);
}

int main(void)
{
    static char line[1 << 20];

    while (fgets(line, sizeof(line), stdin)) {
        char *sp = strchr(line, ' '), *field, *body;
        size_t fl, bl = 0;

        if (!sp) {
            fprintf(stderr, "form_read: want FIELD BODY\n");
            return 2;
        }
        line[strcspn(line, "\r\n")] = '\0';
        fl = (size_t)(sp - line);
        field = calloc(fl / 2 + 1, 1);
        body = malloc(strlen(sp + 1) / 2 + 1);
        if (unhex(line, fl, field, &fl) < 0
            || unhex(sp + 1, strlen(sp + 1), body, &bl) < 0) {
            fprintf(stderr, "form_read: bad hex\n");
            return 2;
        }
        one(field, body, bl);
        free(field);
        free(body);
    }
    return 0;
}
