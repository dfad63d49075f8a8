#!/usr/bin/env python3
"""shardtrain across hosts made from network namespaces (scripts/cluster; standard library only).

    check_cluster.py TRAINER CHECK

Needs root and network namespaces; without them it exits 77, which CTest
reports as Skipped, with the reason. CHECK is one of:
  hosts     2 hosts x 2 ranks through `scripts/cluster mpirun`: every rank runs on
            its own host (hostname, Open MPI's local rank and size per host), over
            TCP between the hosts.
  storage   checkpoint.dir on each host's own disk (/local) is detected as
            node-local and refused before step 1 with what to do; a directory both
            hosts share is detected as shared and saves; checkpoint.shared states it.
  cleanup   `scripts/cluster run` removes every namespace and /local after its
            command ends, and also after it is SIGKILLed (its reaper does).
Each check prints what it observed; a failure exits 1.
"""
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_training import ROOT, expect, fail, sets  # noqa: E402

CLUSTER = os.path.join(ROOT, "scripts", "cluster")
TINY = "configs/llama-tiny.yaml"
SKIP = 77


def cluster(*args, name, **kw):
    env = dict(os.environ, ST_CLUSTER=name)
    return subprocess.run([CLUSTER, *args], cwd=ROOT, env=env, capture_output=True, text=True, **kw)


def netns_names():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def inside(name, check, trainer, tmp):
    """Runs `check` while cluster `name` (2 hosts) is up, via `scripts/cluster run`, which removes it after."""
    cmd = [CLUSTER, "run", "2", "--", sys.executable, os.path.abspath(__file__), trainer, check + "-inside", tmp]
    proc = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, ST_CLUSTER=name), capture_output=True, text=True)
    sys.stdout.write(proc.stdout)
    if proc.returncode == SKIP:
        print(f"SKIPPED: {proc.stderr.strip()}")
        sys.exit(SKIP)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-4000:])
        fail(f"{check} failed on the cluster (exit {proc.returncode})")
    left = {n for n in netns_names() if n.startswith(name + "-")}
    if left:
        fail(f"namespaces left after the cluster's run: {sorted(left)}")


def check_hosts_inside(name, trainer, tmp):
    proc = cluster("mpirun", "--host", "h1:2,h2:2", "-np", "4", "sh", "-c",
                   "echo rank $OMPI_COMM_WORLD_RANK on $(hostname) local $OMPI_COMM_WORLD_LOCAL_RANK"
                   " of $OMPI_COMM_WORLD_LOCAL_SIZE", name=name)
    lines = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("rank "))
    want = [f"rank {r} on h{r // 2 + 1} local {r % 2} of 2" for r in range(4)]
    print(f"hosts: {lines}")
    if proc.returncode != 0 or lines != want:
        sys.stderr.write(proc.stderr[-2000:])
        fail(f"expected {want}")
    # Collectives between the hosts, over TCP: the trainer's self-check at 4 ranks.
    proc = cluster("mpirun", "--host", "h1:2,h2:2", "-np", "4", trainer, "--config", TINY, "--steps", "3", name=name)
    expect(proc, 0, "4 rank(s) (mpi backend)", "step 3/3", what="llama-tiny on 2 hosts x 2 ranks")
    print("hosts: llama-tiny trained 3 steps on 2 hosts x 2 ranks")


def check_storage_inside(name, trainer, tmp):
    job = ["mpirun", "--host", "h1:2,h2:2", "-np", "4", trainer, "--config", TINY, "--steps", "4"]
    proc = cluster(*job, *sets(checkpoint__dir="/local/ckpt", checkpoint__interval=2), name=name)
    expect(proc, 1, "checkpoint.dir /local/ckpt: node-local, each of the 2 hosts h1, h2 has its own (detected)",
           "checkpoint.dir '/local/ckpt' is on each host's own disk (2 hosts)",
           "use a directory every host shares", what="node-local checkpoint.dir")
    if "step 1/4" in proc.stdout + proc.stderr:
        fail("the run with a node-local checkpoint.dir trained before refusing it")
    print("storage: /local/ckpt detected as node-local, refused before step 1 (exit 1)")
    shared = os.path.join(tmp, "shared-ckpt")
    proc = cluster(*job, *sets(checkpoint__dir=shared, checkpoint__interval=2), name=name)
    expect(proc, 0, f"checkpoint.dir {shared}: one file system shared by the 2 hosts h1, h2 (detected)",
           f"saved checkpoint {shared}/step-000004", what="shared checkpoint.dir")
    steps = sorted(n for n in os.listdir(shared) if n.startswith("step-"))
    leftovers = [n for n in os.listdir(shared) if n.startswith(".host-probe")]
    if steps != ["step-000002", "step-000004"] or leftovers:
        fail(f"shared checkpoint.dir holds {sorted(os.listdir(shared))}")
    print(f"storage: {shared} detected as shared; saved {steps}; no probe files left")
    proc = cluster(*job, "--overwrite", *sets(checkpoint__dir=shared, checkpoint__shared="true"), name=name)
    expect(proc, 0, f"checkpoint.dir {shared}: one file system shared by the 2 hosts h1, h2 (checkpoint.shared)",
           what="checkpoint.shared: true")
    print("storage: checkpoint.shared: true is taken as stated")


def check_cleanup(name, trainer, tmp):
    proc = subprocess.run([CLUSTER, "run", "1", "--", "true"], env=dict(os.environ, ST_CLUSTER=name),
                          capture_output=True, text=True)
    if proc.returncode == SKIP:
        print(f"SKIPPED: {proc.stderr.strip()}")
        sys.exit(SKIP)
    left = {n for n in netns_names() if n.startswith(name + "-")}
    if proc.returncode != 0 or left:
        fail(f"cluster run 1 -- true: exit {proc.returncode}, namespaces left {sorted(left)}: {proc.stderr}")
    print("cleanup: after its command ended, nothing of the cluster is left")
    # The command ends by itself once `cluster run` (its parent) is gone.
    waiter = ["sh", "-c", "while kill -0 $PPID 2>/dev/null; do sleep 0.2; done"]
    job = subprocess.Popen([CLUSTER, "run", "1", "--", *waiter], env=dict(os.environ, ST_CLUSTER=name),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    # Killed once the cluster is up (it says so on stdout), not after a delay.
    line = job.stdout.readline()
    if f"cluster '{name}': 1 host(s)" not in line:
        job.kill()
        fail(f"the cluster did not come up: {line!r} {job.stderr.read()[-1000:]}")
    job.send_signal(signal.SIGKILL)
    job.wait()
    deadline = time.time() + 120  # a hang guard: the reaper looks once a second
    while time.time() < deadline and any(n.startswith(name + "-") for n in netns_names()):
        time.sleep(0.2)
    left = {n for n in netns_names() if n.startswith(name + "-")}
    if left or os.path.exists(f"/run/shardtrain-cluster/{name}"):
        fail(f"after SIGKILL of `cluster run`, left: {sorted(left)}")
    print("cleanup: after SIGKILL of `scripts/cluster run`, its reaper removed the namespaces and state")


def main():
    trainer, check = os.path.abspath(sys.argv[1]), sys.argv[2]
    name = "c" + check[:2] + str(os.getpid() % 10000)
    if check.endswith("-inside"):
        name = os.environ["ST_CLUSTER"]
        {"hosts-inside": check_hosts_inside, "storage-inside": check_storage_inside}[check](name, trainer, sys.argv[3])
        return
    with tempfile.TemporaryDirectory() as tmp:
        if check == "cleanup":
            check_cleanup(name, trainer, tmp)
        else:
            inside(name, check, trainer, tmp)


if __name__ == "__main__":
    main()
