#!/usr/bin/env python3
"""test_tools.py: checks gpusync.xml (the External Tools) and the startup run configuration, then
runs every tool's command line as a JetBrains IDE would expand it ($ProjectFileDir$ -> the project,
$Prompt$ -> what a user types, parameters split like IntelliJ's ParametersList.parse) against the
sandbox server that test.sh started. Environment: GPUSYNC_BIN, GS_PROJECT, GS_REMOTE;
GS_JETBRAINS_SKIP_RUN=1 leaves out the tools that need the server-side launcher (Run Job, Logs,
Stop Run). Exit status: 0 when every check passed, else 1."""
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.environ["GPUSYNC_BIN"]
PROJECT = os.environ["GS_PROJECT"]
REMOTE = os.environ["GS_REMOTE"]
SKIP_RUN = os.environ.get("GS_JETBRAINS_SKIP_RUN") == "1"
# The macros the tools may use, and what the IDE puts in their place here.
KNOWN_MACROS = {"ProjectFileDir", "Prompt"}
failures = 0


def check(cond, what):
    global failures
    print(("ok     " if cond else "FAILED ") + what, flush=True)
    if not cond:
        failures += 1
    return cond


def ide_split(params):
    """Splits PARAMETERS as IntelliJ does: on blanks; double quotes group and are dropped; \\"
    is a literal quote; single quotes are ordinary characters."""
    words, cur, quoted, have, i = [], [], False, False, 0
    while i < len(params):
        c = params[i]
        if c == "\\" and i + 1 < len(params) and params[i + 1] == '"':
            cur.append('"')
            have, i = True, i + 2
            continue
        if c == '"':
            quoted, have = not quoted, True
        elif c.isspace() and not quoted:
            if have:
                words.append("".join(cur))
            cur, have = [], False
        else:
            cur.append(c)
            have = True
        i += 1
    if have:
        words.append("".join(cur))
    return words


def expand(text, prompt=None):
    """Replaces the IDE macros in text; $Prompt$ needs a prompt answer."""
    def one(m):
        name = m.group(1)
        if name == "ProjectFileDir":
            return PROJECT
        if name == "Prompt":
            assert prompt is not None, "this tool prompts: give an answer"
            return prompt
        raise AssertionError("unknown macro $%s$" % name)
    return re.sub(r"\$([A-Za-z]+)\$", one, text)


def load_tools():
    root = ET.parse(os.path.join(HERE, "gpusync.xml")).getroot()
    check(root.tag == "toolSet" and root.get("name") == "gpusync", 'the root is <toolSet name="gpusync">')
    tools = {}
    for tool in root.findall("tool"):
        opts = {o.get("name"): o.get("value") for o in tool.findall("exec/option")}
        name = tool.get("name")
        check({"COMMAND", "PARAMETERS", "WORKING_DIRECTORY"} <= set(opts), name + ": has COMMAND, PARAMETERS, WORKING_DIRECTORY")
        check(opts.get("COMMAND") == "gpusync", name + ": runs gpusync")
        check(opts.get("WORKING_DIRECTORY") == "$ProjectFileDir$", name + ": runs in $ProjectFileDir$")
        used = set(re.findall(r"\$([A-Za-z]+)\$", " ".join(opts.values())))
        check(used <= KNOWN_MACROS, name + ": uses only known macros " + str(sorted(used)))
        check(tool.get("useConsole") == "true", name + ": shows its output in the console")
        tools[name] = opts
    for want in ("Push", "Run Job", "Logs", "Stop Run", "Doctor"):
        check(want in tools, "the tool set has " + want)
    return tools


def check_startup_config():
    path = os.path.join(HERE, "run", "gpusync watch.run.xml")
    conf = ET.parse(path).getroot().find("configuration")
    opts = {o.get("name"): o.get("value") for o in conf.findall("option")}
    check(conf.get("type") == "ShConfigurationType", "the startup task is a Shell Script run configuration")
    check("gpusync watch -d" in opts.get("SCRIPT_TEXT", ""), "the startup task runs gpusync watch -d")
    check(opts.get("SCRIPT_WORKING_DIRECTORY") == "$PROJECT_DIR$", "the startup task runs in $PROJECT_DIR$")
    return opts


def run_tool(tools, name, prompt=None, timeout=120):
    """Runs a tool as the IDE would; returns the CompletedProcess."""
    opts = tools[name]
    argv = [BIN] + ide_split(expand(opts["PARAMETERS"], prompt))
    cwd = expand(opts["WORKING_DIRECTORY"])
    print("  $ (cd %s && %s)" % (cwd, " ".join(argv)), flush=True)
    p = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    for line in (p.stdout + p.stderr).splitlines()[-8:]:
        print("    | " + line)
    return p


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def cli_json(*args):
    # --json right after the command name: after a "--" it would belong to the job.
    p = subprocess.run([BIN, args[0], "--json", *args[1:]], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    lines = [l for l in p.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def test_sync_tools(tools):
    with open(os.path.join(PROJECT, "train.py"), "w") as f:
        f.write("print('from pycharm')\n")
    p = run_tool(tools, "Push")
    check(p.returncode == 0, "Push exits 0")
    check(read(os.path.join(REMOTE, "train.py")) == "print('from pycharm')\n", "Push puts train.py on the server")
    p = run_tool(tools, "Doctor")
    lines = p.stdout.splitlines()
    failed = any(l.startswith("fail") for l in lines)
    check(any(l.startswith("ok") and "latency" in l for l in lines), "Doctor lists its checks (latency ok)")
    check(p.returncode == (1 if failed else 0), "Doctor exits 0 unless a check failed")
    p = run_tool(tools, "Start Watching")
    check(p.returncode == 0, "Start Watching starts the daemon")
    check(cli_json("status").get("daemon") is True, "status --json then reports the daemon")
    p = run_tool(tools, "Status")
    check(p.returncode == 0, "Status exits 0")
    p = run_tool(tools, "Stop Watching")
    check(p.returncode == 0 and cli_json("status").get("daemon") is False, "Stop Watching stops it")


def test_startup_task(opts):
    """Runs the startup task's script the way the Shell Script configuration does (bash -c in
    $PROJECT_DIR$), with `gpusync` resolved to GPUSYNC_BIN through PATH."""
    bindir = os.path.join(os.environ.get("GS_WORK", PROJECT), "bin")
    os.makedirs(bindir, exist_ok=True)
    link = os.path.join(bindir, "gpusync")
    if not os.path.exists(link):
        os.symlink(BIN, link)
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ["PATH"])
    for attempt in ("first", "second"):
        p = subprocess.run(["/bin/bash", "-c", opts["SCRIPT_TEXT"]], cwd=PROJECT, env=env,
                           capture_output=True, text=True, timeout=60)
        check(p.returncode == 0, "the startup task succeeds when the project opens (%s time)" % attempt)
    check(cli_json("status").get("daemon") is True, "after the startup task the daemon runs")
    subprocess.run([BIN, "watch", "--stop"], cwd=PROJECT, capture_output=True, timeout=60)


def test_run_tools(tools):
    p = run_tool(tools, "Run Job", prompt='--cpu 2 -- sh -c "echo hello from rank $RANK"')
    out = p.stdout + p.stderr
    check(p.returncode == 0, "Run Job (--cpu 2) exits with the job's status 0")
    check("hello from rank 0" in out and "hello from rank 1" in out, "Run Job shows both ranks' output")
    p = run_tool(tools, "Logs")
    check(p.returncode == 0 and "hello from rank 1" in p.stdout + p.stderr, "Logs shows the newest run's output")
    started = cli_json("run", "--detach", "--cpu", "1", "--", "sleep", "600")
    check(started.get("ok") is True, "a long run starts (detached)")
    p = run_tool(tools, "Stop Run", prompt=started.get("id", "?"))
    check(p.returncode == 0, "Stop Run stops it")
    runs = {r.get("id"): r for r in cli_json("ps").get("runs", [])}
    check(runs.get(started.get("id"), {}).get("state") not in (None, "running"),
          "ps no longer shows it running")


def main():
    tools = load_tools()
    opts = check_startup_config()
    check(ide_split('run --cpu 2 -- sh -c "echo a b"') == ["run", "--cpu", "2", "--", "sh", "-c", "echo a b"],
          "parameters split as the IDE splits them")
    test_sync_tools(tools)
    test_startup_task(opts)
    if SKIP_RUN:
        print("skipped: Run Job, Logs, Stop Run (GS_JETBRAINS_SKIP_RUN=1)")
    else:
        test_run_tools(tools)
    print("%d failure(s)" % failures)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
