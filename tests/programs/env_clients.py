#!/usr/bin/env python3
"""Writes with three clients that read their credentials from the
environment only (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_ENDPOINT_URL, as `fencegate lock --credentials`
sets them): boto3, the aws CLI and obstore (object_store). None adds a
header or metadata.

    env_clients.py NAME GO_FILE RESULTS

Writes jobs/NAME-CLIENT-1 with each client, then waits until GO_FILE
exists, then writes jobs/NAME-CLIENT-2 with each client and reads back
what it wrote. Each outcome is a line of RESULTS: `CLIENT STEP ok` or
`CLIENT STEP refused: WHY`.
"""
import os
import subprocess
import sys
import time

NAME, GO, RESULTS = sys.argv[1], sys.argv[2], sys.argv[3]
BUCKET = "demo"


def report(client, step, error=None):
    with open(RESULTS, "a") as f:
        f.write(f"{client} {step} " + ("ok" if error is None else f"refused: {error}") + "\n")
        f.flush()


def boto3_put(key, body):
    import boto3
    from botocore.config import Config
    s3 = boto3.client("s3", config=Config(s3={"addressing_style": "path"},
                                          retries={"max_attempts": 1}))
    s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body


def cli_put(key, body):
    path = f"{NAME}-cli.txt"
    with open(path, "wb") as f:
        f.write(body)
    aws = os.path.join(os.path.dirname(sys.executable), "aws")
    r = subprocess.run([aws, "s3", "cp", path, f"s3://{BUCKET}/{key}"],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1])
    r = subprocess.run([aws, "s3", "cp", f"s3://{BUCKET}/{key}", "-"],
                       capture_output=True)
    assert r.stdout == body, r


def obstore_put(key, body):
    import obstore
    from obstore.store import S3Store
    store = S3Store(BUCKET, client_options={"allow_http": True})
    obstore.put(store, key, body)
    assert bytes(obstore.get(store, key).bytes()) == body


CLIENTS = {"boto3": boto3_put, "cli": cli_put, "obstore": obstore_put}


def step(n):
    for client, put in CLIENTS.items():
        key = f"jobs/{NAME}-{client}-{n}"
        try:
            put(key, f"{NAME} {client} {n}".encode())
            report(client, n)
        except Exception as e:
            report(client, n, str(e).replace("\n", " ")[:300])


step(1)
while not os.path.exists(GO):
    time.sleep(0.05)
step(2)
