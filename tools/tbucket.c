/* tbucket.c -- the tbucket command: take, inspect and reset the buckets
 * that mod_tbucket and the LD_PRELOAD shim keep in Redis, list and lift
 * TBucketRule's bans, and watch who is limited (tbucket top). A cron job
 * or a legacy shell script shares a limit with the module by taking from
 * the same bucket:
 *
 *   tbucket take nightly-export --capacity 1 --rate 1/h || exit 0
 *
 * This file holds the usage and the table of commands; the manual is
 * docs/reference.txt (tbucket(8)), and tools/README.md says which file
 * owns what. */
#include <stdlib.h>
#include <string.h>

#include "tbucket_tool.h"

void tool_usage(FILE *f)
{
    fputs("usage: tbucket take KEY --capacity N --rate R [--cost C]\n"
          "                        [--route NAME] [--policy fail|open|"
          "closed] [-q]\n"
          "       tbucket inspect KEY [--capacity N --rate R [--cost C]]"
          " [--route NAME]\n"
          "       tbucket reset KEY [--route NAME]\n"
          "       tbucket top URL [--once] [--interval DURATION]\n"
          "       tbucket bans [--rule NAME] [--key KEY] [--limit N]"
          " (newest first:\n"
          "                    the latest-ending ban first)\n"
          "       tbucket ban RULE KEY DURATION\n"
          "       tbucket unban RULE KEY [--keep-bucket] (also refills the"
          " key's bucket)\n"
          "options: --url URL  --config FILE  --prefix STRING (rl:)\n"
          "         --timeout DURATION (1s)  --rule [in:|out:]NAME\n"
          "         --algorithm NAME (token-bucket)\n"
          "         --engine auto|script|module (auto)\n"
          "         --tls-ca FILE  --tls-cert FILE  --tls-key FILE\n"
          "         --tls-server-name NAME  --tls-verify on|off\n"
          "exit: 0 allowed/done, 64 usage, 65 cost > capacity,\n"
          "      69 Redis (top: the status page) unavailable,\n"
          "      75 rejected (retry later), 78 config\n", f);
}

int tool_usage_error(const char *what, const char *detail)
{
    fprintf(stderr, "tbucket: %s%s%s\n", what, detail ? ": " : "",
            detail ? detail : "");
    tool_usage(stderr);
    return EXIT_USAGE;
}

/* The commands, by name. */
static const struct {
    const char *name;
    int (*run)(const tool_t *t);
} commands[] = {
    { "take", tool_cmd_take },
    { "inspect", tool_cmd_inspect },
    { "reset", tool_cmd_reset },
    { "top", tool_cmd_top },
    { "bans", tool_cmd_bans },
    { "ban", tool_cmd_ban },
    { "unban", tool_cmd_unban },
};

int main(int argc, char **argv)
{
    tool_t t;
    size_t i;
    int rc;

    if ((rc = tool_parse_args(&t, argc, argv)) != 0) {
        return rc;
    }
    for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
        if (strcmp(t.cmd, commands[i].name) == 0) {
            return commands[i].run(&t);
        }
    }
    return tool_usage_error("unknown command", t.cmd);
}
