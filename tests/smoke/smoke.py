#!/usr/bin/env python3
"""Smoke test with real, unmodified clients: the aws CLI, boto3, rclone and s3cmd.

Starts the fencegate binary given as argv[1] on free loopback ports with the
embedded store and a fresh data directory, then drives it the way a user
would; then the same in front of Garage, when SMOKE_GARAGE names one
("ENDPOINT KEY_ID SECRET", region `garage`: scripts/test starts it), its
checks named `garage: ...`. Prints one line per check and a closing
'N passed, N failed' line; exits non-zero on any failure.
"""
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile

import boto3
import boto3.s3.transfer
import botocore
from botocore.exceptions import ClientError

BIN = os.path.abspath(sys.argv[1])
WORK = tempfile.mkdtemp(prefix="fencegate-smoke-")
KEY, SECRET = "fencegate-demo", "fencegate-demo-secret-key"
results = []
# The store the checks run on, as their names say it ("" or "garage: ").
WHERE = [""]


def check(name, ok, detail=""):
    results.append(ok)
    name = WHERE[0] + name
    print(f"{'ok  ' if ok else 'FAIL'} {name}" + (f": {detail}" if detail and not ok else ""))


def start(backend="", name="fencegate"):
    cfg = os.path.join(WORK, f"{name}.toml")
    with open(cfg, "w") as f:
        f.write(f'[server]\nlisten = "127.0.0.1:0"\nadmin_listen = "127.0.0.1:0"\ndata_dir = "{WORK}/{name}-data"\n'
                '[[rules]]\nbucket = "demo"\nprefix = "scratch/"\nmode = "unfenced"\n' + backend)
    log = open(os.path.join(WORK, "fencegate.log"), "a")
    p = subprocess.Popen([BIN, "--config", cfg], stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    m = re.search(r"s3=(\S+)", line)
    if not m:
        p.kill()
        sys.exit(f"fencegate did not start: {line!r}")
    return p, "http://" + m.group(1)


def aws(endpoint, *args, stdin=None):
    env = dict(os.environ, AWS_ACCESS_KEY_ID=KEY, AWS_SECRET_ACCESS_KEY=SECRET,
               AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE="/dev/null",
               AWS_SHARED_CREDENTIALS_FILE="/dev/null")
    return subprocess.run(["aws", "--endpoint-url", endpoint, *args], env=env,
                          capture_output=True, text=True, input=stdin)


def boto(endpoint, token=None):
    # signature_version: boto3 presigns with SigV2 unless told otherwise, and
    # fencegate accepts SigV4 only.
    s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=KEY,
                      aws_secret_access_key=SECRET, region_name="us-east-1",
                      config=botocore.config.Config(retries={"max_attempts": 1},
                                                    signature_version="s3v4"))
    if token is not None:
        def add_token(request, **_):
            request.headers["x-fencing-token"] = str(token)
        # Added before signing, so the header is signed like any other.
        s3.meta.events.register("before-sign.s3.*", add_token)
    return s3


def rclone(endpoint, *args, token=None):
    # AWS_CA_BUNDLE (set on some machines) makes rclone's S3 backend fail
    # before it sends anything; the endpoint is plain HTTP anyway.
    env = {k: v for k, v in os.environ.items() if k != "AWS_CA_BUNDLE"}
    env.update(RCLONE_CONFIG_FG_TYPE="s3", RCLONE_CONFIG_FG_PROVIDER="Other",
               RCLONE_CONFIG_FG_ACCESS_KEY_ID=KEY, RCLONE_CONFIG_FG_SECRET_ACCESS_KEY=SECRET,
               RCLONE_CONFIG_FG_ENDPOINT=endpoint, RCLONE_CONFIG_FG_REGION="us-east-1",
               RCLONE_CONFIG=os.path.join(WORK, "rclone.conf"))
    extra = ["--retries", "1", "--low-level-retries", "1", "--s3-upload-cutoff", "8M",
             "--s3-chunk-size", "8M"]
    if token is not None:
        # rclone adds --header after signing, and uploads single parts with a
        # presigned PUT, where fencegate ignores an unsigned token header:
        # uploads carry the token as metadata, which rclone signs.
        extra += ["--header-upload", f"X-Amz-Meta-Fencing-Token: {token}",
                  "--header", f"x-fencing-token: {token}"]
    return subprocess.run(["rclone", *extra, *args], env=env, capture_output=True, text=True)


def s3cmd(endpoint, *args, token=None):
    host = endpoint.split("://", 1)[1]
    extra = ["--config", "/dev/null", "--access_key", KEY, "--secret_key", SECRET,
             "--host", host, "--host-bucket", host, "--no-ssl", "--region", "us-east-1",
             "--multipart-chunk-size-mb", "8"]
    if token is not None:
        extra += ["--add-header", f"x-fencing-token:{token}"]
    return subprocess.run(["s3cmd", *extra, *args], capture_output=True, text=True)


def same_file(a, b):
    return os.path.exists(b) and open(a, "rb").read() == open(b, "rb").read()


def code_of(fn):
    try:
        fn()
        return None
    except ClientError as e:
        return e.response["Error"]["Code"]


def versions():
    def first_line(cmd):
        try:
            r = subprocess.run(cmd, capture_output=True, text=True)
            return (r.stdout or r.stderr).strip().splitlines()[0]
        except Exception as e:  # noqa: BLE001 - informational only
            return f"unavailable ({e})"
    print("clients: aws CLI: " + first_line(["aws", "--version"]))
    print("clients: boto3 " + boto3.__version__ + ", botocore " + botocore.__version__)
    print("clients: " + first_line(["rclone", "version"]))
    print("clients: " + first_line(["s3cmd", "--version"]))


_next_port = [0]


def free_port():
    """A bindable loopback port from below the kernel's ephemeral range, so
    that no outgoing connection can take it before the service binds it
    (the same rule as tests/common/mod.rs)."""
    import socket
    low = 10000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        high = 32768
    span = max(high - low, 1000)
    start = (os.getpid() * 7919) % span
    for _ in range(span):
        port = low + (start + _next_port[0]) % span
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port")


def conditional_writes_on_moto():
    """Conditional writes through fencegate to moto's server (which honours
    them; Garage ignores them): a failed condition is answered 412
    PreconditionFailed, as the SDK expects. fencegate judges the condition
    on the object it holds, so the answer does not show which one refused."""
    import time
    import urllib.request
    port = free_port()
    moto = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    fg = None
    try:
        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/moto-api/")
                break
            except Exception:  # noqa: BLE001 - not up yet
                time.sleep(0.1)
        fg, ep = start(f'[backend]\nkind = "s3"\nendpoint = "http://127.0.0.1:{port}"\n'
                       'access_key_id = "moto"\nsecret_access_key = "moto"\n', name="moto")
        s3 = boto(ep, token=5)
        s3.create_bucket(Bucket="demo")
        first = s3.put_object(Bucket="demo", Key="once", Body=b"first", IfNoneMatch="*")
        check("moto: If-None-Match put creates", first["ResponseMetadata"]["HTTPStatusCode"] == 200)
        check("moto: second If-None-Match put refused (412)",
              code_of(lambda: s3.put_object(Bucket="demo", Key="once", Body=b"again", IfNoneMatch="*"))
              == "PreconditionFailed")
        check("moto: If-Match with a wrong ETag refused (412)",
              code_of(lambda: s3.put_object(Bucket="demo", Key="once", Body=b"x", IfMatch='"0000"'))
              == "PreconditionFailed")
        check("moto: If-Match with the right ETag accepted",
              code_of(lambda: s3.put_object(Bucket="demo", Key="once", Body=b"y", IfMatch=first["ETag"])) is None)
        got = s3.get_object(Bucket="demo", Key="once")["Body"].read()
        check("moto: the object is the accepted one", got == b"y", repr(got))
    finally:
        if fg:
            fg.send_signal(signal.SIGTERM)
            fg.wait(timeout=30)
        moto.kill()
        moto.wait()


def files():
    """Two small files and a 40 MiB one, in WORK."""
    a = os.path.join(WORK, "a.txt")
    b = os.path.join(WORK, "b.txt")
    big = os.path.join(WORK, "big.bin")
    open(a, "w").write("written by holder 34\n")
    open(b, "w").write("written by holder 33\n")
    with open(big, "wb") as f:
        f.write(os.urandom(40 * 1024 * 1024))
    return a, b, big


def clients(ep, a, b, big):
    """Every client's checks against fencegate at ep, bucket `demo` made
    first."""
    # --- aws CLI ---
    r = aws(ep, "s3", "mb", "s3://demo")
    check("cli: make bucket", r.returncode == 0, r.stderr)
    r = aws(ep, "s3", "cp", a, "s3://demo/k", "--metadata", "fencing-token=34")
    check("cli: put with token 34", r.returncode == 0, r.stderr)
    r = aws(ep, "s3", "cp", b, "s3://demo/k", "--metadata", "fencing-token=33")
    check("cli: stale put 33 refused with StaleFencingToken",
          r.returncode != 0 and "StaleFencingToken" in r.stderr, r.stderr)
    r = aws(ep, "s3", "cp", b, "s3://demo/nokey")
    check("cli: put without token refused with MissingFencingToken",
          r.returncode != 0 and "MissingFencingToken" in r.stderr, r.stderr)
    r = aws(ep, "s3", "cp", "s3://demo/k", "-")
    check("cli: get returns the accepted body", r.stdout == "written by holder 34\n", r.stdout + r.stderr)
    r = aws(ep, "s3", "cp", big, "s3://demo/big", "--metadata", "fencing-token=1")
    check("cli: 40 MiB multipart put", r.returncode == 0, r.stderr)
    out = os.path.join(WORK, "big.out")
    r = aws(ep, "s3", "cp", "s3://demo/big", out)
    check("cli: multipart object reads back intact",
          r.returncode == 0 and open(out, "rb").read() == open(big, "rb").read(), r.stderr)
    r = aws(ep, "s3", "ls", "s3://demo/")
    check("cli: list", r.returncode == 0 and "big" in r.stdout and " k\n" in r.stdout, r.stdout + r.stderr)
    r = aws(ep, "s3api", "head-object", "--bucket", "demo", "--key", "k")
    check("cli: object carries x-amz-meta-fencing-token", '"fencing-token": "34"' in r.stdout, r.stdout)

    # --- boto3 (default config: checksums on) ---
    s3 = boto(ep, token=40)
    s3.put_object(Bucket="demo", Key="b3", Body=b"boto3 body " * 1000)
    got = s3.get_object(Bucket="demo", Key="b3")
    check("boto3: put/get with header token",
          got["Body"].read() == b"boto3 body " * 1000 and got["Metadata"].get("fencing-token") == "40")
    s3.upload_file(big, "demo", "b3big")
    check("boto3: upload_file multipart", s3.head_object(Bucket="demo", Key="b3big")["ContentLength"] == 40 * 1024 * 1024)
    check("boto3: stale put refused", code_of(lambda: boto(ep, 39).put_object(Bucket="demo", Key="b3", Body=b"x")) == "StaleFencingToken")
    check("boto3: copy to a new key", code_of(lambda: s3.copy_object(Bucket="demo", Key="b3copy", CopySource={"Bucket": "demo", "Key": "b3"})) is None)
    check("boto3: delete with token", code_of(lambda: s3.delete_object(Bucket="demo", Key="b3copy")) is None)
    check("boto3: stale delete refused", code_of(lambda: boto(ep, 39).delete_object(Bucket="demo", Key="b3")) == "StaleFencingToken")
    check("boto3: malformed token refused", code_of(lambda: boto(ep, "1e3").put_object(Bucket="demo", Key="b3", Body=b"x")) == "InvalidFencingToken")
    # download_file fetches in ranged GETs with If-Match on the ETag it
    # started with; a new version landing midway must fail it, never
    # leave a file joined from two versions.
    s3.put_object(Bucket="demo", Key="b3torn", Body=b"1" * (8 << 20))
    overtaken = []

    def overtake(_):
        if not overtaken:
            overtaken.append(s3.put_object(Bucket="demo", Key="b3torn", Body=b"2" * (8 << 20)))
    torn_out = os.path.join(WORK, "b3torn.out")
    cfg = boto3.s3.transfer.TransferConfig(multipart_threshold=1 << 20, multipart_chunksize=1 << 20,
                                           max_concurrency=1)
    try:
        s3.download_file("demo", "b3torn", torn_out, Config=cfg, Callback=overtake)
        got = open(torn_out, "rb").read()
        outcome = f"finished: {got.count(b'1')} bytes of the first version, {got.count(b'2')} of the second"
    except Exception as e:  # s3transfer's S3DownloadFailedError
        outcome = f"failed: {e}"
    # s3transfer names the changed ETag, or passes on the store's 412
    # (Garage judges If-Match on a GET itself): either way it failed.
    check("boto3: a download overtaken by a new version fails (If-Match), never torn",
          outcome.startswith("failed") and ("ETag" in outcome or "(412)" in outcome), outcome)
    bad = boto3.client("s3", endpoint_url=ep, aws_access_key_id=KEY, aws_secret_access_key="wrong",
                       region_name="us-east-1", config=botocore.config.Config(retries={"max_attempts": 1}))
    check("boto3: wrong secret refused", code_of(lambda: bad.list_objects_v2(Bucket="demo")) == "SignatureDoesNotMatch")

    # --- rclone ---
    out = os.path.join(WORK, "rc.out")
    r = rclone(ep, "copyto", a, "fg:demo/rc", token=70)
    check("rclone: put with token", r.returncode == 0, r.stderr)
    r = rclone(ep, "copyto", big, "fg:demo/rcbig", token=70)
    check("rclone: 40 MiB multipart put", r.returncode == 0, r.stderr)
    r = rclone(ep, "copyto", "fg:demo/rcbig", out)
    check("rclone: get", r.returncode == 0 and same_file(big, out), r.stderr)
    r = rclone(ep, "lsf", "fg:demo/")
    check("rclone: list", r.returncode == 0 and "rcbig" in r.stdout, r.stderr)
    r = rclone(ep, "copyto", "fg:demo/rc", "fg:demo/rccopy", token=70)
    check("rclone: server-side copy", r.returncode == 0, r.stderr)
    r = rclone(ep, "deletefile", "fg:demo/rccopy", token=70)
    check("rclone: delete", r.returncode == 0, r.stderr)
    r = rclone(ep, "copyto", b, "fg:demo/rc", token=69)
    # rclone uploads single parts through a presigned PUT of its own and
    # reports only the status: "Conflict ... status code: 409".
    check("rclone: stale put refused with 409 Conflict",
          r.returncode != 0 and "status code: 409" in r.stderr, r.stderr[-3000:].replace("\n", " | "))

    # --- s3cmd ---
    r = s3cmd(ep, "put", a, "s3://demo/sc", token=80)
    check("s3cmd: put with token", r.returncode == 0, r.stderr)
    r = s3cmd(ep, "put", big, "s3://demo/scbig", token=80)
    check("s3cmd: 40 MiB multipart put", r.returncode == 0, r.stderr)
    out = os.path.join(WORK, "sc.out")
    r = s3cmd(ep, "get", "--force", "s3://demo/scbig", out)
    check("s3cmd: get", r.returncode == 0 and same_file(big, out), r.stderr)
    r = s3cmd(ep, "ls", "s3://demo/")
    check("s3cmd: list", r.returncode == 0 and "scbig" in r.stdout, r.stderr)
    r = s3cmd(ep, "cp", "s3://demo/sc", "s3://demo/scratch/sccopy", token=80)
    check("s3cmd: copy", r.returncode == 0, r.stderr)
    # s3cmd sends --add-header on uploads only, so its deletes work under
    # an unfenced prefix (a fenced delete is refused with 428).
    r = s3cmd(ep, "del", "s3://demo/sc", token=80)
    check("s3cmd: fenced delete without a token refused with MissingFencingToken",
          r.returncode != 0 and "MissingFencingToken" in r.stderr, r.stderr)
    r = s3cmd(ep, "del", "s3://demo/scratch/sccopy")
    check("s3cmd: delete under an unfenced prefix", r.returncode == 0, r.stderr)
    r = s3cmd(ep, "put", b, "s3://demo/sc", token=79)
    check("s3cmd: stale put refused with StaleFencingToken",
          r.returncode != 0 and "StaleFencingToken" in (r.stderr + r.stdout), r.stderr[-2000:])

    # --- presigned URLs made by boto3, used by a plain HTTP client ---
    import urllib.request
    plain = boto(ep)
    url = plain.generate_presigned_url("put_object", ExpiresIn=300, Params={
        "Bucket": "demo", "Key": "presigned", "Metadata": {"fencing-token": "60"}})
    req = urllib.request.Request(url, data=b"via presigned PUT", method="PUT",
                                 headers={"x-amz-meta-fencing-token": "60"})
    check("presigned PUT (boto3 URL, urllib)", urllib.request.urlopen(req).status == 200)
    url = plain.generate_presigned_url("put_object", ExpiresIn=300, Params={
        "Bucket": "demo", "Key": "presigned", "Metadata": {"fencing-token": "59"}})
    req = urllib.request.Request(url, data=b"stale", method="PUT",
                                 headers={"x-amz-meta-fencing-token": "59"})
    try:
        urllib.request.urlopen(req)
        status = 200
    except urllib.error.HTTPError as e:
        status = e.code
    check("presigned stale PUT refused with 409", status == 409, str(status))
    url = plain.generate_presigned_url("get_object", ExpiresIn=300, Params={"Bucket": "demo", "Key": "presigned"})
    check("presigned GET", urllib.request.urlopen(url).read() == b"via presigned PUT")


def on_store(where, backend, name, a, b, big):
    """fencegate (data in WORK/<name>-data) in front of `backend` (its
    [backend] section, "" for the embedded store): the clients, then
    kill -9 and a restart on the same data directory."""
    WHERE[0] = where
    proc, ep = start(backend, name=name)
    try:
        clients(ep, a, b, big)

        # --- kill -9 and restart: the fence holds ---
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc, ep = start(backend, name=name)
        r = aws(ep, "s3", "cp", b, "s3://demo/k", "--metadata", "fencing-token=33")
        check("after kill -9: stale put 33 still refused", r.returncode != 0 and "StaleFencingToken" in r.stderr, r.stderr)
        r = aws(ep, "s3", "cp", "s3://demo/k", "-")
        check("after kill -9: object intact", r.stdout == "written by holder 34\n", r.stdout + r.stderr)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        WHERE[0] = ""


def garage_backend():
    """The [backend] section for the Garage SMOKE_GARAGE names, or None."""
    named = os.environ.get("SMOKE_GARAGE", "").split()
    if len(named) != 3:
        return None
    endpoint, key, secret = named
    return (f'[backend]\nkind = "s3"\nendpoint = "{endpoint}"\nregion = "garage"\n'
            f'access_key_id = "{key}"\nsecret_access_key = "{secret}"\n')


def main():
    versions()
    conditional_writes_on_moto()
    try:
        a, b, big = files()
        on_store("", "", "fencegate", a, b, big)
        garage = garage_backend()
        if garage:
            on_store("garage: ", garage, "garage", a, b, big)
        else:
            print("skipped: the same in front of Garage (SMOKE_GARAGE unset; scripts/test sets it)")
    finally:
        log = open(os.path.join(WORK, "fencegate.log")).read()
        secrets = [SECRET] + os.environ.get("SMOKE_GARAGE", "").split()[2:]
        check("no secret in fencegate's log", not any(x in log for x in secrets))
        if not all(results):
            print("--- fencegate log ---\n" + log[-5000:])
        forms = sorted(set(re.findall(r"payload=\"?([a-z0-9-]+)", log)))
        print("payload forms seen: " + ", ".join(forms))
        shutil.rmtree(WORK, ignore_errors=True)

    passed = sum(results)
    failed = len(results) - passed
    print(f"smoke: {passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
