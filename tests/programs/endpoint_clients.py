#!/usr/bin/env python3
"""Writes with clients that fetch their credentials from the AWS
container-credentials endpoint only (AWS_CONTAINER_CREDENTIALS_FULL_URI
and AWS_CONTAINER_AUTHORIZATION_TOKEN, as `fencegate lock
--credentials-endpoint` sets them; no AWS_ACCESS_KEY_ID): boto3 with one
client for the whole run, obstore (object_store) with one store for the
whole run, and the aws CLI, a process a write.

    endpoint_clients.py NAME SECONDS GO_FILE RESULTS

Writes jobs/NAME-CLIENT-N with each client every half second for SECONDS
(its credentials renewed meanwhile), each line of RESULTS `CLIENT N ok` or
`CLIENT N failed: WHY`; then writes `NAME phase-1 done` and waits until
GO_FILE exists, and writes once more with each client (step `last`).
Writes FENCING_LOCK_KEY to NAME.lock first.
"""
import os
import subprocess
import sys
import time

NAME, SECONDS, GO, RESULTS = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
BUCKET = "demo"
assert "AWS_ACCESS_KEY_ID" not in os.environ, "a static key would be preferred"
with open(f"{NAME}.lock", "w") as f:
    f.write(os.environ["FENCING_LOCK_KEY"])


def report(line):
    with open(RESULTS, "a") as f:
        f.write(line + "\n")
        f.flush()


def boto3_client():
    import boto3
    from botocore.config import Config
    return boto3.client("s3", config=Config(s3={"addressing_style": "path"},
                                            retries={"max_attempts": 1}))


S3 = boto3_client()


def boto3_put(key, body):
    S3.put_object(Bucket=BUCKET, Key=key, Body=body)
    assert S3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body


def obstore_store():
    from obstore.store import S3Store
    return S3Store(BUCKET, client_options={"allow_http": True})


STORE = obstore_store()


def obstore_put(key, body):
    import obstore
    obstore.put(STORE, key, body)
    assert bytes(obstore.get(STORE, key).bytes()) == body


def cli_put(key, body):
    path = f"{NAME}-cli.txt"
    with open(path, "wb") as f:
        f.write(body)
    aws = os.path.join(os.path.dirname(sys.executable), "aws")
    r = subprocess.run([aws, "s3", "cp", path, f"s3://{BUCKET}/{key}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError((r.stderr.strip().splitlines() or ["?"])[-1])


CLIENTS = {"boto3": boto3_put, "obstore": obstore_put, "cli": cli_put}


def step(n):
    for client, put in CLIENTS.items():
        key = f"jobs/{NAME}-{client}-{n}"
        try:
            put(key, f"{NAME} {client} {n}".encode())
            report(f"{client} {n} ok")
        except Exception as e:
            report(f"{client} {n} failed: " + str(e).replace("\n", " ")[:300])


start, n = time.time(), 0
while time.time() - start < SECONDS:
    step(n)
    n += 1
    time.sleep(0.5)
report(f"{NAME} phase-1 done")
while not os.path.exists(GO):
    time.sleep(0.05)
step("last")
