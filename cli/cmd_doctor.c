/* cli/cmd_doctor.c: `gpusync doctor`: local checks and the facts of the server (reachability,
 * auth, latency, OS, disk, GPUs, driver, CUDA, NCCL, Python, torch), each ok / warn / fail with a
 * hint. The server is probed with one shell script in one round trip. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/run_nodes.h"
#include "cli/run_slurm.h"
#include "common/clock.h"
#include "common/proc.h"
#include "remote/exec.h"
#include "syncd/resident.h"

/* Prints key=value lines; GPUs one per "gpu=" line as nvidia-smi's CSV. */
static const char probe_script[] =
    "cd 2>/dev/null; d=%s\n" GS_EXEC_PATH_PROBE "\n"
    "echo os=$(uname -s); echo arch=$(uname -m); echo kernel=$(uname -r)\n"
    "if e=$(mkdir -p -- \"$d\" 2>&1); then [ -w \"$d\" ] || echo path_error=\"$d\": not writable\n"
    "else echo path_error=$(printf '%%s' \"$e\" | head -n1); fi\n"
    "df -Pk -- \"$d\" 2>/dev/null | awk 'NR==2{print \"disk_free_kb=\"$4}'\n"
    "a=~/.gpusync; [ -d \"$a\" ] || a=~\n"
    "df -Pk -- \"$a\" 2>/dev/null | awk 'NR==2{print \"agent_free_kb=\"$4}'\n"
    "if command -v nvidia-smi >/dev/null 2>&1; then\n"
    "  nvidia-smi --query-gpu=index,name,memory.total,memory.used,utilization.gpu "
    "--format=csv,noheader,nounits 2>/dev/null | sed 's/^/gpu=/'\n"
    "  echo driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null "
    "| head -n1)\n"
    "fi\n"
    "n=$(command -v nvcc || ls /usr/local/cuda/bin/nvcc 2>/dev/null)\n"
    "[ -n \"$n\" ] && echo cuda=$(\"$n\" --version | sed -n 's/.*release \\([0-9.]*\\).*/\\1/p')\n"
    "l=$(ldconfig -p 2>/dev/null | awk '/libnccl\\.so/{print $NF; exit}')\n"
    "[ -z \"$l\" ] && l=$(ls /usr/local/cuda/lib64/libnccl.so* 2>/dev/null | head -n1)\n"
    "[ -n \"$l\" ] && echo nccl_system=$l\n"
    "if command -v python3 >/dev/null 2>&1; then\n"
    "  echo python=$(python3 -c 'import platform; print(platform.python_version())')\n"
    "  python3 -c 'import nvidia.nccl as m; print(\"nccl_python=\" + list(m.__path__)[0])' "
    "2>/dev/null\n"
    "  python3 -c 'import torch; print(\"torch=\" + torch.__version__)' 2>/dev/null\n"
    "fi\n"
    "exit 0\n";

/* Run only when the shell printed before a command: sources each startup file a non-interactive
 * SSH shell reads, alone, in a shell that reads nothing else, and names those that print. (The
 * file runs once more; it already ran for every command gpusync started.) */
static const char noisy_files_script[] =
    "s=$(getent passwd \"$(id -un)\" 2>/dev/null | cut -d: -f7); echo shell=${s:-?}\n"
    "case $s in\n"
    "*bash) files=\"/etc/bash.bashrc $HOME/.bashrc\"; sh_cmd='bash --norc --noprofile' ;;\n"
    "*zsh) files=\"/etc/zsh/zshenv $HOME/.zshenv\"; sh_cmd='zsh -f' ;;\n"
    "*) files=; sh_cmd= ;;\n"
    "esac\n"
    "for f in $files; do\n"
    "  [ -r \"$f\" ] || continue\n"
    "  [ -n \"$($sh_cmd -c '. \"$1\"' _ \"$f\" </dev/null 2>&1 | head -c 1)\" ] && echo noisy=$f\n"
    "done\n"
    "exit 0\n";

struct check {
    const char *name;
    const char *status; /* ok, warn, fail */
    char detail[512];
    const char *hint;
};

struct doctor {
    struct check checks[24];
    int n;
    json_t *facts;
};

static void add_check(struct doctor *d, const char *name, const char *status, const char *hint,
                      const char *fmt, ...) __attribute__((format(printf, 5, 6)));
static void add_check(struct doctor *d, const char *name, const char *status, const char *hint,
                      const char *fmt, ...)
{
    struct check *c = &d->checks[d->n++];
    c->name = name;
    c->status = status;
    c->hint = hint;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->detail, sizeof(c->detail), fmt, ap);
    va_end(ap);
    gs_cli_terminal_safe(c->detail); /* it quotes the server: GPU names, rc files' output */
}

/* A copy of one value from the probe output, so several can be held at once. */
struct fact_value {
    char text[512];
};

/* The value of "key=" in the probe output, copied into `v`; NULL if the key is absent. */
static const char *fact_into(const char *out, const char *key, struct fact_value *v)
{
    char *value = v->text;
    size_t klen = strlen(key);
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, key, klen) == 0 && p[klen] == '=') {
            size_t len = strcspn(p + klen + 1, "\n");
            snprintf(value, sizeof(v->text), "%.*s", (int)len, p + klen + 1);
            return value;
        }
    }
    return NULL;
}

/* Each use gets its own buffer (a compound literal lives until the end of the enclosing block). */
#define fact(out, key) fact_into((out), (key), &(struct fact_value){{0}})

static json_t *parse_gpus(const char *out)
{
    json_t *gpus = json_array();
    for (const char *p = strstr(out, "gpu="); p; p = strstr(p + 1, "\ngpu=")) {
        p += (*p == '\n') ? 5 : 4;
        char line[512], name[256];
        snprintf(line, sizeof(line), "%.*s", (int)strcspn(p, "\n"), p);
        int index = 0;
        double total = 0, used = 0, util = 0;
        if (sscanf(line, "%d, %255[^,], %lf, %lf, %lf", &index, name, &total, &used, &util) >= 4)
            json_array_append_new(gpus,
                                  json_pack("{s:i,s:s,s:f,s:f,s:f}", "index", index, "name", name,
                                            "memory_total_mib", total, "memory_used_mib", used,
                                            "utilization_pct", util));
    }
    return gpus;
}

static void set_fact_string(json_t *facts, const char *out, const char *key)
{
    const char *v = fact(out, key);
    json_object_set_new(facts, key, v && *v ? json_string(v) : json_null());
}

static void check_gpus(struct doctor *d, const char *out)
{
    json_t *gpus = parse_gpus(out);
    size_t n = json_array_size(gpus);
    if (n == 0) {
        add_check(d, "gpus", "warn", "run CPU ranks with 'gpusync run --cpu N'",
                  "no NVIDIA GPU found (nvidia-smi missing or no devices)");
    } else {
        json_t *g0 = json_array_get(gpus, 0);
        add_check(d, "gpus", "ok", NULL, "%zu x %s, %.0f MiB", n,
                  json_string_value(json_object_get(g0, "name")),
                  json_real_value(json_object_get(g0, "memory_total_mib")));
    }
    json_object_set_new(d->facts, "gpus", gpus);
}

static void check_toolchain(struct doctor *d, const char *out)
{
    const char *cuda = fact(out, "cuda");
    if (cuda)
        add_check(d, "cuda", "ok", NULL, "nvcc %s", cuda);
    else
        add_check(d, "cuda", "warn", "install the CUDA toolkit to build the trainer's GPU path",
                  "nvcc not found");
    char sys[512] = "", py[512] = "";
    if (fact(out, "nccl_system"))
        snprintf(sys, sizeof(sys), "%s", fact(out, "nccl_system"));
    if (fact(out, "nccl_python"))
        snprintf(py, sizeof(py), "%s", fact(out, "nccl_python"));
    if (*sys || *py)
        add_check(d, "nccl", "ok", NULL, "%s%s%s", *sys ? sys : "", *sys && *py ? "; " : "",
                  *py ? py : "");
    else
        add_check(d, "nccl", "warn", "multi-GPU training needs NCCL (libnccl2, or pip nvidia-nccl)",
                  "NCCL not found");
    json_object_set_new(d->facts, "nccl",
                        json_pack("{s:o,s:o}", "system", *sys ? json_string(sys) : json_null(),
                                  "python", *py ? json_string(py) : json_null()));
    const char *python = fact(out, "python");
    if (python)
        add_check(d, "python", "ok", NULL, "Python %s", python);
    else
        add_check(d, "python", "warn", NULL, "python3 not found");
    const char *torch = fact(out, "torch");
    add_check(d, "torch", torch ? "ok" : "warn", torch ? NULL : "only needed for PyTorch jobs",
              torch ? "torch %s" : "torch not importable%s", torch ? torch : "");
}

/* Less than this free in ~/.gpusync: the agent (a few MiB with its socket and saved check sets)
 * cannot be installed or kept. */
#define AGENT_ROOM_MIB 16

static void check_system(struct doctor *d, const char *out)
{
    set_fact_string(d->facts, out, "os");
    set_fact_string(d->facts, out, "arch");
    set_fact_string(d->facts, out, "kernel");
    set_fact_string(d->facts, out, "driver");
    set_fact_string(d->facts, out, "cuda");
    set_fact_string(d->facts, out, "python");
    set_fact_string(d->facts, out, "torch");
    const char *arch = fact(out, "arch");
    int x86 = arch && strcmp(arch, "x86_64") == 0;
    add_check(d, "system", x86 ? "ok" : "warn",
              x86 ? NULL : "the agent is built from source there (needs cc)", "%s %s",
              fact(out, "os") ? fact(out, "os") : "?", arch ? arch : "?");
    const char *kb = fact(out, "disk_free_kb");
    double gib = kb ? atof(kb) / (1024.0 * 1024.0) : -1;
    json_object_set_new(d->facts, "disk_free_bytes",
                        kb ? json_integer((json_int_t)(atof(kb) * 1024)) : json_null());
    const char *path_error = fact(out, "path_error");
    if (path_error) /* df measures the file system of a file there too: a push would fail */
        add_check(d, "disk", "fail",
                  "remove or rename what is there, or choose another folder (gpusync init --path)",
                  "cannot use the remote path: %s", path_error);
    else if (gib < 0)
        add_check(d, "disk", "warn", NULL, "cannot read free space at the remote path");
    else
        add_check(d, "disk", gib < 5 ? "warn" : "ok", gib < 5 ? "free space before training" : NULL,
                  "%.1f GiB free at the remote path", gib);
    /* the agent lives in ~/.gpusync, often on a small system disk apart from the data disk */
    const char *agent_kb = fact(out, "agent_free_kb");
    double agent_mib = agent_kb ? atof(agent_kb) / 1024.0 : -1;
    if (agent_mib >= 0 && agent_mib < AGENT_ROOM_MIB)
        add_check(d, "disk", "fail", "free space in the remote home (~/.gpusync)",
                  "%.1f MiB free in ~/.gpusync, where the agent is installed: pushes fail there",
                  agent_mib);
}

/* The first line of what the shell printed, for the report. */
static void first_noise_line(const char *noise, char *out, size_t size)
{
    while (*noise == '\n' || *noise == '\r')
        noise++;
    size_t n = strcspn(noise, "\r\n");
    snprintf(out, size, "%.*s%s", (int)(n < 100 ? n : 100), noise, noise[n] ? " ..." : "");
    for (char *p = out; *p; p++)
        if ((unsigned char)*p < 0x20)
            *p = ' ';
}

/* The server's login shell printing in a non-interactive session breaks SFTP, scp and rsync (the
 * agent reads past it): name the file that prints, and how to quiet it. */
static void check_shell_noise(struct gs_cli *cli, struct doctor *d)
{
    const char *noise = gs_ssh_shell_noise(cli->ssh);
    json_object_set_new(d->facts, "shell_noise", *noise ? json_string(noise) : json_null());
    json_object_set_new(d->facts, "shell_noise_files", json_null());
    if (!*noise) {
        add_check(d, "shell", "ok", NULL, "prints nothing before commands");
        return;
    }
    char first[128];
    first_noise_line(noise, first, sizeof(first));
    struct gs_buf out = GS_BUF_INIT, files = GS_BUF_INIT;
    struct gs_error ignored = {0};
    gs_exec_capture(cli->ssh, noisy_files_script, &out, NULL, &ignored);
    for (const char *p = out.data ? strstr(out.data, "noisy=") : NULL; p;
         p = strstr(p + 1, "\nnoisy=")) {
        p += *p == '\n' ? 7 : 6;
        gs_buf_addf(&files, "%s%.*s", files.len ? ", " : "", (int)strcspn(p, "\n"), p);
    }
    json_object_set_new(d->facts, "shell_noise_files", json_string(files.len ? files.data : ""));
    int sftp = cli->cfg.transport == GS_TRANSPORT_SFTP;
    add_check(
        d, "shell", sftp ? "fail" : "warn",
        "wrap what prints in `if [[ $- == *i* ]]; then ... fi` so only interactive shells run "
        "it; SFTP, scp and rsync cannot work until then (gpusync's agent reads past it)",
        "%s prints \"%s\" in non-interactive shells",
        files.len ? files.data : "a startup file of the login shell", first);
    gs_buf_release(&out);
    gs_buf_release(&files);
}

/* A startup file that reads standard input (a `read`, a `cat`) takes the start of what gpusync
 * sends a command: the agent's protocol, so push and watch wait until they give up, or exec's
 * input. Doctor's other probes end their input at once and cannot see it. This one runs `true`
 * with its input left open: a shell that reads none ends at once, one that reads waits for it.
 * `probe_ms` (how long a probe took with its input ended) tells a slow shell from a reading one. */
static void check_shell_input(struct gs_cli *cli, struct doctor *d, int64_t probe_ms)
{
    int hold[2];
    if (pipe(hold) != 0)
        return;
    struct gs_exec_io io = GS_EXEC_IO_INIT;
    io.stdin_fd = hold[0]; /* nothing is written, and it ends only when closed below */
    io.timeout_ms = (int)(probe_ms * 3 > 3000 ? probe_ms * 3 : 3000);
    struct gs_error err = {0};
    int rc = gs_exec_run(cli->ssh, "true", &io, &err);
    close(hold[0]);
    close(hold[1]);
    if (rc == 0)
        add_check(d, "stdin", "ok", NULL, "startup files read no input");
    else if (rc == GS_E_TIMEOUT)
        add_check(d, "stdin", "fail",
                  "move it into the part of the file that only interactive shells run (below "
                  "`case $- in *i*) ;; *) return;; esac`), or guard it with `[ -t 0 ] &&`",
                  "a startup file of the login shell reads standard input: it takes what gpusync "
                  "sends (push and watch fail after up to a minute; exec's input is lost)");
}

static int latency_ms(struct gs_cli *cli, double *ms)
{
    int64_t best = -1;
    for (int i = 0; i < 5; i++) {
        int64_t us;
        if (gs_ssh_ping(cli->ssh, &us, &cli->err) < 0)
            return -1;
        if (best < 0 || us < best)
            best = us;
    }
    *ms = (double)best / 1000.0;
    return 0;
}

static void check_remote(struct gs_cli *cli, struct doctor *d)
{
    add_check(d, "ssh", "ok", NULL, "%s, %s", gs_ssh_target(cli->ssh),
              gs_ssh_auth_method(cli->ssh));
    json_object_set_new(d->facts, "auth", json_string(gs_ssh_auth_method(cli->ssh)));
    json_object_set_new(d->facts, "host_key", json_string(gs_ssh_fingerprint(cli->ssh)));
    double rtt;
    if (latency_ms(cli, &rtt) == 0) {
        add_check(d, "latency", rtt > 150 ? "warn" : "ok", rtt > 150 ? "expect slower saves" : NULL,
                  "%.2f ms round trip", rtt);
        json_object_set_new(d->facts, "rtt_ms", json_real(rtt));
    }
    struct gs_buf dir = GS_BUF_INIT, script = GS_BUF_INIT, out = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    gs_buf_addf(&script, probe_script, dir.data);
    int64_t start = gs_clock_mono_ms();
    int rc = gs_exec_capture(cli->ssh, script.data, &out, NULL, &cli->err);
    int64_t probe_ms = gs_clock_mono_ms() - start;
    struct gs_error path = {0};
    if (rc != 0)
        add_check(d, "probe", "fail", NULL, "server probe failed: %s", cli->err.msg);
    else if (gs_exec_path_broken(cli->ssh, out.data, &path) < 0)
        add_check(d, "system", "fail", NULL, "%s", path.msg); /* every other probe failed too */
    else {
        check_system(d, out.data ? out.data : "");
        check_gpus(d, out.data ? out.data : "");
        check_toolchain(d, out.data ? out.data : "");
        check_shell_noise(cli, d);
        check_shell_input(cli, d, probe_ms);
    }
    gs_buf_release(&dir);
    gs_buf_release(&script);
    gs_buf_release(&out);
}

/* The resident agent (README): whether sessions to this server skip its login shell. */
static void check_resident(struct gs_cli *cli, struct doctor *d)
{
    if (cli->cfg.no_resident) {
        add_check(d, "resident", "ok", NULL,
                  "off ([sync] resident = off): every session starts the agent through the "
                  "login shell");
        return;
    }
    struct gs_buf dir = GS_BUF_INIT;
    gs_cli_remote_dir(cli, &dir);
    char key[GS_RESIDENT_KEY];
    gs_resident_key(gs_ssh_target(cli->ssh), dir.data, key);
    gs_buf_release(&dir);
    struct gs_resident r;
    int known = gs_resident_recall(cli->root.data, key, &r);
    struct gs_error err = {0};
    if (known == 0 && gs_exec_socket_opens(cli->ssh, r.socket, &err) == 1) {
        add_check(d, "resident", "ok", NULL, "listening at %s: sessions skip the login shell",
                  r.socket);
    } else if (known == 0) {
        add_check(d, "resident", "ok", NULL,
                  "not listening at %s (%s): the next session starts the agent through the "
                  "login shell, and a new listener",
                  r.socket, err.msg);
    } else if (known == 1) {
        add_check(d, "resident", "warn",
                  "AllowStreamLocalForwarding yes in the server's sshd_config lets sessions skip "
                  "the login shell",
                  "the server refuses channels to the agent's socket: every session starts the "
                  "agent through the login shell");
    } else {
        add_check(d, "resident", "ok", NULL,
                  "none known yet: the next push leaves one, and later sessions skip the login "
                  "shell");
    }
}

static void check_local(struct gs_cli *cli, struct doctor *d)
{
    add_check(d, "config", "ok", NULL, "%s", cli->cfg.file);
    if (gs_proc_in_path("ssh"))
        add_check(d, "openssh", "ok", NULL, "ssh found: ~/.ssh/config aliases are resolved");
    else
        add_check(d, "openssh", "warn", "install openssh-client to use ~/.ssh/config aliases",
                  "ssh not found");
}

/* Multi-node runs ([remote] hosts): node 1 must reach MASTER_ADDR on node 0's ports. */
static void check_nodes(struct gs_cli *cli, struct doctor *d)
{
    char detail[512];
    int ok =
        gs_nodes_check_reach(cli, cli->cfg.hosts, cli->cfg.master_addr, detail, sizeof(detail));
    add_check(d, "nodes", ok ? "ok" : "fail",
              ok ? NULL
                 : "set [remote] master_addr to node 0's address on the network the nodes share "
                   "(e.g. its 10.x/192.168.x address), and let node 0 accept TCP from node 1",
              "%s", detail);
}

/* A Slurm remote ([remote] scheduler = slurm): the scheduler, the partition, the account. */
static void check_slurm(struct gs_cli *cli, struct doctor *d)
{
    static const char *status[] = {"ok", "warn", "fail"};
    char detail[512];
    const char *hint;
    int s = gs_slurm_doctor(cli, detail, sizeof(detail), &hint);
    add_check(d, "slurm", status[s], hint, "%s", detail);
}

static int report(struct gs_cli *cli, struct doctor *d)
{
    int failed = 0;
    json_t *checks = json_array();
    for (int i = 0; i < d->n; i++) {
        struct check *c = &d->checks[i];
        failed |= strcmp(c->status, "fail") == 0;
        json_array_append_new(checks, json_pack("{s:s,s:s,s:s,s:o}", "name", c->name, "status",
                                                c->status, "detail", c->detail, "hint",
                                                c->hint ? json_string(c->hint) : json_null()));
        if (!cli->json && c->hint)
            printf("%-5s %-8s %s  (hint: %s)\n", c->status, c->name, c->detail, c->hint);
        else if (!cli->json)
            printf("%-5s %-8s %s\n", c->status, c->name, c->detail);
    }
    if (cli->json)
        gs_cli_json_print(json_pack("{s:i,s:b,s:o,s:O}", "v", 1, "ok", !failed, "checks", checks,
                                    "facts", d->facts));
    else
        json_decref(checks);
    return failed ? GS_EXIT_ERR : GS_EXIT_OK;
}

static int doctor_exec(struct gs_cli *cli)
{
    struct doctor d = {.facts = json_object()};
    check_local(cli, &d);
    /* Not GS_CMD_NEED_CONNECTION: connecting is one of the checks, and its failure is reported
     * with the others. */
    if (gs_cli_connect(cli) == 0) {
        check_remote(cli, &d);
        check_resident(cli, &d);
    } else
        add_check(&d, "ssh", "fail", NULL, "%s", cli->err.msg);
    if (cli->cfg.hosts)
        check_nodes(cli, &d);
    if (cli->cfg.slurm.enabled && cli->ssh)
        check_slurm(cli, &d);
    int rc = report(cli, &d);
    json_decref(d.facts);
    return rc;
}

const struct gs_cmd gs_cmd_doctor = {
    .name = "doctor",
    .usage = "doctor [--json]",
    .summary = "Check the local setup and the server: SSH, latency, disk, GPUs, CUDA, NCCL, Python",
    .help = "  With [remote] hosts (multi-node runs), also checks that node 1 reaches MASTER_ADDR\n"
            "  ([remote] master_addr, or as 'run' detects it) on a free port of node 0. With\n"
            "  [remote] scheduler = slurm, checks on the login node that sinfo answers, that\n"
            "  [remote] partition is up and account is yours, and says how many CPUs and GPUs\n"
            "  are idle. The 'resident' check says whether sessions reach the agent's listener on\n"
            "  the server, skipping its login shell ([sync] resident).\n"
            "  Exit status 1 if a check failed (warnings do not fail).\n",
    .flags = GS_CMD_NEED_PROJECT,
    .exec = doctor_exec,
};
