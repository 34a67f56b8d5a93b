# The real `openstack` client (python-openstackclient's own shell), kept loaded: the tests send
# one command per line on stdin, as JSON {"args": [...], "env": {"OS_...": ...}, "timeout": S},
# and read one JSON line back: {"rc": exit code, "out": stdout, "err": stderr}.
#
# Each command runs in a child forked from this loaded process, with only the given OS_*
# variables: it authenticates and behaves as `openstack ARGS` would, sharing no state with the
# commands before it (the client keeps some between runs in one process: a project leaked from
# one user's command into the next), and what it saves is the interpreter's start and the
# client's imports, about 2.5 CPU-seconds per command. A command still running after `timeout`
# seconds is killed and answered with rc 124 (as coreutils' `timeout`).
import contextlib
import io
import json
import os
import select
import signal
import sys
import time

from openstackclient import shell


def command(req):
    """In the forked child: the command's result."""
    for key in [k for k in os.environ if k.startswith("OS_")]:
        del os.environ[key]
    os.environ.update(req["env"])
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = shell.OpenStackShell().run(req["args"])
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except Exception as e:  # noqa: BLE001 - reported to the test as the command's failure
        rc = 1
        err.write(f"{type(e).__name__}: {e}\n")
    return {"rc": rc, "out": out.getvalue(), "err": err.getvalue()}


def read_until(fd, deadline):
    """All the child writes to `fd`, or None when `deadline` passes first."""
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 65536)
        if not chunk:
            return data
        data += chunk


def run(req):
    timeout = int(req.get("timeout", 150))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = command(req)
        except BaseException as e:  # noqa: BLE001
            res = {"rc": 1, "out": "", "err": f"{type(e).__name__}: {e}\n"}
        with os.fdopen(w, "w") as f:
            json.dump(res, f)
        os._exit(0)
    os.close(w)
    data = read_until(r, time.monotonic() + timeout)
    os.close(r)
    if data is None:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return {"rc": 124, "out": "", "err": f"timed out after {timeout} s\n"}
    os.waitpid(pid, 0)
    try:
        return json.loads(data)
    except ValueError:
        return {"rc": 1, "out": "", "err": f"the command's process died: {data[-500:]!r}\n"}


def main():
    # Load what a command uses once, here, so that each child starts with it: the command
    # table (every plugin's entry points) and the modules of a few commands.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            shell.OpenStackShell().run(["help"])
        except SystemExit:
            pass
    reply = sys.stdout
    for line in sys.stdin:
        if line.strip():
            reply.write(json.dumps(run(json.loads(line))) + "\n")
            reply.flush()


if __name__ == "__main__":
    main()
