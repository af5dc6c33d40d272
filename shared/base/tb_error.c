/* tb_error.c -- the one setter of an error and its message.
 *
 * The hiredis contract (docs/hacking.md, "Errors and memory"): a failing
 * call returns TB_ERR and leaves a kind (TB_ERR_*) and a bounded message
 * in a tb__error_t the caller passes down; the client copies the last one into
 * tb_client_t.err and errstr. Every layer sets errors through here, so
 * each message is cut the same way and a batch's shared flag always
 * starts clear.
 */
#include <stdarg.h>
#include <stdio.h>

#include "base/tb_base.h"

void tb__set_error(tb__error_t *e, int err, const char *fmt, ...)
{
    va_list ap;

    e->err = err;
    e->shared = 0;
    va_start(ap, fmt);
    vsnprintf(e->errstr, sizeof(e->errstr), fmt, ap);
    va_end(ap);
}
