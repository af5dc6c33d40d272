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
 * other threads and the host never see it. Whole numbers never get here
 * on the request path (tb_call.c, in the decision path, prints them
 * itself).
 */
#include <locale.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

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

double tb_strtod_c(const char *s, char **end)
{
    locale_t c = the_c_locale(), old = c ? uselocale(c) : (locale_t)0;
    double v = strtod(s, end); /* strtod_l() is not POSIX. */

    if (c) {
        uselocale(old);
    }
    return v;
}
