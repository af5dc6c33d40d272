/* tb_cnum.c -- numbers written and read in the C locale, whatever locale
 * the host has set.
 *
 * The core writes numbers for Lua's tonumber() and reads numbers that
 * people and applications write; both use '.' as the decimal point. The
 * C library's snprintf and strtod follow LC_NUMERIC instead, and the host
 * owns it: a daemon under the shim that calls setlocale(LC_ALL, "") with
 * LANG=de_DE.UTF-8, a PHP script that calls setlocale(LC_ALL, 'de_DE')
 * inside mod_php. With the C library's functions such a process would
 * send a rate of 2.5/s (or any N/m that is not a whole number per second)
 * to Redis as "2,5", the script would fail on it and every decision would
 * go to the failure policy; and a reported cost of "1.5" would be read as
 * 1.
 *
 * uselocale() switches only the calling thread, for the one call, so
 * other threads and the host never see it. Whole numbers, most of what
 * a decision sends and stores, never get there: tb__fmt_num prints their
 * digits itself (snprintf was a third of the client's instructions per
 * decision, bench/README.md), for the client's script arguments and the
 * Redis module's fields alike.
 */
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/tb_base.h"

static locale_t c_locale;
static pthread_once_t c_locale_once = PTHREAD_ONCE_INIT;

static void make_c_locale(void)
{
    /* glibc hands back its static C locale object: nothing to free, and
     * it cannot fail for "C"; (locale_t)0 would leave the host's. */
    c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
}

static locale_t the_c_locale(void)
{
    pthread_once(&c_locale_once, make_c_locale);
    return c_locale;
}

size_t tb_fmt_double(char *buf, size_t len, double v)
{
    locale_t c = the_c_locale(), old = c ? uselocale(c) : (locale_t)0;
    int n = snprintf(buf, len, "%.17g", v);

    if (c) {
        uselocale(old);
    }
    if (n < 0) {
        return 0;
    }
    return (size_t)n < len ? (size_t)n : (len ? len - 1 : 0);
}

/* "00" .. "99": two digits per division. */
static const char digit_pairs[201] =
    "00010203040506070809101112131415161718192021222324252627282930313233"
    "34353637383940414243444546474849505152535455565758596061626364656667"
    "6869707172737475767778798081828384858687888990919293949596979899";

size_t tb__fmt_num(char *buf, size_t len, double v)
{
    /* Whole numbers below 1e15 print as their digits under "%.17g"; -0
     * prints as "-0", which snprintf does. */
    if (v == floor(v) && fabs(v) < 1e15 && !(v == 0 && signbit(v))
        && len >= 18) {
        char tmp[16];
        uint64_t u = (uint64_t)fabs(v);
        size_t k = sizeof(tmp), n;

        while (u >= 100) {
            k -= 2;
            memcpy(tmp + k, digit_pairs + 2 * (u % 100), 2);
            u /= 100;
        }
        if (u >= 10) {
            k -= 2;
            memcpy(tmp + k, digit_pairs + 2 * u, 2);
        }
        else {
            tmp[--k] = (char)('0' + u);
        }
        if (v < 0) {
            tmp[--k] = '-';
        }
        n = sizeof(tmp) - k;
        memcpy(buf, tmp + k, n);
        buf[n] = '\0';
        return n;
    }
    return tb_fmt_double(buf, len, v);
}

double tb_strtod_c(const char *s, char **end)
{
    locale_t c = the_c_locale(), old = c ? uselocale(c) : (locale_t)0;
    double v = strtod(s, end); /* strtod_l() is not POSIX. */

    if (c) {
        uselocale(old);
    }
    return v;
}
