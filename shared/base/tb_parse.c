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

/* The duration grammar: every duration a host reads (the module's
 * options, the shim's settings, the tool's flags) is a plain decimal and
 * one of these units, rounded up to a whole millisecond; "" (a bare
 * number, milliseconds) only where a host's older spelling had it. The
 * shim's and the tool's tb_parse_duration_ms stops at h: its range ends
 * at 24 hours. */
static const unit_t duration_units[] = {
    {"", 1}, {"ms", 1}, {"s", 1000}, {"m", 60000}, {"h", 3600000},
    {"d", 86400000}, {NULL, 0}
};
#define UNIT_DAY 5                    /* duration_units[UNIT_DAY] is d. */
#define UP_TO_HOURS 0x100u            /* Flag: no d (the shim's, tool's). */

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

/* ms as the largest unit that writes it whole: "30d", "1h", "90s",
 * "1500ms". */
size_t tb_format_duration(int64_t ms, char *buf, size_t len)
{
    int i = UNIT_DAY;
    int n;

    while (i > 1 && (ms == 0 || ms % (int64_t)duration_units[i].factor)) {
        i--;
    }
    n = snprintf(buf, len, "%lld%s",
                 (long long)(ms / (int64_t)duration_units[i].factor),
                 duration_units[i].name);
    return n < 0 ? 0 : (size_t)n;
}

/* The one refusal of a duration: what is expected, and the range. */
static int duration_refused(int64_t min_ms, int64_t max_ms, int days,
                            unsigned flags, char *err, size_t errlen)
{
    char lo[32], hi[32];

    if (err && errlen) {
        tb_format_duration(min_ms, lo, sizeof(lo));
        tb_format_duration(max_ms, hi, sizeof(hi));
        snprintf(err, errlen, "expected a duration such as 500ms, 30s, 15m%s"
                 "%s, from %s to %s", days ? ", 1h or 1d" : " or 1h",
                 flags & TB_DURATION_BARE_MS ? " (a bare number is ms)" : "",
                 lo, hi);
    }
    return TB_ERR;
}

/* s in the grammar above, within [min_ms, max_ms]. */
static int parse_duration(const char *s, int64_t min_ms, int64_t max_ms,
                          unsigned flags, int64_t *ms, char *err,
                          size_t errlen)
{
    int last = flags & UP_TO_HOURS ? UNIT_DAY - 1 : UNIT_DAY;
    char *end;
    double v, mult = 0;
    int i;

    if (!s || leading_decimal(s, "duration", &v, &end, NULL, 0) != TB_OK) {
        return duration_refused(min_ms, max_ms, last == UNIT_DAY, flags, err,
                                errlen);
    }
    for (i = (flags & TB_DURATION_BARE_MS) ? 0 : 1; i <= last; i++) {
        if (strcmp(end, duration_units[i].name) == 0) {
            mult = duration_units[i].factor;
        }
    }
    v = ceil(v * mult);
    if (!(mult > 0) || v < (double)min_ms || v > (double)max_ms) {
        return duration_refused(min_ms, max_ms, last == UNIT_DAY, flags, err,
                                errlen);
    }
    *ms = (int64_t)v;
    return TB_OK;
}

int tb_parse_duration(const char *s, int64_t min_ms, int64_t max_ms,
                      unsigned flags, int64_t *ms, char *err, size_t errlen)
{
    return parse_duration(s, min_ms, max_ms, flags & TB_DURATION_BARE_MS, ms,
                          err, errlen);
}

int tb_parse_duration_ms(const char *s, int64_t *ms, char *err,
                         size_t errlen)
{
    return parse_duration(s, 0, 86400000, TB_DURATION_BARE_MS | UP_TO_HOURS,
                          ms, err, errlen);
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
