#!/usr/bin/env python3
"""Writes a wrk Lua script that sends one SigV4-signed S3 PUT again and again.

    wrk-request.py ENDPOINT FORM SIZE TOKEN KEY SECRET REGION OUT.lua [KEYS]

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

With KEYS above 1, the requests go to KEYS objects in turn
(`wrk-object-0` ...), each signed on its own (scripts/bench-cores).
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
def sign(obj):
    """(path, headers) of the request on object `obj`."""
    url = f"{endpoint}/bench/{obj}"
    headers = {}
    if form == "presigned":
        req = AWSRequest(method="PUT", url=f"{url}?x-fencing-token={token}")
        S3SigV4QueryAuth(creds, "s3", region, expires=3600).add_auth(req)
        return req.url.split(endpoint, 1)[1], headers
    if form == "sha256":
        req = AWSRequest(method="PUT", url=url, data=body, headers={
            "x-fencing-token": token,
            "x-amz-content-sha256": hashlib.sha256(body).hexdigest(),
        })
        S3SigV4Auth(creds, "s3", region).add_auth(req)
        for name in ("Authorization", "X-Amz-Date", "x-amz-content-sha256", "x-fencing-token"):
            headers[name] = req.headers[name]
        return f"/bench/{obj}", headers
    if form in ("get", "static", "head", "list"):
        path = "/bench?list-type=2&prefix=wrk" if form == "list" else f"/bench/{obj}"
        req = AWSRequest(method="HEAD" if form == "head" else "GET", url=f"{endpoint}{path}", headers={
            "x-amz-content-sha256": hashlib.sha256(b"").hexdigest(),
        })
        S3SigV4Auth(creds, "s3", region).add_auth(req)
        if form != "static":
            for name in ("Authorization", "X-Amz-Date", "x-amz-content-sha256"):
                headers[name] = req.headers[name]
        return path, headers
    sys.exit(f"unknown form {form!r}")


keys = int(sys.argv[9]) if len(sys.argv) > 9 else 1

reads = form in ("get", "static", "head", "list")
method = "HEAD" if form == "head" else "GET" if reads else "PUT"
with open(out, "w") as f:
    if keys > 1:
        # Formatted in init(): wrk sets the Host header after the script
        # is loaded.
        f.write("local reqs = {}\nfunction init(args)\n")
        if not reads:
            f.write(f'local body = string.rep("x", {size})\n')
        for i in range(keys):
            path, headers = sign(f"wrk-object-{i}")
            hs = ", ".join(f'["{k}"] = "{v}"' for k, v in headers.items())
            b = "nil" if reads else "body"
            f.write(f'reqs[{i + 1}] = wrk.format("{method}", "{path}", {{{hs}}}, {b})\n')
        f.write("end\nlocal i = 0\nfunction request()\n    i = i % #reqs + 1\n    return reqs[i]\nend\n")
        sys.exit(0)
    path, headers = sign("wrk-object")
    f.write(f'wrk.method = "{method}"\n')
    f.write(f"wrk.path = {path!r}\n".replace("'", '"'))
    if not reads:
        f.write(f'wrk.body = string.rep("x", {size})\n')
    for k, v in headers.items():
        f.write(f'wrk.headers["{k}"] = "{v}"\n')
