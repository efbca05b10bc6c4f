/* tests/e2e/test_editor_saves.c: saves as editors really make them (issue 19). While `gpusync
 * watch -d` runs against the sandbox sshd, a writer saves a ~1 KB Python file and a 24 MB text file
 * in bursts, each save a new version; a poller thread opens the SERVER's copies (the server is
 * this machine, so the remote directory is a local path) every millisecond and must never find one
 * missing, empty, or holding bytes that are neither the initial version nor one the writer began
 * to save. The daemon's event stream must carry no "error", no "conflict", and no deletion or
 * rename away of a saved file meanwhile; after `gpusync flush` the server holds exactly the last
 * saved bytes and none of the editors' scratch files (swap files, 4913, f~, #f#, .#f,
 * ___jb_tmp___, ___jb_old___) nor anything else. Writers, one case each: real vim with a backup
 * (rename save) and with backupcopy=yes (in place), real Neovim with its defaults and Emacs with
 * backups (rename saves; Emacs saves a whole burst in one run), and the syscalls of VS Code
 * (truncate and write in place in 1 MiB writes, as node's fs.writeFileSync) and of JetBrains' safe
 * write; a writer whose editor is not installed is skipped. A last case runs every writer while a
 * thread writes and fsyncs 8 MiB at a time in an excluded folder of the project, so the disk is
 * busy. Each save is checked to be the kind its writer claims (a new inode or the same one) and
 * to leave the bytes the test expects locally. The cases share one project and daemon, each going
 * on from the versions the last one saved. The project lies under the build directory, not /tmp:
 * vim, Neovim and Emacs make no backup under /tmp, and without one they save in place.
 * Environment: GS_TEST_FILTER='*name*' runs a subset; GS_TEST_WORKDIR=DIR holds the project
 * (default: the current directory); GS_TEST_KEEP=1 keeps the project and remote folders. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <xxhash.h>

#include "common/buf.h"
#include "common/clock.h"
#include "fixtures/events.h"
#include "fixtures/proc.h"
#include "fixtures/sshd.h"
#include "fixtures/tree.h"

#define RUN_TIMEOUT_MS 120000
#define ARGS(...)      ((const char *const[]){__VA_ARGS__, NULL})

#define SMALL_NAME  "model.py"
#define BIG_NAME    "table.txt"
#define BIG_LINES   314572u /* 80-byte lines: 24 MiB */
#define LINE_LEN    80
#define DIGITS      7         /* a counter's width: every version has the same size */
#define CHUNK       (1 << 20) /* the scripted writers' write size */
#define SMALL_SAVES 10        /* one burst, per writer */
#define BIG_SAVES   8
#define BUSY_SAVES  4 /* per file and writer, with the busy disk */
#define HOG_BLOCK   (8 << 20)
#define HOG_BLOCKS  8  /* the busy-disk file cycles over 64 MiB */
#define MAX_LISTED  40 /* problems listed in the report; all are counted */
#define MAX_WRITERS 8  /* the last row of the counts: problems seen before any save */

static struct gs_test_sshd sshd;

/* ---- the files and their versions ---- */

/* One saved version: what the poller compares the server's bytes with. */
struct version {
    size_t len;
    XXH64_hash_t hash;
};

/* A file the writers save and the poller samples. Version k is `data` with every counter reading
 * k; `versions` holds the initial one and every version a save has begun to write, appended
 * (under `lock`) before the save starts. */
struct file {
    const char *name;
    char local[4400], remote[200];
    char *data;
    size_t len;
    size_t at[2]; /* where each counter's digits are */
    int line[2];  /* on which line (1-based), for the editors' commands */
    int counters;
    int saved; /* the last version made */
    pthread_mutex_t lock;
    struct version *versions;
    size_t n_versions, cap_versions;
    /* the poller's own, read by the test thread once the poller has stopped */
    int have_key;
    struct stat key;
    int missing; /* the last sample found no file */
    long reads;
    struct gs_buf bytes;
};

/* The project all cases share, and what a failed assertion must let the teardown end. */
struct proj {
    char base[4200];  /* GS_TEST_WORKDIR/gs-e2e-saves.XXXXXX; the project is base/proj */
    char local[4300]; /* base/proj */
    char remote[64];  /* /tmp/gs-e2e-saves-remote.XXXXXX (the server is this machine) */
    struct file small, big;
    struct gs_test_events ev;
    char scratch[4400]; /* base/proj/scratch, excluded: the busy disk's file */
    int events_on;
};
static struct proj cur;

static void file_set_counters(struct file *f, int k)
{
    char digits[16];
    snprintf(digits, sizeof(digits), "%0*d", DIGITS, k);
    for (int i = 0; i < f->counters; i++)
        memcpy(f->data + f->at[i], digits, DIGITS);
}

/* Appends "NAME = " and a counter to the content being built in `b`, on line `line`. */
static void add_counter(struct file *f, struct gs_buf *b, const char *name, int line)
{
    gs_buf_addf(b, "%s = ", name);
    f->at[f->counters] = b->len;
    f->line[f->counters++] = line;
    gs_buf_addf(b, "%0*d", DIGITS, 0);
}

/* About 1 KB of Python with one counter line. */
static void make_small(struct file *f)
{
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_adds(&b,
                "\"\"\"A model, saved over and over by the editor tests.\"\"\"\nimport math\n\n");
    add_counter(f, &b, "VERSION", 4);
    gs_buf_adds(&b, "\n");
    for (int i = 0; b.len < 1000; i++)
        gs_buf_addf(&b, "\n\ndef layer_%02d(x):\n    return math.tanh(x * %d.5) + %d\n", i, i, i);
    f->len = b.len;
    f->data = gs_buf_detach(&b, NULL);
}

/* 24 MiB of 80-byte lines, with counters on the middle line and the last one. */
static void make_big(struct file *f)
{
    struct gs_buf b = GS_BUF_INIT;
    gs_buf_grow(&b, (size_t)BIG_LINES * LINE_LEN);
    for (unsigned i = 0; i < BIG_LINES; i++) {
        size_t start = b.len;
        if (i == BIG_LINES / 2 || i == BIG_LINES - 1)
            add_counter(f, &b, i == BIG_LINES - 1 ? "END" : "MID", (int)i + 1);
        else
            gs_buf_addf(&b, "row %07u: the quick brown fox jumps over the lazy dog", i);
        while (b.len - start < LINE_LEN - 1)
            gs_buf_addc(&b, ' ');
        gs_buf_addc(&b, '\n');
    }
    f->len = b.len;
    f->data = gs_buf_detach(&b, NULL);
}

static void version_add(struct file *f)
{
    struct version v = {f->len, XXH3_64bits(f->data, f->len)};
    pthread_mutex_lock(&f->lock);
    if (f->n_versions == f->cap_versions) {
        f->cap_versions = f->cap_versions ? 2 * f->cap_versions : 32;
        f->versions = realloc(f->versions, f->cap_versions * sizeof(*f->versions));
        assert_non_null(f->versions);
    }
    f->versions[f->n_versions++] = v;
    pthread_mutex_unlock(&f->lock);
}

/* Whether `len` bytes hashing to `hash` are a version saved so far. */
static int version_known(struct file *f, size_t len, XXH64_hash_t hash)
{
    int known = 0;
    pthread_mutex_lock(&f->lock);
    for (size_t i = 0; i < f->n_versions && !known; i++)
        known = f->versions[i].len == len && f->versions[i].hash == hash;
    pthread_mutex_unlock(&f->lock);
    return known;
}

static void write_all_or_fail(int fd, const char *data, size_t len, const char *path)
{
    for (size_t off = 0; off < len;) {
        size_t n = len - off < CHUNK ? len - off : CHUNK;
        ssize_t w = write(fd, data + off, n);
        if (w < 0)
            fail_msg("write %s: %s", path, strerror(errno));
        off += (size_t)w;
    }
}

static void write_new(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        fail_msg("open %s: %s", path, strerror(errno));
    write_all_or_fail(fd, data, len, path);
    assert_int_equal(close(fd), 0);
}

static void file_init(struct file *f, const char *name, void (*make)(struct file *))
{
    memset(f, 0, sizeof(*f));
    f->name = name;
    pthread_mutex_init(&f->lock, NULL);
    snprintf(f->local, sizeof(f->local), "%s/%s", cur.local, name);
    snprintf(f->remote, sizeof(f->remote), "%s/%s", cur.remote, name);
    make(f);
    write_new(f->local, f->data, f->len);
    version_add(f);
}

static void file_release(struct file *f)
{
    if (!f->name)
        return;
    free(f->data);
    free(f->versions);
    gs_buf_release(&f->bytes);
    pthread_mutex_destroy(&f->lock);
    memset(f, 0, sizeof(*f));
}

/* ---- what the poller found ---- */

enum { SEEN_MISSING, SEEN_EMPTY, SEEN_OTHER, SEEN_KINDS };
static const char *const seen_names[SEEN_KINDS] = {"missing", "empty", "never saved"};

/* The save under way (or the last one), as the poller attributes what it finds. */
struct progress {
    int writer; /* index in `writers` */
    const char *writer_name;
    const struct file *file;
    int first, last; /* the versions being saved (one process may save several) */
};

/* Problems the poller found, counted per writer and kind, the first MAX_LISTED described. */
static struct {
    pthread_mutex_t lock;
    struct progress now;
    int64_t t0;
    int count[MAX_WRITERS][SEEN_KINDS];
    int total;
    char listed[MAX_LISTED][200];
} seen = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void seen_reset(void)
{
    pthread_mutex_lock(&seen.lock);
    memset(seen.count, 0, sizeof(seen.count));
    seen.total = 0;
    seen.now = (struct progress){MAX_WRITERS - 1, "nobody", NULL, 0, 0};
    seen.t0 = gs_clock_mono_ms();
    pthread_mutex_unlock(&seen.lock);
}

static void seen_progress(int writer, const char *name, const struct file *f, int first, int last)
{
    pthread_mutex_lock(&seen.lock);
    seen.now = (struct progress){writer, name, f, first, last};
    pthread_mutex_unlock(&seen.lock);
}

/* Records what the poller saw of `f` on the server (`kind`, `size` bytes). */
static void seen_problem(const struct file *f, int kind, size_t size)
{
    pthread_mutex_lock(&seen.lock);
    seen.count[seen.now.writer][kind]++;
    if (seen.total < MAX_LISTED) {
        char what[64] = "", range[32] = "";
        if (kind == SEEN_OTHER)
            snprintf(what, sizeof(what), " (%zu bytes, a version has %zu)", size, f->len);
        if (seen.now.last > seen.now.first)
            snprintf(range, sizeof(range), "s %d-%d", seen.now.first, seen.now.last);
        else
            snprintf(range, sizeof(range), " %d", seen.now.first);
        snprintf(seen.listed[seen.total], sizeof(seen.listed[0]),
                 "+%lld ms: %s %s%s on the server, %s saving %s version%s",
                 (long long)(gs_clock_mono_ms() - seen.t0), f->name, seen_names[kind], what,
                 seen.now.writer_name, seen.now.file ? seen.now.file->name : "-", range);
    }
    seen.total++;
    pthread_mutex_unlock(&seen.lock);
}

/* ---- the poller ---- */

static struct {
    pthread_t thread;
    atomic_int stop;
    int running;
    long samples;
    int small_from, big_from; /* the versions saved before the case */
} poller;

static int same_key(const struct stat *a, const struct stat *b)
{
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino && a->st_size == b->st_size &&
           a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec &&
           a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* Reads the open file into f->bytes; returns 0, or -1 when a read fails. */
static int read_whole(struct file *f, int fd)
{
    gs_buf_reset(&f->bytes);
    for (;;) {
        gs_buf_grow(&f->bytes, CHUNK);
        ssize_t n = read(fd, f->bytes.data + f->bytes.len, CHUNK);
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        f->bytes.len += (size_t)n;
    }
}

/* One look at the server's copy of `f`: missing, or (when it changed since the last look) its
 * bytes compared with every version saved so far. */
static void sample(struct file *f)
{
    int fd = open(f->remote, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (!f->missing) /* one problem per spell, however long it lasts */
            seen_problem(f, SEEN_MISSING, 0);
        f->missing = 1;
        f->have_key = 0;
        return;
    }
    f->missing = 0;
    struct stat st;
    if (fstat(fd, &st) == 0 && f->have_key && same_key(&st, &f->key)) {
        close(fd);
        return;
    }
    f->key = st;
    f->have_key = 1;
    f->reads++;
    if (read_whole(f, fd) == 0 && f->bytes.len == 0)
        seen_problem(f, SEEN_EMPTY, 0);
    else if (!version_known(f, f->bytes.len, XXH3_64bits(f->bytes.data, f->bytes.len)))
        seen_problem(f, SEEN_OTHER, f->bytes.len);
    close(fd);
}

static void *poller_main(void *arg)
{
    (void)arg;
    const struct timespec ms = {0, 1000000};
    while (!atomic_load(&poller.stop)) {
        sample(&cur.small);
        sample(&cur.big);
        poller.samples++;
        nanosleep(&ms, NULL); /* the sampling period: a measurement, not a synchronisation */
    }
    return NULL;
}

static void poller_start(void)
{
    seen_reset();
    atomic_store(&poller.stop, 0);
    poller.samples = 0;
    poller.small_from = cur.small.saved;
    poller.big_from = cur.big.saved;
    cur.small.reads = cur.big.reads = 0;
    assert_int_equal(pthread_create(&poller.thread, NULL, poller_main, NULL), 0);
    poller.running = 1;
}

static void poller_stop(void)
{
    if (!poller.running)
        return;
    atomic_store(&poller.stop, 1);
    pthread_join(poller.thread, NULL);
    poller.running = 0;
}

/* ---- the busy disk ---- */

static struct {
    pthread_t thread;
    atomic_int stop;
    int running;
    char path[4600];
    long blocks; /* written and fsynced */
} hog;

/* Writes and fsyncs HOG_BLOCK bytes at a time without pause, over HOG_BLOCKS places in turn. */
static void *hog_main(void *arg)
{
    (void)arg;
    char *block = malloc(HOG_BLOCK);
    int fd = open(hog.path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (!block || fd < 0) {
        free(block);
        return NULL;
    }
    memset(block, 'h', HOG_BLOCK);
    for (long i = 0; !atomic_load(&hog.stop); i++) {
        if (pwrite(fd, block, HOG_BLOCK, (off_t)(i % HOG_BLOCKS) * HOG_BLOCK) != HOG_BLOCK ||
            fsync(fd) != 0)
            break;
        hog.blocks++;
    }
    close(fd);
    free(block);
    return NULL;
}

static void hog_start(const char *path)
{
    snprintf(hog.path, sizeof(hog.path), "%s", path);
    atomic_store(&hog.stop, 0);
    hog.blocks = 0;
    assert_int_equal(pthread_create(&hog.thread, NULL, hog_main, NULL), 0);
    hog.running = 1;
}

static void hog_stop(void)
{
    if (!hog.running)
        return;
    atomic_store(&hog.stop, 1);
    pthread_join(hog.thread, NULL);
    hog.running = 0;
}

/* ---- the writers ---- */

struct writer {
    const char *name;
    const char *program; /* the editor it runs, or NULL for a scripted save */
    int renames;         /* its save puts a new inode in place, else it writes in place */
    /* saves version f->saved; or, where `save_n` is set instead, versions f->saved - n + 1 to
     * f->saved in one run of the editor */
    void (*save)(const struct writer *w, struct file *f);
    void (*save_n)(const struct writer *w, struct file *f, int n);
    const char *set; /* vim's options */
};

/* Runs an editor in the project and fails unless it exits 0. */
static void run_editor(const char *const *argv)
{
    struct gs_test_result r = gs_test_run_prog(cur.local, argv, RUN_TIMEOUT_MS);
    gs_test_expect_status(&r, 0, argv[0]);
    gs_test_result_release(&r);
}

/* Ex commands putting the counters of version f->saved in place (":NNNs/\d\+/0000042/"). */
static void ex_substitutions(const struct file *f, char cmds[2][64])
{
    for (int i = 0; i < f->counters; i++)
        snprintf(cmds[i], sizeof(cmds[0]), "%ds/\\d\\+/%0*d/", f->line[i], DIGITS, f->saved);
}

/* vim in Ex mode, without vimrc, viminfo or swap file: with `backup` (and 'backupskip' cleared) it
 * renames the original to f~, keeps it, and writes a new f; with backupcopy=yes it copies the
 * original to f~ and writes f in place, truncating it first. */
static void save_vim(const struct writer *w, struct file *f)
{
    char cmds[2][64];
    ex_substitutions(f, cmds);
    const char *last = f->counters > 1 ? cmds[1] : "";
    run_editor(ARGS("vim", "-u", "NONE", "-i", "NONE", "-N", "-n", "-es", "-c", w->set, "-c",
                    cmds[0], "-c", last, "-c", "wq", f->name));
}

/* Neovim with its default options (writebackup, backupcopy=auto: the original renamed to f~, a
 * new f written, f~ deleted). -u NONE only skips loading plugins, which takes seconds here. One
 * default is cleared: 'backupskip' names every file under /tmp, where a checkout running this test
 * may live (a fresh clone under /tmp saved in place), and a user's project does not. */
static void save_nvim(const struct writer *w, struct file *f)
{
    (void)w;
    char cmds[2][64];
    ex_substitutions(f, cmds);
    const char *last = f->counters > 1 ? cmds[1] : "";
    run_editor(ARGS("nvim", "--headless", "-u", "NONE", "-i", "NONE", "--cmd",
                    "set backupskip=", "-c", cmds[0], "-c", last, "-c", "wq", f->name));
}

/* The gaps after each save of a burst (ms), so that the daemon's batches (8 ms of quiet, 100 ms
 * at most) end at varied points of the saves: the shape of the workload, not a synchronisation. */
static const int gaps_ms[] = {0, 1, 0, 4, 0, 9, 2, 16};
#define GAP_MS(i) gaps_ms[(i) % (int)(sizeof(gaps_ms) / sizeof(gaps_ms[0]))]

/* Emacs in batch mode, `n` saves in one run. Emacs backs a file up on a buffer's first save only,
 * so buffer-backed-up is cleared before each: every save renames f to f~ and writes a new f (with
 * the .#f lock held meanwhile). Backups are enabled everywhere and the large-file question is off;
 * one run for the burst, as starting Emacs and reading 24 MB again per save takes a second here. */
static void save_emacs(const struct writer *w, struct file *f, int n)
{
    (void)w;
    struct gs_buf el = GS_BUF_INIT;
    gs_buf_addf(&el,
                "(progn (setq backup-enable-predicate (lambda (_) t) make-backup-files t"
                " large-file-warning-threshold nil) (find-file \"%s\")",
                f->name);
    for (int i = 0; i < n; i++) {
        for (int c = 0; c < f->counters; c++)
            gs_buf_addf(&el,
                        " (goto-char (point-min)) (forward-line %d) (re-search-forward \"[0-9]+\")"
                        " (replace-match \"%0*d\")",
                        f->line[c] - 1, DIGITS, f->saved - n + 1 + i);
        gs_buf_addf(&el, " (setq buffer-backed-up nil) (save-buffer) (sleep-for %g)",
                    GAP_MS(i) / 1000.0);
    }
    gs_buf_adds(&el, ")");
    run_editor(ARGS("emacs", "--batch", "-Q", "--eval", el.data));
    gs_buf_release(&el);
}

/* VS Code's save (node's fs.writeFileSync): open with O_TRUNC, write in 1 MiB pieces, close. */
static void save_vscode(const struct writer *w, struct file *f)
{
    (void)w;
    int fd = open(f->local, O_WRONLY | O_TRUNC | O_CLOEXEC);
    if (fd < 0)
        fail_msg("open %s: %s", f->local, strerror(errno));
    write_all_or_fail(fd, f->data, f->len, f->local);
    assert_int_equal(close(fd), 0);
}

/* JetBrains' safe write: f___jb_tmp___ written, f renamed to f___jb_old___, the temporary renamed
 * to f, f___jb_old___ deleted. */
static void save_jetbrains(const struct writer *w, struct file *f)
{
    (void)w;
    char tmp[4500], old[4500];
    snprintf(tmp, sizeof(tmp), "%s___jb_tmp___", f->local);
    snprintf(old, sizeof(old), "%s___jb_old___", f->local);
    write_new(tmp, f->data, f->len);
    assert_int_equal(rename(f->local, old), 0);
    assert_int_equal(rename(tmp, f->local), 0);
    assert_int_equal(unlink(old), 0);
}

enum { W_VIM, W_VIM_IN_PLACE, W_NVIM, W_EMACS, W_VSCODE, W_JETBRAINS, N_WRITERS };
_Static_assert(N_WRITERS < MAX_WRITERS, "seen.count has a row per writer and one for none");

static const struct writer writers[] = {
    [W_VIM] = {"vim (backup, rename save)", "vim", 1, save_vim, NULL,
               "set backupskip= backup writebackup backupcopy=auto"},
    [W_VIM_IN_PLACE] = {"vim (backupcopy=yes, in place)", "vim", 0, save_vim, NULL,
                        "set backupskip= writebackup backupcopy=yes"},
    [W_NVIM] = {"nvim (defaults, rename save)", "nvim", 1, save_nvim, NULL, NULL},
    [W_EMACS] = {"emacs (backup, rename save)", "emacs", 1, NULL, save_emacs, NULL},
    [W_VSCODE] = {"VS Code-style (in place, 1 MiB writes)", NULL, 0, save_vscode, NULL, NULL},
    [W_JETBRAINS] = {"JetBrains-style (safe write)", NULL, 1, save_jetbrains, NULL, NULL},
};

/* Whether `program` is found in PATH. */
static int installed(const char *program)
{
    const char *path = getenv("PATH");
    char dir[4096];
    while (path && *path) {
        size_t n = strcspn(path, ":");
        snprintf(dir, sizeof(dir), "%.*s/%s", (int)n, path, program);
        if (access(dir, X_OK) == 0)
            return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

/* Fails unless the local file holds exactly version f->saved: the editor saved what the test
 * expects the server to show. */
static void expect_local_version(const struct file *f, const struct writer *w)
{
    struct gs_buf b = GS_BUF_INIT;
    if (gs_test_slurp(f->local, &b) != 0)
        fail_msg("%s: %s after a save by %s", f->local, strerror(errno), w->name);
    int same = b.len == f->len && memcmp(b.data, f->data, f->len) == 0;
    size_t len = b.len;
    gs_buf_release(&b);
    if (!same)
        fail_msg("%s saved %s as %zu bytes that are not version %d (%zu bytes): the test's model "
                 "of the edit is wrong",
                 w->name, f->name, len, f->saved, f->len);
}

/* Registers version f->saved + 1 and makes it f's content. */
static void next_version(struct file *f)
{
    f->saved++;
    file_set_counters(f, f->saved);
    version_add(f);
}

/* Opens f's current inode, held open so that no new file can be given its number (inode numbers
 * are reused: two saves by rename can bring a file back to its first one). */
static int hold_inode(const struct file *f)
{
    int fd = open(f->local, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        fail_msg("open %s: %s", f->local, strerror(errno));
    return fd;
}

/* Fails unless the save(s) since hold_inode put a new inode in place (`renames`) or kept it; closes
 * `held`. */
static void expect_save_kind(const struct writer *w, const struct file *f, int held)
{
    struct stat before, after;
    assert_int_equal(fstat(held, &before), 0);
    close(held);
    assert_int_equal(stat(f->local, &after), 0);
    if ((before.st_ino != after.st_ino) != w->renames)
        fail_msg("%s saved %s %s, not as the test expects", w->name, f->name,
                 w->renames ? "in place" : "by a rename");
}

/* `saves` saves of `f` by writer `wi` back to back, each a new version registered before it
 * starts (all of them before an editor that saves several times in one run starts). Checks that
 * each save was made the way the writer claims, and made the bytes the test expects. */
static void burst(int wi, struct file *f, int saves)
{
    const struct writer *w = &writers[wi];
    if (w->save_n) {
        int held = hold_inode(f);
        for (int i = 0; i < saves; i++)
            next_version(f);
        seen_progress(wi, w->name, f, f->saved - saves + 1, f->saved);
        w->save_n(w, f, saves);
        expect_save_kind(w, f, held);
        expect_local_version(f, w);
        return;
    }
    for (int i = 0; i < saves; i++) {
        int held = hold_inode(f);
        next_version(f);
        seen_progress(wi, w->name, f, f->saved, f->saved);
        w->save(w, f);
        expect_save_kind(w, f, held);
        expect_local_version(f, w);
        if (GAP_MS(i))
            usleep(1000 * GAP_MS(i));
    }
}

/* ---- the project and its daemon ---- */

static void gs_ok(const char *const *args, const char *what)
{
    gs_test_gpusync_ok(cur.local, args, what);
}

static void flush(const char *what)
{
    gs_ok(ARGS("flush", "--timeout", "150"), what);
}

/* A new project under GS_TEST_WORKDIR (default: here) holding the two files at version 0 and an
 * empty scratch/ that [sync] excludes, its remote folder in /tmp, initialised against the sandbox
 * sshd. */
static void proj_init(void)
{
    const char *dir = getenv("GS_TEST_WORKDIR") ? getenv("GS_TEST_WORKDIR") : ".";
    char real[4096];
    if (!realpath(dir, real))
        fail_msg("GS_TEST_WORKDIR %s: %s", dir, strerror(errno));
    if (strncmp(real, "/tmp/", 5) == 0)
        print_message("warning: %s is under /tmp, where editors make no backup\n", real);
    snprintf(cur.base, sizeof(cur.base), "%s/gs-e2e-saves.XXXXXX", real);
    assert_non_null(mkdtemp(cur.base));
    snprintf(cur.local, sizeof(cur.local), "%s/proj", cur.base);
    assert_int_equal(mkdir(cur.local, 0755), 0);
    char remote_base[64] = "/tmp/gs-e2e-saves-remote.XXXXXX";
    assert_non_null(mkdtemp(remote_base));
    snprintf(cur.remote, sizeof(cur.remote), "%s/remote", remote_base);
    char target[64];
    snprintf(target, sizeof(target), "root@127.0.0.1:%d", sshd.port);
    gs_ok(ARGS("init", target, "--path", cur.remote, "--accept-new-host-key"), "gpusync init");
    char cfg[4400];
    snprintf(cfg, sizeof(cfg), "%s/.gpusync/config", cur.local);
    FILE *fp = fopen(cfg, "a");
    assert_non_null(fp);
    fputs("[sync]\n\texclude = scratch/\n", fp);
    assert_int_equal(fclose(fp), 0);
    snprintf(cur.scratch, sizeof(cur.scratch), "%s/scratch", cur.local);
    assert_int_equal(mkdir(cur.scratch, 0755), 0);
    file_init(&cur.small, SMALL_NAME, make_small);
    file_init(&cur.big, BIG_NAME, make_big);
}

/* Stops the daemon (SIGKILL if --stop fails) and removes both folders unless GS_TEST_KEEP. */
static void proj_destroy(void)
{
    if (cur.local[0]) {
        struct gs_test_result r =
            gs_test_run_gpusync(cur.local, NULL, NULL, ARGS("watch", "--stop"), RUN_TIMEOUT_MS);
        gs_test_result_release(&r);
        pid_t pid = gs_test_daemon_lock_pid(cur.local);
        if (pid > 0 && kill(pid, 0) == 0)
            kill(pid, SIGKILL);
    }
    if (getenv("GS_TEST_KEEP") == NULL) {
        if (cur.base[0])
            gs_test_sh("rm -rf '%s'", cur.base);
        if (cur.remote[0])
            gs_test_sh("rm -rf '%.*s'", (int)(strrchr(cur.remote, '/') - cur.remote), cur.remote);
    } else if (cur.base[0]) {
        print_message("kept %s and %s\n", cur.local, cur.remote);
    }
    file_release(&cur.small);
    file_release(&cur.big);
    memset(&cur, 0, sizeof(cur));
}

/* Writes `name` and waits for its "synced" event: every event before it has been read. The first
 * marker also proves the stream is subscribed, which `gpusync events` does not announce: rewrite
 * it until an event shows up. */
static void events_mark(const char *name)
{
    for (int i = 0; i < 50; i++) {
        char body[64];
        snprintf(body, sizeof(body), "%s %d\n", name, i);
        gs_test_write_file(cur.local, name, body);
        flush("flush after a marker");
        if (gs_test_events_wait(&cur.ev, "synced", name, 200 + 100 * i))
            return;
    }
    fail_msg("no \"synced\" event for marker %s", name);
}

/* The start of a case: a new subscription to the daemon's events, and the poller. */
static int test_setup(void **state)
{
    (void)state;
    gs_test_events_start(&cur.ev, cur.local);
    cur.events_on = 1;
    events_mark("marker-before.txt");
    poller_start();
    return 0;
}

static int test_teardown(void **state)
{
    (void)state;
    poller_stop();
    hog_stop();
    if (cur.events_on)
        gs_test_events_stop(&cur.ev);
    cur.events_on = 0;
    return 0;
}

/* One project and one daemon for all cases (a login on this machine's server takes about 2 s,
 * so `init` and the daemon's first connection and upload take 10 s): each case goes on from the
 * versions the previous one saved. */
static int group_setup(void **state)
{
    (void)state;
    if (gs_test_sshd_start_for_cli(&sshd) != 0)
        return -1;
    memset(&cur, 0, sizeof(cur));
    proj_init();
    gs_ok(ARGS("watch", "-d"), "gpusync watch -d");
    flush("the first flush");
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    proj_destroy();
    gs_test_sshd_destroy(&sshd);
    return 0;
}

/* ---- the verdict ---- */

/* Appends what the poller found, per writer and kind, then the first problems one by one. */
static void report_seen(struct gs_buf *out)
{
    for (int w = 0; w < MAX_WRITERS; w++) {
        int *c = seen.count[w];
        if (c[SEEN_MISSING] + c[SEEN_EMPTY] + c[SEEN_OTHER])
            gs_buf_addf(out,
                        "  %s: the server showed a file missing %d time(s), empty %d, "
                        "with bytes never saved %d\n",
                        w < N_WRITERS ? writers[w].name : "before any save", c[SEEN_MISSING],
                        c[SEEN_EMPTY], c[SEEN_OTHER]);
    }
    for (int i = 0; i < seen.total && i < MAX_LISTED; i++)
        gs_buf_addf(out, "    %s\n", seen.listed[i]);
    if (seen.total > MAX_LISTED)
        gs_buf_addf(out, "    ... and %d more\n", seen.total - MAX_LISTED);
}

static int is_saved_file(const char *path)
{
    return path && (!strcmp(path, SMALL_NAME) || !strcmp(path, BIG_NAME));
}

/* Whether event `e` says something went wrong: an error, a conflict, or a saved file deleted or
 * renamed away on the server (no writer ever deletes one: a save replaces it). */
static int bad_event(json_t *e)
{
    const char *k = json_string_value(json_object_get(e, "event"));
    if (!k)
        return 0;
    if (!strcmp(k, "error") || !strcmp(k, "conflict"))
        return 1;
    if (!strcmp(k, "deleted"))
        return is_saved_file(json_string_value(json_object_get(e, "path")));
    if (!strcmp(k, "renamed"))
        return is_saved_file(json_string_value(json_object_get(e, "from")));
    return 0;
}

/* Appends every bad event read (bad_event); returns how many. */
static int report_events(struct gs_buf *out)
{
    size_t i;
    json_t *e;
    int n = 0;
    json_array_foreach(cur.ev.all, i, e)
    {
        if (!bad_event(e))
            continue;
        char *text = json_dumps(e, JSON_COMPACT);
        if (n < MAX_LISTED)
            gs_buf_addf(out, "  event %s\n", text);
        free(text);
        n++;
    }
    return n;
}

/* Appends a line unless the server's copy of `f` holds exactly its last saved version. */
static int report_final(const struct file *f, struct gs_buf *out)
{
    struct gs_buf b = GS_BUF_INIT;
    int rc = gs_test_slurp(f->remote, &b);
    int same = rc == 0 && b.len == f->len && memcmp(b.data, f->data, f->len) == 0;
    if (!same)
        gs_buf_addf(out, "  after the flush the server's %s %s, not version %d (%zu bytes)\n",
                    f->name, rc ? "is missing" : "holds other bytes", f->saved, f->len);
    gs_buf_release(&b);
    return !same;
}

/* Whether `name` may be on the server: the saved files and the markers (and .gpusync, where
 * runs live). Anything else is an editor's or gpusync's leftover. */
static int expected_on_server(const char *name)
{
    static const char *const names[] = {SMALL_NAME, BIG_NAME, "marker-before.txt",
                                        "marker-after.txt", ".gpusync"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (!strcmp(name, names[i]))
            return 1;
    return 0;
}

/* Appends each unexpected entry of the server's folder; returns how many. */
static int report_leftovers(struct gs_buf *out)
{
    DIR *d = opendir(cur.remote);
    if (!d) {
        gs_buf_addf(out, "  cannot list the server's folder %s: %s\n", cur.remote, strerror(errno));
        return 1;
    }
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || expected_on_server(de->d_name))
            continue;
        gs_buf_addf(out, "  left on the server: %s\n", de->d_name);
        n++;
    }
    closedir(d);
    return n;
}

/* After the bursts: flush, read every event up to a marker, stop the poller, then fail with every
 * problem found (what the poller saw, error and conflict events, the final bytes, leftovers). */
static void verdict(const char *what, int64_t started_ms)
{
    flush("the flush after the bursts");
    events_mark("marker-after.txt");
    poller_stop();
    struct gs_buf msg = GS_BUF_INIT;
    report_seen(&msg);
    int events = report_events(&msg);
    int final = report_final(&cur.small, &msg) + report_final(&cur.big, &msg);
    int left = report_leftovers(&msg);
    print_message("%s: %d+%d saves in %.1f s; %ld samples, %ld+%ld changed copies read; "
                  "%d seen, %d bad events, %d wrong at the end, %d leftovers\n",
                  what, cur.small.saved - poller.small_from, cur.big.saved - poller.big_from,
                  (double)(gs_clock_mono_ms() - started_ms) / 1000, poller.samples, cur.small.reads,
                  cur.big.reads, seen.total, events, final, left);
    /* line by line: cmocka's print_message cuts a long text */
    for (char *line = msg.data, *nl; line && (nl = strchr(line, '\n')); line = nl + 1)
        print_message("%.*s\n", (int)(nl - line), line);
    gs_buf_release(&msg);
    if (seen.total + events + final + left)
        fail_msg("%s: the server showed a file missing or bytes never saved, or the daemon "
                 "reported errors, or left files behind (listed above)",
                 what);
}

/* ---- the cases ---- */

/* Skips the case when writer `wi` needs an editor that is not installed. */
static void need_writer(int wi)
{
    if (writers[wi].program && !installed(writers[wi].program)) {
        print_message("%s is not installed: skipped\n", writers[wi].program);
        skip();
    }
}

/* One writer: a burst of saves of the small file, then one of the big file. */
static void one_writer(int wi)
{
    need_writer(wi);
    int64_t t0 = gs_clock_mono_ms();
    burst(wi, &cur.small, SMALL_SAVES);
    burst(wi, &cur.big, BIG_SAVES);
    verdict(writers[wi].name, t0);
}

static void test_editor_saves__vim_rename_saves_never_show_a_missing_or_partial_file(void **state)
{
    (void)state;
    one_writer(W_VIM);
}

static void test_editor_saves__vim_in_place_saves_never_show_an_empty_or_partial_file(void **state)
{
    (void)state;
    one_writer(W_VIM_IN_PLACE);
}

static void test_editor_saves__nvim_saves_never_show_a_missing_or_partial_file(void **state)
{
    (void)state;
    one_writer(W_NVIM);
}

static void test_editor_saves__emacs_saves_never_show_a_missing_or_partial_file(void **state)
{
    (void)state;
    one_writer(W_EMACS);
}

static void test_editor_saves__vscode_saves_never_show_an_empty_or_partial_file(void **state)
{
    (void)state;
    one_writer(W_VSCODE);
}

static void
test_editor_saves__jetbrains_safe_writes_never_show_a_missing_or_partial_file(void **state)
{
    (void)state;
    one_writer(W_JETBRAINS);
}

/* Every writer in turn, shorter bursts, while a thread writes and fsyncs 8 MiB at a time in an
 * excluded folder of the project: saves and the daemon's reads and uploads wait on a busy disk. */
static void
test_editor_saves__every_writer_on_a_busy_disk_never_shows_a_missing_or_partial_file(void **state)
{
    (void)state;
    char hog_file[4500];
    snprintf(hog_file, sizeof(hog_file), "%s/busy.bin", cur.scratch);
    hog_start(hog_file);
    int64_t t0 = gs_clock_mono_ms();
    for (int wi = 0; wi < N_WRITERS; wi++) {
        if (writers[wi].program && !installed(writers[wi].program)) {
            print_message("%s is not installed: its saves are skipped\n", writers[wi].program);
            continue;
        }
        burst(wi, &cur.small, BUSY_SAVES);
        burst(wi, &cur.big, BUSY_SAVES);
    }
    hog_stop();
    print_message("the busy disk: %ld blocks of 8 MiB written and fsynced\n", hog.blocks);
    if (hog.blocks == 0)
        fail_msg("the busy-disk writer could not write %s", hog.path);
    verdict("every writer, busy disk", t0);
}

int main(void)
{
    if (getenv("GS_TEST_FILTER")) /* e.g. GS_TEST_FILTER='*emacs*' */
        cmocka_set_test_filter(getenv("GS_TEST_FILTER"));
#define T(fn) cmocka_unit_test_setup_teardown(fn, test_setup, test_teardown)
    const struct CMUnitTest tests[] = {
        T(test_editor_saves__vim_rename_saves_never_show_a_missing_or_partial_file),
        T(test_editor_saves__vim_in_place_saves_never_show_an_empty_or_partial_file),
        T(test_editor_saves__nvim_saves_never_show_a_missing_or_partial_file),
        T(test_editor_saves__emacs_saves_never_show_a_missing_or_partial_file),
        T(test_editor_saves__vscode_saves_never_show_an_empty_or_partial_file),
        T(test_editor_saves__jetbrains_safe_writes_never_show_a_missing_or_partial_file),
        T(test_editor_saves__every_writer_on_a_busy_disk_never_shows_a_missing_or_partial_file),
    };
#undef T
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
