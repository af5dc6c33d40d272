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

#include "base/tb_base.h"

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

/* The plain decimal that starts s, a rate or a duration (what names it
 * in the messages), into *v; *end gets where its unit starts. */
static int leading_decimal(const char *s, const char *what, double *v,
                           char **end, char *err, size_t errlen)
{
    const char *why = NULL;

    if (!s || !*s) {
        why = "empty %s '%s'";
    }
    else {
        errno = 0;
        *v = tb_strtod_c(s, end);
        if (*end == s || errno != 0 || !isfinite(*v)
            || *end != s + decimal_len(s)) {
            why = "%s '%s' is not a number";
        }
    }
    if (why && err && errlen) {
        snprintf(err, errlen, why, what, s ? s : "(null)");
    }
    return why ? TB_ERR : TB_OK;
}

/* The units a number may end in, with what they divide a rate by (to
 * tokens per second) or multiply a duration by (to ms); "" is none. */
typedef struct unit {
    const char *name;
    double factor;
} unit_t;

static const unit_t rate_units[] = {
    {"", 1}, {"/s", 1}, {"/m", 60}, {"/h", 3600}, {NULL, 0}
};

static const unit_t duration_units[] = {
    {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000}, {NULL, 0}
};

/* 1 and *factor when end is one of the units, else 0. */
static int unit_factor(const char *end, const unit_t *u, double *factor)
{
    for (; u->name; u++) {
        if (strcmp(end, u->name) == 0) {
            *factor = u->factor;
            return 1;
        }
    }
    return 0;
}

int tb_parse_rate(const char *s, double *per_sec, char *err, size_t errlen)
{
    char *end;
    double v, div = 1;

    if (leading_decimal(s, "rate", &v, &end, err, errlen) != TB_OK) {
        return TB_ERR;
    }
    if (!unit_factor(end, rate_units, &div)) {
        return fail(err, errlen, *end == '/'
                    ? "rate '%s' must end in /s, /m or /h"
                    : "rate '%s' has trailing characters", s);
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

    if (leading_decimal(s, "duration", &v, &end, err, errlen) != TB_OK) {
        return TB_ERR;
    }
    if (!unit_factor(end, duration_units, &mult)) {
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
    case TB_SRC_LEASE: return "lease";
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
