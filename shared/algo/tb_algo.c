/* tb_algo.c -- the algorithm selector: names, key suffixes.
 *
 * A decision uses one algorithm for all its buckets (one script, one round
 * trip). The names are those of the TBucketAlgorithm directive and the
 * shim's `algorithm` setting; the script texts and digests are generated
 * into $(BUILD)/shared/algo/tb_script.c by scripts/embed-lua.sh.
 */
#include <string.h>

#include "algo/tb_algo_int.h"

const char *const tb_algo_names[TB_ALGO_COUNT] = {
    "token-bucket", "gcra", "sliding-window", "fixed-window", "sliding-log"
};

/* The Redis module's commands (redismod/), one per script, taking the
 * script's keys and arguments. */
const char *const tb_algo_module_commands[TB_ALGO_COUNT] = {
    "tbucket.bucket", "tbucket.gcra", "tbucket.swindow", "tbucket.fwindow",
    "tbucket.slog"
};

/* Short, so that the longest key still fits TB_KEY_BUF. */
static const char *const suffixes[TB_ALGO_COUNT] = {
    "", ":gcra", ":swin", ":fwin", ":slog"
};

int tb_algo_parse(const char *s, tb_algo_t *a)
{
    int i = tb_name_index(tb_algo_names, TB_ALGO_COUNT, s, 0);

    if (i < 0 || !a) {
        return TB_ERR;
    }
    *a = (tb_algo_t)i;
    return TB_OK;
}

const char *tb_algo_name(tb_algo_t a)
{
    return tb_name_at(tb_algo_names, TB_ALGO_COUNT, (int)a);
}

const char *tb_algo_key_suffix(tb_algo_t a)
{
    return (unsigned)a < TB_ALGO_COUNT ? suffixes[a] : "";
}
