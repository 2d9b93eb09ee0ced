#!/usr/bin/env python3
"""Writes a wrk Lua script that sends one SigV4-signed S3 PUT again and again.

    wrk-request.py ENDPOINT FORM SIZE TOKEN KEY SECRET REGION OUT.lua

FORM is `presigned` (the signature and the token in the query,
UNSIGNED-PAYLOAD) or `sha256` (header-signed, the body's hex SHA-256 in
x-amz-content-sha256, the token in the signed x-fencing-token header: what
the SDKs send by default), or `get`: a GET of the same object,
header-signed with the empty body's SHA-256 as the SDKs send it, with no
token (a read needs none); `static` is the same GET unsigned, for nginx
serving the object as a file; `head` is the same as a HEAD (wrk cannot
time it: it waits for the body the answer's Content-Length announces), and
`list` a ListObjectsV2 of the bucket (prefix `wrk`), signed alike. Signed by botocore, not by fencegate's code, so
that neither the generator (wrk) nor the signer is the project's own. The
same signed request is valid for the signature's window (15 minutes for the
header form, an hour for the presigned one); fencegate does not refuse
replays, so wrk may send it as often as it likes.
"""
import hashlib
import sys

from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

endpoint, form, size, token, key, secret, region, out = sys.argv[1:9]
size = int(size)
body = b"x" * size
creds = Credentials(key, secret)
url = f"{endpoint}/bench/wrk-object"
headers = {}
if form == "presigned":
    req = AWSRequest(method="PUT", url=f"{url}?x-fencing-token={token}")
    S3SigV4QueryAuth(creds, "s3", region, expires=3600).add_auth(req)
    path = req.url.split(endpoint, 1)[1]
elif form == "sha256":
    req = AWSRequest(method="PUT", url=url, data=body, headers={
        "x-fencing-token": token,
        "x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
    })
    S3SigV4Auth(creds, "s3", region).add_auth(req)
    path = "/bench/wrk-object"
    for name in ("Authorization", "X-Amz-Date", "x-amz-content-sha256", "x-fencing-token"):
        headers[name] = req.headers[name]
elif form in ("get", "static", "head", "list"):
    path = "/bench?list-type=2&prefix=wrk" if form == "list" else "/bench/wrk-object"
    req = AWSRequest(method="HEAD" if form == "head" else "GET", url=f"{endpoint}{path}", headers={
        "x-amz-content-sha256": hashlib.sha256(b"").hexdigest(),
    })
    S3SigV4Auth(creds, "s3", region).add_auth(req)
    if form != "static":
        for name in ("Authorization", "X-Amz-Date", "x-amz-content-sha256"):
            headers[name] = req.headers[name]
else:
    sys.exit(f"unknown form {form!r}")

reads = form in ("get", "static", "head", "list")
method = "HEAD" if form == "head" else "GET" if reads else "PUT"
with open(out, "w") as f:
    f.write(f'wrk.method = "{method}"\n')
    f.write(f"wrk.path = {path!r}\n".replace("'", '"'))
    if not reads:
        f.write(f'wrk.body = string.rep("x", {size})\n')
    for k, v in headers.items():
        f.write(f'wrk.headers["{k}"] = "{v}"\n')
