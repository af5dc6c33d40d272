/* tbucket_form_parse.h -- a field of an application/x-www-form-urlencoded
 * body, read as PHP reads it; plain C, no APR, so that the fuzzer
 * (tests/fuzz/fuzz_form.c) drives the very code the module runs. */
#ifndef TBUCKET_FORM_PARSE_H
#define TBUCKET_FORM_PARSE_H

#include <stddef.h>

#define TBUCKET_FORM_FOUND 1
#define TBUCKET_FORM_ABSENT 0
/* The body names the field in a way that does not give one value (the
 * caller keys it by the shared key of unreadable bodies). */
#define TBUCKET_FORM_SHARED 2

/* The pairs PHP reads into $_POST at most (its max_input_vars default);
 * a body with more is read as SHARED. */
#define TBUCKET_FORM_MAX_PAIRS 1000

/* The field called name (NUL-terminated) in body (len bytes), the way
 * PHP 8.2 fills $_POST: pairs split at '&' (empty ones counted); in
 * names and values '+' is a space and valid %XX escapes are decoded
 * (others are kept); a name is cut at its first NUL, its leading spaces
 * dropped, and ' ' and '.' become '_' up to its first '['; "a[...]" (a
 * ']' anywhere after the '[') makes the array a, an unclosed '[' becomes
 * '_' with ' ', '.' and '[' after it too; empty names are skipped.
 * Returns TBUCKET_FORM_FOUND with the decoded value in out (which must
 * hold len + 1 bytes; NUL-terminated, it may hold NUL bytes: *vlen is its
 * length) when exactly one pair gives the field; TBUCKET_FORM_ABSENT when
 * none does (PHP leaves it unset); TBUCKET_FORM_SHARED when two or more
 * do, or one makes it an array, or the body has more than
 * TBUCKET_FORM_MAX_PAIRS pairs (out "" and *vlen 0 but for FOUND). */
int tbucket_form_field(const char *body, size_t len, const char *name,
                       char *out, size_t *vlen);

/* A login name (a decoded value, len bytes) as applications compare user
 * names, in place: surrounding spaces trimmed, runs of them made one,
 * ASCII upper case lowered. Returns TBUCKET_FORM_SHARED, s left as it
 * was, when it holds a byte that WordPress's sanitize_user() or a
 * database's collation may fold with others (>= 0x80, '&', '<', '%', a
 * control byte): such names are not told apart. Else TBUCKET_FORM_FOUND,
 * with the new length in *olen and s[*olen] made NUL. */
int tbucket_form_login(char *s, size_t len, size_t *olen);

#endif /* TBUCKET_FORM_PARSE_H */
