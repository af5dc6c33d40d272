/* fuzz_parse.c -- tb_parse_rate / tb_parse_duration_ms / tb_parse_int.
 *
 * Byte 0 picks the parser (and, for tb_parse_int, the range); the rest
 * is the value as a C string. Invariants: the documented ranges hold on
 * success; the error message is terminated; and an accepted rate is
 * usable with every accepted capacity (1 .. TB_MAX_CAPACITY): the bucket
 * TTL stays below 1e17 ms, above which Redis 7.0 refuses the Lua script's
 * PEXPIRE ("value is not an integer or out of range", after the HSET has
 * already stored a key with no TTL), and tb_bucket_take()'s int64 casts
 * of the wait stay defined.
 */
#include <math.h>

#include "fuzz_common.h"
#include "tb.h"

static const int64_t ranges[][2] = {
    {0, 0}, {1, 65535}, {0, 1000000}, {INT64_MIN, INT64_MAX}, {-5, 5},
    {1, 1000000000}, {0, 1}, {INT64_MAX - 1, INT64_MAX},
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char err[96], *s;
    int which;

    if (size < 1) {
        return 0;
    }
    which = data[0];
    s = fuzz_cstr(data + 1, size - 1);
    memset(err, 'x', sizeof(err));
    switch (which % 3) {
    case 0: {
        double r = -1;

        if (tb_parse_rate(s, &r, err, sizeof(err)) == TB_OK) {
            double worst = TB_MAX_CAPACITY / r * 1000;

            FUZZ_CHECK(isfinite(r) && r > 0 && r <= 1e9, "rate %g", r);
            /* TTL = ceil(capacity / rate * 1000) + 1000 must be a
             * PEXPIRE argument Redis accepts, for every capacity. */
            if (FUZZ_KNOWN("core-rate-min")
                && !(isfinite(worst) && worst < 1e17)) {
                free(s); /* Reported; tb_bucket_take would hit UB. */
                return 0;
            }
            FUZZ_CHECK(isfinite(worst) && worst < 1e17,
                       "rate '%s' = %g/s: TTL for capacity %g is %g ms",
                       s, r, TB_MAX_CAPACITY, worst);
            {
                tb_limit_t l = {1.0, r};
                tb_bucket_t in = {0, 0, 1}, out;
                tb_verdict_t v;
                double cost = 1.0;

                /* Empty bucket: refused, with a positive wait. */
                FUZZ_CHECK(tb_bucket_ttl_ms(&l) >= 1000, "ttl");
                FUZZ_CHECK(tb_bucket_take(&in, &l, &cost, 1, 0, &out, &v)
                               == TB_OK && !v.allowed && v.retry_ms > 0,
                           "empty bucket verdict");
            }
        }
        else {
            FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL, "err");
        }
        break;
    }
    case 1: {
        int64_t ms = -1;

        if (tb_parse_duration_ms(s, &ms, err, sizeof(err)) == TB_OK) {
            FUZZ_CHECK(ms >= 0 && ms <= 86400000, "duration %lld",
                       (long long)ms);
        }
        else {
            FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL, "err");
        }
        break;
    }
    default: {
        const int64_t *rg = ranges[(which / 3) % 8];
        int64_t v = 0;

        if (tb_parse_int(s, rg[0], rg[1], &v, err, sizeof(err)) == TB_OK) {
            FUZZ_CHECK(v >= rg[0] && v <= rg[1], "int %lld",
                       (long long)v);
            FUZZ_CHECK(*s != '\0', "empty accepted");
        }
        else {
            FUZZ_CHECK(memchr(err, '\0', sizeof(err)) != NULL, "err");
        }
        break;
    }
    }
    free(s);
    return 0;
}
