/* tbucket_top.c -- tbucket top: who is limited right now, as top(1) shows
 * processes: the status page's top keys by refusals and by decisions over
 * the last minute and fifteen, redrawn in place until q or Ctrl-C, or one
 * frame with --once. Every string from the server is shown with its
 * control characters replaced, so a key cannot drive the terminal. */
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>
#include <poll.h>

#include "tbucket_tool.h"

/* ---- Frames ----------------------------------------------------------- */

/* The sum of tbucket_decisions_total's sample of outcome o. */
static double outcome_total(const jval_t *page, const char *o)
{
    const jval_t *m = json_get(page, "metrics");
    size_t i, k;

    for (i = 0; m && m->type == J_ARR && i < m->n; i++) {
        const jval_t *f = &m->items[i];
        const jval_t *name = json_get(f, "name"), *s = json_get(f, "samples");

        if (!name || name->type != J_STR
            || strcmp(name->str, "tbucket_decisions_total") != 0) {
            continue;
        }
        for (k = 0; s && s->type == J_ARR && k < s->n; k++) {
            const jval_t *l = json_get(&s->items[k], "labels");
            const jval_t *lo = json_get(l, "outcome");

            if (lo && lo->type == J_STR && strcmp(lo->str, o) == 0) {
                return json_num(&s->items[k], "value");
            }
        }
    }
    return 0;
}

static void frame_time(double unix_s, char *buf, size_t len)
{
    time_t t = (time_t)unix_s;
    struct tm tm;

    if (unix_s <= 0 || !gmtime_r(&t, &tm)) {
        snprintf(buf, len, "-");
        return;
    }
    strftime(buf, len, "%H:%M:%S", &tm);
}

/* One ranking of one window, at most rows lines of entries. */
static void frame_ranking(FILE *out, const jval_t *w, const char *which,
                          int minutes, long rows)
{
    const jval_t *list = json_get(w, which);
    int by_ref = strcmp(which, "by_refusals") == 0;
    size_t i;

    fprintf(out, "\nLAST %d MINUTE%s, BY %s\n", minutes,
            minutes == 1 ? "" : "S", by_ref ? "REFUSALS" : "DECISIONS");
    fprintf(out, "%3s %9s %9s %9s %8s  %-12s %-20s %s\n", "#", "REFUSED",
            "DECISIONS", "ALLOWED", "LAST", "LIMIT", "VHOST", "KEY");
    for (i = 0; list && list->type == J_ARR && i < list->n
                && (rows < 0 || (long)i < rows); i++) {
        const jval_t *e = &list->items[i];
        char key[TB_KEY_RAW_MAX + 8], lim[TB_NAME_MAX + 1], vh[200], at[16];

        frame_time(json_num(e, "last_refusal"), at, sizeof(at));
        fprintf(out, "%3zu %9.0f %9.0f %9.0f %8s  %-12s %-20s %s\n", i + 1,
                json_num(e, "refusals"), json_num(e, "decisions"),
                json_num(e, "allowed"), at, json_text(e, "limit", lim, sizeof(lim)),
                json_text(e, "vhost", vh, sizeof(vh)),
                json_text(e, "key", key, sizeof(key)));
    }
    if (!list || !list->n) {
        fprintf(out, "    (none)\n");
    }
}

/* 1 when the locale's characters are UTF-8, as LC_ALL, LC_CTYPE or LANG
 * say in that order: the sparkline's blocks, else an ASCII ramp. */
static int utf8_terminal(void)
{
    static const char *const vars[] = { "LC_ALL", "LC_CTYPE", "LANG" };
    size_t i;

    for (i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);

        if (v && *v) {
            return strstr(v, "UTF-8") || strstr(v, "utf8")
                   || strstr(v, "UTF8") || strstr(v, "utf-8");
        }
    }
    return 0;
}

/* The refusals of the page's last 15 minutes (its "series"), one
 * character per 10-second slot, scaled to the most in a slot: a blank
 * for none, the lowest block for at least one. Nothing without series
 * (a server older than them). */
static void frame_spark(FILE *out, const jval_t *series)
{
    static const char *const blocks[8] = {
        "\xe2\x96\x81", "\xe2\x96\x82", "\xe2\x96\x83", "\xe2\x96\x84",
        "\xe2\x96\x85", "\xe2\x96\x86", "\xe2\x96\x87", "\xe2\x96\x88"
    };
    static const char ascii[] = "._-=+*#@";
    const jval_t *ref = json_get(series, "refused");
    double max = 0, sum = 0;
    int utf8 = utf8_terminal();
    size_t i;

    if (!ref || ref->type != J_ARR || !ref->n) {
        return;
    }
    for (i = 0; i < ref->n; i++) {
        max = ref->items[i].num > max ? ref->items[i].num : max;
        sum += ref->items[i].num;
    }
    fprintf(out, "refused, last 15 min: |");
    for (i = 0; i < ref->n; i++) {
        double v = ref->items[i].num;
        int k = v <= 0 ? -1 : (int)(v * 7 / max + 0.5);

        k = v > 0 && k < 0 ? 0 : k;
        if (k < 0) {
            fputc(' ', out);
        }
        else if (utf8) {
            fputs(blocks[k > 7 ? 7 : k], out);
        }
        else {
            fputc(ascii[k > 7 ? 7 : k], out);
        }
    }
    fprintf(out, "| now; %.0f in all, at most %.0f in 10 s\n", sum, max);
}

/* One frame of `tbucket top` from a status page's JSON, into out. rows
 * bounds each ranking's lines (-1: all of them). */
static void frame(FILE *out, const char *url, const jval_t *page,
                  const tool_t *t, long rows)
{
    static const char *const outcomes[] = {
        "allowed", "rejected", "shadow-rejected", "fallback-open",
        "fallback-closed", "fallback-local", "shed", "banned"
    };
    const jval_t *top = json_get(page, "top"), *ws = json_get(top, "windows");
    char now[16];
    size_t i, w;

    frame_time((double)time(NULL), now, sizeof(now));
    fprintf(out, "tbucket top - %s - %s UTC, every %d ms (q quits)\n", url,
            now, t->interval_ms);
    fprintf(out, "decisions since start:");
    for (i = 0; i < sizeof(outcomes) / sizeof(outcomes[0]); i++) {
        fprintf(out, " %s %.0f", outcomes[i], outcome_total(page, outcomes[i]));
    }
    fputc('\n', out);
    frame_spark(out, json_get(page, "series"));
    if (!top || top->type != J_OBJ) {
        fprintf(out, "top keys: off (TBucketTopKeys Off, or not a status "
                     "page of mod_tbucket)\n");
        return;
    }
    fprintf(out, "top keys: %.0f per ranking, %.0f counters, %.0f bytes; "
                 "counts never below the truth\n", json_num(top, "k"),
            json_num(top, "counters"), json_num(top, "memory_bytes"));
    for (w = 0; ws && ws->type == J_ARR && w < ws->n; w++) {
        const jval_t *win = &ws->items[w];
        int minutes = (int)json_num(win, "minutes");

        fprintf(out, "\nlast %d minute%s: %.0f decisions, %.0f refused; a "
                     "count is over by at most %.0f (decisions), %.0f "
                     "(refusals)\n", minutes, minutes == 1 ? "" : "s",
                json_num(win, "decisions"), json_num(win, "refusals"),
                json_num(win, "decisions_bound"), json_num(win, "refusals_bound"));
        frame_ranking(out, win, "by_refusals", minutes, rows);
        frame_ranking(out, win, "by_decisions", minutes, rows);
    }
}

/* ---- The terminal ----------------------------------------------------- */

static struct termios saved_tty;
static int tty_raw;
static volatile sig_atomic_t top_stop;

static void on_signal(int sig)
{
    (void)sig;
    top_stop = 1;
}

static void tty_restore(void)
{
    if (tty_raw) {
        tcsetattr(STDIN_FILENO, TCSANOW, &saved_tty);
        tty_raw = 0;
    }
}

/* Keys one at a time, unechoed, while top runs on a terminal. */
static void tty_keys(void)
{
    struct termios raw;

    if (!isatty(STDIN_FILENO) || tcgetattr(STDIN_FILENO, &saved_tty) != 0) {
        return;
    }
    raw = saved_tty;
    raw.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0) {
        tty_raw = 1;
        atexit(tty_restore);
    }
}

/* Wait up to ms for a key: 1 when it was q (or the input ended), else
 * 0; Ctrl-C ends the wait through top_stop. */
static int wait_quit(int ms)
{
    int64_t deadline = tool_mono_ms() + ms;
    struct pollfd pfd;
    char c;

    while (!top_stop) {
        int64_t left = deadline - tool_mono_ms();

        if (left <= 0) {
            return 0;
        }
        pfd.fd = STDIN_FILENO;
        pfd.events = POLLIN;
        if (poll(&pfd, 1, (int)left) > 0) {
            ssize_t n = read(STDIN_FILENO, &c, 1);

            if (n == 0 && !isatty(STDIN_FILENO)) {
                /* No more input (stdin at end of file): just wait. */
                usleep((useconds_t)(left > 0 ? left : 0) * 1000);
                return 0;
            }
            if (n == 1 && (c == 'q' || c == 'Q')) {
                return 1;
            }
        }
    }
    return 1;
}

/* The rows of the terminal, or -1 when it is not one. */
static long tty_rows(void)
{
    struct winsize ws;

    if (!isatty(STDOUT_FILENO) || ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0
        || ws.ws_row == 0) {
        return -1;
    }
    return ws.ws_row;
}

/* Fetch and parse one page: 0, or EXIT_UNAVAILABLE with the reason in
 * err. */
static int fetch_page(const tool_t *t, const http_url_t *u, jval_t *page,
                      char *err, size_t errlen)
{
    char *body = tool_http_get(u, t->timeout_ms, err, errlen);

    if (!body) {
        return EXIT_UNAVAILABLE;
    }
    if (json_parse(body, page) != 0) {
        snprintf(err, errlen, "not the JSON view of a tbucket-status page");
        free(body);
        return EXIT_UNAVAILABLE;
    }
    if (page->type != J_OBJ || !json_get(page, "metrics")) {
        snprintf(err, errlen, "not the JSON view of a tbucket-status page");
        json_free(page);
        free(body);
        return EXIT_UNAVAILABLE;
    }
    free(body);
    return 0;
}

/* tbucket top URL: one frame with --once (exit 0, or 69 when the page
 * cannot be read), else a frame every interval until q or Ctrl-C. */
int tool_cmd_top(const tool_t *t)
{
    http_url_t u;
    char err[256];
    jval_t page;
    int rc;

    if (tool_http_url_parse(t->key, &u) != 0) {
        return tool_usage_error("top: expected http://HOST[:PORT]/PATH of a "
                           "tbucket-status page", t->key);
    }
    if (t->once) {
        if ((rc = fetch_page(t, &u, &page, err, sizeof(err))) != 0) {
            fprintf(stderr, "tbucket: %s: %s\n", t->key, err);
            return rc;
        }
        frame(stdout, t->key, &page, t, -1);
        json_free(&page);
        return 0;
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    tty_keys();
    while (!top_stop) {
        long rows = tty_rows();
        char *text = NULL;
        size_t len = 0;
        FILE *out = open_memstream(&text, &len);

        if (!out) {
            return EXIT_UNAVAILABLE;
        }
        if (fetch_page(t, &u, &page, err, sizeof(err)) == 0) {
            /* Four rankings share the screen below seven lines of totals
             * and four of headings each. */
            frame(out, t->key, &page, t,
                  rows < 0 ? -1 : rows > 40 ? (rows - 23) / 4 : 4);
            json_free(&page);
        }
        else {
            fprintf(out, "tbucket top - %s\n\nno page: %s (retrying every "
                         "%d ms; q quits)\n", t->key, err, t->interval_ms);
        }
        fclose(out);
        /* Home and clear, then the frame in one write. */
        fputs("\033[H\033[2J", stdout);
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        free(text);
        if (wait_quit(t->interval_ms)) {
            break;
        }
    }
    tty_restore();
    fputc('\n', stdout);
    return 0;
}
