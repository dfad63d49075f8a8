#!/usr/bin/env python3
"""shardtrain across hosts made from network namespaces (scripts/cluster; standard library only).

    check_cluster.py TRAINER CHECK

Needs root and network namespaces; without them it exits 77, which CTest
reports as Skipped, with the reason. CHECK is one of:
  hosts     2 hosts x 2 ranks through `scripts/cluster mpirun`: every rank runs on
            its own host (hostname, Open MPI's local rank and size per host), over
            TCP between the hosts; --self-check times a pair within and across hosts.
  storage   checkpoint.dir on each host's own disk (/local) is detected as node-local
            and saved to, each data file on one host and identical to a shared save;
            one host's part verifies as partial; the parts copied together resume; --resume ROOT reads the
            hosts' parts together; a host's step directory read as whole is refused.
  restart   node-local --resume auto: 1 -> 2 -> 4 hosts for both layouts equal the uninterrupted run; 4 -> 1
            host without the other hosts' files is refused naming them.
  kill      SIGKILL of one host's ranks after every host published a step but before any `latest` moved:
            each host's `latest` stays on the previous step and the run resumes exactly.
  hybrid    HYBRID_SHARD on 2 hosts x 2 ranks (by slot and --map-by node) equals FULL_SHARD on one host;
            uneven hosts are refused in one line; --profile counts the bytes each rank sends across hosts
            per step, exactly as derived from the unit table for HYBRID_SHARD, more for FULL_SHARD, and
            the test prints them beside the links' own byte counters.
  failures  through scripts/launch: SIGTERM saves on both hosts, exits 0 and resumes; SIGKILL of every rank on
            h2, and h2's link set down, end the job non-zero with one launch line naming host h2.
  cleanup   `scripts/cluster run` removes every namespace and /local after its
            command ends, and also after it is SIGKILLed (its reaper does).
Each check prints what it observed; a failure exits 1.
"""
import json
import os
import shutil
import signal
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import ROOT, SKIP, expect, fail, loss_by_step, mpirun, run, sets  # noqa: E402

CLUSTER = os.path.join(ROOT, "scripts", "cluster")
CKPT = None  # the ckpt tool, beside the trainer
TINY = "configs/llama-tiny.yaml"


def cluster(*args, name, **kw):
    env = dict(os.environ, ST_CLUSTER=name)
    return subprocess.run([CLUSTER, *args], cwd=ROOT, env=env, capture_output=True, text=True, **kw)


def netns_names():
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def inside(name, check, trainer, tmp, hosts=2):
    """Runs `check` while cluster `name` is up, via `scripts/cluster run`, which removes it after."""
    cmd = [CLUSTER, "run", str(hosts), "--", sys.executable, os.path.abspath(__file__), trainer, check + "-inside", tmp]
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
    proc = cluster("mpirun", "--host", "h1:2,h2:2", "-np", "4", trainer, "--config", TINY, "--self-check", name=name)
    out = expect(proc, 0, "collective self-check passed", "ranks 0 <-> 1 (same host h1)",
                 "ranks 0 <-> 2 (hosts h1 and h2)", what="--self-check across hosts")
    print("hosts: --self-check: " + "; ".join(" ".join(ln.split("INFO")[1].split()) for ln in out.splitlines()
                                             if "<->" in ln))


def cluster_job(trainer, steps, *extra):
    return ["mpirun", "--host", "h1:2,h2:2", "-np", "4", trainer, "--config", TINY, "--steps", str(steps), *extra]


def check_storage_inside(name, trainer, tmp):
    """Detection, and a save to node-local disks: each host holds the files its ranks' hosts wrote."""
    local_sets = sets(checkpoint__dir="/local/ckpt", checkpoint__interval=5)
    proc = cluster(*cluster_job(trainer, 12, "--stop-after", "10", *local_sets), name=name)
    expect(proc, 0, "checkpoint.dir /local/ckpt: node-local, each of the 2 hosts h1, h2 has its own (detected)",
           "saved checkpoint /local/ckpt/step-000010", what="node-local checkpoint.dir")
    print("storage: /local/ckpt detected as node-local; steps 5 and 10 saved")
    # The same run on a directory both hosts share, uninterrupted to step 12: the reference.
    shared = os.path.join(tmp, "shared-ckpt")
    full = os.path.join(tmp, "full.jsonl")
    proc = cluster(*cluster_job(trainer, 12, *sets(checkpoint__dir=shared, checkpoint__interval=5,
                                                   logging__metrics_file=full)), name=name)
    expect(proc, 0, f"checkpoint.dir {shared}: one file system shared by the 2 hosts h1, h2 (detected)",
           f"saved checkpoint {shared}/step-000010", what="shared checkpoint.dir")
    leftovers = [n for n in os.listdir(shared) if n.startswith(".host-probe")]
    if leftovers:
        fail(f"probe files left in {shared}: {leftovers}")
    print(f"storage: {shared} detected as shared; no probe files left")
    # Every data file is on exactly one host, byte for byte what the shared save wrote.
    disks = {h: cluster("disk", h, name=name).stdout.strip() for h in ("h1", "h2")}
    whole = os.path.join(shared, "step-000010")
    data = sorted(n for n in os.listdir(whole) if n.endswith(".safetensors"))
    where = {}
    for h, disk in disks.items():
        part = os.path.join(disk, "ckpt", "step-000010")
        for n in os.listdir(part):
            if n.endswith(".safetensors"):
                where.setdefault(n, []).append(h)
                if open(os.path.join(part, n), "rb").read() != open(os.path.join(whole, n), "rb").read():
                    fail(f"{h}'s {n} differs from the shared save's")
        for n in ("model.safetensors.index.json", "trainer_state.json", "config.json", "COMPLETE"):
            if not os.path.exists(os.path.join(part, n)):
                fail(f"{h}'s step-000010 lacks {n}")
    if sorted(where) != data or any(len(v) != 1 for v in where.values()):
        fail(f"data files by host: {where}; the shared save has {data}")
    per_host = {h: sorted(n for n, hs in where.items() if h in hs) for h in disks}
    print(f"storage: {len(data)} data files, each on one host ({', '.join(f'{h}: {len(v)}' for h, v in per_host.items())}),"
          f" identical to the shared save's")
    check_copied_restart(trainer, tmp, disks, loss_by_step(full))
    check_resume_path(name, trainer, tmp, loss_by_step(full))


def check_resume_path(name, trainer, tmp, full):
    """--resume PATH on node-local disks: a root is read as --resume auto reads checkpoint.dir (the hosts' parts
    together); a step directory read as whole (no node-local checkpoint.dir) is refused in one line."""
    metrics = os.path.join(tmp, "resumed-root.jsonl")
    proc = cluster(*cluster_job(trainer, 12, "--resume", "/local/ckpt",
                                *sets(checkpoint__dir="/local/ckpt-b", logging__metrics_file=metrics)), name=name)
    expect(proc, 0, "resumed from /local/ckpt/step-000010", what="--resume ROOT on node-local disks")
    got = loss_by_step(metrics)
    print(f"storage: --resume /local/ckpt (node-local root): steps 11, 12 loss {got.get(11)!r}, {got.get(12)!r}; "
          f"uninterrupted {full[11]!r}, {full[12]!r}")
    if got != {11: full[11], 12: full[12]}:
        fail("the run resumed from the root differs from the uninterrupted one")
    proc = cluster(*cluster_job(trainer, 12, "--resume", "/local/ckpt/step-000010"), name=name)
    expect(proc, 1, "--resume /local/ckpt/step-000010: /local/ckpt/step-000010 (as rank 0 on host h1 sees it) holds "
                    "one host's part", "put checkpoint.dir on the hosts' own disks too", what="one host's part as whole")
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("trainer: error")]
    if len(errors) != 1:
        fail(f"expected one error line, got {errors}")
    print("storage: --resume STEP without a node-local checkpoint.dir: exit 1, one line: " + errors[0][:120] + " ...")


def check_copied_restart(trainer, tmp, disks, full):
    """One host's part is partial; the hosts' parts copied into one directory are the whole checkpoint, which
    resumes on one machine at the same world size (bit-exact) and at another (1e-5)."""
    part = os.path.join(disks["h2"], "ckpt", "step-000010")
    proc = subprocess.run([CKPT, "verify", part], capture_output=True, text=True)
    expect(proc, 1, "partial: this directory holds one host's part of a checkpoint saved to node-local disks; "
                    "6 file(s) are on other hosts", what="ckpt verify of one host's part")
    print("restart: ckpt verify of h2's part alone: exit 1, partial, names the 6 files on h1")
    roots = [os.path.join(disks[h], "ckpt") for h in ("h1", "h2")]
    expect(subprocess.run([CKPT, "verify", *roots], capture_output=True, text=True), 0,
           "verified 84 tensors (84 chunks) in 12 files", ": OK", what="ckpt verify of both hosts' roots together")
    print("restart: ckpt verify H1_ROOT H2_ROOT checks the two parts as one checkpoint: OK")
    merged = os.path.join(tmp, "merged", "step-000010")
    shutil.copytree(os.path.join(disks["h1"], "ckpt", "step-000010"), merged)
    for n in os.listdir(part):
        if n.endswith(".safetensors"):
            shutil.copy(os.path.join(part, n), merged)
    expect(subprocess.run([CKPT, "verify", merged], capture_output=True, text=True), 0, ": OK",
           what="ckpt verify of the hosts' parts copied together")
    for np_ in (4, 2):
        metrics = os.path.join(tmp, f"resumed-{np_}.jsonl")
        proc = run(mpirun(np_) + [trainer, "--config", TINY, "--steps", "12", "--resume", merged] +
                   sets(logging__metrics_file=metrics))
        got = loss_by_step(metrics)
        worst = max(abs(got[k] - full[k]) / abs(full[k]) for k in (11, 12))
        print(f"restart: 2 hosts x 2 ranks -> 1 host x {np_} ranks from the copied parts: steps 11, 12 loss "
              f"{got[11]!r}, {got[12]!r}; uninterrupted {full[11]!r}, {full[12]!r} (largest relative difference "
              f"{worst:.1e})")
        if sorted(got) != [11, 12] or worst > (0 if np_ == 4 else 1e-5):
            fail("the resumed run differs from the uninterrupted one")


def check_restart_inside(name, trainer, tmp):
    """--resume auto on node-local disks, on more and on fewer hosts, for both layouts (unified async)."""
    for layout, extra in (("unified", ["checkpoint.async=true"]), ("sharded", [])):
        restart_cases(name, trainer, tmp, layout, extra)


def restart_cases(name, trainer, tmp, layout, extra):
    ckpt = f"/local/ckpt-{layout}"
    opts = ["--set", f"checkpoint.dir={ckpt}", "--set", "checkpoint.interval=5", "--set", f"checkpoint.format={layout}"]
    for kv in extra:
        opts += ["--set", kv]
    # The uninterrupted reference: one machine, 4 ranks, no checkpoints.
    ref = os.path.join(tmp, f"ref-{layout}.jsonl")
    run(mpirun(4) + [trainer, "--config", TINY, "--steps", "16"] + sets(logging__metrics_file=ref))
    full = loss_by_step(ref)
    cases = [  # (hosts, ranks per host, stop after, what, bit-exact)
        ("h1:2", 2, 5, "1 host x 2 ranks, fresh", False),
        ("h1:2,h2:2", 4, 10, "1 -> 2 hosts (h2's disk empty), 2 -> 4 ranks", False),
        ("h1:1,h2:1,h3:1,h4:1", 4, 15, "2 -> 4 hosts (h3, h4 empty), 4 ranks", True),
    ]
    for hosts, np_, stop, what, exact in cases:
        metrics = os.path.join(tmp, f"{layout}-{stop}.jsonl")
        job = ["mpirun", "--host", hosts, "-np", str(np_), trainer, "--config", TINY, "--steps", "16",
               "--stop-after", str(stop), *opts, "--set", f"logging.metrics_file={metrics}"]
        proc = cluster(*job, name=name)
        expect(proc, 0, f"saved checkpoint {ckpt}/step-{stop:06d}", what=f"{layout}: {what}")
        got = loss_by_step(metrics)
        worst = max(abs(got[k] - full[k]) / abs(full[k]) for k in got)
        print(f"restart {layout}: {what}: steps {min(got)}-{max(got)}, last loss {got[stop]!r} vs uninterrupted "
              f"{full[stop]!r}; largest relative difference {worst:.1e}")
        if worst > (0 if exact else 1e-5) or (min(got) != stop - 4 and stop != 5):
            fail(f"{layout}: {what}: the losses differ from the uninterrupted run's: {got} vs {full}")
    # 4 -> 1 host without copying: h3 alone holds a quarter of step 15; an error before step 1, naming the files.
    proc = cluster("mpirun", "--host", "h3:2", "-np", "2", trainer, "--config", TINY, "--steps", "16", *opts,
                   name=name)
    expect(proc, 1, "step-000015: holds one host's part:", "file(s) are on other hosts",
           "run on those hosts too, or copy the files here from their step-000015", what=f"{layout}: 4 -> 1 host")
    if "step 16/16" in proc.stdout + proc.stderr:
        fail("the run without the other hosts' files trained")
    print(f"restart {layout}: 4 -> 1 host (h3) without the others' files: exit 1 before step 1, naming them")


def check_kill_inside(name, trainer, tmp):
    """Every rank of one host SIGKILLed inside a save, after both hosts published step 10 but before any `latest`
    moved: every host's `latest` still names a step the hosts hold between them, and the run resumes."""
    opts = ["--config", TINY, "--steps", "14", "--set", "checkpoint.dir=/local/ckpt", "--set", "checkpoint.interval=5"]
    ref = os.path.join(tmp, "ref.jsonl")
    run(mpirun(4) + [trainer, "--config", TINY, "--steps", "14"] + sets(logging__metrics_file=ref))
    full = loss_by_step(ref)
    env = dict(os.environ, ST_CLUSTER=name)
    job = subprocess.Popen([CLUSTER, "mpirun", "--host", "h1:2,h2:2", "-np", "4", "-x", "ST_TEST_PAUSE_AT=renamed@10",
                            trainer, *opts], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    paused = 0
    for line in job.stderr:  # EOF if the job ends first; the test's timeout guards a hang
        if "test hook: paused at renamed of step 10" in line:
            paused += 1
            if paused == 2:  # both hosts' root owners
                break
    if paused < 2:
        job.wait()
        fail(f"the job ended (exit {job.returncode}) before both hosts published step 10")
    # Every process inside h2 (its Open MPI daemon and ranks), but not the process that holds the host itself.
    holder = open(f"/run/shardtrain-cluster/{name}/h2.pid").read().strip()
    victims = [p for p in subprocess.run(["ip", "netns", "pids", f"{name}-h2"], capture_output=True,
                                         text=True).stdout.split() if p != holder]
    for pid in victims:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except ProcessLookupError:
            pass
    job.communicate(timeout=300)
    latest = {h: open(os.path.join(cluster("disk", h, name=name).stdout.strip(), "ckpt", "latest")).read().strip()
              for h in ("h1", "h2")}
    print(f"kill: SIGKILL of h2's {len(victims)} processes while step 10 was published but no latest moved: "
          f"job exit {job.returncode}; latest {latest}")
    if job.returncode == 0 or set(latest.values()) != {"step-000005"}:
        fail("every host's latest should still name step-000005")
    metrics = os.path.join(tmp, "resumed.jsonl")
    proc = cluster("mpirun", "--host", "h1:2,h2:2", "-np", "4", trainer, *opts,
                   *sets(logging__metrics_file=metrics), name=name)
    expect(proc, 0, "resumed from /local/ckpt/step-000005", what="resume after the kill")
    got = loss_by_step(metrics)
    print(f"kill: resumed from step-000005 on both hosts; steps 6-14 equal the uninterrupted run: {got == {k: full[k] for k in got}}")
    if sorted(got) != list(range(6, 15)) or any(got[k] != full[k] for k in got):
        fail(f"the resumed run differs from the uninterrupted one: {got} vs {full}")


def check_hybrid_inside(name, trainer, tmp):
    """HYBRID_SHARD on 2 hosts x 2 ranks shards within each host (also when the launcher deals ranks out across
    the hosts, --map-by node) and trains exactly as FULL_SHARD on one host; uneven hosts are refused."""
    ref = os.path.join(tmp, "full_shard.jsonl")
    run(mpirun(4) + [trainer, "--config", TINY, "--steps", "8"] + sets(logging__metrics_file=ref))
    full = loss_by_step(ref)
    for mapping in ([], ["--map-by", "node"]):
        metrics = os.path.join(tmp, f"hybrid{len(mapping)}.jsonl")
        proc = cluster("mpirun", "--host", "h1:2,h2:2", "-np", "4", *mapping, trainer, "--config", TINY, "--steps", "8",
                       *sets(fsdp__sharding_strategy="HYBRID_SHARD", logging__metrics_file=metrics), name=name)
        expect(proc, 0, "HYBRID_SHARD (shard groups of 2)", "2 replica(s)", what=f"HYBRID_SHARD {mapping}")
        got = loss_by_step(metrics)
        worst = max(abs(got[k] - full[k]) / abs(full[k]) for k in full)
        print(f"hybrid: 2 hosts x 2 ranks{' ' + ' '.join(mapping) if mapping else ''}: 8 steps, largest relative "
              f"difference to FULL_SHARD on one host {worst:.1e}")
        if sorted(got) != sorted(full) or worst > 1e-6:
            fail(f"HYBRID_SHARD across hosts differs from FULL_SHARD: {got} vs {full}")
    proc = cluster("mpirun", "--host", "h1:3,h2:1", "-np", "4", trainer, "--config", TINY, "--steps", "2",
                   *sets(fsdp__sharding_strategy="HYBRID_SHARD"), name=name)
    expect(proc, 1, "so every host needs the same number of ranks; this job has 3 on h1, 1 on h2", what="uneven hosts")
    errors = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("trainer: error")]
    if len(errors) != 1:
        fail(f"uneven hosts should print one error line, got {errors}")
    print("hybrid: 3 ranks on h1 and 1 on h2: one error line, exit 1")
    check_bytes_across_hosts(name, trainer)


def wire_tx_bytes(name):
    """Bytes each host's link (eth0 in its namespace) has sent so far, by host."""
    out = {}
    for host in ("h1", "h2"):
        proc = subprocess.run(["ip", "-n", f"{name}-{host}", "-s", "-j", "link", "show", "eth0"], capture_output=True,
                              text=True, check=True)
        out[host] = json.loads(proc.stdout)[0]["stats64"]["tx"]["bytes"]
    return out


def fsdp_table(out):
    """(shard group size, accumulation steps, [padded numel per unit]) from the trainer's start-up lines."""
    g = re.search(r"fsdp units \([A-Z_]+, shard groups of (\d+), \d+ replica\(s\)\):", out)
    accum = re.search(r"global batch \d+ = \d+ rank\(s\) x (\d+) micro-batch\(es\)", out)
    if not g or not accum:
        fail("no 'fsdp units' table or 'global batch' line in the trainer's output")
    table = out[g.end():].split("per-rank memory")[0]
    padded = [int(m.group(2)) for m in re.finditer(r"\s(\d+)\s+(\d+)\s*$", table, re.M)]
    if not padded:
        fail(f"no unit rows in the 'fsdp units' table: {table!r}")
    return int(g.group(1)), int(accum.group(1)), padded


def profiled_bytes(name, trainer, strategy, steps):
    """A 2 hosts x 2 ranks --profile run: (trainer output, counted bytes per step by step, wire tx bytes by host)."""
    before = wire_tx_bytes(name)
    proc = cluster("mpirun", "--host", "h1:2,h2:2", "-np", "4", trainer, "--config", TINY, "--steps", str(steps),
                   "--profile", *sets(fsdp__sharding_strategy=strategy, fsdp__mixed_precision__reduce_dtype="f32"),
                   name=name)
    after = wire_tx_bytes(name)
    out = expect(proc, 0, "across hosts:", "collectives over groups that span hosts: payload)", what=strategy)
    counted = {int(s): int(b.replace(",", "")) for s, b in
               re.findall(r"profile step (\d+): .*\| across hosts ([0-9,]+) B$", out, re.M)}
    if sorted(counted) != list(range(1, steps + 1)):
        fail(f"{strategy}: expected an 'across hosts' figure for steps 1..{steps}, got {sorted(counted)}")
    return out, counted, {h: after[h] - before[h] for h in after}


def check_bytes_across_hosts(name, trainer):
    """--profile counts the payload each rank sends in collectives over groups that span hosts. HYBRID_SHARD
    sends only its replica all-reduce and the trainer's scalar world collectives across hosts, so the count is
    derived from the printed unit table; FULL_SHARD, whose every collective spans the hosts, sends more."""
    steps = 4
    hybrid_out, hybrid, hybrid_wire = profiled_bytes(name, trainer, "HYBRID_SHARD", steps)
    g, accum, padded = fsdp_table(hybrid_out)
    # Per micro-batch and unit, a replica all-reduce of this rank's gradient shard, padded/g F32 elements.
    grads = accum * sum(p // g for p in padded) * 4
    # One 4-byte element each over the world: the loss count (I32), a stop flag between micro-batches, the loss
    # sum, and the stop flag at the step's end (no checkpoint.dir: Checkpointer::end_of_step).
    scalars = 4 * (1 + (accum - 1) + 1 + 1)
    if any(b != grads + scalars for b in hybrid.values()):
        fail(f"HYBRID_SHARD: counted {hybrid} bytes per step, expected {grads} + {scalars} = {grads + scalars} "
             f"({accum} micro-batches x units padded {padded} / {g} x 4 bytes, plus the scalars)")
    full_out, full, full_wire = profiled_bytes(name, trainer, "FULL_SHARD", steps)
    if min(full.values()) <= max(hybrid.values()):
        fail(f"FULL_SHARD should send more across hosts than HYBRID_SHARD: {full} vs {hybrid}")
    for strategy, counted, wire in (("HYBRID_SHARD", hybrid, hybrid_wire), ("FULL_SHARD", full, full_wire)):
        total = 4 * sum(counted.values())
        print(f"hybrid: --profile {strategy}: across hosts {counted[steps]:,} B per step per rank counted "
              f"(payload); {steps} steps x 4 ranks = {total:,} B; wire tx over the whole job (start-up included) "
              f"h1 {wire['h1']:,} B, h2 {wire['h2']:,} B")
    # Each HYBRID replica all-reduce is a pair on two hosts: every counted byte crosses the wire.
    if sum(hybrid_wire.values()) < 4 * sum(hybrid.values()):
        fail(f"HYBRID_SHARD: the links sent {hybrid_wire} bytes, less than the payload counted {hybrid}")


def start_launch(name, trainer, *args):
    """`scripts/cluster launch` on 2 hosts x 2 ranks, started; returns it once the ranks trained step 3."""
    job = subprocess.Popen([CLUSTER, "launch", "--host", "h1:2,h2:2", "-np", "4", trainer, "--config", TINY, *args],
                           cwd=ROOT, env=dict(os.environ, ST_CLUSTER=name), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    seen = []
    for line in job.stderr:  # EOF if the job ends first; the test's timeout guards a hang
        seen.append(line)
        if "step 3/" in line:
            return job, seen
    job.wait()
    fail(f"the job ended (exit {job.returncode}) before step 3: {''.join(seen)[-3000:]}")


def finish(job, seen):
    """Waits for the job; returns its exit status and its whole output."""
    out, err = job.communicate()
    return job.returncode, "".join(seen) + err + out


def host_trainers(name, host, trainer):
    """The pids of the trainer processes running inside `host`."""
    pids = subprocess.run(["ip", "netns", "pids", f"{name}-{host}"], capture_output=True, text=True).stdout.split()
    found = []
    for pid in pids:
        try:
            if os.readlink(f"/proc/{pid}/exe") == trainer:
                found.append(int(pid))
        except OSError:
            pass
    return found


def check_failures_inside(name, trainer, tmp):
    """Through scripts/launch across hosts: SIGTERM saves on every host and exits 0, and the run resumes; every
    rank of one host killed, or its link cut, ends the job non-zero with one line naming the host."""
    ckpt = ["--set", "checkpoint.dir=/local/ckpt", "--set", "checkpoint.interval=100"]
    job, seen = start_launch(name, trainer, "--steps", "400", *ckpt)
    job.send_signal(signal.SIGTERM)  # the Popen's pid is scripts/launch itself (cluster and nsenter exec it)
    code, out = finish(job, seen)
    stopped = [ln for ln in out.splitlines() if "stopped after step" in ln]
    if code != 0 or not stopped:
        sys.stderr.write(out[-3000:])
        fail(f"SIGTERM to the launcher: exit {code}, expected 0 and a 'stopped after step' line")
    k = int(stopped[0].split("stopped after step ")[1].split()[0])
    latest = {h: open(os.path.join(cluster("disk", h, name=name).stdout.strip(), "ckpt", "latest")).read().strip()
              for h in ("h1", "h2")}
    print(f"failures: SIGTERM to scripts/launch: exit 0 after step {k}; latest on each host: {latest}")
    if set(latest.values()) != {f"step-{k:06d}"}:
        fail(f"every host's latest should name step-{k:06d}")
    metrics = os.path.join(tmp, "resumed.jsonl")
    proc = cluster(*cluster_job(trainer, k + 2, *ckpt, *sets(logging__metrics_file=metrics)), name=name)
    expect(proc, 0, f"resumed from /local/ckpt/step-{k:06d}", what="resume after SIGTERM")
    if sorted(loss_by_step(metrics)) != [k + 1, k + 2]:
        fail(f"the resumed run logged steps {sorted(loss_by_step(metrics))}, expected {k + 1}, {k + 2}")
    print(f"failures: resumed on both hosts from step-{k:06d}, trained steps {k + 1}-{k + 2}")

    job, seen = start_launch(name, trainer, "--steps", "400", "--set", "comm.timeout_s=10")
    victims = host_trainers(name, "h2", trainer)
    for pid in victims:
        os.kill(pid, signal.SIGKILL)
    start = time.monotonic()  # printed, not asserted: how long the job took to end
    code, out = finish(job, seen)
    said = [ln for ln in out.splitlines() if ln.startswith("launch: rank") and "on host h2" in ln]
    print(f"failures: SIGKILL of h2's {len(victims)} ranks: exit {code} after {time.monotonic() - start:.0f} s; " +
          (said[0] if said else "no launch line"))
    if len(victims) != 2 or code == 0 or len(said) != 1:
        sys.stderr.write(out[-3000:])
        fail("expected exit non-zero and one 'launch: rank ...' line naming host h2")

    job, seen = start_launch(name, trainer, "--steps", "400", "--set", "comm.timeout_s=10")
    cluster("link", "h2", "down", name=name)
    start = time.monotonic()
    code, out = finish(job, seen)
    said = [ln for ln in out.splitlines() if ln.startswith("launch: rank")]
    print(f"failures: h2's link down: exit {code} after {time.monotonic() - start:.0f} s; " +
          (said[0] if said else "no launch line"))
    if code == 0 or len(said) != 1 or "host h2 (ranks 2, 3) has gone silent" not in said[0]:
        sys.stderr.write(out[-3000:])
        fail("expected exit non-zero and one 'launch: rank ...' line saying host h2 (ranks 2, 3) has gone silent")


def check_cleanup(name, trainer, tmp):
    proc = subprocess.run([CLUSTER, "run", "1", "--", "true"], env=dict(os.environ, ST_CLUSTER=name),
                          capture_output=True, text=True)
    if proc.returncode == SKIP:
        print(f"SKIPPED: {proc.stderr.strip()}")
        sys.exit(SKIP)
    left = {n for n in netns_names() if n.startswith(name + "-")}
    if os.path.exists(f"/var/tmp/shardtrain-cluster/{name}"):
        left.add(f"/var/tmp/shardtrain-cluster/{name}")
    if proc.returncode != 0 or left:
        fail(f"cluster run 1 -- true: exit {proc.returncode}, left {sorted(left)}: {proc.stderr}")
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
    state = f"/run/shardtrain-cluster/{name}"  # removed last, after the namespaces
    while time.time() < deadline and (os.path.exists(state) or any(n.startswith(name + "-") for n in netns_names())):
        time.sleep(0.2)
    left = {n for n in netns_names() if n.startswith(name + "-")}
    disks = f"/var/tmp/shardtrain-cluster/{name}"
    if left or os.path.exists(state) or os.path.exists(disks):
        fail(f"after SIGKILL of `cluster run`, left: {sorted(left)} {state if os.path.exists(state) else ''} "
             f"{disks if os.path.exists(disks) else ''}")
    print("cleanup: after SIGKILL of `scripts/cluster run`, its reaper removed the namespaces and state")


def main():
    global CKPT
    trainer, check = os.path.abspath(sys.argv[1]), sys.argv[2]
    CKPT = os.path.join(os.path.dirname(trainer), "ckpt")
    name = "c" + check[:2] + str(os.getpid() % 10000)
    if check.endswith("-inside"):
        name = os.environ["ST_CLUSTER"]
        {"hosts-inside": check_hosts_inside, "storage-inside": check_storage_inside,
         "restart-inside": check_restart_inside, "kill-inside": check_kill_inside,
         "hybrid-inside": check_hybrid_inside, "failures-inside": check_failures_inside}[check](name, trainer, sys.argv[3])
        return
    with tempfile.TemporaryDirectory() as tmp:
        if check == "cleanup":
            check_cleanup(name, trainer, tmp)
        else:
            inside(name, check, trainer, tmp, hosts=4 if check == "restart" else 2)


if __name__ == "__main__":
    main()
