/* tb_parse.c -- parsers for the values users write: rates, durations,
 * whole numbers.
 *
 * The module's directives, the shim's config loader and the tbucket tool
 * all parse through here, so "10/s" means the same everywhere and a bad
 * value is refused with the same words. Parsing happens at configuration
 * time only; nothing on the request path calls these.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb.h"

static int fail(char *err, size_t errlen, const char *fmt, const char *s)
{
    if (err && errlen) {
        snprintf(err, errlen, fmt, s ? s : "(null)");
    }
    return TB_ERR;
}

/* Length of a plain decimal at s ("12", "0.5", ".5"), or 0. strtod alone
 * would also take hex, exponents, "inf" and "nan", none of which a person
 * writes in a rate or a duration. */
static size_t decimal_len(const char *s)
{
    size_t i = 0, digits = 0;

    while (s[i] >= '0' && s[i] <= '9') {
        i++;
        digits++;
    }
    if (s[i] == '.') {
        i++;
        while (s[i] >= '0' && s[i] <= '9') {
            i++;
            digits++;
        }
    }
    return digits ? i : 0;
}

int tb_parse_rate(const char *s, double *per_sec, char *err, size_t errlen)
{
    char *end;
    double v, div = 1;

    if (!s || !*s) {
        return fail(err, errlen, "empty rate '%s'", s);
    }
    errno = 0;
    v = strtod(s, &end);
    if (end == s || errno != 0 || !isfinite(v)
        || end != s + decimal_len(s)) {
        return fail(err, errlen, "rate '%s' is not a number", s);
    }
    if (*end == '/') {
        if (strcmp(end, "/s") == 0) {
            div = 1;
        }
        else if (strcmp(end, "/m") == 0) {
            div = 60;
        }
        else if (strcmp(end, "/h") == 0) {
            div = 3600;
        }
        else {
            return fail(err, errlen,
                        "rate '%s' must end in /s, /m or /h", s);
        }
    }
    else if (*end != '\0') {
        return fail(err, errlen, "rate '%s' has trailing characters", s);
    }
    v = v / div;
    if (!(v > 0)) {
        return fail(err, errlen, "rate '%s' must be greater than zero", s);
    }
    if (v > 1e9) {
        return fail(err, errlen, "rate '%s' is above 1e9 per second", s);
    }
    if (v < 1e-6) {
        return fail(err, errlen,
                    "rate '%s' is below 1e-6 per second (one token in 11.6 "
                    "days)", s);
    }
    *per_sec = v;
    return TB_OK;
}

int tb_parse_duration_ms(const char *s, int64_t *ms, char *err,
                         size_t errlen)
{
    char *end;
    double v, mult = 1;

    if (!s || !*s) {
        return fail(err, errlen, "empty duration '%s'", s);
    }
    errno = 0;
    v = strtod(s, &end);
    if (end == s || errno != 0 || !isfinite(v)
        || end != s + decimal_len(s)) {
        return fail(err, errlen, "duration '%s' is not a number", s);
    }
    if (*end == '\0' || strcmp(end, "ms") == 0) {
        mult = 1;
    }
    else if (strcmp(end, "s") == 0) {
        mult = 1000;
    }
    else if (strcmp(end, "m") == 0) {
        mult = 60000;
    }
    else if (strcmp(end, "h") == 0) {
        mult = 3600000;
    }
    else {
        return fail(err, errlen,
                    "duration '%s' must end in ms, s, m or h", s);
    }
    v = v * mult;
    if (v < 0 || v > 86400000.0) {
        return fail(err, errlen, "duration '%s' is outside 0..24h", s);
    }
    *ms = (int64_t)ceil(v);
    return TB_OK;
}

int tb_parse_int(const char *s, int64_t min, int64_t max, int64_t *out,
                 char *err, size_t errlen)
{
    char *end;
    long long v;

    if (!s || !*s) {
        return fail(err, errlen, "empty number '%s'", s);
    }
    errno = 0;
    v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0) {
        return fail(err, errlen, "'%s' is not a whole number", s);
    }
    if (v < min || v > max) {
        if (err && errlen) {
            snprintf(err, errlen, "'%s' is outside %lld..%lld", s,
                     (long long)min, (long long)max);
        }
        return TB_ERR;
    }
    *out = v;
    return TB_OK;
}

const char *tb_source_name(tb_source_t s)
{
    switch (s) {
    case TB_SRC_REDIS: return "redis";
    case TB_SRC_OPEN: return "open";
    case TB_SRC_CLOSED: return "closed";
    case TB_SRC_LOCAL: return "local";
    case TB_SRC_ERROR: return "error";
    }
    return "unknown";
}

const char *tb_err_name(int err)
{
    static const char *const names[TB_ERR_KINDS] = {
        "none", "io", "timeout", "protocol", "reply", "arg", "oom",
        "breaker", "auth", "tls"
    };

    if (err < 0 || err >= TB_ERR_KINDS) {
        return "unknown";
    }
    return names[err];
}
