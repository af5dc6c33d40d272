/* fuzz_parse.c -- tb_parse_rate / tb_parse_duration_ms / tb_parse_int.
 *
 * Byte 0 picks the parser (and, for tb_parse_int, the range); the rest
 * is the value as a C string. Invariants: the documented ranges hold on
 * success; the error message is terminated; and an accepted rate, with
 * every capacity tb_limit_check() accepts it with, keeps the bucket TTL
 * below 1e17 ms, above which Redis 7.0 refuses the Lua script's PEXPIRE
 * ("value is not an integer or out of range", after the HSET has already
 * stored a key with no TTL), and tb_bucket_take()'s int64 casts of the
 * wait stay defined. (Found: rates down to 4.4e-85/s were accepted;
 * fixed by tb_limit_check and a 1e-6/s floor; kept in the corpus as
 * parse/regress-tiny-rate-ttl-overflow.)
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
            FUZZ_CHECK(isfinite(r) && r > 0 && r <= 1e9, "rate %g", r);
            /* A rate is usable with the capacities tb_limit_check() lets
             * through: for those the TTL ceil(capacity / rate * 1000) +
             * 1000 stays below 1e17 ms, above which Redis 7.0 refuses the
             * scripts' PEXPIRE (after the HSET stored a key with no TTL),
             * and tb_bucket_take()'s int64 casts stay defined. */
            static const double caps[] = {1, 10, 1000, 1e6, 1e9};
            size_t i;

            for (i = 0; i < sizeof(caps) / sizeof(caps[0]); i++) {
                tb_limit_t l = {caps[i], r};
                double worst = caps[i] / r * 1000;
                tb_bucket_t in = {0, 0, 1}, out;
                tb_verdict_t v;
                double cost = caps[i];

                if (tb_limit_check(&l, NULL, 0) != TB_OK) {
                    continue;
                }
                FUZZ_CHECK(isfinite(worst) && worst < 1e17,
                           "rate '%s' = %g/s passes tb_limit_check with "
                           "capacity %g: TTL %g ms", s, r, caps[i], worst);
                FUZZ_CHECK(tb_bucket_ttl_ms(&l) >= 1000, "ttl");
                /* Empty bucket, full cost: refused with a positive wait. */
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
