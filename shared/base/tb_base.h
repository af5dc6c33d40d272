/* tb_base.h -- the ground floor of libtb that hosts never call: errors in
 * the hiredis manner, deadlines on the monotonic clock, SHA-256 and the
 * latency histogram. Internal: every layer above (algo/, redis/ and the
 * decision path) and the unit tests include it; hosts include tb.h only.
 *
 * What lives here calls nothing of libtb but base/ itself: the clock,
 * numbers in the C locale, name tables, the parsers of configuration
 * values, the counters and the lock of tables in shared memory are
 * public (tb.h); these are the helpers the layers above share.
 */
#ifndef TB_BASE_H
#define TB_BASE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "tb.h"

/* ---- Errors (tb_error.c) ------------------------------------------- */

/* A failure: kind and message, as the hiredis contract has them. shared
 * is set on every decision of a failed batch but the first, so that the
 * breaker counts one failed write-and-read once, not once per decision
 * that rode on it. */
typedef struct tb__error {
    int err;
    int shared;
    char errstr[TB_ERRSTR_LEN];
} tb__error_t;

/* Set *e to kind err and the formatted message (cut to TB_ERRSTR_LEN - 1
 * bytes); shared goes back to 0. */
void tb__set_error(tb__error_t *e, int err, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* ---- Numbers for Lua and Redis (tb_cnum.c) -------------------------- */

/* v as "%.17g" prints it in the C locale, so that Lua's tonumber() reads
 * back the same double, whole numbers without snprintf. The client's
 * script arguments and the Redis module's stored fields both use it.
 * Returns the length. */
size_t tb__fmt_num(char *buf, size_t len, double v);

/* ---- Deadlines (tb_clock.c) ---------------------------------------- */

/* The monotonic clock ms milliseconds from now. */
tb_monotime_us tb__deadline_ms(int ms);

/* t as the absolute time pthread_cond_timedwait() and FUTEX_WAIT_BITSET
 * take on CLOCK_MONOTONIC. */
struct timespec tb__timespec_at(tb_monotime_us t);

/* A condition variable that waits against CLOCK_MONOTONIC, so that a
 * wall-clock step cannot stretch a bounded wait. */
void tb__cond_init(pthread_cond_t *cv);

/* ---- SHA-256 (tb_digest.c) ----------------------------------------- */

/* The SHA-256 digest of len bytes at data into out, for key hashing and
 * the local tables' entry identities. TB_OK, or TB_ERR when libcrypto
 * could not make it (out of memory); out is then all zero bytes and must
 * not be used. Thread-safe. */
int tb_sha256(const void *data, size_t len, unsigned char out[32]);

/* HMAC-SHA-256 of len bytes at data under a 32-byte key, into out; as
 * tb_sha256 for errors. Thread-safe. */
int tb_hmac_sha256(const unsigned char key[32], const void *data,
                   size_t len, unsigned char out[32]);

/* ---- Counters (tb_stats.c) ----------------------------------------- */

/* Count one Redis call's latency in the histogram. */
void tb_stats_latency(tb_stats_t *s, int64_t us);

#endif /* TB_BASE_H */
