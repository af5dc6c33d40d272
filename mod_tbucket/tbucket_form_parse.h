/* tbucket_form_parse.h -- a field of an application/x-www-form-urlencoded
 * body, read as PHP reads it; plain C, no APR, so that the fuzzer
 * (tests/fuzz/fuzz_form.c) drives the very code the module runs. */
#ifndef TBUCKET_FORM_PARSE_H
#define TBUCKET_FORM_PARSE_H

#include <stddef.h>

#define TBUCKET_FORM_FOUND 1
#define TBUCKET_FORM_ABSENT 0

/* The field called name (NUL-terminated) in body (len bytes), the way PHP
 * fills $_POST: pairs split at '&'; '+' is a space and valid %XX escapes
 * are decoded, in names and values alike (others are kept as they are);
 * a name's leading spaces are dropped; the LAST pair of a name wins. The
 * decoded value goes into out, which must hold len + 1 bytes, NUL
 * terminated (it may hold NUL bytes: *vlen is its length). Returns
 * TBUCKET_FORM_FOUND or TBUCKET_FORM_ABSENT (*vlen 0, out ""). */
int tbucket_form_field(const char *body, size_t len, const char *name,
                       char *out, size_t *vlen);

/* A login name as applications compare them, in place: markup (<...>)
 * and %XX sequences dropped, white space trimmed and runs of it made one
 * space, ASCII upper case lowered (WordPress's sanitize_user() and a
 * case-insensitive database make all these one user). Returns the new
 * length; s[len] is made NUL. */
size_t tbucket_form_login(char *s, size_t len);

#endif /* TBUCKET_FORM_PARSE_H */
